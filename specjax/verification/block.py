"""Block verification: a chain's drafts judged together, never keeping fewer on average.

Token-wise rejection sampling stops at the first draft it rejects. Block verification
(Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025) judges
the chain as a whole, and its expected number of accepted drafts is the most any
verifier that keeps the target's distribution can reach, at least token-wise
rejection sampling's. For drafts ``x_1..x_γ`` drawn from ``q_1..q_γ``, the target's
``p_1..p_{γ+1}`` at the same positions (1-based here, as in the paper; ``p_i``
scores ``x_i``):

* a running ratio ``r_0 = 1``, ``r_i = min(1, r_{i-1} p_i(x_i) / q_i(x_i))``;
* the residual after ``i`` drafts, ``res_i = max(r_i p_{i+1} - q_{i+1}, 0)``, its mass
  ``Z_i``, and the threshold ``h_i = Z_i / (Z_i + 1 - r_i)`` for ``i < γ``, ``h_γ = r_γ``;
* a coin ``η_i`` per draft; ``τ`` is the *last* ``i`` with ``η_i < h_i`` (0 if none);
* keep ``x_1..x_τ``, then draw the next token from ``res_τ`` normalised, or from
  ``p_{γ+1}`` when ``τ = γ`` (the bonus token).

A draft that was not proposed (``-1``, under ``draft_confidence``) is an
out-of-vocabulary draft with ``q = 1`` on it and ``p = 0``: its ratio is 0 and the
residual before it is ``r_i p_{i+1}``. One-hot drafts (``q`` None: prompt lookup, a
greedy drafter) are the case ``q_i = δ_{x_i}``, where ``Z_i = r_i (1 - p_{i+1}(x_{i+1}))``.
At temperature 0 the target's ``p`` is one-hot, and the rule keeps exactly the drafts
equal to the target's argmax up to the first that is not, then the argmax: greedy
verification.

**Noise.** The coins decide τ from every draft of the chain, the ones it throws away
included, and so do those drafts' own draws. Position-keyed noise reused at the next
step (as token-wise verification may, `specjax.sampling.noise`) would then be known
to have failed, and the output would no longer follow the target. So the drafts and
the coins of a step are drawn from the step's own stream: keyed by the row's key and
the position the step starts at, which a row never starts at twice. The emitted token
is drawn from the SAMPLE stream of its position, used by nothing else. A row's tokens
still depend on its key, seed and prompt only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.sampling.distributions import noise, sample

__all__ = ["block_keys", "block_verify"]

# The step's own streams (`block_keys`), apart from the position streams of `noise`.
BLOCK = 7
_DRAFTS, _COINS = 0, 1


def block_keys(keys_BW: jax.Array, which: int) -> jax.Array:
    """Keys ``[B, W]`` of the step that starts at ``keys_BW[:, 0]``'s position, for its
    drafts (``which=0``) or its coins (``1``): fresh at every step of a row."""
    step_B = noise.stream(keys_BW[:, 0], BLOCK)
    per_row = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
    offsets_W = jnp.arange(keys_BW.shape[1]) * 2 + which
    return jax.vmap(per_row, in_axes=(0, None))(step_B, offsets_W)


def _last_passed(passed_G: jax.Array) -> jax.Array:
    """τ: the last ``i`` in ``1..γ`` whose coin passed, 0 if none did (not the first to
    fail: a later draft may pass where an earlier one did not)."""
    indices_G = jnp.arange(1, passed_G.shape[0] + 1, dtype=jnp.int32)
    return jnp.max(jnp.where(passed_G, indices_G, 0))


def _single(keys_W, coin_keys_W, chain_G, draft_probs_GV, target_WV):
    gamma = chain_G.shape[0]
    vocab = target_WV.shape[-1]
    p_WV = target_WV.astype(jnp.float32)
    if gamma == 0:  # a step that drafts nothing (adaptive γ): the target's own token
        token = sample(noise.stream(keys_W[0], noise.SAMPLE), p_WV[0])
        return token[None].astype(jnp.int32), jnp.zeros((), jnp.int32)
    proposed_G = (chain_G >= 0) & (chain_G < vocab)
    safe_G = jnp.clip(chain_G, 0, vocab - 1)
    p_at_G = jnp.take_along_axis(p_WV[:gamma], safe_G[:, None], axis=-1)[:, 0]
    if draft_probs_GV is None:  # one-hot q: q_i(x_i) = 1
        q_at_G = jnp.ones((gamma,), jnp.float32)
    else:
        q_GV = draft_probs_GV.astype(jnp.float32)
        q_at_G = jnp.take_along_axis(q_GV, safe_G[:, None], axis=-1)[:, 0]
    ratio_G = jnp.where(proposed_G & (q_at_G > 0), p_at_G / jnp.where(q_at_G > 0, q_at_G, 1), 0)

    def running(r, ratio):
        r = jnp.minimum(1.0, r * ratio)
        return r, r

    _, r_G = lax.scan(running, jnp.float32(1.0), ratio_G)
    r_W = jnp.concatenate([jnp.ones((1,), jnp.float32), r_G])  # r_0 .. r_γ

    # res_i = max(r_i p_{i+1} - q_{i+1}, 0) for i = 0..γ-1 (q_{i+1} the draft at i, 0-based).
    if draft_probs_GV is None:
        onehot_GV = jax.nn.one_hot(chain_G, vocab, dtype=jnp.float32)  # zero where not proposed
        q_GV = onehot_GV
    else:
        q_GV = jnp.where(proposed_G[:, None], q_GV, 0.0)
    residual_GV = jnp.maximum(r_W[:gamma, None] * p_WV[:gamma] - q_GV, 0.0)
    mass_G = jnp.sum(residual_GV, axis=-1)
    # h_i for i = 1..γ-1 (the residual after i drafts is residual_GV[i]); h_γ = r_γ.
    denominator = mass_G[1:] + 1.0 - r_W[1:gamma]
    h_inner = jnp.where(denominator > 0, mass_G[1:] / jnp.where(denominator > 0, denominator, 1), 0)
    h_G = jnp.concatenate([h_inner, r_W[gamma:]])  # h_1 .. h_γ
    coins_G = jax.vmap(lambda k: noise.uniform(k, ()))(coin_keys_W[:gamma])
    tau = _last_passed(coins_G < h_G)

    residual_V = jnp.where(
        tau < gamma,
        lax.dynamic_index_in_dim(
            jnp.concatenate([residual_GV, jnp.zeros_like(p_WV[:1])]), tau, keepdims=False
        ),
        lax.dynamic_index_in_dim(p_WV, gamma, keepdims=False),
    )
    p_tau_V = lax.dynamic_index_in_dim(p_WV, tau, keepdims=False)
    # A zero residual has probability 0 with exact inputs; rounding may leave one.
    weights_V = jnp.where(jnp.any(residual_V > 0), residual_V, p_tau_V)
    token = sample(noise.stream(keys_W[tau], noise.SAMPLE), weights_V)
    positions_W = jnp.arange(gamma + 1, dtype=jnp.int32)
    chain_W = jnp.concatenate([chain_G.astype(jnp.int32), jnp.full((1,), -1, jnp.int32)])
    block_W = jnp.where(positions_W < tau, chain_W, jnp.where(positions_W == tau, token, -1))
    return block_W, tau


def block_verify(keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV):
    """``(block int32[B, W], num_accepted int32[B])`` of one step by block verification.

    Args:
        keys_BW: each row's position keys at the step's W positions.
        chain_BW1: ``int32[B, W-1]`` the drafts, ``-1`` where none was proposed.
        draft_probs_BW1V: the q each draft was drawn from, or ``None`` for one-hot drafts.
        target_probs_BWV: the target's p at the W positions.

    Returns:
        The kept drafts, then the drawn token, then ``-1``; and τ per row.
    """
    coin_keys_BW = block_keys(keys_BW, _COINS)
    if draft_probs_BW1V is None:
        single = lambda k, c, x, p: _single(k, c, x, None, p)  # noqa: E731
        return jax.vmap(single)(keys_BW, coin_keys_BW, chain_BW1, target_probs_BWV)
    return jax.vmap(_single)(keys_BW, coin_keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV)
