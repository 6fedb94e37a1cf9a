"""The k most probable ids at each emitted position (``GenerationResult.top_ids``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import BufferFeature


@struct.dataclass
class TopLogprobs(BufferFeature):
    """The k most probable ids at each emitted position and their log-probabilities,
    most probable first (ties: the lowest id).

    Attributes:
        k: static k >= 0; with 0 the buffers are ``[.., 0]`` and nothing is computed.
        raw: static: from the raw logits' log-softmax, not the processed distribution
            the token was drawn from.
    """

    k: int = struct.field(pytree_node=False, default=0)
    raw: bool = struct.field(pytree_node=False, default=False)
    name = "top_logprobs"

    def buffers(self):
        return {
            "top_ids": (jnp.int32, (self.k,), -1),
            "top_logprobs": (jnp.float32, (self.k,), 0.0),
        }

    def values(self, state, emission):
        b, g = emission.block.shape
        if self.k == 0:
            return {
                "top_ids": jnp.zeros((b, g, 0), jnp.int32),
                "top_logprobs": jnp.zeros((b, g, 0), jnp.float32),
            }
        if self.raw:
            logits = emission.logits.astype(jnp.float32)
            log_dist = jax.nn.log_softmax(jnp.where(jnp.isnan(logits), -jnp.inf, logits), axis=-1)
        else:
            log_dist = jnp.log(emission.probs)
        values, ids = jax.lax.top_k(log_dist, self.k)
        return {"top_ids": ids.astype(jnp.int32), "top_logprobs": values}
