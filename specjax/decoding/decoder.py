"""The `Decoder`: what stays fixed while a batch decodes, and the programs it runs.

`specjax.decoding.init` checks a call's inputs, builds their `Decoder`
(`specjax.decoding.build`) and returns it with the first `DecodeState`. The decoder
then advances the state (`Decoder.run`), reads it (`Decoder.result`) and streams it
(`Decoder.stream`). Its models and tables are traced and its options static; it is
an argument of each jitted program, never part of the state that the loop carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.typed_jit import typed_jit
from specjax.core.validation import INT32_MAX, check_int, is_concrete
from specjax.decoding.loop import run_loop
from specjax.decoding.refill import hand_on
from specjax.decoding.state import DecodeState, GenerationResult
from specjax.drafters.base import step_slots
from specjax.verification.verifiers import Rejection, Verifier


@struct.dataclass(kw_only=True)
class Decoder:
    """What stays fixed while a batch decodes: the models, the options and the features.

    Attributes:
        target: the target model (model contract).
        drafter: the `Drafter`; `~specjax.drafters.NoDraft` for plain decoding.
        features: the per-row `~specjax.decoding.features.RowFeature` parts, in the
            order they run (their tables are traced, their options static).
        eos_ids: ``int32[K]`` ids that end a row (``-1`` pads).
        draft_confidence: ``float32[]`` τ, or ``None``: a row stops proposing after
            its first draft whose own probability is below τ.
        verifier: static: the `~specjax.verification.verifiers.Verifier` of each step's
            chain (`Rejection` or `Coupled`; `Coupled` for plain decoding).
        gamma_table: static ``((max_active_rows, γ), ...)`` pairs, ascending: a step
            with ``a`` active rows drafts the γ of the first pair with
            ``a <= max_active_rows`` (the last pair beyond). Empty: always the
            drafter's γ.
        forward_width: static W: every target forward of the loop scores exactly W
            columns (`specjax.decoding.numerics`), or ``None``: each scores only what
            its step needs (1 for plain decoding, the step's verify width otherwise).
    """

    target: object
    drafter: object
    features: tuple = ()
    eos_ids: jax.Array
    draft_confidence: jax.Array | None = None
    verifier: Verifier = struct.field(pytree_node=False, default=Rejection())
    gamma_table: tuple[tuple[int, int], ...] = struct.field(pytree_node=False, default=())
    forward_width: int | None = struct.field(pytree_node=False, default=None)

    @property
    def lookahead(self) -> int:
        """Slots one step may write past a row's length: γ + 1 (N + 1 for a tree), or
        the forward width W when it is fixed."""
        return step_slots(self.drafter, self.forward_width)

    def feature_state(self, state: DecodeState, name: str):
        """The per-slot state of the feature called ``name`` in ``state``."""
        for feature, feature_state in zip(self.features, state.features, strict=True):
            if feature.name == name:
                return feature_state
        raise KeyError(f"no feature {name!r} in this decoder")

    def run(self, state: DecodeState, num_steps: int | None = None) -> DecodeState:
        """Runs up to ``num_steps`` iterations of the decode loop, or until every row is done.

        One jitted chunk of the same ``lax.while_loop`` that `specjax.generate` runs,
        with no host sync inside. ``num_steps`` is traced, so chunks of any size (and
        ``None``) share one compiled program. The state's buffers are donated: use the
        returned state.

        Args:
            state: from `specjax.decoding.init` or an earlier `run`.
            num_steps: iterations to run (an int >= 0; each emits 1 to γ+1 tokens per
                active row), or ``None``: until every row is done.

        Returns:
            the advanced `DecodeState`.

        Examples:
            >>> import specjax
            >>> model = specjax.testing.tiny_model(seed=0)
            >>> decoder, state = specjax.decoding.init(None, model, [[1, 2], [3]], max_new_tokens=5)
            >>> while not bool(state.done.all()):  # two iterations a chunk
            ...     state = decoder.run(state, 2)
            >>> int(state.step), decoder.result(state).lengths.tolist()
            (5, [5, 5])
        """
        if not isinstance(state, DecodeState):
            raise TypeError(
                "state must be the DecodeState that specjax.decoding.init returned with "
                f"this decoder, got {type(state).__name__}"
            )
        if num_steps is None:
            num_steps = INT32_MAX
        elif is_concrete(num_steps):
            num_steps = check_int("num_steps", num_steps, lo=0)
        return _run_jit(self, state, jnp.int32(num_steps))

    def result(self, state: DecodeState) -> GenerationResult:
        """The output so far: every prompt's generated tokens, lengths, flags and stats.

        Rows are prompts, in prompt order (also with fewer slots than prompts); a
        prompt not started yet has length 0. ``tokens`` has width
        ``max(max_new_tokens)`` (or what the cache can hold).
        """
        q = state.queue
        width = output_width(q.max_new_tokens, q.prompt_lengths, state.seq.shape[1])
        return trim(_result_jit(self, state), width)

    def stream(
        self, state: DecodeState, steps_per_chunk: int = 4
    ) -> Iterator[tuple[DecodeState, list[list[int]]]]:
        """Runs the loop chunk by chunk until every row is done, yielding the new tokens.

        Each iteration syncs with the host once (to read the new tokens), between
        chunks, never inside one.

        Args:
            state: from `specjax.decoding.init`; it is donated to the first chunk.
            steps_per_chunk: loop iterations per chunk.

        Yields:
            ``(state, new_tokens)``: the state after the chunk, and per prompt (in
            prompt order) the list of token ids generated in it (possibly empty). Use
            the last yielded state (e.g. with `result`); earlier ones are donated to
            the next chunk.

        Examples:
            >>> import jax, specjax
            >>> model = specjax.testing.tiny_model(seed=0)
            >>> decoder, state = specjax.decoding.init(None, model, [[1, 2]], max_new_tokens=6)
            >>> chunks = [new for _, new in decoder.stream(state, steps_per_chunk=2)]
            >>> sum(len(new[0]) for new in chunks)
            6
        """
        steps_per_chunk = check_int("steps_per_chunk", steps_per_chunk, lo=1)
        seen = np.asarray(_result_jit(self, state).lengths)
        while True:
            state = self.run(state, steps_per_chunk)
            out = _result_jit(self, state)
            tokens, lengths, done = jax.device_get((out.tokens, out.lengths, state.done))
            new = [row[s:e].tolist() for row, s, e in zip(tokens, seen, lengths, strict=True)]
            seen = lengths
            yield state, new
            # Refilling keeps every slot busy while prompts wait, so all slots done
            # means every prompt is.
            if done.all():
                return


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


# typed_jit, not jax.jit: models of different classes with the same fields must not
# share a compiled program (see specjax/core/typed_jit.py). The loop state is donated
# (its caches and buffers are updated in place, so a chunk needs no second copy of
# them: without donation peak memory doubles); the decoder (models and tables) is not,
# since the caller still holds it.
_run_jit = typed_jit(run_loop, donate_argnums=(1,))
_result_jit = typed_jit(gather_result)
