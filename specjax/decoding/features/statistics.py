"""The decoding counters (``GenerationResult.stats``): calls, drafts and acceptances."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import RowFeature
from specjax.decoding.state import GenerationStats

# Counted per row, and per prompt in the result.
_PER_ROW = ("row_target_calls", "drafted", "accepted")
# Counted per row too (so that a refilled row starts from zero like any other state),
# and summed over the prompts in the result.
_SUMMED = ("accepted_hist", "position_drafted", "position_reached", "position_accepted")


@struct.dataclass
class Statistics(RowFeature):
    """Counts each row's target calls, drafted and accepted tokens, and per draft position.

    Its state is ``{counter: int32[B, ...]}``, one row per slot; the counters are handed
    on with the prompt's output, and the result sums the histograms over the prompts.
    The loop's own iteration count is `~specjax.decoding.DecodeState.step`, which the
    result reports as ``target_calls``.

    Attributes:
        num_positions: static γ, the draft positions counted (a tree's depth).
    """

    num_positions: int = struct.field(pytree_node=False, default=0)
    name = "statistics"

    def init(self, decoder, prompts_M, cache_len):
        return self._zeros(prompts_M.shape[0])

    def commit(self, state, counts, emission):
        gamma = self.num_positions
        active, num_accepted = emission.active, emission.num_accepted
        active_i = active.astype(jnp.int32)
        # Per draft position i (a tree's depth i): proposed, judged (drafts 0..i-1 all
        # accepted) and accepted, for active rows.
        positions_G = jnp.arange(gamma)[None]
        drafted_BG = (positions_G < emission.num_drafted[:, None]) & active[:, None]
        reached_BG = drafted_BG & (positions_G <= num_accepted[:, None])
        accepted_BG = drafted_BG & (positions_G < num_accepted[:, None])
        hist_BG1 = jax.nn.one_hot(num_accepted, gamma + 1, dtype=jnp.int32) * active_i[:, None]
        new = {
            "row_target_calls": active_i,
            "drafted": emission.num_drafted * active_i,
            "accepted": num_accepted * active_i,
            "accepted_hist": hist_BG1,
            "position_drafted": drafted_BG,
            "position_reached": reached_BG,
            "position_accepted": accepted_BG,
        }
        return {name: counts[name] + new[name].astype(jnp.int32) for name in counts}

    def empty_output(self, num_prompts, width):
        return self._zeros(num_prompts)

    def gather(self, counts, slots_M, positions_MS, valid_MS):
        return {name: x[slots_M] for name, x in counts.items()}

    def result(self, counts, out_N):
        summed = {name: jnp.sum(out_N[name], axis=0) for name in _SUMMED}
        per_prompt = {name: out_N[name] for name in _PER_ROW}
        # target_calls: the loop's iterations, which the decoder fills in.
        return {"stats": GenerationStats(target_calls=None, **per_prompt, **summed)}

    def _zeros(self, rows: int) -> dict:
        g = self.num_positions
        zeros = {name: jnp.zeros((rows,), jnp.int32) for name in _PER_ROW}
        zeros["accepted_hist"] = jnp.zeros((rows, g + 1), jnp.int32)
        for name in _SUMMED[1:]:
            zeros[name] = jnp.zeros((rows, g), jnp.int32)
        return zeros
