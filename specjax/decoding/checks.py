"""Input checks: every check of the decoders' inputs, on the host, before anything compiles.

`prepare` is the one entry point the decoders call: it checks the key (``None`` when
every row is greedy), the models and the drafter (`specjax.drafters.checks`), the
prompts (`pad_prompts`), budgets, sampling, seeds, the slot count and the widths,
resolves the static cache length (`resolve_cache_len`), has
`specjax.decoding.build` build the `Decoder` (checking the options it is built from),
checks that the state fits in memory, and returns what
`specjax.decoding.refill.init_state` takes, named (`Prepared`). A bad input is therefore
refused here with a message naming it, never by a trace-time error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.validation import (
    INT32_MAX,
    as_prng_key,
    check_bool,
    check_fits_memory,
    check_int,
    check_int_array,
    is_concrete,
)
from specjax.decoding.build import DecodeOptions, build_decoder, state_bytes
from specjax.decoding.decoder import Decoder, step_slots
from specjax.decoding.numerics import check_forward_width
from specjax.decoding.output import output_width
from specjax.decoding.refill import PromptInputs
from specjax.decoding.state import CACHE_BUCKET, PROMPT_BUCKET, VERIFICATIONS, round_up
from specjax.drafters.base import Drafter
from specjax.drafters.checks import check_drafter, check_model_members
from specjax.models.contract import check_before_compiling
from specjax.sampling import PENALTY_OFF, SamplingConfig, check_sampling_config, per_row
from specjax.sampling.vocab import resolve_vocab_limit


def pad_prompts(prompts) -> tuple[jax.Array, jax.Array]:
    """Normalises prompts to right-padded ``int32[B, P]`` plus ``int32[B]`` lengths.

    Args:
        prompts: an integer array ``[B, P]`` (every row a full prompt) or a
            sequence of token-id sequences of possibly different lengths.

    Raises:
        ValueError / TypeError naming ``prompts``: on empty or malformed input, or on
            ids that do not fit in int32 (they are refused, never wrapped).
    """
    if isinstance(prompts, (jax.Array, np.ndarray)):
        arr = check_int_array("prompts", prompts, ndim=2)
        b, p = arr.shape
        if b < 1 or p < 1:
            raise ValueError(
                f"prompts must have at least one row and one token, got shape {list(arr.shape)}"
            )
        return jnp.asarray(arr, jnp.int32), jnp.full((b,), p, jnp.int32)
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise TypeError(
            "prompts must be an int array [B, P] or a list of token-id lists, "
            f"got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("prompts is empty: need at least one prompt")
    if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts):
        raise ValueError(
            f"prompts must be a batch of prompts, each a list of token ids; got one flat "
            f"list of {len(prompts)} ids {list(prompts)!r:.60}: for one prompt pass "
            f"[prompt], e.g. [{list(prompts)!r:.40}]"
        )
    rows = []
    for i, row in enumerate(prompts):
        try:
            ndim = -1 if isinstance(row, (str, bytes)) else np.ndim(row)
        except ValueError:  # numpy refuses ragged nesting such as [[3], 4]
            raise ValueError(
                f"prompts[{i}] must be a flat list of int token ids (a 1-D array), "
                f"got a nested {row!r:.60}"
            ) from None
        if isinstance(row, (str, bytes)) or ndim != 1 or len(row) == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {row!r:.60}")
        rows.append(check_int_array(f"prompts[{i}]", row, ndim=1))
    lengths = np.array([len(r) for r in rows], np.int32)
    padded = np.zeros((len(rows), lengths.max()), np.int32)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    return jnp.asarray(padded), jnp.asarray(lengths)


def _check_tokens_in_vocab(prompts_BP, lengths_B, vocab_size: int, whose: str = "model's"):
    if is_concrete(prompts_BP):
        prompts, lengths = np.asarray(prompts_BP), np.asarray(lengths_B)
        real = np.arange(prompts.shape[1])[None] < lengths[:, None]
        lo, hi = int(prompts[real].min()), int(prompts[real].max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"prompts hold token ids in [{lo}, {hi}], outside the {whose} vocabulary "
                f"[0, {vocab_size})"
            )


def resolve_cache_len(cache_len, max_prompt_len: int, max_new_tokens, step_slots: int) -> int:
    """The static cache length a decoder uses: ``cache_len`` checked, or the default.

    The default is ``max_prompt_len + max(max_new_tokens) + step_slots`` (the decoder's
    `~specjax.decoding.decoder.step_slots`) rounded up to a multiple of ``CACHE_BUCKET``.
    """
    if cache_len is None:
        if not is_concrete(max_new_tokens):
            raise ValueError(
                "cache_len must be given explicitly when max_new_tokens is traced "
                "(it fixes the static cache shape)"
            )
        needed = max_prompt_len + int(np.max(max_new_tokens)) + step_slots
        return round_up(needed, CACHE_BUCKET)
    cache_len = check_int("cache_len", cache_len, lo=1)
    if max_prompt_len + step_slots > cache_len:
        raise ValueError(
            f"the longest prompt ({max_prompt_len} tokens) plus the {step_slots} slots one "
            f"step needs does not fit in cache_len={cache_len}"
        )
    return cache_len


def _check_max_new_tokens(max_new_tokens, batch_size: int):
    """``int32[B]`` budgets from an int or a ``[B]`` array; traced values pass unchecked."""
    if not is_concrete(max_new_tokens):
        value = jnp.asarray(max_new_tokens)
        if not jnp.issubdtype(value.dtype, jnp.integer) or value.shape not in ((), (batch_size,)):
            raise ValueError(
                f"max_new_tokens must be an int or int[{batch_size}], got a traced "
                f"{value.dtype}{list(value.shape)}"
            )
        return jnp.broadcast_to(value.astype(jnp.int32), (batch_size,))
    if np.ndim(max_new_tokens) == 0:
        value = np.full((batch_size,), check_int("max_new_tokens", max_new_tokens, lo=1))
    else:
        value = check_int_array("max_new_tokens", max_new_tokens, lo=1, ndim=1)
        if value.shape != (batch_size,):
            raise ValueError(
                f"max_new_tokens must be an int or one per prompt, [{batch_size}]; got shape "
                f"{list(value.shape)}"
            )
    return value.astype(np.int32)


def _check_seeds(seeds, batch_size: int) -> jax.Array:
    if seeds is None:
        return jnp.arange(batch_size, dtype=jnp.int32)
    if is_concrete(seeds) and np.ndim(seeds) == 0:
        raise ValueError(
            f"seeds must hold one int per prompt, [{batch_size}], got the scalar {seeds!r}"
        )
    value = check_int_array("seeds", seeds, lo=0, ndim=1)
    if value.shape != (batch_size,):
        raise ValueError(
            f"seeds must hold one int per prompt, [{batch_size}]; got shape {list(value.shape)}"
        )
    return jnp.asarray(value, jnp.int32)


def _check_num_slots(num_slots, num_prompts: int) -> int:
    """B: the rows decoded at once, in ``[1, N]``; default one per prompt."""
    if num_slots is None:
        return num_prompts
    num_slots = check_int("num_slots", num_slots, lo=1)
    if num_slots > num_prompts:
        raise ValueError(
            f"num_slots={num_slots} is more than the {num_prompts} prompts: a slot would "
            "never hold a prompt (use at most one slot per prompt)"
        )
    return num_slots


def _check_pair(target, drafter: Drafter, options: DecodeOptions) -> int:
    """Checks the models, the drafter and the options that depend on them; returns V."""
    vocab = check_model_members("target", target)
    check_drafter(target, drafter)
    check_before_compiling(target, "target")
    if drafter.tree is not None and (
        options.gamma_by_active_rows is not None or options.draft_confidence is not None
    ):
        raise ValueError(
            "gamma_by_active_rows and draft_confidence adapt a chain's γ; they cannot be "
            f"used with a tree drafter ({drafter.tree!r})"
        )
    if options.verification not in (None, *VERIFICATIONS):
        raise ValueError(
            f"verification must be one of {VERIFICATIONS}, got {options.verification!r}"
        )
    return vocab


def _check_prompts(prompts, drafter: Drafter, vocab: int):
    """``(int32[B, P], int32[B])``: the prompts, checked against both vocabularies."""
    prompts_BP, lengths_B = pad_prompts(prompts)
    _check_tokens_in_vocab(prompts_BP, lengths_B, vocab)
    if drafter.vocab_size is not None and drafter.vocab_size < vocab:
        _check_tokens_in_vocab(prompts_BP, lengths_B, drafter.vocab_size, "drafter's")
    return prompts_BP, lengths_B


def _check_context(target, lengths_N, max_new_N, cache_len: int) -> None:
    """Refuses a budget that takes a row past the target's context (a row stops at the
    cache's end, so a ``cache_len`` within the context bounds every row)."""
    context = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    if not (isinstance(context, int) and is_concrete(lengths_N) and is_concrete(max_new_N)):
        return
    lengths_N, max_new_N = np.asarray(lengths_N), np.asarray(max_new_N)
    row = int(np.argmax(lengths_N))
    if lengths_N[row] > context:
        raise ValueError(
            f"prompts: prompt {row} has {lengths_N[row]} tokens, beyond the target's context "
            f"of {context} (config.max_position_embeddings)"
        )
    ends_N = np.minimum(lengths_N + max_new_N, cache_len)
    row = int(np.argmax(ends_N))
    if ends_N[row] > context:
        length = int(lengths_N[row])
        raise ValueError(
            f"max_new_tokens: prompt {row} has {length} tokens, and {length} + "
            f"{int(max_new_N[row])} new tokens go beyond the target's context "
            f"of {context} (config.max_position_embeddings): ask for at most "
            f"{context - length} new tokens, or pass cache_len={context} to stop rows there"
        )


