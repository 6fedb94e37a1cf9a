"""Token distributions from logits, and sampling from them.

The same two functions serve the drafter and the target, so that speculative decoding
compares like with like:

* `probs_from_logits` turns logits ``[..., V]`` into float32 probabilities after
  temperature, top-k, top-p and min-p (in that order), or into a one-hot of the argmax
  when the temperature is zero.
* `sample` draws one token per row of a ``[..., V]`` array of non-negative weights.

Every knob of `SamplingConfig` is an array leaf, so a jitted decoder is compiled once and
serves any temperature or truncation, including a different one per row.

Top-k and top-p need a threshold (the k-th largest probability, or the probability at
which the sorted cumulative mass reaches ``top_p``). Sorting 128k entries per position is
the obvious way and the slow one; here the threshold is found exactly by bisection over
the int32 bit pattern of the probabilities (a non-negative float32's bits order the same
way as its value), 30 passes of compare-and-reduce per row. See BENCHMARKS.md for the
measured difference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

__all__ = [
    "SamplingConfig",
    "apply_sampling",
    "check_sampling_config",
    "greedy_tokens",
    "probs_from_logits",
    "sample",
]

# Bits of float32 1.0 plus one: no probability reaches it, so it is a strict upper bound.
_PROB_BITS_UPPER = 0x3F800001
# Bisection halves [0, 0x3F800001) to width 1 in ceil(log2(0x3F800001)) = 30 steps.
_BISECTION_STEPS = 30
# Above this vocabulary size `sample` draws a block, then a token inside it, which needs
# ~2*sqrt(V) Gumbel draws per row instead of V (random bits dominate flat sampling).
_FLAT_SAMPLING_MAX_V = 2048
_SAMPLING_BLOCK = 256

_FLOAT_FIELDS = ("temperature", "top_p", "min_p")


def _is_host_value(value) -> bool:
    return isinstance(value, (bool, int, float, np.ndarray, np.generic))


@struct.dataclass
class SamplingConfig:
    """How logits become a token distribution. Every field is a traced array leaf.

    Leaves are scalars or arrays broadcastable (numpy rules) to the logits' batch shape
    ``logits.shape[:-1]``; e.g. ``temperature`` of shape ``[B, 1]`` gives each row of
    ``[B, T, V]`` logits its own temperature. Python and numpy scalars are stored as 0-d
    numpy arrays of a fixed dtype (float32, and int32 for ``top_k``), so
    ``SamplingConfig(temperature=0.7)`` and ``SamplingConfig(temperature=jnp.float32(0.9))``
    hit the same jit cache entry.

    Call `validate` (or `check_sampling_config`) on the host before jitting; traced values
    cannot be checked and are used as given.

    Attributes:
        temperature: logits are divided by it; ``<= 0`` (or NaN) means greedy.
        top_k: keep the ``top_k`` most probable tokens (all ties at the k-th probability
            included); ``0`` disables it.
        top_p: nucleus sampling: keep the smallest set of most probable tokens whose mass
            reaches ``top_p`` (all ties at the boundary included); ``1`` disables it.
        min_p: keep tokens whose probability is at least ``min_p`` times the largest;
            ``0`` disables it.
    """

    temperature: jax.Array | float = 1.0
    top_k: jax.Array | int = 0
    top_p: jax.Array | float = 1.0
    min_p: jax.Array | float = 0.0

    def __post_init__(self):
        # A Python float and a float32 array are different jit signatures; storing one
        # canonical host array keeps a single compiled program for every value.
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if _is_host_value(value):
                object.__setattr__(self, name, np.asarray(value, dtype=np.float32))
        if _is_host_value(self.top_k):
            top_k = np.asarray(self.top_k)
            if not np.issubdtype(top_k.dtype, np.integer) and not np.all(top_k == np.round(top_k)):
                raise ValueError(f"SamplingConfig.top_k must be an integer, got {top_k!r}")
            object.__setattr__(self, "top_k", top_k.astype(np.int32))

    @classmethod
    def greedy(cls) -> SamplingConfig:
        """Argmax decoding (temperature 0)."""
        return cls(temperature=0.0)

    def validate(self) -> SamplingConfig:
        """Raises ValueError for out-of-range concrete values; returns ``self``."""
        check_sampling_config(self)
        return self


def check_sampling_config(config: SamplingConfig) -> None:
    """Raises ValueError naming the first field with an out-of-range concrete value.

    Valid ranges: ``temperature >= 0``, ``top_k >= 0``, ``0 < top_p <= 1`` and
    ``0 <= min_p < 1``. Traced fields (inside jit or vmap) are skipped silently, since
    their values are unknown; call this on the host before jitting.
    """
    checks = {
        "temperature": (lambda v: v >= 0, "must be >= 0 (0 means greedy)"),
        "top_k": (lambda v: v >= 0, "must be >= 0 (0 disables top-k)"),
        "top_p": (lambda v: (v > 0) & (v <= 1), "must be in (0, 1] (1 disables top-p)"),
        "min_p": (lambda v: (v >= 0) & (v < 1), "must be in [0, 1) (0 disables min-p)"),
    }
    for name, (is_valid, requirement) in checks.items():
        value = getattr(config, name)
        if isinstance(value, jax.core.Tracer):
            continue
        value = np.asarray(value)
        # Written as "all valid" rather than "any invalid" so that NaN fails.
        if not np.all(is_valid(value)):
            raise ValueError(f"SamplingConfig.{name} {requirement}; got {value!r}")
        if name == "top_k" and not np.issubdtype(value.dtype, np.integer):
            if not np.all(value == np.round(value)):
                raise ValueError(f"SamplingConfig.top_k must be an integer; got {value!r}")


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


def _per_row(value, batch_shape: tuple[int, ...], dtype) -> jax.Array:
    """A config leaf broadcast to ``batch_shape + (1,)`` (explicitly: rank promotion is off)."""
    return jnp.broadcast_to(jnp.asarray(value).astype(dtype), batch_shape)[..., None]


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

    keep_RxV = (bits_RxV >= p_bits_R1) & (probs_RxV >= min_p_R1 * max_prob_R1)
    kept_RxV = jnp.where(keep_RxV, probs_RxV, 0.0)
    return kept_RxV / jnp.sum(kept_RxV, axis=-1, keepdims=True)


def probs_from_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """Float32 token probabilities ``[..., V]`` from logits ``[..., V]`` of any float dtype.

    Steps, each on the previous step's (renormalised) output:

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
    distribution over all V tokens (its greedy one-hot is token 0).

    Args:
        logits: ``[..., V]`` float array (bf16, f16, f32, ...).
        config: a `SamplingConfig`; leaves broadcast to ``logits.shape[:-1]``.

    Returns:
        float32 ``[..., V]``, non-negative, each row summing to 1 up to rounding.
    """
    logits = jnp.asarray(logits)
    if logits.ndim < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(
            f"probs_from_logits: logits must be a float array [..., V], got "
            f"{logits.dtype}{list(logits.shape)}"
        )
    batch_shape = logits.shape[:-1]
    temperature_R1 = _per_row(config.temperature, batch_shape, jnp.float32)
    top_k_R1 = _per_row(config.top_k, batch_shape, jnp.int32)
    top_p_R1 = _per_row(config.top_p, batch_shape, jnp.float32)
    min_p_R1 = _per_row(config.min_p, batch_shape, jnp.float32)

    x_RxV = logits.astype(jnp.float32)
    x_RxV = jnp.where(jnp.isnan(x_RxV), -jnp.inf, x_RxV)
    greedy_R1 = ~(temperature_R1 > 0)

    def greedy():
        vocab_ids_RxV = lax.broadcasted_iota(jnp.int32, x_RxV.shape, x_RxV.ndim - 1)
        return (vocab_ids_RxV == greedy_tokens(x_RxV)[..., None]).astype(jnp.float32)

    def sampled():
        max_R1 = jnp.max(x_RxV, axis=-1, keepdims=True)
        # Shift before dividing so nothing overflows to +inf. The where() covers the
        # degenerate rows: max == +inf (inf - inf is NaN) and max == -inf (all -inf).
        safe_temperature_R1 = jnp.where(greedy_R1, 1.0, temperature_R1)
        z_RxV = jnp.where(x_RxV == max_R1, 0.0, (x_RxV - max_R1) / safe_temperature_R1)
        e_RxV = jnp.exp(z_RxV)
        probs_RxV = e_RxV / jnp.sum(e_RxV, axis=-1, keepdims=True)
        return _truncate(probs_RxV, top_k_R1, top_p_R1, min_p_R1)

    # The greedy and sampled branches each cost a few passes over V, so the common cases (all
    # rows greedy, or none) compute only what they return.
    mixed = lambda: jnp.where(greedy_R1, greedy(), sampled())
    branch = jnp.where(jnp.all(greedy_R1), 0, jnp.where(jnp.any(greedy_R1), 2, 1))
    return lax.switch(branch, [greedy, sampled, mixed])


def _gumbel_argmax(key: jax.Array, weights_RxV: jax.Array) -> jax.Array:
    """Index of ``max(log w + Gumbel)`` over the last axis; entries ``w <= 0`` never win."""
    gumbel_RxV = jax.random.gumbel(key, weights_RxV.shape, jnp.float32)
    scores_RxV = jnp.where(weights_RxV > 0, jnp.log(weights_RxV) + gumbel_RxV, -jnp.inf)
    return _first_argmax(scores_RxV)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draws one token per row: ``[..., V]`` weights -> ``int32[...]``.

    Token ``i`` is drawn with probability ``probs[i] / sum(probs)`` (Gumbel-max), so the
    weights need not be normalised. Entries that are zero, negative or NaN are never
    drawn; a row with no positive entry returns token 0. Denormal weights (below
    1.2e-38) may count as zero: XLA on CPU flushes denormals to zero.

    For ``V > 2048`` the draw is two-stage, with the same distribution: a block of 256
    tokens is drawn in proportion to its mass, then a token inside the block. This needs
    ``V/256 + 256`` Gumbel variates per row instead of V.

    Args:
        key: a PRNG key; all rows use (independent parts of) it.
        probs: ``[..., V]`` non-negative weights of any float dtype.

    Returns:
        int32 ``[...]`` token ids in ``[0, V)``.
    """
    weights_RxV = jnp.asarray(probs).astype(jnp.float32)
    vocab = weights_RxV.shape[-1]
    if vocab <= _FLAT_SAMPLING_MAX_V:
        return _gumbel_argmax(key, weights_RxV)

    # Rows are flattened to [R, V]: the block gather compiles much faster on rank 2.
    batch_shape = weights_RxV.shape[:-1]
    weights_RxV = weights_RxV.reshape(-1, vocab)
    num_blocks = -(-vocab // _SAMPLING_BLOCK)
    padded_RxV = jnp.pad(weights_RxV, [(0, 0), (0, num_blocks * _SAMPLING_BLOCK - vocab)])
    blocks_RxNxK = padded_RxV.reshape(-1, num_blocks, _SAMPLING_BLOCK)
    # Non-positive and NaN entries must not contribute mass to their block.
    blocks_RxNxK = jnp.where(blocks_RxNxK > 0, blocks_RxNxK, 0.0)
    block_key, token_key = jax.random.split(key)
    block_R = _gumbel_argmax(block_key, jnp.sum(blocks_RxNxK, axis=-1))
    chosen_RxK = jnp.take_along_axis(blocks_RxNxK, block_R[:, None, None], axis=1)[:, 0]
    tokens_R = block_R * _SAMPLING_BLOCK + _gumbel_argmax(token_key, chosen_RxK)
    return tokens_R.reshape(batch_shape)


def apply_sampling(key: jax.Array, logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """``sample(key, probs_from_logits(logits, config))``: logits ``[..., V]`` -> ``int32[...]``."""
    return sample(key, probs_from_logits(logits, config))
