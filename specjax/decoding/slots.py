"""Continuous batching: more prompts than slots, refilled inside the decode loop.

The decode loop runs ``B`` *slots*. With ``N > B`` prompts, a slot whose row has
finished hands its output to a per-prompt buffer and takes the next prompt, all on
device, inside the same ``lax.while_loop``: no host round trip, no recompilation. The
state the decoder keeps for this is two small pytrees:

* `PromptQueue`: the ``N`` prompts with their per-prompt settings (budget, sampling,
  row key) and which prompt each slot is serving;
* `PromptOutputs`: the ``[N, S]`` output buffers, filled as rows finish.

Everything that identifies a row's randomness and settings travels with the prompt,
not the slot, so a prompt's output does not depend on which slot served it or when
(with the default per-row-local settings; see `specjax.decoding`).

`insert_row` writes a one-row pytree (a freshly prefilled cache or drafter state)
into slot ``b`` of a batched one, for any pytree whose leaves carry the batch on one
axis, so caches of models following the model contract need no refill support of
their own.

The functions that fill and refill the slots on device are
`specjax.decoding.refill`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class PromptQueue:
    """The prompts one decode call serves, in prompt order.

    Attributes:
        prompts: ``int32[N, P]`` right-padded prompts.
        prompt_lengths: ``int32[N]``.
        settings: each prompt's `~specjax.decoding.state.RowSettings` (``[N]`` leaves).
        order: ``int32[N]`` the prompts in the order they are served.
        next_prompt: ``int32[]`` how many prompts have been started (``N`` once all
            have); the next one is ``order[next_prompt]``.
        slot_prompt: ``int32[B]`` the prompt each slot serves.
    """

    prompts: jax.Array
    prompt_lengths: jax.Array
    settings: object
    order: jax.Array
    next_prompt: jax.Array
    slot_prompt: jax.Array

    @property
    def max_new_tokens(self) -> jax.Array:
        """``int32[N]`` each prompt's token budget."""
        return self.settings.max_new_tokens

    @property
    def num_prompts(self) -> int:
        """N, the number of prompts (static)."""
        return self.prompts.shape[0]


def serving_order(max_new_tokens_N: jax.Array, num_slots: int) -> jax.Array:
    """``int32[N]``: longest budget first (stable), when prompts outnumber slots.

    The loop's idle row-steps are the tail, when no prompt is left to refill a finished
    slot and the others drain: serving the longest budgets first leaves the shortest
    for the tail (longest-processing-time-first scheduling). Outputs come back in
    prompt order whatever the order served. With one slot per prompt nothing waits,
    and slot ``b`` serves prompt ``b``.
    """
    n = max_new_tokens_N.shape[0]
    if n == num_slots:
        return jnp.arange(n, dtype=jnp.int32)
    return jnp.argsort(-max_new_tokens_N, stable=True).astype(jnp.int32)


@struct.dataclass
class PromptOutputs:
    """Per-prompt results, written when a prompt's slot is handed on (or at the end).

    Attributes:
        tokens: ``int32[N, S]`` generated tokens, ``-1`` after each prompt's length.
        lengths: ``int32[N]`` tokens generated per prompt.
        truncated: ``bool[N]``.
        invalid: ``bool[N]``.
        features: each feature's per-prompt output (`RowFeature.empty_output`), in
            the decoder's feature order.
    """

    tokens: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    invalid: jax.Array
    features: tuple

    @classmethod
    def empty(cls, num_prompts: int, width: int, features: tuple) -> PromptOutputs:
        flags = jnp.zeros((num_prompts,), bool)
        return cls(
            tokens=jnp.full((num_prompts, width), -1, jnp.int32),
            lengths=jnp.zeros((num_prompts,), jnp.int32),
            truncated=flags,
            invalid=flags,
            features=tuple(f.empty_output(num_prompts, width) for f in features),
        )

    def write(self, rows_M: jax.Array, values: PromptOutputs) -> PromptOutputs:
        """Writes row ``m`` of ``values`` (``[M, ...]`` leaves) to prompt ``rows_M[m]``."""
        return jax.tree.map(lambda out, v: out.at[rows_M].set(v), self, values)


def insert_row(batched, row, index: jax.Array, batch_size: int):
    """Writes the one-row pytree ``row`` into row ``index`` of ``batched``.

    Each leaf of ``batched`` carries the batch on the one axis where its shape differs
    from the matching leaf of ``row`` (size ``batch_size`` there, 1 in ``row``): e.g. a
    `~specjax.models.cache.KVCache`'s ``k [L, B, K, D, S]`` and ``lengths [B]``. A leaf
    with equal shapes has no batch axis and is kept (replaced when ``batch_size`` is 1).

    Raises:
        TypeError (at trace time) naming the leaf when its shapes do not fit that rule.
    """

    def put(path, x, x_1):
        # (PRNG key arrays have no astype: rows of one dtype are written as they are.)
        x_1 = x_1 if x_1.dtype == x.dtype else x_1.astype(x.dtype)
        if x.shape == x_1.shape:
            return x_1 if batch_size == 1 else x
        axes = [i for i, (a, c) in enumerate(zip(x.shape, x_1.shape, strict=False)) if a != c]
        if (
            x.ndim != x_1.ndim
            or len(axes) != 1
            or x_1.shape[axes[0]] != 1
            or (x.shape[axes[0]] != batch_size)
        ):
            raise TypeError(
                f"cannot refill a slot of {jax.tree_util.keystr(path)}: a one-row state "
                f"of shape {list(x_1.shape)} does not match the {batch_size}-row shape "
                f"{list(x.shape)} on exactly one batch axis"
            )
        return jax.lax.dynamic_update_slice_in_dim(x, x_1, index, axes[0])

    return jax.tree_util.tree_map_with_path(put, batched, row)
