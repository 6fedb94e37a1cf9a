"""Repetition, presence and frequency penalties (`specjax.sampling.penalties`).

Stateless: the counts are taken from each row's committed tokens every step, and
position i of a step counts drafts 0..i-1 as well.
"""

from __future__ import annotations

from flax import struct

from specjax.decoding.features.base import RowFeature
from specjax.sampling.penalties import prefix_counts


@struct.dataclass
class Penalize(RowFeature):
    """Gives the drafter and the target the token counts the penalties read."""

    vocab_size: int = struct.field(pytree_node=False, default=0)
    name = "penalties"

    def history(self, state, state_B):
        return prefix_counts(
            state.sampling, state.seq, state.prompt_lengths, state.seq_lengths, self.vocab_size
        )
