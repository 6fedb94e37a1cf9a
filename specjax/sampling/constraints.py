"""Constrained decoding: a regular expression or a JSON schema as a token automaton on device.

A `Constraint` is a deterministic automaton over token ids, built on the host with
`outlines-core <https://github.com/dottxt-ai/outlines-core>`_ (why that library: it
compiles a regex over *bytes* against a whole vocabulary in Rust, handles strings split
across tokens and multi-byte characters, turns a JSON schema into a regex, and is one
small wheel with no runtime dependencies; xgrammar and llguidance do context-free
grammars with a pushdown stack, which does not fit a fixed-size on-device table).
Each of its states says which tokens may come next and where each one leads; a state is
*final* when the text so far is in the language (then the EOS ids are allowed too), and
*complete* when it is final and no token can extend it: the row then ends, with no EOS.

On device the automaton is a `ConstraintTable`: ``next_state int32[S, C]`` (``-1``: the
token is not allowed) over C token classes (ids that behave alike in every state share
a column: a 1,636-state JSON schema over SmolLM2's 49,152 ids needs 175 columns),
``token_class int32[V]``, and ``final``/``complete`` flags ``bool[S]``. Rows of one
batch may carry different constraints, or none: the table is the disjoint union of the
batch's automata plus state 0, which allows every token and loops to itself.

Why this stays exact under speculation. The decoder keeps each row's state after its
committed tokens; at the i-th drafted position of a step the state is advanced along
drafts 0..i-1 (`AutomatonCursor.along`), so the mask applied to the target's p at that
position is the one plain decoding would apply after the same prefix, and a draft model
draws its i-th draft from q masked with the state after its own drafts 0..i-1. That is
the same condition penalties need (`specjax.sampling.penalties`): the verifiers are exact for
any p_i and q_i as long as p_i is plain decoding's distribution after that prefix and
q_i the law the draft was drawn from. A proposal that leaves the language has p = 0 and
is always rejected, so drafters that know nothing of the constraint (prompt lookup, the
block drafter) stay exact, only slower. Masking p alone would be exact too; masking q
alone (or masking every drafted position with the state before the step) is not, and
the tests reject those variants (tests/test_constraints.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.sampling.history import RowHistory

__all__ = ["AutomatonCursor", "Constraint", "ConstraintTable"]

# A dense host table above this many entries is refused with advice, not built.
_MAX_DENSE_ENTRIES = 1 << 28
# The device table's states and classes are padded to a multiple of this.
_TABLE_BUCKET = 64


def _vocabulary_bytes(tokenizer, vocab_size: int | None) -> list[bytes]:
    """Each id's bytes: from a ``tokenizers.Tokenizer`` or a given list of bytes."""
    if isinstance(tokenizer, (list, tuple)):
        table = [bytes(b) for b in tokenizer]
        if vocab_size is not None and vocab_size != len(table):
            raise ValueError(
                f"Constraint: {len(table)} token byte strings given, but vocab_size = {vocab_size}"
            )
        return table
    if tokenizer is None or not hasattr(tokenizer, "id_to_token"):
        raise TypeError(
            "Constraint needs the model's tokenizer (a tokenizers.Tokenizer, e.g. "
            f"model.tokenizer) or one bytes string per id, got {type(tokenizer).__name__}"
        )
    from specjax.sampling.stops import token_bytes

    return token_bytes(tokenizer, vocab_size or tokenizer.get_vocab_size(with_added_tokens=True))


