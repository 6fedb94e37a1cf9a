"""The decoding counters (``GenerationResult.stats``): calls, drafts and acceptances."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.features.base import RowFeature
from specjax.decoding.state import GenerationStats

_PER_ROW = ("row_target_calls", "drafted", "accepted")


@struct.dataclass
class Statistics(RowFeature):
    """Counts target calls, drafted and accepted tokens, per prompt and per draft position.

    Its state is a `GenerationStats` with ``[B]`` per-slot counters; the per-prompt
    ones are handed on with the prompt's output.
    """

    name = "statistics"

    def init(self, decoder, prompts_B, cache_len):
        gamma = decoder.drafter.num_draft
        zeros_B = jnp.zeros(prompts_B.shape, jnp.int32)
        zeros_G = jnp.zeros((gamma,), jnp.int32)
        return GenerationStats(
            target_calls=jnp.zeros((), jnp.int32),
            row_target_calls=zeros_B,
            drafted=zeros_B,
            accepted=zeros_B,
            accepted_hist=jnp.zeros((gamma + 1,), jnp.int32),
            position_drafted=zeros_G,
            position_reached=zeros_G,
            position_accepted=zeros_G,
        )

    def reset(self, stats, slot, prompt):
        return stats.replace(**{name: getattr(stats, name).at[slot].set(0) for name in _PER_ROW})

    def commit(self, state, stats, emission):
        gamma = stats.position_drafted.shape[0]
        active, num_accepted = emission.active, emission.num_accepted
        active_i = active.astype(jnp.int32)
        hist_BG1 = jax.nn.one_hot(num_accepted, gamma + 1, dtype=jnp.int32) * active_i[:, None]
        # Per draft position i (a tree's depth i): proposed, judged (drafts 0..i-1 all
        # accepted) and accepted, over active rows.
        positions_G = jnp.arange(gamma)[None]
        drafted_BG = (positions_G < emission.num_drafted[:, None]) & active[:, None]
        reached_BG = drafted_BG & (positions_G <= num_accepted[:, None])
        accepted_BG = drafted_BG & (positions_G < num_accepted[:, None])
        total = lambda mask_BG: jnp.sum(mask_BG, axis=0, dtype=jnp.int32)  # noqa: E731
        return stats.replace(
            target_calls=stats.target_calls + 1,
            row_target_calls=stats.row_target_calls + active_i,
            drafted=stats.drafted + emission.num_drafted * active_i,
            accepted=stats.accepted + num_accepted * active_i,
            accepted_hist=stats.accepted_hist + jnp.sum(hist_BG1, axis=0),
            position_drafted=stats.position_drafted + total(drafted_BG),
            position_reached=stats.position_reached + total(reached_BG),
            position_accepted=stats.position_accepted + total(accepted_BG),
        )

    def empty_output(self, num_prompts, width):
        return {name: jnp.zeros((num_prompts,), jnp.int32) for name in _PER_ROW}

    def gather(self, stats, slots_M, positions_MS, valid_MS):
        return {name: getattr(stats, name)[slots_M] for name in _PER_ROW}

    def result(self, stats, out_N):
        return {"stats": stats.replace(**out_N)}
