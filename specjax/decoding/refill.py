"""Filling the slots, on device: the first prefill, then refills as rows finish.

`_init_state` prefills the first ``num_slots`` prompts (in serving order) into the
slots of the `DecodeState` that `_unfilled_state` builds, with each feature's first
state. With more prompts than slots, `_refill` runs inside the decode loop after every
step: a finished slot hands its output on to the per-prompt buffers (`_hand_on`) and
`_load` prefills the next waiting prompt into it. The containers this moves data
between are `specjax.decoding.slots`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding.slots import PromptOutputs, PromptQueue, insert_row, serving_order
from specjax.decoding.state import Decoder, DecodeState, RowSettings, RowStatus
from specjax.drafters.base import prefill
from specjax.sampling import noise


def _init_state(*traced, cache_len: int, num_slots: int) -> DecodeState:
    """Prefills the first ``num_slots`` prompts into the slots (one batched forward).

    ``traced`` are `_unfilled_state`'s arguments, as `specjax.decoding.checks._prepare`
    returns them.
    """
    state = _unfilled_state(*traced, cache_len=cache_len, num_slots=num_slots)
    decoder, prompts_BP = state.decoder, state.queue.prompts[state.queue.slot_prompt]
    _, target_cache, features = prefill(
        decoder.target, prompts_BP, state.prompt_lengths, cache_len, decoder.drafter.target_layers
    )
    drafter_state = decoder.drafter.init(prompts_BP, state.prompt_lengths, cache_len, features)
    # Slots whose first prompt is done before it starts are handed on at once.
    return _refill(state.replace(target_cache=target_cache, drafter_state=drafter_state))


def _unfilled_state(
    key,
    decoder: Decoder,
    prompts_NP,
    prompt_lengths_N,
    max_new_N,
    sampling_N,
    seeds_N,
    *,
    cache_len: int,
    num_slots: int,
) -> DecodeState:
    """`_init_state`'s state before the prefill: the target's cache and the drafter's
    state are ``None``, every other buffer (each feature's state and output included)
    is built.

    It runs no model, so `specjax.decoding.build.state_bytes` sizes it from shapes.
    """
    num_prompts, p = prompts_NP.shape
    order_N = serving_order(max_new_N, num_slots)
    first_B = order_N[:num_slots]
    settings_N = RowSettings(
        keys=noise.row_keys(key, seeds_N), sampling=sampling_N, max_new_tokens=max_new_N
    )
    prompts_BP, prompt_lengths_B = prompts_NP[first_B], prompt_lengths_N[first_B]
    done, truncated = _starts_done(
        prompt_lengths_B, max_new_N[first_B], decoder.lookahead, cache_len
    )
    return DecodeState(
        decoder=decoder,
        seq=jnp.zeros((num_slots, cache_len), jnp.int32).at[:, :p].set(prompts_BP[:, :cache_len]),
        seq_lengths=prompt_lengths_B,
        prompt_lengths=prompt_lengths_B,
        status=RowStatus.starting(done, truncated),
        settings=jax.tree.map(lambda x_N: x_N[first_B], settings_N),
        target_cache=None,
        drafter_state=None,
        features=tuple(f.init(decoder, first_B, cache_len) for f in decoder.features),
        queue=PromptQueue(
            prompts=prompts_NP,
            prompt_lengths=prompt_lengths_N,
            settings=settings_N,
            order=order_N,
            next_prompt=jnp.asarray(num_slots, jnp.int32),
            slot_prompt=first_B,
        ),
        outputs=PromptOutputs.empty(num_prompts, cache_len, decoder.features),
    )


def _starts_done(prompt_lengths, max_new_tokens, slots_per_step: int, cache_len: int):
    """``(done, truncated)`` of rows before their first step.

    A traced budget <= 0 gives the row no tokens (the host refuses concrete ones); a
    prompt with no room for one step is truncated.
    """
    no_budget = max_new_tokens <= 0
    no_room = prompt_lengths + slots_per_step > cache_len
    return no_budget | no_room, no_room & ~no_budget


def _slot_outputs(state: DecodeState, slots_M) -> PromptOutputs:
    """Slots ``slots_M``' generated tokens gathered to ``[M, S]`` (padded with -1), with
    every feature's output.

    The full width keeps the output shape static per cache length, so that budgets of
    any size share the compiled program; `~specjax.decoding.build.output_width` then
    says how much to keep.
    """
    width = state.seq.shape[1]
    lengths_M = state.num_generated[slots_M]
    positions_MS = state.prompt_lengths[slots_M][:, None] + jnp.arange(width)[None]
    positions_MS = jnp.minimum(positions_MS, width - 1)
    valid_MS = jnp.arange(width)[None] < lengths_M[:, None]
    tokens_MS = jnp.take_along_axis(state.seq[slots_M], positions_MS, axis=1)
    features = state.decoder.features
    return PromptOutputs(
        tokens=jnp.where(valid_MS, tokens_MS, -1),
        lengths=lengths_M,
        truncated=state.status.truncated[slots_M],
        invalid=state.status.invalid[slots_M],
        features=tuple(
            f.gather(f_state, slots_M, positions_MS, valid_MS)
            for f, f_state in zip(features, state.features, strict=True)
        ),
    )


def _hand_on(state: DecodeState, slots_M) -> PromptOutputs:
    """The outputs with the prompts in slots ``slots_M`` (``int32[M]``) written out.

    Only those M rows are gathered: a refill hands on one slot, and must not cost a
    pass over every slot's buffers.
    """
    rows = state.queue.slot_prompt[slots_M]
    return state.outputs.write(rows, _slot_outputs(state, slots_M))


def _load(state: DecodeState, slot) -> DecodeState:
    """Prefills the next prompt served into slot ``slot`` (a one-row forward), resetting it.

    The slot's cache lengths, drafter state, token buffer, flags, budget, sampling
    settings, row key and every feature's row all come from the prompt, so its output
    is the one it would get in a slot of its own.
    """
    decoder, q = state.decoder, state.queue
    b, cache_len = state.seq.shape
    prompt = q.order[q.next_prompt]
    prompt_1P = jax.lax.dynamic_slice_in_dim(q.prompts, prompt, 1)
    length_1 = jax.lax.dynamic_slice_in_dim(q.prompt_lengths, prompt, 1)
    _, cache_1, features = prefill(
        decoder.target, prompt_1P, length_1, cache_len, decoder.drafter.target_layers
    )
    drafter_1 = decoder.drafter.init(prompt_1P, length_1, cache_len, features)
    settings = jax.tree.map(lambda x_N: x_N[prompt], q.settings)
    length = length_1[0]
    done, truncated = _starts_done(length, settings.max_new_tokens, decoder.lookahead, cache_len)
    row = jnp.zeros((cache_len,), jnp.int32).at[: prompt_1P.shape[1]].set(prompt_1P[0, :cache_len])
    put = lambda x_B, value: x_B.at[slot].set(value)  # noqa: E731
    status = RowStatus(done=done, truncated=truncated, invalid=jnp.asarray(False))
    return state.replace(
        seq=put(state.seq, row),
        seq_lengths=put(state.seq_lengths, length),
        prompt_lengths=put(state.prompt_lengths, length),
        status=jax.tree.map(put, state.status, status),
        settings=jax.tree.map(put, state.settings, settings),
        target_cache=insert_row(state.target_cache, cache_1, slot, b),
        drafter_state=insert_row(state.drafter_state, drafter_1, slot, b),
        features=tuple(
            f.reset(f_state, slot, prompt)
            for f, f_state in zip(decoder.features, state.features, strict=True)
        ),
        queue=q.replace(next_prompt=q.next_prompt + 1, slot_prompt=put(q.slot_prompt, prompt)),
    )


def _refill(state: DecodeState) -> DecodeState:
    """Hands every finished slot on to the next waiting prompt, on device.

    A slot whose new prompt is done at once (no budget, or no room) is handed on again
    in the same call. With one slot per prompt (N == B) nothing is compiled here.
    """
    b = state.seq.shape[0]
    if state.queue.num_prompts == b:
        return state

    def waiting(s):
        return jnp.any(s.done) & (s.queue.next_prompt < s.queue.num_prompts)

    def hand_on(s):
        slot = jnp.argmax(s.done)
        s = s.replace(outputs=_hand_on(s, slot[None]))
        return _load(s, slot)

    return jax.lax.while_loop(waiting, hand_on, state)
