"""Constrained decoding: rows emit only text of their language (`specjax.sampling.constraints`).

The feature's state is each row's automaton state after its committed tokens. Its
history, the rows' `~specjax.sampling.constraints.AutomatonCursor`, masks the drafter's q
and the target's p at every scored position, and a row ends with the token that
completes its language when nothing can follow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import RowFeature
from specjax.sampling.constraints import AutomatonCursor, ConstraintTable


@struct.dataclass
class Constrain(RowFeature):
    """Masks each row's distributions with its prompt's constraint.

    Attributes:
        table: the `ConstraintTable` (``initial`` per prompt).
        eos_ids: ``int32[K]`` the decoder's EOS ids (``-1`` pads): where the language
            is complete, an EOS id is allowed too.
    """

    table: ConstraintTable
    eos_ids: jax.Array
    name = "constraint"

    def init(self, decoder, prompts_M, cache_len):
        return self.table.initial[prompts_M]

    def cursor(self, state, states_B) -> AutomatonCursor:
        """The rows' cursor after their committed tokens."""
        return AutomatonCursor(self.table, states_B, self.eos_ids)

    def history(self, state, states_B):
        return self.cursor(state, states_B)

    def cut(self, state, states_B, block_BG):
        complete_BG = self.table.complete[self._states_along(state, states_B, block_BG)]
        g = block_BG.shape[1]
        hit_B = jnp.any(complete_BG, axis=1)
        return jnp.where(hit_B, jnp.argmax(complete_BG, axis=1) + 1, g), hit_B

    def commit(self, state, states_B, emission):
        after_BG = self._states_along(state, states_B, emission.block)
        states_BG1 = jnp.concatenate([states_B[:, None], after_BG], axis=1)
        return jnp.take_along_axis(states_BG1, emission.num_emit[:, None], axis=1)[:, 0]

    def _states_along(self, state, states_B, block_BG):
        """``int32[B, G]``: the state after each of ``block``'s tokens."""
        return self.table.states_after(states_B, block_BG)
