"""Stop strings: a row ends with the token that completes one (`specjax.sampling.stops`)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import RowFeature
from specjax.sampling.stops import StopStrings, first_stop


@struct.dataclass
class StopAtStrings(RowFeature):
    """Cuts a row's step after the token that completes one of its prompt's stop strings
    in the generated text (split across tokens too); that token is kept.

    Attributes:
        table: the `StopStrings` (``active`` per prompt).
    """

    table: StopStrings
    name = "stop_strings"

    def cut(self, state, state_B, block_BG):
        active_BS = self.table.active[state.queue.slot_prompt]
        return first_stop(
            self.table,
            active_BS,
            state.seq,
            state.prompt_lengths,
            state.seq_lengths,
            jnp.maximum(block_BG, 0),
        )