class Constraint:
    """One language as a token automaton: build it with `regex` or `json_schema`.

    Attributes:
        pattern: the regular expression (for a JSON schema, the one built from it).
        next_state: ``int32[S, C]`` the state after a token of class c in state s; ``-1``:
            not allowed. State 0 is the start.
        token_class: ``int32[V]`` each id's column of ``next_state``.
        final: ``bool[S]`` the text so far is in the language (EOS is allowed).
        complete: ``bool[S]`` final and no token extends it (the row ends there).

    Examples:
        >>> import specjax
        >>> vocab = [b"a", b"b", b"ab", b"0", b""]
        >>> c = specjax.Constraint.regex("(ab)+0", vocab)
        >>> c.num_states, c.allowed_ids(0)
        (4, [0, 2])
    """

    def __init__(self, pattern: str, next_state, token_class, final, complete):
        self.pattern = pattern
        self.next_state = np.asarray(next_state, np.int32)
        self.token_class = np.asarray(token_class, np.int32)
        self.final = np.asarray(final, bool)
        self.complete = np.asarray(complete, bool)

    @property
    def num_states(self) -> int:
        return len(self.next_state)

    @property
    def vocab_size(self) -> int:
        return len(self.token_class)

    def __repr__(self) -> str:
        return (
            f"Constraint({self.pattern!r:.80}, states={self.num_states}, "
            f"classes={self.next_state.shape[1]}, V={self.vocab_size})"
        )

    def allowed_ids(self, state: int) -> list[int]:
        """The ids allowed in ``state`` (EOS aside), ascending."""
        return np.flatnonzero(self.next_state[state][self.token_class] >= 0).tolist()

    def walk(self, ids) -> int:
        """The state after ``ids`` from the start, or ``-1`` once one is not allowed."""
        state = 0
        for i in ids:
            state = int(self.next_state[state, self.token_class[i]])
            if state < 0:
                return -1
        return state

    @classmethod
    def regex(cls, pattern: str, tokenizer, vocab_size: int | None = None) -> Constraint:
        """The language of ``pattern`` (matched whole, over the decoded bytes).

        Args:
            pattern: a regular expression (outlines-core's syntax: Rust's ``regex``
                crate, without look-around or back-references).
            tokenizer: the model's ``tokenizers.Tokenizer``, or one ``bytes`` per id.
            vocab_size: V, the model's vocabulary (default: the tokenizer's size); ids
                past the tokenizer's spell nothing and are never allowed.

        Raises:
            ValueError: the pattern does not parse, matches only the empty string, or
                the tokenizer cannot spell some string of it.
        """
        if not isinstance(pattern, str):
            raise TypeError(
                f"Constraint.regex: pattern must be a str, got {type(pattern).__name__}"
            )
        return cls(pattern, *_compile(pattern, _vocabulary_bytes(tokenizer, vocab_size)))

    @classmethod
    def json_schema(
        cls, schema, tokenizer, vocab_size: int | None = None, whitespace: str | None = None
    ) -> Constraint:
        """The JSON documents that validate against ``schema``.

        Args:
            schema: a JSON schema, as a dict or a JSON string.
            tokenizer: as in `regex`.
            vocab_size: as in `regex`.
            whitespace: the regex of the whitespace allowed between JSON tokens
                (outlines-core's default: at most one space); ``""`` for compact JSON.

        Raises:
            ValueError: the schema is not valid JSON or uses what outlines-core cannot
                express; or as in `regex`.
        """
        from outlines_core.json_schema import build_regex_from_schema

        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            json.loads(text)
            pattern = build_regex_from_schema(text, whitespace)
        except (ValueError, TypeError) as e:
            raise ValueError(f"Constraint.json_schema: schema cannot be compiled: {e}") from e
        return cls(pattern, *_compile(pattern, _vocabulary_bytes(tokenizer, vocab_size)))


# Appended to the pattern (see `_compile`): a noncharacter, so that no id spells it in
# practice (one that does is still handled: it can only ever stand for itself).
_END = "\U0010ffff"


