"""The decoders: the jitted programs and the public open- and closed-loop functions.

`generate` and `speculative_generate` (closed) check their inputs
(`specjax.decoding.checks._prepare`) and run prefill, the loop and the output gather
as one jitted program. `init`, `step`, `result` and `stream` (open) run the same
pieces as separate jitted programs, with the loop state donated between chunks.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.checks import _output_width, _prepare
from specjax.decoding.loop import _run
from specjax.decoding.refill import _hand_on, _init_state
from specjax.decoding.state import DecodeState, GenerationResult
from specjax.drafters.base import Drafter, NoDraft
from specjax.sampling import SamplingConfig
from specjax.typed_jit import typed_jit
from specjax.validation import check_int, is_concrete


def _result(state: DecodeState) -> GenerationResult:
    """Every prompt's output in prompt order: those handed on, plus those still in a slot.

    ``tokens`` etc. are ``[N, S]`` (padded with -1); `_output_width` says how much of
    the width to keep.
    """
    out = _hand_on(state, jnp.arange(state.seq.shape[0]))
    return GenerationResult(
        tokens=out.tokens,
        lengths=out.lengths,
        from_draft=out.from_draft,
        logprobs=out.logprobs,
        top_ids=out.top_ids,
        top_logprobs=out.top_logprobs,
        truncated=out.truncated,
        invalid=out.invalid,
        stats=state.stats.replace(
            row_target_calls=out.row_target_calls, drafted=out.drafted, accepted=out.accepted
        ),
    )


def _trim(out: GenerationResult, width: int) -> GenerationResult:
    return out.replace(
        tokens=out.tokens[:, :width],
        from_draft=out.from_draft[:, :width],
        logprobs=out.logprobs[:, :width],
        top_ids=out.top_ids[:, :width],
        top_logprobs=out.top_logprobs[:, :width],
    )


_STATIC = (
    "cache_len", "verification", "num_slots", "gamma_table", "top_logprobs", "raw_logprobs",
    "forward_width",
)  # fmt: skip
# typed_jit, not jax.jit: models of different classes with the same fields must not
# share a compiled program (see specjax/typed_jit.py).
_decode_jit = typed_jit(
    lambda *a, **k: _result(_run(_init_state(*a, **k))), static_argnames=_STATIC
)
_init_jit = typed_jit(_init_state, static_argnames=_STATIC)
_result_jit = typed_jit(_result)


def _decode(traced, static, width: int) -> GenerationResult:
    return _trim(_decode_jit(*traced, **static), width)


def _step_loop(models, loop_state: DecodeState, num_steps) -> DecodeState:
    target, drafter = models
    out = _run(loop_state.replace(target=target, drafter=drafter), num_steps)
    return out.replace(target=None, drafter=None)


# The loop state is donated (its caches and buffers are updated in place, so a chunk
# needs no second copy of them: without donation peak memory doubles); the models are
# not, since the caller still holds them.
_step_jit = typed_jit(_step_loop, donate_argnums=(1,))


# ----------------------------------------------------------------------------
# The open loop.


def init(
    key: jax.Array,
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
) -> DecodeState:
    """Prefills the prompts and returns the `DecodeState` that `step` advances.

    Takes the arguments of `speculative_generate` (``drafter=None`` decodes plainly),
    ``forward_width`` included, and validates them the same way, before anything
    compiles; ``sampling``'s
    ``vocab_limit`` is resolved as there and travels (traced) in the state.

    Example:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> state = specjax.decoding.init(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=8)
        >>> state = specjax.decoding.step(state, 3)   # three steps
        >>> state = specjax.decoding.step(state, 100)  # the rest (stops when done)
        >>> specjax.decoding.result(state).tokens.shape
        (1, 8)
    """
    drafter = NoDraft() if drafter is None else drafter
    traced, static, width = _prepare(
        key, target, drafter, prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
        verification, num_slots, gamma_by_active_rows, draft_confidence,
        top_logprobs=top_logprobs, raw_logprobs=raw_logprobs, stop=stop,
        constraint=constraint, forward_width=forward_width,
    )  # fmt: skip
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
    models = (state.target, state.drafter)
    out = _step_jit(models, state.replace(target=None, drafter=None), jnp.int32(num_steps))
    return out.replace(target=state.target, drafter=state.drafter)


def result(state: DecodeState) -> GenerationResult:
    """The output so far: every prompt's generated tokens, lengths, flags and stats.

    Rows are prompts, in prompt order (also with fewer slots than prompts); a prompt
    not started yet has length 0. ``tokens`` has width ``max(max_new_tokens)`` (or
    what the cache can hold).
    """
    q = state.queue
    width = _output_width(q.max_new_tokens, q.prompt_lengths, state.seq.shape[1])
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

    Example:
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
    key: jax.Array,
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
) -> GenerationResult:
    """Plain autoregressive decoding: prefill, then one ``lax.while_loop``.

    The baseline speculative decoding must match. It is the same loop as
    `speculative_generate` with the null drafter (γ = 0): each step emits the
    target's sample at the row's next position t, drawn with
    ``fold_in(fold_in(key, seeds[b]), t)``. A row's tokens therefore depend on its
    key, seed and prompt only, not on the rest of the batch, and coupled speculative
    decoding reproduces them token for token.

    Compiles once per (model, batch size, prompt width bucket of 16, ``cache_len``):
    temperature, top-k/p, min-p (scalars or per row), ``max_new_tokens`` (within one
    cache bucket), ``eos_id`` (up to 8 ids), seeds and the prompt contents are traced.

    Args:
        key: one PRNG key (unused at temperature 0, but always required).
        model: a model following the contract (e.g. :class:`specjax.Model`).
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens to generate per row (>= 1), EOS included: an int, or
            ``int[B]`` for one budget per row.
        sampling: :class:`SamplingConfig`, each setting a scalar or ``[B]``; default
            samples at temperature 1. Its ``vocab_limit`` (ids ``>=`` it are never
            emitted; an int in ``[1, V]``, scalar or ``[B]``, traced) defaults to the
            model's real vocabulary: its tokenizer's size where that is smaller than
            V (padded embedding rows), else V.
        eos_id: optional id, or ``[K]`` ids, that end a row (it is emitted).
        seeds: optional ``int[B]`` per-row seeds (default: the row index).
        cache_len: static cache length S; default ``P + max_new_tokens + 1``
            rounded up to a multiple of 64.
        num_slots: rows decoded at once, B (default: one per prompt). With fewer
            slots than prompts, a finished row's slot is prefilled with the next prompt
            inside the same on-device loop (continuous batching), serving the longest
            budgets first so that the shortest fill the tail; settings, seeds and
            budgets follow the prompt, and outputs come back in prompt order.
        top_logprobs: k >= 0 (static): also return the k most probable ids at each
            emitted position and their log-probabilities (``GenerationResult.top_ids``,
            ``.top_logprobs``), from the processed distribution the token was drawn
            from.
        raw_logprobs: static: ``top_logprobs`` from the raw logits' log-softmax
            (before the vocabulary limit, penalties, temperature and filters).
        stop: stop strings: a list of strings (every prompt) or one list per prompt,
            spelled with ``model.tokenizer``, or a `specjax.StopStrings`. A row ends
            with the token that completes one of its stop strings in the generated
            text (split across tokens too); that token is kept (`specjax.stops`).
        constraint: a `specjax.Constraint` (a regex or a JSON schema compiled for the
            model's tokenizer) for every prompt, or a list with one Constraint or None
            per prompt. A constrained row only ever emits text of its language: ids
            the automaton does not allow next get ``-inf`` before the other
            transforms (p masked and renormalised), the EOS ids only where the text is
            complete, and the row ends with the token that completes it when nothing
            can follow (`specjax.constraints`).
        forward_width: static W: every step scores its token at column 0 of a W-wide
            forward (W - 1 padding columns after it), so that the output equals
            speculative decoding's at the same W token for token, in any precision
            (`specjax.decoding.numerics`). Default 1 (``None``), the fastest.

    Returns:
        :class:`GenerationResult` with ``tokens int32[N, max(max_new_tokens)]``.

    Example:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> out = specjax.generate(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=5,
        ...                        sampling=specjax.SamplingConfig.greedy())
        >>> out.tokens.shape
        (1, 5)
    """
    traced, static, width = _prepare(
        key, model, NoDraft(), prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
        "rejection", num_slots, top_logprobs=top_logprobs, raw_logprobs=raw_logprobs, stop=stop,
        constraint=constraint, forward_width=forward_width,
    )  # fmt: skip
    return _decode(traced, static, width)


def speculative_generate(
    key: jax.Array,
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
) -> GenerationResult:
    """Speculative decoding in one jitted ``lax.while_loop``, exact in distribution.

    Every step the drafter proposes γ tokens per row, the target scores the
    row's pending token and the γ drafts in one forward, and the verifier keeps a
    prefix per row plus one target token. Rows accept different numbers of tokens
    and stop independently; the loop ends when every row is done. There is no host
    round trip inside.

    Verification:

    * ``"rejection"`` (default): speculative rejection sampling, accepting a draft
      with probability ``min(1, p/q)``; the acceptance rate is ``1 - TV(p, q)``, the
      most any exact verifier gets. The output has exactly the distribution of
      :func:`generate` (token for token at temperature 0), but not the same sample
      for one key: the drafter and γ decide how each position's randomness is used.
    * ``"coupled"``: the drafter draws with the same noise the target samples each
      position with, and a draft is accepted iff it equals the target's sample. The
      output then *equals* :func:`generate`'s for the same key and seeds, token for
      token, at any sampling setting and with any drafter; acceptance falls to the
      coupling probability (at least ``(1 - TV) / (1 + TV)`` for a flat race).

    Args:
        key: one PRNG key.
        target: the target model (model contract).
        drafter: a :class:`~specjax.drafters.Drafter` (e.g. ``DraftModel``,
            ``PromptLookup``) sharing the target's ids: its vocabulary size ``V_d`` is
            at most the target's V (its q is zero-padded, which is exact), and where
            both have tokenizers they agree on the ids below ``V_d``
            (`specjax.vocab`).
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens to generate per row (>= 1), EOS included: an int or
            ``int[B]``.
        sampling: :class:`SamplingConfig` applied identically to target and draft,
            each setting a scalar or ``[B]``. Its ``vocab_limit`` masks ids ``>=`` it
            in the target's and the draft's distributions alike (an int in ``[1, V]``,
            traced); default: the target's tokenizer size where that is smaller than
            V, else V. With a drafter of a smaller vocabulary ``V_d`` it must be at
            most ``V_d``.
        eos_id: optional id, or ``[K]`` ids, that end a row; drafts after it are
            discarded.
        seeds: optional ``int[B]`` per-row seeds (default: the row index).
        cache_len: static cache length S; default ``P + max_new_tokens + γ + 1``
            rounded up to a multiple of 64. A row that would overflow it stops
            and is flagged in ``truncated``.
        verification: ``"rejection"`` or ``"coupled"``.
        num_slots: rows decoded at once, B (default: one per prompt). With fewer
            slots than prompts, a finished row's slot is prefilled with the next prompt
            inside the same on-device loop (continuous batching), serving the longest
            budgets first so that the shortest fill the tail; settings, seeds and
            budgets follow the prompt, and outputs come back in prompt order.
        gamma_by_active_rows: optional table choosing each step's γ by the number of
            active rows, a dict ``{max_active_rows: γ}`` or ``(max_active_rows, γ)``
            pairs, each γ in ``[0, drafter.num_draft]``: a step with ``a`` active rows
            drafts the γ of the smallest ``max_active_rows >= a`` (the largest entry's
            beyond it), e.g. ``{1: 4, 8: 2, 64: 0}``; γ = 0 is a plain step, for batches
            where verifying costs more than speculation saves. Each entry is its own
            ``while_loop`` with its own γ, run in turn on device as rows finish (the
            active count never grows). Exact; with rejection verification a row's
            sample then depends on how many rows are active.
        draft_confidence: optional τ in ``[0, 1]``: a row stops proposing after its
            first draft whose own probability ``q(x)`` is below τ (that draft is
            still verified), and the verify forward covers only as many positions as
            the longest active row proposed. Exact: whether a position is proposed
            depends only on the drafts before it, and the drafts not proposed are
            never accepted. Needs a drafter that returns q.
        top_logprobs: k (static): the k most probable ids and their log-probabilities
            at each emitted position, as in `generate`; the same for accepted drafts
            and target tokens (the target's processed distribution at that position).
        raw_logprobs: static: from the raw logits instead, as in `generate`.
        stop: stop strings, as in `generate`; no token past a stop is ever emitted.
        constraint: a `specjax.Constraint` or one (or None) per prompt, as in
            `generate`; the same mask applies to the target's p and to a draft model's
            q at every drafted position, and drafts outside the language are always
            rejected, so the output is exactly constrained plain decoding's (with a
            tree, each node on the accepted path is masked after the path's tokens).
        forward_width: static W >= γ + 1 (a tree: its nodes + 1): every target forward
            of the loop scores exactly W columns, padded after the drafts, and never
            a narrower one (``gamma_by_active_rows`` and ``draft_confidence`` keep
            their logic, not their width). Then greedy rows, and with coupled
            verification every row, are plain decoding's tokens at the same W in any
            precision (`specjax.decoding.numerics`). ``None`` (default): each forward
            is as wide as its step's verify.

    Returns:
        :class:`GenerationResult` with ``tokens int32[N, max(max_new_tokens)]``.

    Example:
        >>> import jax, specjax
        >>> target = specjax.testing.tiny_model(seed=0)
        >>> drafter = specjax.DraftModel(specjax.testing.tiny_model(seed=1), num_draft=3)
        >>> out = specjax.speculative_generate(jax.random.key(0), target, drafter, [[1, 2, 3]],
        ...                                    max_new_tokens=6)
        >>> out.tokens.shape
        (1, 6)
    """
    traced, static, width = _prepare(
        key, target, drafter, prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
        verification, num_slots, gamma_by_active_rows, draft_confidence,
        top_logprobs=top_logprobs, raw_logprobs=raw_logprobs, stop=stop,
        constraint=constraint, forward_width=forward_width,
    )  # fmt: skip
    return _decode(traced, static, width)
