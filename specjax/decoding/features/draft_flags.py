"""Which emitted tokens were accepted drafts (``GenerationResult.from_draft``)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import BufferFeature


@struct.dataclass
class DraftFlags(BufferFeature):
    """``bool[N, W]``: the token was an accepted draft (the rest came from the target)."""

    name = "draft_flags"

    def buffers(self):
        return {"from_draft": (jnp.bool_, (), False)}

    def values(self, state, emission):
        offsets_G = jnp.arange(emission.block.shape[1])
        return {"from_draft": offsets_G[None] < emission.num_accepted[:, None]}