def _check_key(key, sampling: SamplingConfig | None) -> jax.Array:
    """The decoders' PRNG key. ``None`` is accepted when every row is greedy (no row
    draws at random), and stands for a fixed key then."""
    if key is not None:
        return as_prng_key("key", key)
    sampling = SamplingConfig() if sampling is None else sampling
    check_sampling_config(sampling)  # a bad config is named as such, not as a key problem
    fix = "pass a PRNG key, e.g. key=jax.random.key(0)"
    temperature = sampling.temperature
    if not is_concrete(temperature):
        raise ValueError(
            "key is None, which only greedy decoding allows, but sampling.temperature is "
            f"traced, so whether a row samples is unknown: {fix}"
        )
    temperature = np.asarray(temperature)
    if np.any(temperature > 0):
        rows = np.flatnonzero(temperature > 0).tolist()
        which = (
            f"sampling.temperature is {float(temperature):g}"
            if temperature.ndim == 0
            else f"rows {rows} of sampling.temperature are > 0"
        )
        raise ValueError(
            f"key is None, but {which}: sampling draws at random and needs a PRNG key: pass "
            "key=jax.random.key(0) (the same key gives the same tokens), or decode greedily "
            "with SamplingConfig(temperature=0.0), which needs none"
        )
    # Greedy rows read no noise: any key gives the same tokens.
    return jax.random.key(0)


