"""Penalties, logit bias and forbidden ids: logit transforms that read the tokens so far.

`SamplingConfig` carries five such settings, each applied to the logits before the
temperature and the truncation filters (`specjax.sampling.probs_from_logits`), in
this order:

1. ``forbidden_ids``: those ids get ``-inf`` (never sampled, never chosen greedily);
2. ``logit_bias``: an additive ``[V]`` (every row) or ``[B, V]`` (one per row) bias;
3. ``repetition_penalty`` (transformers' semantics): a token that occurs in the
   prompt or the generated text has its logit divided by the penalty when positive,
   multiplied by it when negative;
4. ``presence_penalty`` and ``frequency_penalty`` (OpenAI's and vLLM's semantics):
   ``logit -= presence * (count > 0) + frequency * count`` over the *generated*
   tokens only (the prompt does not count).

The last two depend on the tokens before the position being scored. That is what makes
them subtle under speculation: at the i-th drafted position of a step, the target's
distribution is the one plain decoding would use after the committed tokens *and the
step's drafts 0..i-1* (they are its prefix if position i is reached at all), so the
counts there are the committed counts plus those drafts (`TokenCounts.along`). The
draft's q is computed with the same transforms over its own prefix. Why this keeps the
output exact: rejection sampling (and coupled verification) is exact for any target
distributions p_i and any q_i, provided p_i is the distribution plain decoding would use
at that position given the same prefix, and q_i the one the draft was drawn from. Both
hold: p_i's prefix is the committed tokens plus drafts 0..i-1, exactly the prefix plain
decoding has when it reaches position i with those tokens; a draft model samples its
i-th draft from q_i computed over its own prefix. Position i is only ever *used* when
drafts 0..i-1 were accepted, i.e. when that prefix is the output's prefix. Counting
the prefix without the step's drafts gives plain decoding's distribution only at the
first position, and the tests reject it (tests/test_penalties.py).

The counts are ``int32[B, V]`` per row, computed on device from the token buffer each
step (a scatter-add over ``[B, S]``), only when some row has a penalty: a step with
none costs one reduction over ``[B]`` settings and no pass over the vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specjax.sampling.history import RowHistory
from specjax.sampling.settings import histories_of

__all__ = [
    "TokenCounts",
    "after_token",
    "apply_logit_transforms",
    "constrain",
    "has_penalties",
    "penalties_in_program",
    "prefix_counts",
    "token_counts",
]


@struct.dataclass
class TokenCounts(RowHistory):
    """How often each id occurs before a position, per row: the penalties' history.

    Attributes:
        all: ``int32[B, (T,) V]`` occurrences in the prompt and the generated tokens
            (what ``repetition_penalty`` reads).
        generated: ``int32[B, (T,) V]`` occurrences in the generated tokens only (what
            ``presence_penalty`` and ``frequency_penalty`` read).
        counting: ``bool[]`` some row has a penalty (`has_penalties`), or ``None``
            (always): when False the counts are zeros and `along` computes none.
    """

    all: jax.Array
    generated: jax.Array
    counting: jax.Array | None = None
    masks_only = False

    def mask(self, logits_RxV, config):
        """The repetition, presence and frequency penalties (`apply_penalties`)."""
        return apply_penalties(logits_RxV, config, self)

    def add(self, tokens_B: jax.Array) -> TokenCounts:
        """The counts after each row's next token ``tokens_B`` (generated), ``[B, V]``."""
        # A scatter of one entry per row, not a [B, V] one-hot: O(B) per draft.
        rows_B = jnp.arange(tokens_B.shape[0])
        add = lambda counts_BV: counts_BV.at[rows_B, tokens_B].add(1, mode="drop")  # noqa: E731
        return self.replace(all=add(self.all), generated=add(self.generated))

    def advance(self, tokens_B):
        return self.add(tokens_B)

    def along(self, drafts_BG: jax.Array) -> TokenCounts:
        """``[B, G+1, V]`` counts at the step's G+1 scored positions from ``[B, V]`` ones.

        Position i (0: the token after the committed prefix) counts the prefix and
        drafts ``0..i-1``. Drafts outside ``[0, V)`` (``-1``: not proposed) count nothing.
        """
        b, v = self.all.shape
        g1 = drafts_BG.shape[1] + 1

        def counts():
            one_hot_BGV = jax.nn.one_hot(drafts_BG, v, dtype=jnp.int32)
            before_BG1V = jnp.concatenate(
                [jnp.zeros((b, 1, v), jnp.int32), jnp.cumsum(one_hot_BGV, axis=1)], axis=1
            )
            return self.all[:, None] + before_BG1V, self.generated[:, None] + before_BG1V

        if self.counting is None:
            all_, generated = counts()
        else:  # no row has a penalty: no [B, G+1, V] pass
            zeros = lambda: (jnp.zeros((b, g1, v), jnp.int32),) * 2  # noqa: E731
            all_, generated = lax.cond(self.counting, counts, zeros)
        return self.replace(all=all_, generated=generated)

    def along_tree(self, node_tokens_BN, parents, width):
        raise NotImplementedError(
            "penalties along a tree's paths: the decoders refuse penalties with a tree"
        )


