"""Drafters: who proposes the γ tokens the target verifies.

A drafter is a small frozen pytree (``flax.struct.dataclass``) with three pure
functions. The decoder calls them inside its ``lax.while_loop``:

* ``init(prompts_BS, seq_lengths_B, cache_len) -> state`` once, after the prompt;
* ``propose(keys_BG, state, seq_BS, seq_lengths_B, sampling) -> Proposal`` each step;
* ``update(state, seq_lengths_B) -> state`` after verification, with each row's
  new length (this is where a draft model rolls its KV cache back).

``seq_BS`` is the decoder's token buffer: slot ``s`` of row ``b`` holds the
token at position ``s``; only ``s < seq_lengths_B[b]`` is valid. The last valid
token of each row has not been fed to any model yet.

``keys_BG`` holds one PRNG key per row and drafted position: draft ``i`` of row
``b`` (position ``seq_lengths_B[b] + i``) must be drawn with ``keys_BG[b, i]``,
e.g. ``specjax.sample(keys_BG[:, i], q_BV)``, and with nothing else. The decoder
derives them from the position (`specjax.noise`), so drafts are reproducible per
row; in coupled verification they are the very keys the target samples that
position with, which is what makes a good drafter's tokens match. A deterministic
drafter ignores them. ``sampling`` has one value per row in each leaf (``[B]``).

The static shape parameters (``num_draft`` = γ) are non-pytree fields, so they
are part of the compiled program; everything else is an array leaf.

Drafters that read the target (`specjax.BlockDrafter`) name the target layers they
need in a static tuple ``target_layers``. The decoder then asks the target for those
layers' hidden states inside the forwards it runs anyway (prefill and verify, through
the model contract's ``feature_layers=``) and hands them over as `TargetFeatures`:

* ``init(prompts_BS, seq_lengths_B, cache_len, features)`` with the prompt's features;
* ``update(state, seq_lengths_B, features)`` with the features of the γ+1 tokens the
  verify forward scored. Those at positions ``< seq_lengths_B - 1`` are committed;
  the rest (rejected drafts) are stale and must never be read.

No drafter ever runs a second target forward. Drafters with an empty
``target_layers`` (the default) get the two- and three-argument calls above.

**Trees.** A drafter with a static ``tree`` (`specjax.tree.Tree`, set by
``with_tree``) proposes ``tokens int32[B, N]``, one per drafted node in the tree's
order, with ``probs=None`` (children are deterministic: the top-k of its
distribution) and ``num_draft`` = the tree's depth D; it gets ``keys_BG`` ``[B, D]``
and may ignore them. The decoder verifies the tree exactly (`specjax.tree`), and a
feature-reading drafter's ``update`` gets the features of the root and of the
accepted path, ``[B, D+1, ·]`` at consecutive positions, as for a chain.

Writing another drafter (e.g. Medusa-style heads on the target's hidden states)
means writing one such dataclass; see the README's "Writing a drafter".
"""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.cache import KVCache, TreeMask
from specjax.sampling import SamplingConfig, greedy_tokens, mask_vocab, probs_from_logits, sample
from specjax.tree import Tree, expand_top_k


@struct.dataclass
class Proposal:
    """What a drafter proposes for one decode step.

    Attributes:
        tokens: ``int32[B, γ]`` drafted tokens, each in ``[0, V)``.
        probs: ``float32[B, γ, V]`` the processed draft distributions the
            tokens were sampled from, or ``None`` for a deterministic drafter
            (q is then the one-hot of ``tokens``; no one-hots are materialised).
            A drafter whose ``vocab_size`` V_d is smaller than the target's returns
            ``[B, γ, V_d]``; the decoder zero-pads it (`specjax.vocab`).
        state: the drafter's new state.
    """

    tokens: jax.Array
    probs: jax.Array | None
    state: object


@struct.dataclass
class TargetFeatures:
    """Hidden states of the target's ``target_layers``, as handed to a drafter.

    Attributes:
        hidden: ``[B, T, n·E]`` the outputs of the n requested layers at T
            positions, concatenated in ``target_layers`` order.
        positions: ``int32[B, T]`` the absolute position of each column.
    """

    hidden: jax.Array
    positions: jax.Array


