"""Filling the slots, on device: the first prefill, then refills as rows finish.

`_init_state` prefills the first ``num_slots`` prompts (in serving order) into the
slots and builds the `DecodeState`. With more prompts than slots, `_refill` runs
inside the decode loop after every step: a finished slot hands its output on to the
per-prompt buffers (`_hand_on`) and `_load` prefills the next waiting prompt into
it. The containers this moves data between are `specjax.decoding.slots`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import noise
from specjax.decoding.slots import PromptOutputs, PromptQueue, insert_row, serving_order
from specjax.decoding.state import DecodeState, GenerationStats
from specjax.drafters.base import prefill, step_slots


def _init_state(
    key, target, drafter, prompts_NP, prompt_lengths_N, max_new_N, sampling_N, eos_K, seeds_N,
    draft_confidence, stop=None, constraint=None, *, cache_len, verification, num_slots,
    gamma_table, top_logprobs=0, raw_logprobs=False, forward_width=None,
) -> DecodeState:  # fmt: skip
    """Prefills the first ``num_slots`` prompts into the slots (one batched forward)."""
    b = num_slots
    num_prompts, p = prompts_NP.shape
    order_N = serving_order(max_new_N, b)
    first = lambda x: x[order_N[:b]]  # noqa: E731
    prompts_BP, prompt_lengths_B, max_new_B = map(first, (prompts_NP, prompt_lengths_N, max_new_N))
    row_keys_N = noise.row_keys(key, seeds_N)
    _, target_cache, features = prefill(
        target, prompts_BP, prompt_lengths_B, cache_len, drafter.target_layers
    )
    drafter_state = drafter.init(prompts_BP, prompt_lengths_B, cache_len, features)
    zeros = jnp.zeros((b,), jnp.int32)
    done, truncated = _starts_done(
        prompt_lengths_B, max_new_B, step_slots(drafter, forward_width), cache_len
    )
    state = DecodeState(
        target=target,
        drafter=drafter,
        verification=verification,
        seq=jnp.zeros((b, cache_len), jnp.int32).at[:, :p].set(prompts_BP[:, :cache_len]),
        seq_lengths=prompt_lengths_B,
        prompt_lengths=prompt_lengths_B,
        from_draft=jnp.zeros((b, cache_len), bool),
        logprobs=jnp.zeros((b, cache_len), jnp.float32),
        top_ids=jnp.full((b, cache_len, top_logprobs), -1, jnp.int32),
        top_logprobs=jnp.zeros((b, cache_len, top_logprobs), jnp.float32),
        raw_logprobs=raw_logprobs,
        stop=stop,
        constraint=constraint,
        automaton_state=None if constraint is None else first(constraint.initial),
        done=done,
        truncated=truncated,
        invalid=jnp.zeros((b,), bool),
        target_cache=target_cache,
        drafter_state=drafter_state,
        row_keys=first(row_keys_N),
        sampling=jax.tree.map(first, sampling_N),
        max_new_tokens=max_new_B,
        eos_ids=eos_K,
        stats=GenerationStats(
            target_calls=jnp.zeros((), jnp.int32),
            row_target_calls=zeros,
            drafted=zeros,
            accepted=zeros,
            accepted_hist=jnp.zeros((drafter.num_draft + 1,), jnp.int32),
            position_drafted=jnp.zeros((drafter.num_draft,), jnp.int32),
            position_reached=jnp.zeros((drafter.num_draft,), jnp.int32),
            position_accepted=jnp.zeros((drafter.num_draft,), jnp.int32),
        ),
        queue=PromptQueue(
            prompts=prompts_NP,
            prompt_lengths=prompt_lengths_N,
            max_new_tokens=max_new_N,
            sampling=sampling_N,
            row_keys=row_keys_N,
            order=order_N,
            next_prompt=jnp.asarray(b, jnp.int32),
            slot_prompt=order_N[:b],
        ),
        outputs=PromptOutputs.empty(num_prompts, cache_len, top_logprobs),
        gamma_table=gamma_table,
        draft_confidence=draft_confidence,
        forward_width=forward_width,
    )
    # Slots whose first prompt is done before it starts are handed on at once.
    return _refill(state)


def _starts_done(prompt_lengths, max_new_tokens, slots_per_step: int, cache_len: int):
    """``(done, truncated)`` of rows before their first step.

    A traced budget <= 0 gives the row no tokens (the host refuses concrete ones); a
    prompt with no room for one step is truncated.
    """
    no_budget = max_new_tokens <= 0
    no_room = prompt_lengths + slots_per_step > cache_len
    return no_budget | no_room, no_room & ~no_budget


def _slot_outputs(state: DecodeState, slots_M) -> PromptOutputs:
    """Slots ``slots_M``' generated tokens gathered to ``[M, S]`` (padded with -1), with flags.

    The full width keeps the output shape static per cache length, so that budgets of
    any size share the compiled program; `~specjax.decoding.checks._output_width` then
    says how much to keep.
    """
    width = state.seq.shape[1]
    take = lambda x_B: x_B[slots_M]  # noqa: E731
    lengths = take(state.num_generated)
    idx = take(state.prompt_lengths)[:, None] + jnp.arange(width)[None]
    valid = jnp.arange(width)[None] < lengths[:, None]
    idx = jnp.minimum(idx, width - 1)
    gather = lambda buffer: jnp.take_along_axis(take(buffer), idx, axis=1)  # noqa: E731
    # [M, S, k] buffers: the same slots, every one of the k entries.
    gather_k = lambda buffer: jnp.take_along_axis(take(buffer), idx[..., None], axis=1)  # noqa: E731
    stats = state.stats
    return PromptOutputs(
        tokens=jnp.where(valid, gather(state.seq), -1),
        from_draft=valid & gather(state.from_draft),
        logprobs=jnp.where(valid, gather(state.logprobs), 0.0),
        top_ids=jnp.where(valid[..., None], gather_k(state.top_ids), -1),
        top_logprobs=jnp.where(valid[..., None], gather_k(state.top_logprobs), 0.0),
        lengths=lengths,
        truncated=take(state.truncated),
        invalid=take(state.invalid),
        row_target_calls=take(stats.row_target_calls),
        drafted=take(stats.drafted),
        accepted=take(stats.accepted),
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

    The slot's cache lengths, drafter state, token buffer, flags, counters, budget,
    sampling settings and row key all come from the prompt, so its output is the one
    it would get in a slot of its own.
    """
    target, drafter, q = state.target, state.drafter, state.queue
    b, cache_len = state.seq.shape
    prompt = q.order[q.next_prompt]
    take = lambda x_N: jax.lax.dynamic_index_in_dim(x_N, prompt, keepdims=False)  # noqa: E731
    prompt_1P = jax.lax.dynamic_slice_in_dim(q.prompts, prompt, 1)
    length_1 = jax.lax.dynamic_slice_in_dim(q.prompt_lengths, prompt, 1)
    _, cache_1, features = prefill(target, prompt_1P, length_1, cache_len, drafter.target_layers)
    drafter_1 = drafter.init(prompt_1P, length_1, cache_len, features)
    length, max_new = length_1[0], take(q.max_new_tokens)
    done, truncated = _starts_done(length, max_new, state.lookahead, cache_len)
    row = jnp.zeros((cache_len,), jnp.int32).at[: prompt_1P.shape[1]].set(prompt_1P[0, :cache_len])
    put = lambda x_B, value: x_B.at[slot].set(value)  # noqa: E731
    stats = state.stats
    if state.constraint is not None:
        state = state.replace(
            automaton_state=put(state.automaton_state, take(state.constraint.initial))
        )
    return state.replace(
        seq=put(state.seq, row),
        seq_lengths=put(state.seq_lengths, length),
        prompt_lengths=put(state.prompt_lengths, length),
        from_draft=put(state.from_draft, False),
        logprobs=put(state.logprobs, 0.0),
        top_ids=put(state.top_ids, -1),
        top_logprobs=put(state.top_logprobs, 0.0),
        done=put(state.done, done),
        truncated=put(state.truncated, truncated),
        invalid=put(state.invalid, False),
        target_cache=insert_row(state.target_cache, cache_1, slot, b),
        drafter_state=insert_row(state.drafter_state, drafter_1, slot, b),
        row_keys=put(state.row_keys, take(q.row_keys)),
        sampling=jax.tree.map(lambda x_B, x_N: put(x_B, take(x_N)), state.sampling, q.sampling),
        max_new_tokens=put(state.max_new_tokens, max_new),
        stats=stats.replace(
            row_target_calls=put(stats.row_target_calls, 0),
            drafted=put(stats.drafted, 0),
            accepted=put(stats.accepted, 0),
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
