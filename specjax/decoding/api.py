"""The decoders: the jitted programs and the public open- and closed-loop functions.

`generate` and `speculative_generate` (closed) check their inputs
(`specjax.decoding.checks._prepare`) and run prefill, the loop and the output gather
as one jitted program. `init`, `step`, `result` and `stream` (open) run the same
pieces as separate jitted programs, with the loop state donated between chunks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.typed_jit import typed_jit
from specjax.core.validation import check_int, is_concrete
from specjax.decoding.build import DecodeOptions, output_width
from specjax.decoding.checks import _prepare
from specjax.decoding.loop import _run
from specjax.decoding.refill import _hand_on, _init_state
from specjax.decoding.state import DecodeState, GenerationResult
from specjax.drafters.base import Drafter, NoDraft
from specjax.sampling import SamplingConfig

_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationResult))


def _result(state: DecodeState) -> GenerationResult:
    """Every prompt's output in prompt order: those handed on, plus those still in a slot.

    ``tokens`` and the per-position outputs are ``[N, S, ...]`` (padded); `output_width`
    says how much of the width to keep. Each feature's result fills the
    `GenerationResult` fields it names, the rest go to ``extras`` under their keys.
    """
    out = _hand_on(state, jnp.arange(state.seq.shape[0]))
    fields, extras = {}, {}
    features = zip(state.decoder.features, state.features, out.features, strict=True)
    for feature, feature_state, feature_out in features:
        for name, value in feature.result(feature_state, feature_out).items():
            (fields if name in _RESULT_FIELDS else extras)[name] = value
    return GenerationResult(
        tokens=out.tokens,
        lengths=out.lengths,
        truncated=out.truncated,
        invalid=out.invalid,
        extras=extras,
        **fields,
    )


def _trim(out: GenerationResult, width: int) -> GenerationResult:
    """``out`` with every per-position output (``[N, S, ...]``) cut to ``width`` columns."""
    full = out.tokens.shape[1]
    cut = lambda x: x[:, :width] if x.ndim >= 2 and x.shape[1] == full else x  # noqa: E731
    return jax.tree.map(cut, out)


_STATIC = ("cache_len", "num_slots")
# typed_jit, not jax.jit: models of different classes with the same fields must not
# share a compiled program (see specjax/core/typed_jit.py).
_decode_jit = typed_jit(
    lambda *a, **k: _result(_run(_init_state(*a, **k))), static_argnames=_STATIC
)
_init_jit = typed_jit(_init_state, static_argnames=_STATIC)
_result_jit = typed_jit(_result)


def _decode(key, target, drafter, prompts, options: DecodeOptions) -> GenerationResult:
    traced, static, width = _prepare(key, target, drafter, prompts, options)
    return _trim(_decode_jit(*traced, **static), width)


def _step_loop(decoder, loop_state: DecodeState, num_steps) -> DecodeState:
    out = _run(loop_state.replace(decoder=decoder), num_steps)
    return out.replace(decoder=None)


# The loop state is donated (its caches and buffers are updated in place, so a chunk
# needs no second copy of them: without donation peak memory doubles); the decoder
# (models and tables) is not, since the caller still holds it.
_step_jit = typed_jit(_step_loop, donate_argnums=(1,))


# ----------------------------------------------------------------------------
# The open loop.


def init(
    key: jax.Array | None,
    target,
    prompts,
    *,
    drafter: Drafter | None = None,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id=None,
    seeds=None,
    cache_len: int | None = None,
    verification: str = "rejection",
    num_slots: int | None = None,
    gamma_by_active_rows=None,
    draft_confidence: float | None = None,
    top_logprobs: int = 0,
    raw_logprobs: bool = False,
    stop=None,
    constraint=None,
    forward_width: int | None = None,
    features: Sequence = (),
) -> DecodeState:
    """Prefills the prompts and returns the `DecodeState` that `step` advances.

    Takes the arguments of `speculative_generate` (``drafter=None`` decodes plainly)
    and validates them the same way, before anything compiles.

    Examples:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> state = specjax.decoding.init(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=8)
        >>> state = specjax.decoding.step(state, 3)   # three steps
        >>> state = specjax.decoding.step(state, 100)  # the rest (stops when done)
        >>> specjax.decoding.result(state).tokens.shape
        (1, 8)
    """
    options = DecodeOptions.of_call(locals())
    drafter = NoDraft() if drafter is None else drafter
    traced, static, _ = _prepare(key, target, drafter, prompts, options)
    return _init_jit(*traced, **static)


def step(state: DecodeState, num_steps=1) -> DecodeState:
    """Runs up to ``num_steps`` iterations of the decode loop (fewer if every row is done).

    One jitted chunk of the same ``lax.while_loop`` that `generate` runs, with no host
    sync inside. ``num_steps`` is traced, so chunks of any size share one compiled
    program. The state's buffers are donated: use the returned state.

    Args:
        state: from `init` or a previous `step`.
        num_steps: iterations to run (an int >= 0; each emits 1 to γ+1 tokens per
            active row).

    Returns:
        the advanced `DecodeState`.
    """
    if not isinstance(state, DecodeState):
        raise TypeError(
            f"state must be a DecodeState from specjax.decoding.init, got {type(state).__name__}"
        )
    if is_concrete(num_steps):
        num_steps = check_int("num_steps", num_steps, lo=0)
    decoder = state.decoder
    out = _step_jit(decoder, state.replace(decoder=None), jnp.int32(num_steps))
    return out.replace(decoder=decoder)


def result(state: DecodeState) -> GenerationResult:
    """The output so far: every prompt's generated tokens, lengths, flags and stats.

    Rows are prompts, in prompt order (also with fewer slots than prompts); a prompt
    not started yet has length 0. ``tokens`` has width ``max(max_new_tokens)`` (or
    what the cache can hold).
    """
    q = state.queue
    width = output_width(q.max_new_tokens, q.prompt_lengths, state.seq.shape[1])
    return _trim(_result_jit(state), width)


def stream(
    state: DecodeState, steps_per_chunk: int = 4
) -> Iterator[tuple[DecodeState, list[list[int]]]]:
    """Runs `step` chunk by chunk until every row is done, yielding the new tokens.

    Each iteration syncs with the host once (to read the new tokens), between chunks,
    never inside one.

    Args:
        state: from `init`; it is donated to the first chunk.
        steps_per_chunk: loop iterations per chunk.

    Yields:
        ``(state, new_tokens)``: the state after the chunk, and per prompt (in prompt
        order) the list of token ids generated in it (possibly empty). Use the last
        yielded state (e.g. with `result`); earlier ones are donated to the next chunk.

    Examples:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> state = specjax.decoding.init(jax.random.key(0), model, [[1, 2]], max_new_tokens=6)
        >>> chunks = [new for _, new in specjax.decoding.stream(state, steps_per_chunk=2)]
        >>> sum(len(new[0]) for new in chunks)
        6
    """
    steps_per_chunk = check_int("steps_per_chunk", steps_per_chunk, lo=1)
    seen = np.asarray(_result_jit(state).lengths)
    while True:
        state = step(state, steps_per_chunk)
        out = _result_jit(state)
        tokens, lengths, done = jax.device_get((out.tokens, out.lengths, state.done))
        new = [row[s:e].tolist() for row, s, e in zip(tokens, seen, lengths, strict=True)]
        seen = lengths
        yield state, new
        # Refilling keeps every slot busy while prompts wait, so all slots done means
        # every prompt is.
        if done.all():
            return


# ----------------------------------------------------------------------------
# The closed loop.


def generate(
    key: jax.Array | None,
    model,
    prompts,
    *,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id=None,
    seeds=None,
    cache_len: int | None = None,
    num_slots: int | None = None,
    top_logprobs: int = 0,
    raw_logprobs: bool = False,
    stop=None,
    constraint=None,
    forward_width: int | None = None,
    features: Sequence = (),
) -> GenerationResult:
    """Plain autoregressive decoding: prefill, then one ``lax.while_loop``.

    The same loop as `speculative_generate` with the null drafter (γ = 0): each step
    emits the target's sample at the row's next position t, drawn with
    ``fold_in(fold_in(key, seeds[b]), t)``, so a row's tokens depend on its key, seed
    and prompt only, and coupled speculative decoding reproduces them token for token.
    Compiles once per (model, batch size, prompt width bucket of 16, ``cache_len``);
    the settings, budgets, EOS ids, seeds and prompt contents are traced.

    Args:
        key: one PRNG key, or ``None`` when every row is greedy (temperature 0, the
            default); a row that samples without a key raises ValueError.
        model: a model following the contract (e.g. :class:`specjax.Model`).
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens, sampling, eos_id, seeds, cache_len, num_slots: as in
            `speculative_generate`, and so are ``top_logprobs``, ``raw_logprobs``,
            ``stop``, ``constraint``, ``forward_width`` and ``features``.
            ``forward_width`` W makes every step score its token at column 0 of a
            W-wide forward, so that the output equals speculative decoding's at the
            same W token for token, in any precision.

    Returns:
        :class:`GenerationResult` with ``tokens int32[N, max(max_new_tokens)]``.

    Examples:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> greedy = specjax.generate(None, model, [[1, 2, 3]], max_new_tokens=5)  # no key
        >>> greedy.tokens.shape
        (1, 5)
        >>> sampled = specjax.generate(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=5,
        ...                            sampling=specjax.SamplingConfig(temperature=1.0))
        >>> sampled.tokens.shape
        (1, 5)
    """
    options = DecodeOptions.of_call(locals())
    return _decode(key, model, NoDraft(), prompts, options)


def speculative_generate(
    key: jax.Array | None,
    target,
    drafter: Drafter,
    prompts,
    *,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id=None,
    seeds=None,
    cache_len: int | None = None,
    verification: str = "rejection",
    num_slots: int | None = None,
    gamma_by_active_rows=None,
    draft_confidence: float | None = None,
    top_logprobs: int = 0,
    raw_logprobs: bool = False,
    stop=None,
    constraint=None,
    forward_width: int | None = None,
    features: Sequence = (),
) -> GenerationResult:
    """Speculative decoding in one jitted ``lax.while_loop``, exact in distribution.

    Each step the drafter proposes γ tokens per row, the target scores them in one
    forward, and the verifier keeps a prefix per row plus one target token.
    ``verification="rejection"`` accepts a draft with probability ``min(1, p/q)``: the
    output has exactly `generate`'s distribution. ``"coupled"`` draws drafts with the
    target's noise and accepts a draft iff it equals the target's sample: the output
    equals `generate`'s for the same key and seeds. `specjax.decoding` describes every
    argument in full.

    Args:
        key: one PRNG key, or ``None`` when every row is greedy (temperature 0, the
            default); a row that samples without a key raises ValueError.
        target: the target model (model contract).
        drafter: a :class:`~specjax.drafters.Drafter` sharing the target's ids.
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens per row (>= 1), EOS included: an int or ``int[B]``.
        sampling: :class:`SamplingConfig`, each setting a scalar or ``[B]`` (default:
            greedy, ``SamplingConfig()``).
        eos_id: optional id, or ``[K]`` ids, that end a row (it is emitted).
        seeds: optional ``int[B]`` per-row seeds (default: the row index).
        cache_len: static cache length S (default: the longest row's need, rounded up).
        verification: ``"rejection"`` or ``"coupled"``.
        num_slots: rows decoded at once (default: one per prompt); fewer slots than
            prompts refill finished slots on device (continuous batching).
        gamma_by_active_rows: optional ``{max_active_rows: γ}`` table of each step's γ.
        draft_confidence: optional τ in ``[0, 1]``: a row stops proposing after its
            first draft whose own probability is below τ.
        top_logprobs: static k: the k most probable ids at each emitted position.
        raw_logprobs: static: those from the raw logits' log-softmax.
        stop: stop strings (one list, or one per prompt), or a `specjax.StopStrings`.
        constraint: a `specjax.Constraint`, or one (or None) per prompt.
        forward_width: static W: every target forward scores exactly W columns.
        features: extra `~specjax.decoding.features.RowFeature` parts.

    Returns:
        :class:`GenerationResult` with ``tokens int32[N, max(max_new_tokens)]``.
    """
    options = DecodeOptions.of_call(locals())
    return _decode(key, target, drafter, prompts, options)
