"""Verification of drafted tokens against the target model: greedy and rejection sampling.

Each algorithm is a per-sequence pure core (``*_single``) plus a batched wrapper that
`jax.vmap`s it. All share one output layout, for drafts ``x[0:γ]``:

* ``num_accepted``: ``n`` in ``[0, γ]``, the number of leading drafts accepted;
* ``tokens`` ``[γ+1]``: ``tokens[:n] = x[:n]``, ``tokens[n]`` = the target's own token at
  position n (a correction after a rejection, or the bonus token when ``n == γ``), and
  ``-1`` after it. A row therefore always gains ``n + 1`` tokens.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023) makes the emitted tokens
exactly distributed as the target's: draft ``x_i ~ q_i`` is accepted iff
``u_i * q_i(x_i) < p_i(x_i)`` with ``u_i ~ U[0, 1)`` (``min(1, p/q)`` without a
division), and the first rejected position is resampled from ``max(0, p_n - q_n)``
(falling back to ``p_n`` where that is all zero). Only ``2γ`` gathered scalars and two
rows of length V per sequence are read, not the whole ``[γ+1, V]`` probabilities.

A drafted token outside ``[0, V)`` can never be emitted: it is always rejected and
position n is then sampled from the target's ``p_n`` (as if q put no mass on it), so
the output still follows p.

Coupled verification (`coupled_verify`) needs no q: the target's own sample at each
position is drawn with that position's noise, the same noise the drafter was given,
and a draft is accepted iff it equals the target's sample. The emitted tokens are then
exactly the target's samples, token for token what plain decoding draws with the same
keys.

**Keys.** Every draw is keyed by position (`specjax.sampling.noise`): the core of each algorithm
takes one key per scored position, ``[γ+1]``, and draws the acceptance uniform of
position i from its `~specjax.sampling.noise.ACCEPT` stream and the token emitted at position i
(correction, bonus, or coupled sample) from its `~specjax.sampling.noise.SAMPLE` stream. The
public functions take either one key (row b, position i then uses
``fold_in(fold_in(key, b), i)``) or those position keys directly, ``[B, γ+1]`` (what
the decoders pass).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.core.validation import as_prng_keys
from specjax.sampling.distributions import greedy_tokens, noise, sample
from specjax.verification.checks import (
    check_dtypes,
    check_shapes,
    checked_args,
    checked_onehot_args,
)

__all__ = [
    "coupled_verify",
    "coupled_verify_single",
    "greedy_verify",
    "greedy_verify_single",
    "rejection_core",
    "rejection_sample",
    "rejection_sample_onehot",
    "rejection_sample_onehot_single",
    "rejection_sample_single",
    "target_samples",
]


# --------------------------------------------------------------------------------------
# Shared pieces.


def _num_leading_true(flags_G: jax.Array) -> jax.Array:
    return jnp.sum(jnp.cumprod(flags_G.astype(jnp.int32)), dtype=jnp.int32)


def _layout(draft_tokens_G: jax.Array, num_accepted: jax.Array, last_token: jax.Array):
    """``[γ+1]`` tokens: accepted drafts, then ``last_token`` at ``num_accepted``, then -1."""
    padded_G1 = jnp.concatenate([draft_tokens_G, jnp.full((1,), -1, jnp.int32)])
    positions_G1 = jnp.arange(padded_G1.shape[0], dtype=jnp.int32)
    tokens_G1 = jnp.where(
        positions_G1 < num_accepted,
        padded_G1,
        jnp.where(positions_G1 == num_accepted, last_token, -1),
    )
    return tokens_G1, num_accepted


def _fold_range(key: jax.Array, n: int) -> jax.Array:
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(n))


def _sequence_keys(fn: str, key, num_positions: int) -> jax.Array:
    """Position keys ``[γ+1]``: given, or ``fold_in(key, i)`` of one key."""
    key = as_prng_keys(f"{fn}: key", key)
    if key.shape == (num_positions,):
        return key
    if key.shape == ():
        return _fold_range(key, num_positions)
    raise ValueError(
        f"{fn}: key must be one key or one per position, [{num_positions}]; got keys of "
        f"shape {list(key.shape)}"
    )


def _batch_keys(fn: str, key, batch: int, num_positions: int) -> jax.Array:
    """Position keys ``[B, γ+1]``: given, or ``fold_in(fold_in(key, b), i)`` of one key."""
    key = as_prng_keys(f"{fn}: key", key)
    if key.shape == (batch, num_positions):
        return key
    if key.shape == ():
        # fold_in by row index: a row's randomness is independent of the batch around it.
        return jax.vmap(_fold_range, in_axes=(0, None))(_fold_range(key, batch), num_positions)
    raise ValueError(
        f"{fn}: key must be one key or one per row and position, [{batch}, {num_positions}]; "
        f"got keys of shape {list(key.shape)}"
    )


def rejection_core(keys_G1, draft_tokens_G, target_GxV, draft_prob_at_G, draft_row):
    """Speculative rejection sampling of one sequence, given how to read its q.

    `rejection_sample_single` and `rejection_sample_onehot_single` both run it, so that
    one-hot drafts give bit-identical results to explicit one-hot ``draft_probs``.
    Arguments are not checked.

    Args:
        keys_G1: position keys ``[γ+1]``.
        draft_tokens_G: ``int32[γ]`` the drafts.
        target_GxV: ``[γ+1, V]`` the target's p.
        draft_prob_at_G: ``tokens [γ] -> q_i(tokens_i)``, ``float32[γ]``.
        draft_row: ``(n, token) -> q_n``, ``float32[V]``, for ``n < γ``.

    Returns:
        ``(tokens int32[γ+1], num_accepted int32[])`` (see the module docstring).
    """
    gamma = draft_tokens_G.shape[0]
    vocab = target_GxV.shape[-1]
    in_vocab_G = (draft_tokens_G >= 0) & (draft_tokens_G < vocab)
    safe_tokens_G = jnp.clip(draft_tokens_G, 0, vocab - 1)
    # Gather first, then convert: only what is read is ever converted to float32.
    p_at_G = jnp.take_along_axis(target_GxV[:gamma], safe_tokens_G[:, None], axis=-1)[:, 0]
    p_at_G = p_at_G.astype(jnp.float32)

    if gamma == 0:
        num_accepted = jnp.zeros((), jnp.int32)
    else:
        accept_keys_G = noise.stream(keys_G1[:gamma], noise.ACCEPT)
        u_G = jax.vmap(lambda k: noise.uniform(k, ()))(accept_keys_G)
        accepted_G = (u_G * draft_prob_at_G(safe_tokens_G) < p_at_G) & in_vocab_G
        num_accepted = _num_leading_true(accepted_G)

    p_n_V = lax.dynamic_index_in_dim(target_GxV, num_accepted, keepdims=False)
    p_n_V = p_n_V.astype(jnp.float32)
    if gamma == 0:
        q_n_V = jnp.zeros_like(p_n_V)
    else:
        last = jnp.minimum(num_accepted, gamma - 1)
        # n == γ: bonus token, sampled from p itself; an out-of-vocab draft: q := 0.
        use_q = (num_accepted < gamma) & in_vocab_G[last]
        q_n_V = jnp.where(use_q, draft_row(last, draft_tokens_G[last]), 0.0)
    residual_V = jnp.maximum(p_n_V - q_n_V, 0.0)
    # Zero residual mass happens when p_n == q_n (then a rejection has probability 0 for
    # exact inputs, but rounding can still produce one); p_n is the correct fallback.
    weights_V = jnp.where(jnp.any(residual_V > 0), residual_V, p_n_V)
    # The emitted position's SAMPLE stream: the bonus token then uses exactly the noise
    # plain decoding would use at that position, and a correction uses noise that nothing
    # kept so far has seen (see specjax.sampling.noise on why reuse is exact).
    sample_key = noise.stream(keys_G1[num_accepted], noise.SAMPLE)
    return _layout(draft_tokens_G, num_accepted, sample(sample_key, weights_V))


def _target_samples_single(keys_T, target_TxV):
    return sample(noise.stream(keys_T, noise.SAMPLE), target_TxV)


def target_samples(keys_BT: jax.Array, target_BTV: jax.Array) -> jax.Array:
    """``int32[B, T]``: the target's own token at every scored position.

    ``sample(stream(keys[b, t], SAMPLE), p[b, t])``, the draw plain decoding makes at
    that position. Coupled verification and a tree's walk at a fixed forward width both
    call this one function on ``[B, T, V]``, so that their samples are computed exactly
    as plain decoding's at that width, bit for bit.

    Args:
        keys_BT: position keys ``[B, T]``.
        target_BTV: ``[B, T, V]`` the target's distributions p (any scale).
    """
    return jax.vmap(_target_samples_single)(keys_BT, target_BTV)


def _coupled_core(keys_G1, draft_tokens_G, target_G1xV):
    """Accept drafts while they equal the target's own sample at their position."""
    gamma = draft_tokens_G.shape[0]
    samples_G1 = _target_samples_single(keys_G1, target_G1xV)
    num_accepted = _num_leading_true(draft_tokens_G == samples_G1[:gamma])
    return _layout(draft_tokens_G, num_accepted, samples_G1[num_accepted])


