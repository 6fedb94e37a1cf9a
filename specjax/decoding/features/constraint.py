"""Constrained decoding: rows emit only text of their language (`specjax.sampling.constraints`).

The feature's state is each row's automaton state after its committed tokens. Its
cursor masks the drafter's q and the target's p at every scored position
(`~specjax.sampling.RowSampling`'s ``automaton``), and a row ends with the token that
completes its language when nothing can follow.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import RowFeature
from specjax.sampling.constraints import AutomatonCursor, ConstraintTable


def _cursor_along(cursor_B: AutomatonCursor, drafts_BG):
    """The ``[B, G+1]`` cursor the verifier masks p with (position i: after drafts
    0..i-1)."""
    return cursor_B.along(drafts_BG)


@struct.dataclass
class Constrain(RowFeature):
    """Masks each row's distributions with its prompt's constraint.

    Attributes:
        table: the `ConstraintTable` (``initial`` per prompt).
    """

    table: ConstraintTable
    name = "constraint"

    def init(self, decoder, prompts_B, cache_len):
        return self.table.initial[prompts_B]

    def reset(self, states_B, slot, prompt):
        return states_B.at[slot].set(self.table.initial[prompt])

    def cursor(self, state, states_B) -> AutomatonCursor:
        """The rows' cursor after their committed tokens."""
        return AutomatonCursor(self.table, states_B, state.decoder.eos_ids)

    def history(self, state, states_B):
        return {"automaton": self.cursor(state, states_B)}

    def along(self, history, chain_BG, sampling):
        return {"automaton": _cursor_along(history["automaton"], chain_BG)}

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
        return self.cursor(state, states_B).along(block_BG).states[:, 1:]
