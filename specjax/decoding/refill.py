"""Filling the slots, on device: one function builds a row's state, for the first
slots and for every refill.

`start_rows` builds the per-slot part of the `DecodeState` for the prompts it is
given: their prefill (one batched forward), the drafter's state, the token buffer,
flags, settings and every feature's first state. `init_state` runs it for the first
``num_slots`` prompts (in serving order). With more prompts than slots, `refill` runs
inside the decode loop after every step: a finished slot hands its output on to the
per-prompt buffers (`hand_on`), and the one row `start_rows` builds for the next
waiting prompt is written into that slot (`~specjax.decoding.slots.insert_row`), so a
refilled row starts exactly as a first one does. The containers this moves data
between are `specjax.decoding.slots`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.decoder import Decoder
from specjax.decoding.slots import PromptOutputs, PromptQueue, insert_row, serving_order
from specjax.decoding.state import DecodeState, RowSettings, RowStatus
from specjax.models.forward import prefill
from specjax.sampling import noise


@struct.dataclass
class PromptInputs:
    """A call's checked prompts and per-prompt settings, as `init_state` takes them.

    Attributes:
        key: the call's PRNG key (a fixed one when every row is greedy).
        prompts: ``int32[N, P]`` right-padded prompts (P a bucket multiple).
        prompt_lengths: ``int32[N]``.
        max_new_tokens: ``int32[N]`` each prompt's token budget.
        sampling: the `~specjax.sampling.SamplingConfig` with ``[N]`` leaves.
        seeds: ``int32[N]`` each prompt's seed.
    """

    key: jax.Array
    prompts: jax.Array
    prompt_lengths: jax.Array
    max_new_tokens: jax.Array
    sampling: object
    seeds: jax.Array


def queue_of(inputs: PromptInputs, num_slots: int) -> PromptQueue:
    """The `PromptQueue` of the prompts, the first ``num_slots`` served in the slots."""
    order_N = serving_order(inputs.max_new_tokens, num_slots)
    settings_N = RowSettings(
        keys=noise.row_keys(inputs.key, inputs.seeds),
        sampling=inputs.sampling,
        max_new_tokens=inputs.max_new_tokens,
    )
    return PromptQueue(
        prompts=inputs.prompts,
        prompt_lengths=inputs.prompt_lengths,
        settings=settings_N,
        order=order_N,
        next_prompt=jnp.asarray(num_slots, jnp.int32),
        slot_prompt=order_N[:num_slots],
    )


def start_rows(
    decoder: Decoder, queue: PromptQueue, prompts_M, cache_len: int, *, run_models: bool = True
) -> dict:
    """The per-slot fields of a `DecodeState` whose M rows start prompts ``prompts_M``.

    ``prompts_M`` is ``int32[M]`` (prompt indices). The rows are prefilled in one
    forward; each row's fields depend on its own prompt only, so a row built alone (a
    refill) equals the same row built with others.

    Args:
        decoder: the `Decoder`.
        queue: the call's `PromptQueue`.
        prompts_M: ``int32[M]`` the prompts the rows start.
        cache_len: the static cache length S.
        run_models: ``False`` leaves the target's cache and the drafter's state
            ``None`` (no model runs): the shapes of everything else, for the memory
            estimate.

    Returns:
        ``{field: value}`` for `DecodeState`'s per-slot fields, each ``[M, ...]``.
    """
    prompts_MP, lengths_M = queue.prompts[prompts_M], queue.prompt_lengths[prompts_M]
    settings_M = jax.tree.map(lambda x_N: x_N[prompts_M], queue.settings)
    done, truncated = _starts_done(
        lengths_M, settings_M.max_new_tokens, decoder.step_slots, cache_len
    )
    target_cache = drafter_state = None
    if run_models:
        drafter = decoder.drafter
        target_cache, hidden = prefill(
            decoder.target, prompts_MP, lengths_M, cache_len, drafter.target_layers
        )
        drafter_state = drafter.init(prompts_MP, lengths_M, cache_len, hidden)
    seq_MS = jnp.zeros((prompts_MP.shape[0], cache_len), jnp.int32)
    return dict(
        seq=seq_MS.at[:, : prompts_MP.shape[1]].set(prompts_MP[:, :cache_len]),
        seq_lengths=lengths_M,
        prompt_lengths=lengths_M,
        status=RowStatus.starting(done, truncated),
        settings=settings_M,
        target_cache=target_cache,
        drafter_state=drafter_state,
        features=tuple(f.init(decoder, prompts_M, cache_len) for f in decoder.features),
    )


def init_state(
    decoder: Decoder,
    inputs: PromptInputs,
    *,
    cache_len: int,
    num_slots: int,
    run_models: bool = True,
) -> DecodeState:
    """The first state: the first ``num_slots`` prompts started in the slots.

    Slots whose first prompt is done before it starts (no budget, or no room) are
    handed on at once. ``run_models=False``: the state before any model runs
    (`start_rows`), for the memory estimate.
    """
    queue = queue_of(inputs, num_slots)
    rows = start_rows(decoder, queue, queue.slot_prompt, cache_len, run_models=run_models)
    state = DecodeState(
        step=jnp.zeros((), jnp.int32),
        queue=queue,
        outputs=PromptOutputs.empty(queue.num_prompts, cache_len, decoder.features),
        **rows,
    )
    return refill(decoder, state) if run_models else state


def _starts_done(prompt_lengths, max_new_tokens, slots_per_step: int, cache_len: int):
    """``(done, truncated)`` of rows before their first step.

    A traced budget <= 0 gives the row no tokens (the host refuses concrete ones); a
    prompt with no room for one step is truncated.
    """
    no_budget = max_new_tokens <= 0
    no_room = prompt_lengths + slots_per_step > cache_len
    return no_budget | no_room, no_room & ~no_budget


def _slot_outputs(decoder: Decoder, state: DecodeState, slots_M) -> PromptOutputs:
    """Slots ``slots_M``' generated tokens gathered to ``[M, S]`` (padded with -1), with
    every feature's output.

    The full width keeps the output shape static per cache length, so that budgets of
    any size share the compiled program; `~specjax.decoding.output.output_width` then
    says how much to keep.
    """
    width = state.seq.shape[1]
    lengths_M = state.num_generated[slots_M]
    positions_MS = state.prompt_lengths[slots_M][:, None] + jnp.arange(width)[None]
    positions_MS = jnp.minimum(positions_MS, width - 1)
    valid_MS = jnp.arange(width)[None] < lengths_M[:, None]
    tokens_MS = jnp.take_along_axis(state.seq[slots_M], positions_MS, axis=1)
    return PromptOutputs(
        tokens=jnp.where(valid_MS, tokens_MS, -1),
        lengths=lengths_M,
        truncated=state.status.truncated[slots_M],
        invalid=state.status.invalid[slots_M],
        features=tuple(
            f.gather(f_state, slots_M, positions_MS, valid_MS)
            for f, f_state in zip(decoder.features, state.features, strict=True)
        ),
    )


def hand_on(decoder: Decoder, state: DecodeState, slots_M) -> PromptOutputs:
    """The outputs with the prompts in slots ``slots_M`` (``int32[M]``) written out.

    Only those M rows are gathered: a refill hands on one slot, and must not cost a
    pass over every slot's buffers.
    """
    rows = state.queue.slot_prompt[slots_M]
    return state.outputs.write(rows, _slot_outputs(decoder, state, slots_M))


def refill(decoder: Decoder, state: DecodeState) -> DecodeState:
    """Hands every finished slot on to the next waiting prompt, on device.

    The slot's output goes to the per-prompt buffers, and the row `start_rows` builds
    for the next prompt (a one-row prefill) is written into the slot. A slot whose new
    prompt is done at once (no budget, or no room) is handed on again in the same
    call. With one slot per prompt (N == B) nothing is compiled here.
    """
    b, cache_len = state.seq.shape
    if state.queue.num_prompts == b:
        return state

    def waiting(s):
        return jnp.any(s.done) & (s.queue.next_prompt < s.queue.num_prompts)

    def next_prompt(s):
        slot, q = jnp.argmax(s.done), s.queue
        prompt = q.order[q.next_prompt]
        row = start_rows(decoder, q, prompt[None], cache_len)
        slots = insert_row({name: getattr(s, name) for name in row}, row, slot, b)
        return s.replace(
            outputs=hand_on(decoder, s, slot[None]),
            queue=q.replace(
                next_prompt=q.next_prompt + 1, slot_prompt=q.slot_prompt.at[slot].set(prompt)
            ),
            **slots,
        )

    return jax.lax.while_loop(waiting, next_prompt, state)