def _compile(pattern: str, table: list[bytes]):
    """``(next_state [S, C], token_class [V], final [S], complete [S])`` of ``pattern``.

    outlines-core's index records a token's move only if it does not end in a match
    state of its byte DFA, or ends in a whole match; with the DFA's one-byte match delay
    that drops every token that continues a whole match into a non-match (from "ab" in
    ``(ab)+``, the token "a": measured on outlines-core 0.2.10 to 0.2.14, and caught by
    tests/test_constraints.py). So the index is built for ``(?:pattern)END`` instead,
    with one extra id spelling the END character: no token inside the language then
    reaches a match state, every move is recorded, and a state is final exactly when
    that extra id may follow.
    """
    from outlines_core import Index, Vocabulary

    vocab_size = len(table)
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(table):
        if b:
            by_bytes.setdefault(b, []).append(i)
    if not by_bytes:
        raise ValueError("Constraint: no id of the vocabulary spells any byte")
    end_id, fake_eos = vocab_size, vocab_size + 1  # ids past the vocabulary
    by_bytes.setdefault(_END.encode(), []).append(end_id)
    try:
        index = Index(f"(?:{pattern}){_END}", Vocabulary(fake_eos, by_bytes))
    except ValueError as e:
        message = str(e)
        if "incompatible" in message:
            raise ValueError(
                f"Constraint: the tokenizer cannot spell every string of {pattern!r:.80}: {message}"
            ) from e
        raise ValueError(f"Constraint: {pattern!r:.80} is not a valid regex ({message})") from e
    # Dense over every state outlines-core built, in numpy: a JSON schema's string
    # states allow most of the vocabulary each, millions of moves in all.
    moves = [
        (
            name,
            np.fromiter(row.keys(), np.int64, len(row)),
            np.fromiter(row.values(), np.int64, len(row)),
        )
        for name, row in index.get_transitions().items()
    ]
    names = np.unique(
        np.concatenate(
            [[index.get_initial_state()]] + [[m[0]] for m in moves] + [m[2] for m in moves]
        )
    )
    if names.size * (vocab_size + 2) > _MAX_DENSE_ENTRIES:
        raise ValueError(
            f"Constraint: {pattern!r:.80} has {names.size} states; a table of {names.size} x "
            f"{vocab_size} ids is too large to build: bound the lengths of its strings"
        )
    dense = np.full((names.size, vocab_size + 2), -1, np.int64)
    for name, ids, targets in moves:
        dense[np.searchsorted(names, name), ids] = np.searchsorted(names, targets)
    del moves
    final_all = dense[:, end_id] >= 0
    dense = dense[:, :vocab_size]  # the END id and the fake EOS go
    # A real id whose bytes hold END as END itself leads to a state where only the end
    # of the text may follow: no move and not final. Drop moves into such dead ends,
    # until none is left.
    while True:
        dead = ~np.any(dense >= 0, axis=1) & ~final_all
        into_dead = (dense >= 0) & dead[np.maximum(dense, 0)]
        if not into_dead.any():
            break
        dense[into_dead] = -1
    start = int(np.searchsorted(names, index.get_initial_state()))
    # Renumber the states reachable from the start 0..S-1, breadth first.
    order, number = [start], np.full(names.size, -1, np.int64)
    number[start] = 0
    for state in order:
        for nxt in np.unique(dense[state][dense[state] >= 0]).tolist():
            if number[nxt] < 0:
                number[nxt] = len(order)
                order.append(nxt)
    order_a = np.asarray(order, np.int64)
    dense = dense[order_a]
    dense = np.where(dense >= 0, number[np.maximum(dense, 0)], -1).astype(np.int32)
    final = final_all[order_a]
    if not np.any(dense[0] >= 0):
        raise ValueError(
            f"Constraint: {pattern!r:.80} matches only the empty string (or nothing): no "
            "token can start it"
        )
    # Ids that behave alike in every state share one column.
    columns, token_class = np.unique(dense.T, axis=0, return_inverse=True)
    next_state = np.ascontiguousarray(columns.T)
    complete = final & ~np.any(next_state >= 0, axis=1)
    return next_state, token_class.reshape(-1).astype(np.int32), final, complete


