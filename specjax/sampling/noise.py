"""Where the randomness comes from: position-keyed keys and high-resolution variates.

**Position keys.** Every random draw for row ``b`` at absolute position ``t`` (the
position of the token being decided) comes from

    key_bt = fold_in(fold_in(key, seed_b), t)

and then from one *stream* of it, ``fold_in(key_bt, stream)``:

* `SAMPLE`: the noise that turns the target's distribution at ``t`` into a token
  (plain decoding, the bonus token, the residual after a rejection, and in coupled
  verification the drafter's own draw too);
* `DRAFT`: the drafter's draw at ``t`` in rejection-sampling mode;
* `ACCEPT`: the acceptance uniform at ``t``.

A row's randomness therefore depends on ``(key, seed_b, t)`` only: not on its index
in the batch, the rows around it, the batch size, or how many steps ran before.

**Reusing a position's keys is exact.** A position can be drafted more than once:
drafts after a rejection are discarded and drafted again next step, with the same
keys. That is safe because a step's *emitted* tokens are a function of the noise at
the positions it emits only. A step starting at length L that accepts n drafts emits
positions L..L+n, decided by the draft noise, uniforms and sample noise at those
positions; the noise at positions >= L+n+1 was used only for drafts that were thrown
away and influenced nothing that was kept. So when the next step starts at
L' = L+n+1, the noise at every position >= L' is still independent of everything
emitted so far, which is all the rejection-sampling proof needs of fresh noise.

**Variates.** `uniform` builds a float32 uniform on (0, 1) from 64 random bits, so it
is resolved to about 2**-64 near 0 (a plain float32 uniform has 23 bits: no value
between 0 and 1.2e-7). `exponential` is ``-log1p(-uniform)``, whose small values are
as finely resolved. Exponential races need exactly that: a token of weight w wins
``argmax_i w_i / E_i`` when its E_i is about w_i / w_max times the others', so a
coarse grid near 0 makes tokens below about 1e-7 of the top weight undrawable (the
Gumbel tail problem of ``jax.random.gumbel``, whose float32 range is about
[-4.5, 15.9]).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "ACCEPT",
    "DRAFT",
    "SAMPLE",
    "exponential",
    "position_keys",
    "row_keys",
    "stream",
    "uniform",
]

SAMPLE = 0
DRAFT = 1
ACCEPT = 2

# 1 - 2**-24, the largest float32 below 1: keeps exponential() finite.
_BELOW_ONE = 1.0 - 2.0**-24


def row_keys(key: jax.Array, seeds_B: jax.Array) -> jax.Array:
    """Per-row keys ``fold_in(key, seed_b)``: one typed key -> keys ``[B]``."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, seeds_B)


def position_keys(row_keys_B: jax.Array, positions_BT: jax.Array) -> jax.Array:
    """Keys ``fold_in(row_key_b, t)`` for ``int32[B, T]`` positions -> keys ``[B, T]``."""
    per_row = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
    return jax.vmap(per_row)(row_keys_B, positions_BT)


def stream(keys: jax.Array, which: int) -> jax.Array:
    """The ``which`` stream (`SAMPLE`, `DRAFT`, `ACCEPT`) of each key, same shape."""
    if keys.size == 0:
        return keys
    flat = keys.reshape(-1)
    out = jax.vmap(jax.random.fold_in, in_axes=(0, None))(flat, which)
    return out.reshape(keys.shape)


def uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """float32 uniform on (0, 1] from 64 random bits per value.

    ``hi * 2**-32 + (lo + 0.5) * 2**-64``: exact near 0 down to 2**-65, and rounded to
    float32 (24 bits) elsewhere, so probabilities are resolved to float32 precision
    whatever their size. (Values round to 1.0 with probability about 2**-25.)
    """
    bits = jax.random.bits(key, (2, *shape), jnp.uint32)
    hi = bits[0].astype(jnp.float32) * jnp.float32(2.0**-32)
    lo = (bits[1].astype(jnp.float32) + 0.5) * jnp.float32(2.0**-64)
    return hi + lo


def exponential(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """float32 Exp(1) variates, finely resolved near 0 (see the module docstring)."""
    return -jnp.log1p(-jnp.minimum(uniform(key, shape), _BELOW_ONE))