class Drafter(abc.ABC):
    """Interface of a drafter. Subclasses are frozen ``flax.struct`` dataclasses.

    Attributes:
        num_draft: γ, tokens proposed per step (static).
        target_layers: static tuple of target layer indices whose hidden states the
            drafter reads (`TargetFeatures`); empty for drafters that do not.
    """

    num_draft: int
    target_layers: tuple[int, ...] = ()
    tree: Tree | None = None
    #: Whether the drafter can propose trees (`with_tree`).
    drafts_trees: bool = False

    def with_tree(self, tree) -> Drafter:
        """The same drafter proposing ``tree`` (a `Tree`, a branching tuple or "3,2,2,1").

        ``num_draft`` becomes the tree's depth. ``None`` goes back to a chain of
        ``num_draft`` drafts.
        """
        if tree is None:
            return self.replace(tree=None)
        if not self.drafts_trees:
            raise ValueError(f"{type(self).__name__} does not propose trees")
        tree = as_tree(tree)
        out = self.replace(tree=tree, num_draft=tree.depth)
        out.check()  # e.g. a BlockDrafter's block is at least the tree's depth
        return out

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int | None:
        """V of the drafter (at most the target's), or ``None`` for any vocabulary."""

    @abc.abstractmethod
    def init(self, prompts_BS: jax.Array, seq_lengths_B: jax.Array, cache_len: int):
        """Builds the drafter's state after the prompt (e.g. prefills its cache)."""

    @abc.abstractmethod
    def propose(
        self,
        keys_BG: jax.Array,
        state,
        seq_BS: jax.Array,
        seq_lengths_B: jax.Array,
        sampling: SamplingConfig,
    ) -> Proposal:
        """Proposes ``num_draft`` tokens per row continuing ``seq_BS[b, :seq_lengths_B[b]]``.

        Args:
            keys_BG: PRNG keys ``[B, γ]``; draft ``i`` of row ``b`` is drawn with
                ``keys_BG[b, i]`` only.
            state: the drafter's state.
            seq_BS: ``int32[B, S]`` the token buffer (slot == position).
            seq_lengths_B: ``int32[B]`` valid tokens per row.
            sampling: the rows' `SamplingConfig`, each leaf ``[B]``.

        Returns:
            a `Proposal` with ``tokens int32[B, γ]``.
        """

    @abc.abstractmethod
    def update(self, state, seq_lengths_B: jax.Array):
        """Returns the state after verification left each row ``seq_lengths_B`` long."""

    def check(self) -> None:
        """Raises ValueError/TypeError if the drafter's own settings are inconsistent.

        The decoders call it before anything compiles (after `with_tree` too). The
        default checks nothing; drafters with settings that can disagree (a block
        shorter than γ, a mode they lack) override it.
        """
        return None

    def own_models(self) -> dict[str, object]:
        """The models the drafter runs under the model contract, by the name errors use.

        The decoders check each like the target (vocabulary, tree support). The
        default is none; `DraftModel` returns ``{"drafter.model": model}``.
        """
        return {}

    def state_bytes(self, batch_size: int, cache_len: int) -> int:
        """Bytes of the drafter's state for ``batch_size`` rows of ``cache_len`` slots.

        The decoders add it to the target's cache in their memory check, before
        anything compiles. The default, 0, fits drafters whose state is a few
        per-row scalars; a drafter with a cache overrides it (see `cache_bytes`).
        """
        del batch_size, cache_len
        return 0


def cache_bytes(model, batch_size: int, cache_len: int) -> int:
    """Bytes of ``model.init_cache(batch_size, cache_len)``, from shapes alone."""
    shapes = jax.eval_shape(lambda: model.init_cache(batch_size, cache_len))
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def as_tree(tree) -> Tree:
    """A `Tree` from a `Tree`, a branching sequence like ``(3, 2, 2, 1)``, or ``"3,2,2,1"``."""
    if isinstance(tree, Tree):
        return tree
    if isinstance(tree, str):
        return Tree.parse(tree)
    return Tree.from_branching(tree)


def lookahead(drafter: Drafter) -> int:
    """Cache slots one step may write past a row's length: γ + 1, or N + 1 for a tree."""
    tree = getattr(drafter, "tree", None)
    return (tree.num_nodes if tree is not None else drafter.num_draft) + 1


def prefill_positions(batch_size: int, length: int) -> jax.Array:
    """``int32[B, T]`` positions ``0..T-1`` for every row."""
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length))


