"""Token distributions from logits, and sampling from them.

The same two functions serve the drafter and the target, so that speculative decoding
compares like with like:

* `probs_from_logits` turns logits ``[B, ..., V]`` into float32 probabilities after
  the vocabulary limit (padded embedding rows are never tokens), temperature, top-k,
  top-p and min-p (in that order), or into a one-hot of the argmax when the
  temperature is zero.
* `sample` draws one token per row of a ``[..., V]`` array of non-negative weights by
  an exponential race, ``argmax_i w_i / E_i`` with ``E_i ~ Exp(1)``, from one key or
  from one key per row.

The settings they read, `SamplingConfig` (scalars or one value per row, read along the
*leading* axis of the logits), and their checks are `specjax.sampling.settings`.

Top-k and top-p need a threshold (the k-th largest probability, or the probability at
which the sorted cumulative mass reaches ``top_p``). Sorting 128k entries per position is
the obvious way and the slow one; here the threshold is found exactly by bisection over
the int32 bit pattern of the probabilities (a non-negative float32's bits order the same
way as its value), 30 passes of compare-and-reduce per row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.core.validation import as_prng_keys
from specjax.sampling import noise
from specjax.sampling.penalties import apply_logit_transforms
from specjax.sampling.settings import SamplingConfig, check_sampling_config

__all__ = [
    "apply_sampling",
    "greedy_tokens",
    "mask_vocab",
    "probs_from_logits",
    "sample",
]

# Bits of float32 1.0 plus one: no probability reaches it, so it is a strict upper bound.
_PROB_BITS_UPPER = 0x3F800001
# Bisection halves [0, 0x3F800001) to width 1 in ceil(log2(0x3F800001)) = 30 steps.
_BISECTION_STEPS = 30
# Above this vocabulary size `sample` races blocks, then a token inside the chosen block,
# which needs ~2*sqrt(V) exponential variates per row instead of V (random bits
# dominate a flat race).
_FLAT_SAMPLING_MAX_V = 2048
_SAMPLING_BLOCK = 256


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """Argmax over the last axis: ``[..., V] -> int32[...]``.

    NaN is treated as ``-inf``, and ties go to the lowest index, so a row with no usable
    logit (all ``-inf`` or NaN) yields token 0. Works on logits or probabilities.
    """
    logits = jnp.asarray(logits)
    return _first_argmax(jnp.where(jnp.isnan(logits), -jnp.inf, logits))


def _first_argmax(x: jax.Array) -> jax.Array:
    """``argmax`` over the last axis (lowest index on ties) of NaN-free ``x``, as int32.

    Written as a max, then the lowest index holding it: two plain reductions that
    XLA:CPU vectorises. ``jnp.argmax`` lowers to one reduction over (value, index)
    pairs that it does not, and measured 3-10x slower (18.8 us against 1.9 us for
    one row of V = 4096; it ran several times per decode step).
    """
    max_R1 = jnp.max(x, axis=-1, keepdims=True)
    ids = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == max_R1, ids, x.shape[-1] - 1), axis=-1)


def _per_row(name: str, value, batch_shape: tuple[int, ...], dtype) -> jax.Array:
    """A config leaf (scalar or ``[B]``) broadcast to ``batch_shape + (1,)`` by its leading axis.

    ``[B]`` leaves meet ``batch_shape = (B, ...)`` along B, whatever else follows (γ+1
    target positions, nothing for the draft): rank promotion's trailing alignment would
    read them along the wrong axis.
    """
    value = jnp.asarray(value).astype(dtype)
    if value.ndim == 0:
        return jnp.broadcast_to(value, batch_shape)[..., None]
    if value.ndim != 1 or not batch_shape or value.shape[0] != batch_shape[0]:
        rows = f"[{batch_shape[0]}]" if batch_shape else "a scalar (the logits have no batch axis)"
        raise ValueError(
            f"SamplingConfig.{name} has shape {list(value.shape)}, but logits with batch shape "
            f"{list(batch_shape)} need a scalar or {rows}: one value per row of the leading axis"
        )
    value = value.reshape(value.shape + (1,) * len(batch_shape))
    return jnp.broadcast_to(value, batch_shape + (1,))


def greedy_rows(config: SamplingConfig, batch_size: int) -> jax.Array:
    """``bool[B]``: the rows `probs_from_logits` makes one-hot (temperature ``<= 0`` or NaN)."""
    return ~(_per_row("temperature", config.temperature, (batch_size,), jnp.float32)[:, 0] > 0)


def mask_vocab(logits: jax.Array, vocab_limit) -> jax.Array:
    """``logits`` with every id ``>= vocab_limit`` set to ``-inf``: ``[B, ..., V]`` in, same out.

    Args:
        logits: ``[B, ..., V]`` float array.
        vocab_limit: ``None`` (nothing is masked), or an integer scalar or ``[B]``, read
            along the leading axis like every `SamplingConfig` field.
    """
    if vocab_limit is None:
        return logits
    limit_R1 = _per_row("vocab_limit", vocab_limit, logits.shape[:-1], jnp.int32)
    ids_RxV = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.where(ids_RxV < limit_R1, logits, -jnp.inf)


def _bisect_threshold(predicate, lo_R1: jax.Array, hi_R1: jax.Array) -> jax.Array:
    """Largest int32 ``t`` in ``[lo, hi)`` with ``predicate(t)`` true, per row.

    ``predicate`` must be monotone (true then false as ``t`` grows), true at ``lo`` and
    false at ``hi``; ``hi - lo <= 2**30``.
    """

    def step(_, bracket):
        lo, hi = bracket
        mid = lo + (hi - lo) // 2
        ok = predicate(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo_R1, _ = lax.fori_loop(0, _BISECTION_STEPS, step, (lo_R1, hi_R1))
    return lo_R1


def _truncate(probs_RxV: jax.Array, top_k_R1, top_p_R1, min_p_R1) -> jax.Array:
    """Top-k, then top-p on the renormalised survivors, then min-p; renormalised."""
    vocab = probs_RxV.shape[-1]
    bits_RxV = lax.bitcast_convert_type(probs_RxV, jnp.int32)
    max_prob_R1 = jnp.max(probs_RxV, axis=-1, keepdims=True)
    # The most probable token survives every filter, so the renormaliser is >= max_prob.
    hi_R1 = lax.bitcast_convert_type(max_prob_R1, jnp.int32) + 1
    zero_R1 = jnp.zeros_like(hi_R1)

    def top_k_threshold():
        k_R1 = jnp.clip(top_k_R1, 1, vocab)
        count_at_least = lambda t: jnp.sum(bits_RxV >= t, axis=-1, keepdims=True) >= k_R1
        return jnp.where(top_k_R1 > 0, _bisect_threshold(count_at_least, zero_R1, hi_R1), 0)

    k_bits_R1 = lax.cond(jnp.any(top_k_R1 > 0), top_k_threshold, lambda: zero_R1)

    def top_p_threshold():
        kept_mass = lambda t: jnp.sum(
            jnp.where(bits_RxV >= t, probs_RxV, 0.0), axis=-1, keepdims=True
        )
        # Top-p acts on the top-k survivors renormalised, i.e. on mass top_p * M_k.
        target_R1 = top_p_R1 * kept_mass(k_bits_R1)
        bits = _bisect_threshold(lambda t: kept_mass(t) >= target_R1, k_bits_R1, hi_R1)
        # top_p == 1 must keep everything; a mass test could drop tokens lost to rounding.
        return jnp.where(top_p_R1 < 1, bits, k_bits_R1)

    p_bits_R1 = lax.cond(jnp.any(top_p_R1 < 1), top_p_threshold, lambda: k_bits_R1)

    # The most probable token always survives (even a min_p > 1 given inside jit, where it
    # is not checked), so the renormaliser is never 0 and no NaN comes out.
    is_max_RxV = probs_RxV == max_prob_R1
    keep_RxV = (bits_RxV >= p_bits_R1) & ((probs_RxV >= min_p_R1 * max_prob_R1) | is_max_RxV)
    kept_RxV = jnp.where(keep_RxV, probs_RxV, 0.0)
    return kept_RxV / jnp.sum(kept_RxV, axis=-1, keepdims=True)


def probs_from_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """Float32 token probabilities ``[B, ..., V]`` from logits ``[B, ..., V]`` of any float dtype.

    Steps, each on the previous step's (renormalised) output:

    0. vocabulary limit: logits at ids ``>= config.vocab_limit`` become ``-inf`` (when it
       is set), so those ids get probability 0 in every later step and in the
       degenerate cases below; then the logit transforms of `specjax.sampling.penalties`
       (a constraint's mask, forbidden ids, logit bias, then the penalties; the
       constraint and the penalties need the rows' history, which only a `RowSampling`
       from the decoders carries);
    1. temperature: ``softmax(logits / temperature)``; a temperature ``<= 0`` or NaN
       returns the one-hot of `greedy_tokens` (lowest index on ties) instead, chosen per
       row by a traced select, so greedy and sampled rows share one compiled program;
    2. top-k: keep every token whose probability is ``>=`` the k-th largest (ties at the
       threshold are all kept, so more than k tokens can survive);
    3. top-p: keep every token whose probability is ``>=`` the largest threshold ``t``
       such that the tokens ``>= t`` carry at least ``top_p`` of the mass: the smallest
       set of most probable tokens reaching ``top_p``, plus all ties at its boundary;
    4. min-p: keep tokens with probability ``>= min_p * max probability``;
    5. renormalise.

    Thresholds are found by an exact bisection over the float32 bit patterns rather than
    a sort; disabled filters (``top_k == 0``, ``top_p == 1``) cost nothing when disabled
    for every row.

    Degenerate logits never produce NaN: NaN logits are treated as ``-inf`` (the token
    gets probability 0); if any logit is ``+inf`` the distribution is uniform over the
    ``+inf`` tokens; a row with no usable logit (all ``-inf`` or NaN) yields the uniform
    distribution over all V tokens, or over the ids below ``vocab_limit`` (its greedy
    one-hot is token 0).

    Args:
        logits: ``[B, ..., V]`` float array (bf16, f16, f32, ...).
        config: a `SamplingConfig` (or the decoders' `RowSampling`); each setting a
            scalar or ``[B]`` (one value per row of the leading axis); any other shape
            raises ValueError naming the field.

    Returns:
        float32 ``[..., V]``, non-negative, each row summing to 1 up to rounding.
    """
    logits = jnp.asarray(logits)
    if logits.ndim < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(
            f"probs_from_logits: logits must be a float array [..., V], got "
            f"{logits.dtype}{list(logits.shape)}"
        )
    if logits.shape[-1] == 0:
        raise ValueError(
            f"probs_from_logits: logits have no tokens (shape {list(logits.shape)}); "
            "the last axis is the vocabulary, V >= 1"
        )
    # Concrete settings are range-checked here (traced ones cannot be): a min_p above 1,
    # say, would otherwise silently keep only the most probable token.
    check_sampling_config(config)
    batch_shape = logits.shape[:-1]
    temperature_R1 = _per_row("temperature", config.temperature, batch_shape, jnp.float32)
    top_k_R1 = _per_row("top_k", config.top_k, batch_shape, jnp.int32)
    top_p_R1 = _per_row("top_p", config.top_p, batch_shape, jnp.float32)
    min_p_R1 = _per_row("min_p", config.min_p, batch_shape, jnp.float32)

    x_RxV = logits.astype(jnp.float32)
    x_RxV = mask_vocab(jnp.where(jnp.isnan(x_RxV), -jnp.inf, x_RxV), config.vocab_limit)
    x_RxV = apply_logit_transforms(x_RxV, config)
    greedy_R1 = ~(temperature_R1 > 0)

    def greedy():
        vocab_ids_RxV = lax.broadcasted_iota(jnp.int32, x_RxV.shape, x_RxV.ndim - 1)
        return (vocab_ids_RxV == greedy_tokens(x_RxV)[..., None]).astype(jnp.float32)

    def sampled():
        max_R1 = jnp.max(x_RxV, axis=-1, keepdims=True)
        # Shift before dividing so nothing overflows to +inf. The where()s cover the
        # degenerate rows: max == +inf (inf - inf is NaN), max == -inf (all -inf), and
        # -inf logits at temperature inf (-inf / inf is NaN).
        safe_temperature_R1 = jnp.where(greedy_R1, 1.0, temperature_R1)
        shifted_RxV = jnp.where(x_RxV == -jnp.inf, -jnp.inf, (x_RxV - max_R1) / safe_temperature_R1)
        z_RxV = jnp.where(x_RxV == max_R1, 0.0, shifted_RxV)
        # A row with no usable logit is uniform over the ids that may be tokens, never
        # over masked ones (which are -inf like the rest, so equal to the max).
        z_RxV = mask_vocab(z_RxV, config.vocab_limit)
        e_RxV = jnp.exp(z_RxV)
        probs_RxV = e_RxV / jnp.sum(e_RxV, axis=-1, keepdims=True)
        return _truncate(probs_RxV, top_k_R1, top_p_R1, min_p_R1)

    # The sampled rows cost a few passes over V, so a batch of greedy rows (the common
    # case) computes only their one-hots. Otherwise a sampled row's probabilities come
    # out of one program whatever the other rows' temperatures, and the greedy one-hots,
    # one more pass, are selected per row.
    mixed = lambda: jnp.where(greedy_R1, greedy(), sampled())
    return lax.cond(jnp.all(greedy_R1), greedy, mixed)


def _race_argmax(noise_RxV: jax.Array, weights_RxV: jax.Array) -> jax.Array:
    """``argmax_i w_i / E_i`` per row (an exponential race); entries ``w <= 0`` never win.

    Weights are scaled by their row maximum first, so that ``w / E`` neither overflows
    nor loses a small weight to an underflow that matters (the top token scores at least
    ``1 / max E``).
    """
    positive_RxV = weights_RxV > 0
    max_R1 = jnp.max(jnp.where(positive_RxV, weights_RxV, 0.0), axis=-1, keepdims=True)
    scaled_RxV = weights_RxV / jnp.where(max_R1 > 0, max_R1, 1.0)
    return _first_argmax(jnp.where(positive_RxV, scaled_RxV / noise_RxV, -1.0))


def _row_keys_for(key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    """Keys ``[R]`` for the ``R = prod(batch_shape)`` rows: given per row, or folded from one."""
    if key.shape == batch_shape:
        return key.reshape(-1)
    if key.shape == ():
        # One key for all rows: row r uses fold_in(key, r), independent of the others.
        num_rows = int(np.prod(batch_shape, dtype=np.int64))
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_rows))
    raise ValueError(
        f"sample: key must be one key or one key per row, of shape {list(batch_shape)}; "
        f"got keys of shape {list(key.shape)}"
    )


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draws one token per row: ``[..., V]`` weights -> ``int32[...]``.

    Token ``i`` is drawn with probability ``probs[i] / sum(probs)`` by an exponential
    race, ``argmax_i probs[i] / E_i`` with ``E_i ~ Exp(1)`` drawn from 64 random bits
    (`specjax.sampling.noise.exponential`), so the weights need not be normalised and tokens are
    drawn at their rate down to float32 resolution: a token 1e-12 as likely as the top
    one is drawn at rate 1e-12, not never (the Gumbel-max tail problem). Entries that
    are zero, negative or NaN are never drawn; a row with no positive entry returns
    token 0. Denormal weights (below 1.2e-38) may count as zero: XLA on CPU flushes
    denormals to zero. Weights must be finite.

    For ``V > 2048`` the draw is two-stage, with the same distribution: a block of 256
    tokens is raced in proportion to its mass, then a token inside the block. This needs
    ``V/256 + 256`` variates per row instead of V.

    The noise of a row is a function of that row's key only, so two calls with the same
    key and the same V use the same noise: this is what coupled verification relies on.

    Args:
        key: one PRNG key (row ``r`` of the flattened batch uses ``fold_in(key, r)``), or
            one key per row, of shape ``probs.shape[:-1]``.
        probs: ``[..., V]`` non-negative weights of any float dtype.

    Returns:
        int32 ``[...]`` token ids in ``[0, V)``.
    """
    weights = jnp.asarray(probs).astype(jnp.float32)
    if weights.ndim < 1 or weights.shape[-1] == 0:
        raise ValueError(
            f"sample: probs must be [..., V] with V >= 1 tokens, got shape {list(weights.shape)}"
        )
    batch_shape, vocab = weights.shape[:-1], weights.shape[-1]
    keys_R = _row_keys_for(as_prng_keys("sample: key", key), batch_shape)
    weights_RxV = weights.reshape(-1, vocab)
    if vocab <= _FLAT_SAMPLING_MAX_V:
        noise_RxV = jax.vmap(lambda k: noise.exponential(k, (vocab,)))(keys_R)
        return _race_argmax(noise_RxV, weights_RxV).reshape(batch_shape)

    num_blocks = -(-vocab // _SAMPLING_BLOCK)
    padded_RxV = jnp.pad(weights_RxV, [(0, 0), (0, num_blocks * _SAMPLING_BLOCK - vocab)])
    blocks_RxNxK = padded_RxV.reshape(-1, num_blocks, _SAMPLING_BLOCK)
    # Non-positive and NaN entries must not contribute mass to their block.
    blocks_RxNxK = jnp.where(blocks_RxNxK > 0, blocks_RxNxK, 0.0)

    # One draw per row serves both stages (independent variates, one random-bits call).
    noise_RxNK = jax.vmap(lambda k: noise.exponential(k, (num_blocks + _SAMPLING_BLOCK,)))(keys_R)
    block_noise_RxN, token_noise_RxK = noise_RxNK[:, :num_blocks], noise_RxNK[:, num_blocks:]
    block_R = _race_argmax(block_noise_RxN, jnp.sum(blocks_RxNxK, axis=-1))
    chosen_RxK = jnp.take_along_axis(blocks_RxNxK, block_R[:, None, None], axis=1)[:, 0]
    tokens_R = block_R * _SAMPLING_BLOCK + _race_argmax(token_noise_RxK, chosen_RxK)
    return tokens_R.reshape(batch_shape)


def apply_sampling(key: jax.Array, logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """``sample(key, probs_from_logits(logits, config))``: ``[B, ..., V]`` -> ``int32[B, ...]``."""
    return sample(key, probs_from_logits(logits, config))
