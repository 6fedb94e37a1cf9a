"""Each emitted token's log-probability (``GenerationResult.logprobs``)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import BufferFeature


@struct.dataclass
class Logprobs(BufferFeature):
    """``float32[N, W]``: log p of each token under the processed distribution it was
    drawn from (0 for greedy rows, whose distribution is one-hot)."""

    name = "logprobs"

    def buffers(self):
        return {"logprobs": (jnp.float32, (), 0.0)}

    def values(self, state, emission):
        block_BG = jnp.maximum(emission.block, 0)
        p_BG = jnp.take_along_axis(emission.probs, block_BG[..., None], -1)[..., 0]
        return {"logprobs": jnp.log(p_BG)}