# --------------------------------------------------------------------------------------
# Greedy.


def greedy_verify_single(
    draft_tokens: jax.Array, target_logits: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Greedy verification of one sequence.

    Args:
        draft_tokens: int ``[γ]`` drafted tokens.
        target_logits: float ``[γ+1, V]`` target logits (or probabilities: only the
            argmax is used; NaN counts as ``-inf``, ties go to the lowest index).

    Returns:
        ``(tokens int32[γ+1], num_accepted int32[])``: the longest prefix of drafts equal
        to the target's argmax, then the target's argmax at the first mismatch (or the
        bonus position γ), then -1 (see the module docstring).
    """
    fn = "greedy_verify_single"
    draft_tokens, target_logits = jnp.asarray(draft_tokens), jnp.asarray(target_logits)
    check_dtypes(fn, draft_tokens, target_logits=target_logits)
    check_shapes(fn, 0, draft_tokens, target_logits, "target_logits")
    draft_tokens_G = draft_tokens.astype(jnp.int32)
    target_G1 = greedy_tokens(target_logits)
    num_accepted = _num_leading_true(draft_tokens_G == target_G1[:-1])
    return _layout(draft_tokens_G, num_accepted, target_G1[num_accepted])


def greedy_verify(draft_tokens: jax.Array, target_logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Batched `greedy_verify_single`.

    Args:
        draft_tokens: int ``[B, γ]``.
        target_logits: float ``[B, γ+1, V]`` logits or probabilities.

    Returns:
        ``(tokens int32[B, γ+1], num_accepted int32[B])``.
    """
    fn = "greedy_verify"
    draft_tokens, target_logits = jnp.asarray(draft_tokens), jnp.asarray(target_logits)
    check_dtypes(fn, draft_tokens, target_logits=target_logits)
    check_shapes(fn, 1, draft_tokens, target_logits, "target_logits")
    return jax.vmap(greedy_verify_single)(draft_tokens, target_logits)


# --------------------------------------------------------------------------------------
# Rejection sampling with a stochastic drafter.


def rejection_sample_single(
    key: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Speculative rejection sampling for one sequence.

    Accepts draft ``i`` iff ``u_i * q_i(x_i) < p_i(x_i)``, ``u_i ~ U[0, 1)``; ``n`` is the
    number of leading acceptances. Position ``n < γ`` is resampled from
    ``max(0, p_n - q_n)`` normalised (``p_n`` if that is all zero); when ``n == γ`` the
    bonus token is drawn from ``p_γ``. A zero-probability target token is never emitted.
    All arithmetic is float32.

    Args:
        key: PRNG key for this sequence, or one key per position ``[γ+1]``.
        draft_tokens: int ``[γ]``, drawn from ``draft_probs``.
        draft_probs: float ``[γ, V]`` the draft distributions q.
        target_probs: float ``[γ+1, V]`` the target distributions p.

    Returns:
        ``(tokens int32[γ+1], num_accepted int32[])`` (see the module docstring).
    """
    fn = "rejection_sample_single"
    draft_tokens, draft_probs, target_probs = checked_args(
        fn, 0, draft_tokens, draft_probs, target_probs
    )

    def draft_prob_at_G(tokens_G):
        q_at_G = jnp.take_along_axis(draft_probs, tokens_G[:, None], axis=-1)[:, 0]
        return q_at_G.astype(jnp.float32)

    def draft_row(i, _):
        return lax.dynamic_index_in_dim(draft_probs, i, keepdims=False).astype(jnp.float32)

    keys_G1 = _sequence_keys(fn, key, target_probs.shape[0])
    return rejection_core(
        keys_G1, draft_tokens.astype(jnp.int32), target_probs, draft_prob_at_G, draft_row
    )


def rejection_sample(
    key: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Batched `rejection_sample_single`.

    Args:
        key: one PRNG key for the batch (row b, position i uses
            ``fold_in(fold_in(key, b), i)``), or position keys ``[B, γ+1]``.
        draft_tokens: int ``[B, γ]``.
        draft_probs: float ``[B, γ, V]``.
        target_probs: float ``[B, γ+1, V]``.

    Returns:
        ``(tokens int32[B, γ+1], num_accepted int32[B])``.
    """
    fn = "rejection_sample"
    draft_tokens, draft_probs, target_probs = checked_args(
        fn, 1, draft_tokens, draft_probs, target_probs
    )
    keys = _batch_keys(fn, key, *target_probs.shape[:2])
    return jax.vmap(rejection_sample_single)(keys, draft_tokens, draft_probs, target_probs)


# --------------------------------------------------------------------------------------
# Rejection sampling with a deterministic drafter (q = one-hot of the draft).


def rejection_sample_onehot_single(
    key: jax.Array, draft_tokens: jax.Array, target_probs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`rejection_sample_single` with ``q_i = one_hot(x_i)``, never materialised.

    Accepts draft ``i`` iff ``u_i < p_i(x_i)``; a rejection resamples from ``p_n`` with
    the drafted token zeroed (``p_n`` if nothing else is left). Bit-identical to
    `rejection_sample_single` given explicit one-hot ``draft_probs`` and the same key.

    Args:
        key: PRNG key for this sequence, or one key per position ``[γ+1]``.
        draft_tokens: int ``[γ]`` from a deterministic drafter (n-gram, prompt lookup).
        target_probs: float ``[γ+1, V]``.

    Returns:
        ``(tokens int32[γ+1], num_accepted int32[])``.
    """
    fn = "rejection_sample_onehot_single"
    draft_tokens, target_probs = checked_onehot_args(fn, 0, draft_tokens, target_probs)
    vocab = target_probs.shape[-1]

    def one_hot_row(_, token):
        # Same values as the explicit one-hot row, so max(p - q, 0) rounds identically.
        return (jnp.arange(vocab, dtype=jnp.int32) == token).astype(jnp.float32)

    return rejection_core(
        _sequence_keys(fn, key, target_probs.shape[0]),
        draft_tokens.astype(jnp.int32),
        target_probs,
        draft_prob_at_G=lambda tokens_G: jnp.ones(tokens_G.shape, jnp.float32),
        draft_row=one_hot_row,
    )


def rejection_sample_onehot(
    key: jax.Array, draft_tokens: jax.Array, target_probs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Batched `rejection_sample_onehot_single`.

    Args:
        key: one PRNG key for the batch (row b, position i uses
            ``fold_in(fold_in(key, b), i)``), or position keys ``[B, γ+1]``.
        draft_tokens: int ``[B, γ]``.
        target_probs: float ``[B, γ+1, V]``.

    Returns:
        ``(tokens int32[B, γ+1], num_accepted int32[B])``.
    """
    return _batched_onehot(
        "rejection_sample_onehot", rejection_sample_onehot_single, key, draft_tokens, target_probs
    )


# --------------------------------------------------------------------------------------
# Coupled verification: drafter and target share each position's noise.


def coupled_verify_single(
    key: jax.Array, draft_tokens: jax.Array, target_probs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Coupled verification of one sequence.

    The target's token at position i is ``sample(stream(keys[i], SAMPLE), p_i)``; draft
    i is accepted iff it equals that token (and every draft before it was accepted),
    and the first mismatch (or the bonus position γ) emits the target's token. So the
    output is the target's own samples, exact in distribution whatever drafted, and
    equal to plain decoding's tokens for the same keys. A drafter that drew its token i
    with the same noise (``sample(stream(keys[i], SAMPLE), q_i)``) is accepted with the
    coupling probability of p_i and q_i, at least ``(1 - TV) / (1 + TV)`` for a flat
    race (``V <= 2048``).

    Args:
        key: PRNG key for this sequence, or one key per position ``[γ+1]``.
        draft_tokens: int ``[γ]``.
        target_probs: float ``[γ+1, V]`` the target distributions p.

    Returns:
        ``(tokens int32[γ+1], num_accepted int32[])`` (see the module docstring).
    """
    fn = "coupled_verify_single"
    draft_tokens, target_probs = checked_onehot_args(fn, 0, draft_tokens, target_probs)
    keys_G1 = _sequence_keys(fn, key, target_probs.shape[0])
    return _coupled_core(keys_G1, draft_tokens.astype(jnp.int32), target_probs)


def coupled_verify(
    key: jax.Array, draft_tokens: jax.Array, target_probs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Batched `coupled_verify_single`.

    Args:
        key, draft_tokens, target_probs: as in `rejection_sample_onehot`.

    Returns:
        ``(tokens int32[B, γ+1], num_accepted int32[B])``.
    """
    return _batched_onehot("coupled_verify", coupled_verify_single, key, draft_tokens, target_probs)


def _batched_onehot(fn: str, single, key, draft_tokens, target_probs):
    """``single`` (a verifier that needs no q) over the batch, its arguments checked and
    one key folded into position keys ``[B, γ+1]``."""
    draft_tokens, target_probs = checked_onehot_args(fn, 1, draft_tokens, target_probs)
    keys = _batch_keys(fn, key, *target_probs.shape[:2])
    return jax.vmap(single)(keys, draft_tokens, target_probs)