def token_counts(
    seq_BS: jax.Array, prompt_lengths_B: jax.Array, seq_lengths_B: jax.Array, vocab_size: int
) -> TokenCounts:
    """Counts of ``seq_BS[b, :seq_lengths_B[b]]`` (all) and of its generated part.

    Args:
        seq_BS: ``int32[B, S]`` prompt then generated tokens (slot == position).
        prompt_lengths_B: ``int32[B]`` where each row's generated tokens start.
        seq_lengths_B: ``int32[B]`` valid tokens per row.
        vocab_size: V; ids outside ``[0, V)`` are not counted.

    Returns:
        `TokenCounts` of ``int32[B, V]``.
    """
    b, s = seq_BS.shape
    slots_BS = jnp.arange(s)[None]
    valid_BS = (slots_BS < seq_lengths_B[:, None]) & (seq_BS >= 0) & (seq_BS < vocab_size)
    generated_BS = valid_BS & (slots_BS >= prompt_lengths_B[:, None])
    rows_BS = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
    ids_BS = jnp.clip(seq_BS, 0, vocab_size - 1)
    zeros = jnp.zeros((b, vocab_size), jnp.int32)
    count = lambda keep_BS: zeros.at[rows_BS, ids_BS].add(keep_BS.astype(jnp.int32))  # noqa: E731
    return TokenCounts(all=count(valid_BS), generated=count(generated_BS))


def _leading(value, like_RxV: jax.Array, dtype) -> jax.Array:
    """A ``[B]`` setting as ``[B, 1, ..., 1]`` against ``like`` ``[B, ..., V]``."""
    value = jnp.asarray(value, dtype)
    if value.ndim == 0:
        return value
    return value.reshape(value.shape + (1,) * (like_RxV.ndim - 1))


def _rows(x_BxV: jax.Array, like_RxV: jax.Array) -> jax.Array:
    """``[B, V]`` (or ``[V]``) broadcast to ``like``'s ``[B, ..., V_l]`` along the leading axis.

    A drafter with a smaller vocabulary (``V_l < V``, `specjax.sampling.vocab`) reads the first
    ``V_l`` columns: its ids are the target's first ``V_l``.
    """
    v = like_RxV.shape[-1]
    if x_BxV.shape[-1] < v:
        raise ValueError(
            f"a [.., {x_BxV.shape[-1]}] logit bias or token count cannot serve logits "
            f"[.., {v}]: it must be as wide as the target's vocabulary"
        )
    x_BxV = x_BxV[..., :v]
    if x_BxV.ndim == 1 or x_BxV.ndim == like_RxV.ndim:
        return x_BxV
    return x_BxV.reshape(x_BxV.shape[:1] + (1,) * (like_RxV.ndim - x_BxV.ndim) + x_BxV.shape[1:])


def penalties_in_program(config) -> bool:
    """Static: the config carries penalty settings (``None`` ones are not in the program)."""
    return any(
        getattr(config, name) is not None
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty")
    )


def _value(config, name: str, off: float):
    value = getattr(config, name)
    return off if value is None else value


def has_penalties(config) -> jax.Array:
    """``bool[]``: some row has a repetition, presence or frequency penalty."""
    if not penalties_in_program(config):
        return jnp.asarray(False)
    return (
        jnp.any(jnp.asarray(_value(config, "repetition_penalty", 1.0)) != 1)
        | jnp.any(jnp.asarray(_value(config, "presence_penalty", 0.0)) != 0)
        | jnp.any(jnp.asarray(_value(config, "frequency_penalty", 0.0)) != 0)
    )