def score(
    model, tokens_BT, positions_BT, cache, feature_layers: tuple[int, ...] = (), tree=None
):  # fmt: skip
    """One target forward, collecting a drafter's features when it reads any.

    The one place that calls the model contract with or without ``feature_layers=``
    (and ``tree=``, a `~specjax.models.cache.TreeMask`, for a tree of drafts).

    Returns:
        ``(logits float32[B, T, V], new_cache, features)``: ``features`` are the
        `TargetFeatures` of ``feature_layers`` at ``positions_BT``, or ``None`` when
        ``feature_layers`` is empty (the plain three-argument call).
    """
    extra = {} if tree is None else {"tree": tree}
    if not feature_layers:
        logits, cache = model(tokens_BT, positions_BT, cache, **extra)
        return logits, cache, None
    logits, cache, hidden = model(
        tokens_BT, positions_BT, cache, feature_layers=feature_layers, **extra
    )
    return logits, cache, TargetFeatures(hidden=hidden, positions=positions_BT)


def init_drafter(drafter: Drafter, prompts_BS, seq_lengths_B, cache_len: int, features):
    """``drafter.init``, handing over the prompt's features if the drafter reads any."""
    if drafter.target_layers:
        return drafter.init(prompts_BS, seq_lengths_B, cache_len, features)
    return drafter.init(prompts_BS, seq_lengths_B, cache_len)


def update_drafter(drafter: Drafter, state, seq_lengths_B, features):
    """``drafter.update``, handing over the verify forward's features if it reads any."""
    if drafter.target_layers:
        return drafter.update(state, seq_lengths_B, features)
    return drafter.update(state, seq_lengths_B)


def prefill(
    model, prompts_BP: jax.Array, prompt_lengths_B: jax.Array, cache_len: int,
    feature_layers: tuple[int, ...] = (),
):  # fmt: skip
    """Runs ``model`` over right-padded prompts into a fresh cache of ``cache_len`` slots.

    Returns:
        ``(logits float32[B, P, V], cache, features)``, ``features`` the prompt's
        `TargetFeatures` of ``feature_layers`` (``None`` without them). The cache's
        lengths are set to ``prompt_lengths - 1``: the last prompt token stays
        "pending", the same invariant the decode loops keep (the pending token is fed
        next step). The padded slots written here are overwritten before they are read.
    """
    b, p = prompts_BP.shape
    cache = model.init_cache(b, cache_len)
    logits, cache, features = score(
        model, prompts_BP, prefill_positions(b, p), cache, feature_layers
    )
    return logits, cache.rollback(prompt_lengths_B - 1), features