@struct.dataclass
class ConstraintTable:
    """The batch's automata as one table on device (state 0 allows every token).

    Build it with `ConstraintTable.build`. Attributes:
        next_state: ``int32[S, C]``: the state after a token of class c; ``-1``: not
            allowed.
        token_class: ``int32[V]``.
        final: ``bool[S]`` the EOS ids are allowed.
        complete: ``bool[S]`` nothing can follow: the row ends.
        initial: ``int32[N]`` each prompt's start state (0: unconstrained).
    """

    next_state: jax.Array
    token_class: jax.Array
    final: jax.Array
    complete: jax.Array
    initial: jax.Array

    @property
    def vocab_size(self) -> int:
        return self.token_class.shape[0]

    @classmethod
    def build(cls, per_prompt: Sequence[Constraint | None], vocab_size: int) -> ConstraintTable:
        """One table for ``per_prompt`` (a `Constraint` or None per prompt), all of width V."""
        distinct: list[Constraint] = []
        for c in per_prompt:
            if c is not None and not any(c is d for d in distinct):
                distinct.append(c)
        for c in distinct:
            if c.vocab_size != vocab_size:
                raise ValueError(
                    f"constraint: {c!r} was built for V = {c.vocab_size}, but the target has "
                    f"V = {vocab_size}: build it with the target's tokenizer and vocab_size"
                )
        # Combined classes: ids that share a class in every automaton.
        stacked = np.stack([np.zeros(vocab_size, np.int32)] + [c.token_class for c in distinct])
        _, first_id, token_class = np.unique(
            stacked.T, axis=0, return_index=True, return_inverse=True
        )
        num_classes = first_id.size
        rows = [np.zeros((1, num_classes), np.int32)]  # state 0: anything, back to 0
        final, complete, offsets = [np.ones(1, bool)], [np.zeros(1, bool)], []
        offset = 1
        for c in distinct:
            nxt = c.next_state[:, c.token_class[first_id]]
            rows.append(np.where(nxt >= 0, nxt + offset, -1).astype(np.int32))
            final.append(c.final)
            complete.append(c.complete)
            offsets.append(offset)
            offset += c.num_states
        initial = [
            0 if c is None else offsets[next(i for i, d in enumerate(distinct) if d is c)]
            for c in per_prompt
        ]
        # Shapes are static: padded up to a bucket (unreachable states, unused classes),
        # so that other constraints of a similar size reuse the compiled program.
        next_state = np.concatenate(rows)
        s, c = (-(-n // _TABLE_BUCKET) * _TABLE_BUCKET for n in next_state.shape)
        next_state = np.pad(
            next_state,
            [(0, s - next_state.shape[0]), (0, c - next_state.shape[1])],
            constant_values=-1,
        )
        pad_states = lambda flags: np.pad(np.concatenate(flags), (0, s - offset))  # noqa: E731
        return cls(
            next_state=jnp.asarray(next_state),
            token_class=jnp.asarray(token_class.reshape(-1).astype(np.int32)),
            final=jnp.asarray(pad_states(final)),
            complete=jnp.asarray(pad_states(complete)),
            initial=jnp.asarray(initial, jnp.int32),
        )

    def states_after(self, states_B, tokens_BG):
        """``int32[B, G]``: the states after each of ``tokens_BG``'s tokens in turn."""
        after = []
        for i in range(tokens_BG.shape[1]):
            after.append(self.step(after[-1] if after else states_B, tokens_BG[:, i]))
        return jnp.stack(after, axis=1) if after else jnp.zeros(states_B.shape + (0,), jnp.int32)

    def step(self, states, tokens):
        """The states after ``tokens`` (same shape); a token not allowed (or ``-1``) leads
        to state 0, which only positions that are never used can reach."""
        v = self.token_class.shape[0]
        nxt = self.next_state[states, self.token_class[jnp.clip(tokens, 0, v - 1)]]
        return jnp.where((tokens >= 0) & (tokens < v) & (nxt >= 0), nxt, 0)


@struct.dataclass
class AutomatonCursor(RowHistory):
    """Rows' automaton states at the positions being scored: a constraint's history.

    Attributes:
        table: the `ConstraintTable`.
        states: ``int32[B]`` or ``int32[B, T]`` (one per scored position).
        eos_ids: ``int32[K]`` the decoder's EOS ids (``-1`` pads), allowed in final states.
    """

    table: ConstraintTable
    states: jax.Array
    eos_ids: jax.Array

    def allowed(self, like_RxV: jax.Array) -> jax.Array:
        """``bool`` mask broadcastable to logits ``like`` ``[B, ..., V_l]`` (``V_l <= V``)."""
        v_l = like_RxV.shape[-1]
        t = self.table
        if v_l > t.vocab_size:
            raise ValueError(
                f"a constraint built for V = {t.vocab_size} cannot mask logits [.., {v_l}]"
            )
        states = self.states.reshape(
            self.states.shape + (1,) * (like_RxV.ndim - 1 - self.states.ndim)
        )
        by_class = t.next_state[states] >= 0  # [B, ..., C]
        allowed = jnp.take(by_class, t.token_class[:v_l], axis=-1)
        is_eos_V = (
            jnp.zeros((v_l,), bool)
            .at[jnp.where(self.eos_ids >= 0, self.eos_ids, v_l)]
            .set(True, mode="drop")
        )
        is_eos = is_eos_V.reshape((1,) * states.ndim + (v_l,))
        return allowed | (is_eos & t.final[states][..., None])

    def mask(self, logits_RxV, config):
        """``-inf`` where the rows' constraint allows no token."""
        return jnp.where(self.allowed(logits_RxV), logits_RxV, -jnp.inf)

    def advance(self, tokens_B: jax.Array) -> AutomatonCursor:
        """The cursor after each row's next token ``tokens_B`` (``states`` ``[B]``)."""
        return self.replace(states=self.table.step(self.states, tokens_B))

    def along_tree(
        self, node_tokens_BN: jax.Array, parents: tuple[int, ...], width: int
    ) -> AutomatonCursor:
        """``[B, width]`` states at a tree's nodes (root first), then padding: node j is
        after the committed tokens and the tokens on the path from the root to j, j's
        own included (``parents`` as in `specjax.verification.tree.Tree`, each before its
        children). The padding columns take the root's state: they are never read."""
        states = [self.states]
        for j, parent in enumerate(parents, start=1):
            states.append(self.table.step(states[parent], node_tokens_BN[:, j - 1]))
        states += [self.states] * (width - len(states))
        return self.replace(states=jnp.stack(states, axis=1))

    def along(self, drafts_BG: jax.Array) -> AutomatonCursor:
        """``[B, G+1]`` states at the step's scored positions: position i is after the
        committed tokens and drafts ``0..i-1``."""
        after_BG = self.table.states_after(self.states, drafts_BG)
        return self.replace(states=jnp.concatenate([self.states[:, None], after_BG], axis=1))