def _check_sampling(options: DecodeOptions, target, drafter: Drafter, vocab: int, n: int):
    """The sampling settings with ``[N]`` leaves and ``vocab_limit`` resolved."""
    sampling = SamplingConfig() if options.sampling is None else options.sampling
    check_sampling_config(sampling, n)
    _check_logit_transforms(sampling, vocab, drafter)
    return per_row(resolve_vocab_limit(sampling, target, drafter), n)


def _cache_len_name(options: DecodeOptions) -> str:
    """What an error about the cache length names: ``cache_len``, or the budget that
    set the default."""
    if options.cache_len is not None:
        return "cache_len"
    return "max_new_tokens (through the default cache_len)"


def _resolve_cache(options: DecodeOptions, drafter: Drafter, prompt_width: int, max_new_N):
    """The static cache length S, checked to fit int32 positions."""
    slots = step_slots(drafter, options.forward_width)
    resolved = resolve_cache_len(options.cache_len, prompt_width, max_new_N, slots)
    if resolved > INT32_MAX // 2:
        raise ValueError(
            f"{_cache_len_name(options)}: a cache of {resolved} slots does not fit int32 positions"
        )
    return resolved


def _check_memory(options: DecodeOptions, prepared: Prepared) -> None:
    """Refuses a decode state the device cannot hold: caches, buffers and every
    feature's state (`specjax.decoding.build.state_bytes`)."""
    cache_len, num_slots = prepared.cache_len, prepared.num_slots
    what = f"caches of {cache_len} slots for {num_slots} rows"
    size = state_bytes(prepared.decoder, prepared.inputs, cache_len=cache_len, num_slots=num_slots)
    check_fits_memory(_cache_len_name(options), size, what)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A decoder call's checked inputs: what `~specjax.decoding.refill.init_state` takes.

    Attributes:
        decoder: the call's `~specjax.decoding.Decoder`.
        inputs: the prompts and per-prompt settings (`PromptInputs`, traced).
        cache_len: the static cache length S.
        num_slots: the static number of slots B.
        width: the result's width (`~specjax.decoding.output.output_width`).
    """

    decoder: Decoder
    inputs: PromptInputs
    cache_len: int
    num_slots: int
    width: int


def prepare(key, target, drafter: Drafter, prompts, options: DecodeOptions, *, host_memory=True):
    """Validates a decoder's inputs on the host, before anything compiles (the state's
    size against this host with ``host_memory``; `specjax.chips` checks a chip's).

    Returns:
        the `Prepared` inputs: the `Decoder`, the prompts' arrays, the static cache
        length and slot count, and the output width.
    """
    key = _check_key(key, options.sampling)
    vocab = _check_pair(target, drafter, options)
    prompts_NP, lengths_N = _check_prompts(prompts, drafter, vocab)
    n, p = prompts_NP.shape
    max_new_N = _check_max_new_tokens(options.max_new_tokens, n)
    sampling_N = _check_sampling(options, target, drafter, vocab, n)
    num_slots = _check_num_slots(options.num_slots, n)
    forward_width = check_forward_width(options.forward_width, drafter)
    top_logprobs = _check_top_logprobs(options.top_logprobs, vocab)
    options = dataclasses.replace(options, forward_width=forward_width, top_logprobs=top_logprobs)
    cache_len = _resolve_cache(options, drafter, p, max_new_N)
    _check_context(target, lengths_N, max_new_N, cache_len)
    decoder = build_decoder(options, target, drafter, sampling_N, vocab, n)
    check_bool("raw_logprobs", options.raw_logprobs)
    # Bucket the prompt width like the cache, capped by the cache itself.
    width = min(round_up(p, PROMPT_BUCKET), cache_len)
    inputs = PromptInputs(
        key=key,
        prompts=jnp.pad(prompts_NP, [(0, 0), (0, width - p)]),
        prompt_lengths=lengths_N,
        max_new_tokens=jnp.asarray(max_new_N),
        sampling=sampling_N,
        seeds=_check_seeds(options.seeds, n),
    )
    # From host values (inside a user's jit the arrays above are already traced).
    host_lengths = np.asarray(lengths_N) if is_concrete(lengths_N) else np.full((n,), p)
    prepared = Prepared(
        decoder=decoder,
        inputs=inputs,
        cache_len=cache_len,
        num_slots=num_slots,
        width=output_width(max_new_N, host_lengths, cache_len),
    )
    if host_memory:
        _check_memory(options, prepared)
    return prepared


def _check_top_logprobs(k, vocab: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= vocab:
        raise ValueError(
            f"top_logprobs must be an int in [0, V = {vocab}] (0: none), got {k!r:.40}"
        )
    return int(k)


def _check_logit_transforms(sampling: SamplingConfig, vocab: int, drafter: Drafter) -> None:
    """The settings that need the target's V or the drafter: bias width, forbidden ids, trees."""
    bias = sampling.logit_bias
    if bias is not None and jnp.shape(bias)[-1] != vocab:
        raise ValueError(
            f"SamplingConfig.logit_bias has shape {list(jnp.shape(bias))}: its last axis "
            f"must be the target's vocabulary size V = {vocab}"
        )
    ids = sampling.forbidden_ids
    if ids is not None and is_concrete(ids) and np.size(ids) and np.max(ids) >= vocab:
        raise ValueError(
            f"SamplingConfig.forbidden_ids holds id {int(np.max(ids))}, outside the target's "
            f"vocabulary [0, {vocab})"
        )
    if drafter.tree is None:
        return
    settings = [getattr(sampling, name) for name in PENALTY_OFF]
    off = PENALTY_OFF.values()
    if not all(
        x is None or (is_concrete(x) and np.all(np.asarray(x) == o))
        for x, o in zip(settings, off, strict=True)
    ):
        raise ValueError(
            "repetition_penalty, presence_penalty and frequency_penalty are not supported "
            f"with a tree drafter ({drafter.tree!r}): a node's penalties would have to count "
            "its own ancestors; use a chain drafter (they must be concrete and off here)"
        )