@struct.dataclass
class DraftModel(Drafter):
    """A smaller LM that drafts γ tokens autoregressively with its own KV cache.

    The draft samples from ``probs_from_logits(draft_logits, sampling)``, the
    same transforms the target's distribution gets (``vocab_limit`` included), and
    returns those full probabilities so rejection sampling sees the q it actually
    sampled from.

    The draft may have a smaller vocabulary than the target (a padded family, see
    `specjax.vocab`): its ``[B, γ, V_d]`` q is zero-padded by the decoder.

    With ``greedy_draft=True`` it proposes its argmax instead (below the row's
    ``vocab_limit``) and returns no q: the verifier then treats q as the one-hot of
    each draft, which is exact (a draft ``x`` is accepted with probability
    ``p(x)``), needs no ``[B, γ, V]`` buffer, and can accept more than the true q
    when the draft ranks well but is underconfident (BENCHMARKS.md measures both).

    Attributes:
        model: the draft model (any object following the model contract).
        num_draft: γ, tokens proposed per step (static).
        greedy_draft: propose the draft's argmax with one-hot q (static).
    """

    model: object
    num_draft: int = struct.field(pytree_node=False, default=4)
    greedy_draft: bool = struct.field(pytree_node=False, default=False)
    tree: Tree | None = struct.field(pytree_node=False, default=None)
    drafts_trees = True

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def _readable(self, tokens):
        # The decoders refuse concrete limits and prompts that would show the draft an
        # id >= its V; a traced vocab_limit cannot be checked, and an out-of-range id
        # would embed as NaN (jnp.take's fill) and poison its cache. Any input keeps the
        # output exact (the verifier only needs the q the drafts came from).
        return jnp.minimum(tokens, self.model.vocab_size - 1)

    def init(self, prompts_BS, seq_lengths_B, cache_len):
        _, cache, _ = prefill(self.model, self._readable(prompts_BS), seq_lengths_B, cache_len)
        return cache

    def own_models(self) -> dict[str, object]:
        return {"drafter.model": self.model}

    def state_bytes(self, batch_size: int, cache_len: int) -> int:
        return cache_bytes(self.model, batch_size, cache_len)

    def propose(self, keys_BG, state: KVCache, seq_BS, seq_lengths_B, sampling):
        if self.tree is not None:
            return self._propose_tree(state, seq_BS, seq_lengths_B, sampling)
        b = seq_BS.shape[0]
        rows = jnp.arange(b)
        last = seq_lengths_B - 1
        # The first step feeds the two newest tokens. After a step where every
        # draft was accepted the draft cache lacks the last draft token; feeding
        # it again otherwise rewrites an identical entry, so one code path
        # serves both cases without a Python branch.
        prev = jnp.maximum(last - 1, 0)
        tokens_B2 = self._readable(jnp.stack([seq_BS[rows, prev], seq_BS[rows, last]], axis=1))
        positions_B2 = jnp.stack([prev, last], axis=1)
        logits, cache = self.model(tokens_B2, positions_B2, state)
        if self.num_draft == 0:
            # A step that drafts nothing (adaptive γ): the two newest tokens are still
            # fed, so that the cache never lacks more than the newest one.
            return Proposal(tokens=jnp.zeros((b, 0), jnp.int32), probs=None, state=cache)

        def draw(keys_B, logits_BV):
            if self.greedy_draft:
                # No q to return, so no [B, V] probabilities are ever computed.
                return greedy_tokens(mask_vocab(logits_BV, sampling.vocab_limit)), None
            probs = probs_from_logits(logits_BV, sampling)
            return sample(keys_B, probs), probs

        token, probs = draw(keys_BG[:, 0], logits[:, -1])

        def step(carry, keys_B):
            token_B, position_B, cache = carry
            logits, cache = self.model(token_B[:, None], position_B[:, None], cache)
            next_token, probs = draw(keys_B, logits[:, 0])
            return (next_token, position_B + 1, cache), (next_token, probs)

        # Unrolled: γ is small and static, and the inner while loop's carry
        # copies cost ~10% of a proposal on CPU (0.37 -> 0.335 ms, bundled draft, γ=4).
        (_, _, cache), (tokens_rest, probs_rest) = jax.lax.scan(
            step, (token, last + 1, cache), jnp.moveaxis(keys_BG[:, 1:], 1, 0), unroll=True
        )
        tokens = jnp.concatenate([token[:, None], jnp.moveaxis(tokens_rest, 0, 1)], axis=1)
        if self.greedy_draft:
            return Proposal(tokens=tokens, probs=None, state=cache)
        probs = jnp.concatenate([probs[:, None], jnp.moveaxis(probs_rest, 0, 1)], axis=1)
        return Proposal(tokens=tokens, probs=probs, state=cache)

    def _propose_tree(self, state: KVCache, seq_BS, seq_lengths_B, sampling) -> Proposal:
        """Expands the top-k of each node, one draft forward per level.

        The draft cache holds committed tokens only (``state.lengths`` of them): tree
        nodes are written past the pending token and forgotten by `update`, since the
        accepted ones sit at tree slots, not at their positions. So a step first feeds
        every committed token the cache lacks (at most D + 1: the accepted path and the
        pending token), then the levels, each attending to its ancestors.
        """
        tree = self.tree
        b, s = seq_BS.shape
        rows = jnp.arange(b)
        last = seq_lengths_B - 1
        fed = jnp.minimum(state.lengths, last)
        positions_BW = fed[:, None] + jnp.arange(tree.depth + 1)[None]
        # Positions past `last` feed stale tokens into slots the levels overwrite (or
        # past the cache's end, dropped); no committed query sees them.
        tokens_BW = self._readable(seq_BS[rows[:, None], jnp.minimum(positions_BW, s - 1)])
        logits_BWV, cache = self.model(tokens_BW, positions_BW, state)
        visible = jnp.asarray(tree.ancestors)

        def score_level(depth, tokens_Bn, cache):
            first, stop = tree.level(depth)
            mask = TreeMask(
                start=last, slots=last[:, None] + jnp.arange(first, stop)[None],
                visible=visible[first:stop],
            )  # fmt: skip
            positions_Bn = jnp.broadcast_to(last[:, None] + depth, tokens_Bn.shape)
            return self.model(self._readable(tokens_Bn), positions_Bn, cache, tree=mask)

        root_B1V = logits_BWV[rows, last - fed][:, None]
        tokens, cache = expand_top_k(tree, root_B1V, sampling.vocab_limit, score_level, cache)
        return Proposal(tokens=tokens, probs=None, state=cache.rollback(last + 1))

    def update(self, state: KVCache, seq_lengths_B):
        # A tree step leaves its committed length in state.lengths (below the new
        # length); a chain step's cache holds every accepted draft.
        return state.rollback(jnp.minimum(state.lengths, seq_lengths_B - 1))


