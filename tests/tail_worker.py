"""Counts tail draws for tests/test_sampling.py's tail test (run as a subprocess).

Prints one JSON line: how many of DRAWS draws from [1, r x 2047] hit a tail token,
for `specjax.sampling.sample` and for the float32 Gumbel-max sampler it replaced.
"""

import json

import jax
import jax.numpy as jnp

from specjax.sampling import sample

TAIL_TOKENS = 2047
TAIL_WEIGHT = 5e-8
DRAWS = 400_000
CHUNK = 20_000


def gumbel_sample(key, weights_V):
    """The sampler before the fix: log w + float32 Gumbel noise, argmax."""
    gumbel = jax.random.gumbel(key, weights_V.shape, jnp.float32)
    return jnp.argmax(jnp.where(weights_V > 0, jnp.log(weights_V) + gumbel, -jnp.inf))


def tail_hits(sampler) -> int:
    weights = jnp.concatenate([jnp.ones((1,)), jnp.full((TAIL_TOKENS,), TAIL_WEIGHT)])
    # vmap over keys with shared weights: only the noise is [CHUNK, V].
    draw = jax.jit(jax.vmap(lambda k: sampler(k, weights) > 0))
    keys = jax.random.split(jax.random.key(99), DRAWS).reshape(-1, CHUNK)
    return sum(int(jnp.sum(draw(chunk))) for chunk in keys)


if __name__ == "__main__":
    report = dict(
        draws=DRAWS,
        tail_tokens=TAIL_TOKENS,
        tail_weight=TAIL_WEIGHT,
        sample=tail_hits(sample),
        gumbel=tail_hits(gumbel_sample),
    )
    print(json.dumps(report))
