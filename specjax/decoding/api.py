"""The decoders: the public open- and closed-loop functions.

`generate` and `speculative_generate` (closed) check their inputs
(`specjax.decoding.checks.prepare`) and run prefill, the loop and the output gather
as one jitted program. `init` (open) checks the same inputs and returns the
`~specjax.decoding.Decoder` with its first state; `run` then advances the state in
separate jitted chunks, with the loop state donated between them, and `stream` runs
it chunk by chunk, yielding the new tokens. `specjax.decoding.result` reads
the output at any point.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.typed_jit import typed_jit
from specjax.core.validation import INT32_MAX, check_int, is_concrete
from specjax.decoding.build import DecodeOptions, takes_options
from specjax.decoding.checks import prepare
from specjax.decoding.decoder import Decoder
from specjax.decoding.loop import run_loop
from specjax.decoding.output import gather_result, gather_result_jit, trim
from specjax.decoding.refill import init_state
from specjax.decoding.state import DecodeState, GenerationResult
from specjax.drafters.base import Drafter, NoDraft
from specjax.sampling import SamplingConfig


def _generate(decoder, inputs, *, cache_len: int, num_slots: int) -> GenerationResult:
    state = init_state(decoder, inputs, cache_len=cache_len, num_slots=num_slots)
    return gather_result(decoder, run_loop(decoder, state))


_STATIC = ("cache_len", "num_slots")
# typed_jit, not jax.jit: models of different classes with the same fields must not
# share a compiled program (see specjax/core/typed_jit.py).
_generate_jit = typed_jit(_generate, static_argnames=_STATIC)
_init_jit = typed_jit(init_state, static_argnames=_STATIC)
# The loop state is donated (its caches and buffers are updated in place, so a chunk
# needs no second copy of them: without donation peak memory doubles); the decoder
# (models and tables) is not, since the caller still holds it.
_run_jit = typed_jit(run_loop, donate_argnums=(1,))


def _decode(key, target, drafter, prompts, options: DecodeOptions) -> GenerationResult:
    p = prepare(key, target, drafter, prompts, options)
    out = _generate_jit(p.decoder, p.inputs, cache_len=p.cache_len, num_slots=p.num_slots)
    return trim(out, p.width)


# ----------------------------------------------------------------------------
# The open loop.


@takes_options
def init(
    key: jax.Array | None, target, prompts, *, drafter: Drafter | None = None, **options
) -> tuple[Decoder, DecodeState]:
    """Prefills the prompts: the `~specjax.decoding.Decoder` and its first `DecodeState`.

    Takes the arguments of `speculative_generate` (``drafter=None`` decodes plainly)
    and validates them the same way, before anything compiles. The decoder holds what
    stays fixed (the models, the options, the features); the state is what the loop
    carries. Advance the state with `run` and read it with `specjax.decoding.result`
    (or `stream` both).

    Returns:
        ``(decoder, state)``.

    Examples:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> decoder, state = specjax.decoding.init(None, model, [[1, 2, 3]], max_new_tokens=8)
        >>> state = specjax.decoding.run(decoder, state, 3)  # three steps
        >>> state = specjax.decoding.run(decoder, state)     # the rest
        >>> specjax.decoding.result(decoder, state).tokens.shape
        (1, 8)
    """
    options = DecodeOptions.of_keywords("init", options)
    drafter = NoDraft() if drafter is None else drafter
    p = prepare(key, target, drafter, prompts, options)
    return p.decoder, _init_jit(p.decoder, p.inputs, cache_len=p.cache_len, num_slots=p.num_slots)


def run(decoder: Decoder, state: DecodeState, num_steps: int | None = None) -> DecodeState:
    """Runs up to ``num_steps`` iterations of the decode loop, or until every row is done.

    One jitted chunk of the same ``lax.while_loop`` that `specjax.generate` runs,
    with no host sync inside. ``num_steps`` is traced, so chunks of any size (and
    ``None``) share one compiled program. The state's buffers are donated: use the
    returned state.

    Args:
        decoder: the `~specjax.decoding.Decoder` from `init`.
        state: from `init` or an earlier `run`.
        num_steps: iterations to run (an int >= 0; each emits 1 to γ+1 tokens per
            active row), or ``None``: until every row is done.

    Returns:
        the advanced `DecodeState`.

    Examples:
        >>> import specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> decoder, state = specjax.decoding.init(None, model, [[1, 2], [3]], max_new_tokens=5)
        >>> while not bool(state.done.all()):  # two iterations a chunk
        ...     state = specjax.decoding.run(decoder, state, 2)
        >>> int(state.step), specjax.decoding.result(decoder, state).lengths.tolist()
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
    return _run_jit(decoder, state, jnp.int32(num_steps))


def stream(
    decoder: Decoder, state: DecodeState, steps_per_chunk: int = 4
) -> Iterator[tuple[DecodeState, list[list[int]]]]:
    """Runs the loop chunk by chunk until every row is done, yielding the new tokens.

    Each iteration syncs with the host once (to read the new tokens), between
    chunks, never inside one.

    Args:
        decoder: the `~specjax.decoding.Decoder` from `init`.
        state: from `init`; it is donated to the first chunk.
        steps_per_chunk: loop iterations per chunk.

    Yields:
        ``(state, new_tokens)``: the state after the chunk, and per prompt (in
        prompt order) the list of token ids generated in it (possibly empty). Use
        the last yielded state (e.g. with `specjax.decoding.result`); earlier
        ones are donated to the next chunk.

    Examples:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> decoder, state = specjax.decoding.init(None, model, [[1, 2]], max_new_tokens=6)
        >>> chunks = [new for _, new in specjax.decoding.stream(decoder, state, steps_per_chunk=2)]
        >>> sum(len(new[0]) for new in chunks)
        6
    """
    steps_per_chunk = check_int("steps_per_chunk", steps_per_chunk, lo=1)
    # Full width: each row is read only up to its length.
    seen = np.asarray(gather_result_jit(decoder, state).lengths)
    while True:
        state = run(decoder, state, steps_per_chunk)
        out = gather_result_jit(decoder, state)
        tokens, lengths, done = jax.device_get((out.tokens, out.lengths, state.done))
        new = [row[s:e].tolist() for row, s, e in zip(tokens, seen, lengths, strict=True)]
        seen = lengths
        yield state, new
        # Refilling keeps every slot busy while prompts wait, so all slots done
        # means every prompt is.
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


@takes_options
def speculative_generate(
    key: jax.Array | None, target, drafter: Drafter, prompts, **options
) -> GenerationResult:
    """Speculative decoding in one jitted ``lax.while_loop``, exact in distribution.

    Each step the drafter proposes γ tokens per row, the target scores them in one
    forward, and the verifier keeps a prefix per row plus one target token.
    ``verification="rejection"`` accepts a draft with probability ``min(1, p/q)``: the
    output has exactly `generate`'s distribution. ``"coupled"`` draws drafts with the
    target's noise and accepts a draft iff it equals the target's sample: the output
    equals `generate`'s for the same key and seeds. ``"block"`` judges the chain as a
    whole (Sun et al. 2025): exact, and at least as many drafts kept on average as
    ``"rejection"``. `specjax.decoding` describes every argument in full.

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
        verification: ``"block"`` (a chain judged as a whole,
            `specjax.verification.block`; not for trees), ``"rejection"`` (draft by
            draft) or ``"coupled"``; ``None`` (default): block for a chain of drafts,
            rejection for a tree. Greedy rows are the same under all three.
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
    options = DecodeOptions.of_keywords("speculative_generate", options)
    return _decode(key, target, drafter, prompts, options)
