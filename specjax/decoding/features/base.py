"""The per-row feature protocol: what a part of the decoder may do to each row.

A feature is a frozen ``flax.struct`` dataclass: its tables (a stop-string or
constraint table) are traced leaves, its options static fields. The decoder keeps one
state per feature (``[B]``-leading leaves, one row per slot) and calls the hooks below
at fixed points of every step; each hook has a default that does nothing, so a
feature writes only the ones it needs.

* `init` builds the state of rows starting the given prompts: the first slots', and
  one row's when a refill hands a slot the next prompt (the decoder writes that row
  into the slot, so every leaf of the state carries the rows on one axis);
* `history` gives the rows' `~specjax.sampling.history.RowHistory` at the committed
  prefix (penalty counts, a constraint's automaton states, a user's mask): the decoder
  hands it to the drafter, and its `~specjax.sampling.history.RowHistory.along` at each
  scored position of the step masks the target's p;
* `cut` limits how many of a step's tokens a row emits, and may end the row there;
* `commit` records the emitted tokens (`Emission`);
* `empty_output`, `gather` and `result` hand the feature's per-row output on, per
  prompt, into the `~specjax.GenerationResult`.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Emission:
    """One step's verified tokens, as the features see them before they are written.

    Attributes:
        block: ``int32[B, G]`` the step's chain: accepted drafts, the target's token,
            then ``-1``.
        num_emit: ``int32[B]`` tokens each row emits (0 for finished rows).
        num_accepted: ``int32[B]`` drafts the verifier accepted.
        num_drafted: ``int32[B]`` drafts the row proposed.
        start: ``int32[B]`` the slot of each row's first emitted token.
        active: ``bool[B]`` the row was running this step.
        probs: ``float32[B, G, V]`` the target's p that decided each position.
        logits: ``[B, G, V]`` the target's raw logits there.
    """

    block: jax.Array
    num_emit: jax.Array
    num_accepted: jax.Array
    num_drafted: jax.Array
    start: jax.Array
    active: jax.Array
    probs: jax.Array
    logits: jax.Array


class RowFeature:
    """A per-row part of the decoder. Subclass it as a ``flax.struct`` dataclass.

    Example (a feature counting each prompt's steps, defined in a user's file)::

        @struct.dataclass
        class StepCount(RowFeature):
            name = "step_count"

            def init(self, decoder, prompts_M, cache_len):
                return jnp.zeros(prompts_M.shape, jnp.int32)

            def commit(self, state, state_B, emission):
                return state_B + emission.active

            def empty_output(self, num_prompts, width):
                return jnp.zeros((num_prompts,), jnp.int32)

            def gather(self, state_B, slots_M, positions_MS, valid_MS):
                return state_B[slots_M]

            def result(self, state_B, out_N):
                return {"step_count": out_N}  # GenerationResult.extras["step_count"]
    """

    #: What the decoder calls the feature (unique among a decoder's features).
    name: ClassVar[str] = ""

    def init(self, decoder, prompts_M: jax.Array, cache_len: int):
        """The state of M rows starting prompts ``prompts_M`` (``int32[M]``): the first
        slots, or (M = 1) a slot a refill hands the next prompt.

        Every leaf carries the M rows on one axis (a refill writes the one-row state
        into its slot with `~specjax.decoding.slots.insert_row`), and a row's state
        depends on its own prompt only.
        """
        return None

    def history(self, state, state_B):
        """The rows' `~specjax.sampling.history.RowHistory` at the committed prefix, which
        changes their distributions (the drafter's q and the target's p), or ``None``."""
        return None

    def cut(self, state, state_B, block_BG: jax.Array):
        """``(int32[B], bool[B])``: at most how many of ``block``'s tokens a row may emit,
        and whether the row ends there; ``None`` for no limit."""
        return None

    def commit(self, state, state_B, emission: Emission):
        """The state after the step's tokens (``emission``) are emitted."""
        return state_B

    def empty_output(self, num_prompts: int, width: int):
        """The per-prompt output before any prompt is handed on (``[N, ...]`` leaves)."""
        return None

    def gather(self, state_B, slots_M, positions_MS, valid_MS):
        """Slots ``slots_M``' output (``[M, ...]`` leaves). ``positions_MS[m, s]`` is the
        slot of the row's s-th generated token, ``valid_MS`` whether it has one."""
        return None

    def result(self, state_B, out_N) -> dict:
        """`GenerationResult` fields from the per-prompt output; other keys go to
        ``GenerationResult.extras``."""
        return {}


def write_slots(buffer_BS, values_BT, start_B, count_B):
    """``buffer[b, start[b] + t] = values[b, t]`` for ``t < count[b]``; nothing else changes.

    ``buffer`` is ``[B, S, ...]`` and ``values`` ``[B, T, ...]`` (the same trailing axes).
    """
    b, t = values_BT.shape[:2]
    rows = jnp.arange(b)[:, None]
    slots = start_B[:, None] + jnp.arange(t)[None]
    keep = (jnp.arange(t)[None] < count_B[:, None]).reshape((b, t) + (1,) * (values_BT.ndim - 2))
    old = buffer_BS[rows, jnp.minimum(slots, buffer_BS.shape[1] - 1)]
    # mode="drop": a slot past the end of the buffer is never written (or clamped).
    return buffer_BS.at[rows, slots].set(jnp.where(keep, values_BT, old), mode="drop")


def gather_slots(buffer_BS, slots_M, positions_MS, valid_MS, fill):
    """``buffer[slots[m], positions[m, s]]`` where valid, else ``fill``: ``[M, S, ...]``."""
    rows = buffer_BS[slots_M]
    index = positions_MS.reshape(positions_MS.shape + (1,) * (rows.ndim - 2))
    values = jnp.take_along_axis(rows, index, axis=1)
    return jnp.where(valid_MS.reshape(index.shape), values, fill)


class BufferFeature(RowFeature):
    """A feature that records a value per emitted token in ``[B, S, ...]`` buffers.

    Subclasses name their buffers in `buffers` and compute the step's values in
    `values`; the buffers' per-prompt copies are `GenerationResult` fields of the
    same names.
    """

    def buffers(self) -> dict:
        """``{name: (dtype, trailing_shape, fill)}`` of each buffer."""
        raise NotImplementedError

    def values(self, state, emission: Emission) -> dict:
        """``{name: [B, G, ...]}``: the value at each of the step's positions."""
        raise NotImplementedError

    def init(self, decoder, prompts_M, cache_len):
        return self._filled(prompts_M.shape[0], cache_len)

    def commit(self, state, state_B, emission):
        new = self.values(state, emission)
        return {
            name: write_slots(x, new[name], emission.start, emission.num_emit)
            for name, x in state_B.items()
        }

    def empty_output(self, num_prompts, width):
        return self._filled(num_prompts, width)

    def gather(self, state_B, slots_M, positions_MS, valid_MS):
        return {
            name: gather_slots(x, slots_M, positions_MS, valid_MS, self.buffers()[name][2])
            for name, x in state_B.items()
        }

    def result(self, state_B, out_N):
        return dict(out_N)

    def _filled(self, rows: int, width: int) -> dict:
        return {
            name: jnp.full((rows, width, *shape), fill, dtype)
            for name, (dtype, shape, fill) in self.buffers().items()
        }