@struct.dataclass
class PromptLookup(Drafter):
    """Drafts by copying what followed the latest earlier match of the current n-gram.

    For ``n = ngram, ngram-1, ..., 1`` it looks for the most recent earlier
    occurrence of the row's last ``n`` tokens in the prompt and text generated
    so far, and proposes the γ tokens that followed it (the longest ``n`` with a
    match wins). Rows with no match propose their last token repeated. All on
    device with vectorised comparisons, no model; q is one-hot.

    Attributes:
        ngram: longest suffix length to match (static).
        num_draft: γ, tokens proposed per step (static).
    """

    ngram: int = struct.field(pytree_node=False, default=3)
    num_draft: int = struct.field(pytree_node=False, default=4)

    def __post_init__(self):
        # ngram < 1 would match nothing and silently propose the last token forever.
        # num_draft is left to the decoder's drafter check, which names it.
        from specjax.validation import check_int

        check_int("PromptLookup.ngram", self.ngram, lo=1)

    @property
    def vocab_size(self) -> None:
        return None

    def init(self, prompts_BS, seq_lengths_B, cache_len):
        return ()

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        del keys_BG, sampling  # deterministic drafter
        b, s = seq_BS.shape
        slots = jnp.arange(s)
        lengths = seq_lengths_B[:, None]
        best_start = jnp.full((b,), -1, jnp.int32)
        # Shortest n first, so a longer match found later overrides it.
        for n in range(1, self.ngram + 1):
            # match[b, i]: seq[b, i:i+n] == seq[b, L-n:L], with the window ending
            # before the last token so that at least one continuation token exists.
            match = jnp.ones((b, s), bool)
            for j in range(n):
                suffix_tok = jnp.take_along_axis(seq_BS, jnp.maximum(lengths - n + j, 0), axis=1)
                window_tok = jnp.roll(seq_BS, -j, axis=1)
                match &= window_tok == suffix_tok
            valid = (slots[None] + n < lengths) & (lengths >= n + 1)
            match &= valid
            latest = jnp.max(jnp.where(match, slots[None], -1), axis=1)
            best_start = jnp.where(latest >= 0, latest + n, best_start)
        # Continuation tokens, clamped to the valid part of the row; with no
        # match the row proposes its last token repeatedly.
        last = seq_lengths_B - 1
        start = jnp.where(best_start >= 0, best_start, last)
        idx = jnp.minimum(start[:, None] + jnp.arange(self.num_draft)[None], last[:, None])
        tokens = jnp.take_along_axis(seq_BS, idx, axis=1)
        return Proposal(tokens=tokens.astype(jnp.int32), probs=None, state=state)

    def update(self, state, seq_lengths_B):
        return state


@struct.dataclass
class NoDraft(Drafter):
    """The null drafter (γ = 0): with it, speculative decoding *is* plain decoding.

    Each step then scores only the pending token and emits the target's own sample,
    drawn with the same position-keyed noise that speculative decoding uses for its
    bonus tokens. `specjax.generate` runs the one decode loop with this drafter.
    """

    num_draft: int = struct.field(pytree_node=False, default=0)

    @property
    def vocab_size(self) -> None:
        return None

    def init(self, prompts_BS, seq_lengths_B, cache_len):
        return ()

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        tokens = jnp.zeros((seq_BS.shape[0], 0), jnp.int32)
        return Proposal(tokens=tokens, probs=None, state=state)

    def update(self, state, seq_lengths_B):
        return state