def forbidden_mask(forbidden_ids, like_RxV: jax.Array) -> jax.Array:
    """``bool`` mask broadcastable to ``like``: the ids of ``forbidden_ids`` (``[K]`` or ``[B, K]``,
    ``-1`` pads), per row."""
    ids = jnp.asarray(forbidden_ids, jnp.int32)
    v = like_RxV.shape[-1]
    if ids.ndim == 1:
        return jnp.zeros((v,), bool).at[jnp.where(ids >= 0, ids, v)].set(True, mode="drop")
    b = ids.shape[0]
    rows_BK = jnp.broadcast_to(jnp.arange(b)[:, None], ids.shape)
    mask_BV = (
        jnp.zeros((b, v), bool).at[rows_BK, jnp.where(ids >= 0, ids, v)].set(True, mode="drop")
    )
    return _rows(mask_BV, like_RxV)


def apply_logit_transforms(logits_RxV: jax.Array, config) -> jax.Array:
    """Forbidden ids, logit bias, then each history's mask, on float32 logits ``[B, ..., V]``.

    Args:
        logits_RxV: float32 logits, NaN already replaced by ``-inf``.
        config: a `~specjax.sampling.SamplingConfig`, or the decoders'
            `~specjax.sampling.RowSampling` with the rows' histories (the penalties'
            counts, a constraint's states, a user's: `~specjax.sampling.history`);
            its settings scalars or ``[B]``, read along the leading axis.

    Returns:
        the transformed logits, same shape.
    """
    x = logits_RxV
    if config.forbidden_ids is not None:
        x = jnp.where(forbidden_mask(config.forbidden_ids, x), -jnp.inf, x)
    if config.logit_bias is not None:
        x = x + _rows(jnp.asarray(config.logit_bias, jnp.float32), x)
    for history in histories_of(config):
        x = history.mask(x, config)
    return x


def apply_penalties(logits_RxV: jax.Array, config, counts: TokenCounts) -> jax.Array:
    """The repetition, presence and frequency penalties of ``config`` over ``counts``
    (``[B, V]``, broadcast over any middle axes, or with the logits' shape)."""
    if not penalties_in_program(config):
        return logits_RxV

    def penalize(x):
        counts_all = _rows(counts.all, x)
        counts_generated = _rows(counts.generated, x).astype(jnp.float32)
        repetition = _leading(_value(config, "repetition_penalty", 1.0), x, jnp.float32)
        seen = counts_all > 0
        x = jnp.where(seen, jnp.where(x > 0, x / repetition, x * repetition), x)
        presence = _leading(_value(config, "presence_penalty", 0.0), x, jnp.float32)
        frequency = _leading(_value(config, "frequency_penalty", 0.0), x, jnp.float32)
        generated = (counts_generated > 0).astype(jnp.float32)
        return x - presence * generated - frequency * counts_generated

    return lax.cond(has_penalties(config), penalize, lambda x: x, logits_RxV)


def _zeros(shape) -> TokenCounts:
    zeros = jnp.zeros(shape, jnp.int32)
    return TokenCounts(all=zeros, generated=zeros)


def prefix_counts(config, seq_BS, prompt_lengths_B, seq_lengths_B, vocab_size: int):
    """``[B, V]`` counts of each row's committed tokens, or zeros when no row has a penalty.

    ``None`` (nothing computed, nothing compiled) when the sampling settings carry no
    penalties at all.

    Args:
        config: the rows' `SamplingConfig` (``[B]`` leaves).
        seq_BS: ``int32[B, S]`` prompt then generated tokens.
        prompt_lengths_B, seq_lengths_B: ``int32[B]``.
        vocab_size: the target's V.
    """
    if not penalties_in_program(config):
        return None
    b = seq_BS.shape[0]
    counting = has_penalties(config)
    counts = lax.cond(
        counting,
        lambda: token_counts(seq_BS, prompt_lengths_B, seq_lengths_B, vocab_size),
        lambda: _zeros((b, vocab_size)),
    )
    return counts.replace(counting=counting)


def constrain(logits_RxV: jax.Array, config) -> jax.Array:
    """``logits`` with the masks of ``config``'s histories that only mask (a constraint's:
    `RowHistory.masks_only`), unchanged when it carries none. Greedy drafters use it
    alone: argmax needs no more."""
    for history in histories_of(config):
        if history.masks_only:
            logits_RxV = history.mask(logits_RxV, config)
    return logits_RxV


def after_token(config, token_B: jax.Array):
    """The sampling settings one token later: each history the transforms read (penalty
    counts, constraint states, a user's) advanced by each row's ``token_B``.

    What a drafter that draws its drafts one by one calls between drafts, so that its
    i-th q reads its own drafts 0..i-1, as the target's p at that position does.
    """
    histories = histories_of(config)
    if not histories:
        return config
    return config.replace(histories=tuple(h.advance(token_B) for h in histories))
