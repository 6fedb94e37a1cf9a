"""The output: a decode state read as every prompt's `GenerationResult`.

`gather_result` collects it on device, full width (one compiled program per cache
length, whatever the budgets); `output_width` says how much of that width a call
keeps and `trim` cuts it there. `result` does all three for a state of the open loop;
the closed loop gathers inside its own program and trims after it
(`specjax.decoding.api`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.typed_jit import typed_jit
from specjax.core.validation import is_concrete
from specjax.decoding.decoder import Decoder
from specjax.decoding.refill import hand_on
from specjax.decoding.state import DecodeState, GenerationResult

_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationResult))


def gather_result(decoder: Decoder, state: DecodeState) -> GenerationResult:
    """Every prompt's output in prompt order: those handed on, plus those still in a slot.

    ``tokens`` and the per-position outputs are ``[N, S, ...]`` (padded); `output_width`
    says how much of the width to keep. Each feature's result fills the
    `GenerationResult` fields it names, the rest go to ``extras`` under their keys; the
    statistics' ``target_calls`` are the loop's iterations.
    """
    out = hand_on(decoder, state, jnp.arange(state.seq.shape[0]))
    fields, extras = {}, {}
    features = zip(decoder.features, state.features, out.features, strict=True)
    for feature, feature_state, feature_out in features:
        for name, value in feature.result(feature_state, feature_out).items():
            (fields if name in _RESULT_FIELDS else extras)[name] = value
    fields["stats"] = fields["stats"].replace(target_calls=state.step)
    return GenerationResult(
        tokens=out.tokens,
        lengths=out.lengths,
        truncated=out.truncated,
        invalid=out.invalid,
        extras=extras,
        **fields,
    )


# typed_jit, not jax.jit: models of different classes with the same fields must not
# share a compiled program (see specjax/core/typed_jit.py).
gather_result_jit = typed_jit(gather_result)


def result(decoder: Decoder, state: DecodeState) -> GenerationResult:
    """The output so far: every prompt's generated tokens, lengths, flags and stats.

    Rows are prompts, in prompt order (also with fewer slots than prompts); a
    prompt not started yet has length 0. ``tokens`` has width
    ``max(max_new_tokens)`` (or what the cache can hold).

    Args:
        decoder: the `~specjax.decoding.Decoder` from `specjax.decoding.init`.
        state: its `DecodeState`, at any point of the loop (it is not donated).

    Returns:
        the `GenerationResult` of every prompt.
    """
    q = state.queue
    width = output_width(q.max_new_tokens, q.prompt_lengths, state.seq.shape[1])
    return trim(gather_result_jit(decoder, state), width)


def trim(out: GenerationResult, width: int) -> GenerationResult:
    """``out`` with every per-position output (``[N, S, ...]``) cut to ``width`` columns."""
    full = out.tokens.shape[1]
    cut = lambda x: x[:, :width] if x.ndim >= 2 and x.shape[1] == full else x  # noqa: E731
    return jax.tree.map(cut, out)


def output_width(max_new_B, prompt_lengths_B, cache_len: int) -> int:
    """The result's width: the largest budget, or the most a row can hold, whichever is
    smaller.

    Never a ``[B, 10**9]`` buffer for a 64-slot cache. With traced budgets or prompt
    lengths (inside a user's jit) it is the cache length.
    """
    if not (is_concrete(max_new_B) and is_concrete(prompt_lengths_B)):
        return cache_len
    room = cache_len - int(np.min(prompt_lengths_B))
    return max(0, min(int(np.max(max_new_B)), room))
