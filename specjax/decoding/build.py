"""Building the decoder: a call's options (`DecodeOptions`) become its `Decoder`.

`build_decoder` turns the options into the `Decoder`'s parts, each checked as it is
built: the features (the built-in ones the options turn on, with their stop-string and
constraint tables, then the user's), the EOS ids, τ and the γ table. `state_bytes`
sizes the `DecodeState` it will allocate from shapes alone, every feature's state
included, for the memory check. The checks
of the other inputs, and `_prepare` that runs them all, are `specjax.decoding.checks`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.typed_jit import dataclass_types
from specjax.core.validation import check_int, check_int_array, is_concrete
from specjax.decoding.decoder import Decoder
from specjax.decoding.features import (
    Constrain,
    DraftFlags,
    Logprobs,
    Penalize,
    RowFeature,
    Statistics,
    StopAtStrings,
    TopLogprobs,
)
from specjax.decoding.refill import PromptInputs, init_state
from specjax.decoding.state import EOS_BUCKET, round_up
from specjax.drafters.base import Drafter
from specjax.models.forward import cache_bytes, tree_bytes
from specjax.sampling import SamplingConfig
from specjax.sampling.constraints import Constraint, ConstraintTable
from specjax.sampling.penalties import penalties_in_program
from specjax.sampling.stops import StopStrings
from specjax.verification.verifiers import VERIFIERS, Coupled


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """A decoder call's options, as `specjax.speculative_generate` documents them."""

    max_new_tokens: object
    sampling: SamplingConfig | None = None
    eos_id: object = None
    seeds: object = None
    cache_len: int | None = None
    verification: str | None = None
    num_slots: int | None = None
    gamma_by_active_rows: object = None
    draft_confidence: float | None = None
    top_logprobs: int = 0
    raw_logprobs: bool = False
    stop: object = None
    constraint: object = None
    forward_width: int | None = None
    features: Sequence = ()

    @classmethod
    def of_call(cls, arguments: dict) -> DecodeOptions:
        """The options among a decoder call's ``arguments`` (its ``locals()`` on entry:
        every keyword-only parameter of the public decoders is a field here)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in arguments.items() if name in names})

    @classmethod
    def of_keywords(cls, caller: str, options: dict) -> DecodeOptions:
        """The options a decoder declared with `takes_options` was called with.

        Raises:
            TypeError: naming ``caller``, for an option it does not take, or without
                ``max_new_tokens``.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise TypeError(
                f"{caller}() got an unexpected keyword argument {unknown[0]!r}; its options "
                f"are {', '.join(names)}"
            )
        if "max_new_tokens" not in options:
            raise TypeError(f"{caller}() missing required keyword-only argument: 'max_new_tokens'")
        return cls(**options)


_MISSING = dataclasses.MISSING


def takes_options(fn):
    """``fn``, which takes ``**options``, declared with every `DecodeOptions` field as a
    keyword-only parameter (what `inspect.signature` and ``help`` show); its body reads
    them with `DecodeOptions.of_keywords`."""
    signature = inspect.signature(fn)
    leading = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    options = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if field.default is _MISSING else field.default,
            annotation=field.type,
        )
        for field in dataclasses.fields(DecodeOptions)
    ]
    fn.__signature__ = signature.replace(parameters=leading + options)
    return fn


def build_decoder(
    options: DecodeOptions, target, drafter: Drafter, sampling_N, vocab: int, n: int
) -> Decoder:
    """The `Decoder` of a call whose models, prompts and sampling are checked.

    Args:
        options: the call's options, with ``forward_width`` and ``top_logprobs``
            already checked.
        target: the target model.
        drafter: the `Drafter` (`~specjax.drafters.NoDraft` for plain decoding).
        sampling_N: the sampling settings with ``[N]`` leaves.
        vocab: the target's vocabulary size V.
        n: the number of prompts N.

    Raises:
        ValueError / TypeError naming the option: on a bad stop, constraint, feature,
            EOS id, ``draft_confidence`` or ``gamma_by_active_rows``.
    """
    eos_ids = _eos_array(options.eos_id, vocab)
    builtin = _builtin_features(options, target, drafter, sampling_N, vocab, n, eos_ids)
    return Decoder(
        target=target,
        drafter=drafter,
        features=builtin + _check_user_features(options.features, builtin),
        eos_ids=eos_ids,
        draft_confidence=_check_confidence(options.draft_confidence),
        verifier=_verifier(options.verification, drafter),
        gamma_table=_check_gamma_table(options.gamma_by_active_rows, drafter.num_draft),
        forward_width=options.forward_width,
    )


def _verifier(verification: str, drafter):
    """The verifier of ``verification=`` (checked against the names before)."""
    if drafter.null_drafter:  # proposes nothing: its steps are coupled verification's
        return Coupled()
    if verification is None:  # the default: block verification keeps the most drafts
        verification = "rejection" if drafter.tree is not None else "block"
    if verification == "block" and drafter.tree is not None:
        raise ValueError(
            "verification='block' judges a chain of drafts; a tree drafter "
            f"({drafter.tree!r}) is verified by 'rejection' or 'coupled'"
        )
    return VERIFIERS[verification]


def _builtin_features(
    options: DecodeOptions, target, drafter, sampling_N, vocab: int, n: int, eos_ids
):
    """The built-in features: those every decoder runs, then those the options ask for."""
    features = [
        Statistics(num_positions=drafter.num_draft),
        DraftFlags(),
        Logprobs(),
        TopLogprobs(k=options.top_logprobs, raw=options.raw_logprobs),
    ]
    # A tree's penalties are checked off (`checks._check_logit_transforms`): nothing to count.
    if penalties_in_program(sampling_N) and drafter.tree is None:
        features.append(Penalize(vocab_size=vocab))
    stop = _stop_strings(options.stop, target, vocab, n)
    if stop is not None:
        features.append(StopAtStrings(table=stop))
    constraint = _constraint_table(options.constraint, vocab, n)
    if constraint is not None:
        features.append(Constrain(table=constraint, eos_ids=eos_ids))
    return tuple(features)


def _check_user_features(user, builtin) -> tuple:
    """A user's features: `RowFeature` instances whose names are their own."""
    if isinstance(user, RowFeature) or not isinstance(user, Sequence):
        raise TypeError(
            "features must be a list of specjax.decoding.features.RowFeature instances, "
            f"got {type(user).__name__}"
        )
    names = {f.name for f in builtin}
    for i, feature in enumerate(user):
        if not isinstance(feature, RowFeature):
            raise TypeError(
                f"features[{i}] must be a specjax.decoding.features.RowFeature, got "
                f"{type(feature).__name__}"
            )
        if not feature.name or feature.name in names:
            raise ValueError(
                f"features[{i}] ({type(feature).__name__}) needs a name of its own, got "
                f"{feature.name!r}: set the class attribute name = '...'"
            )
        names.add(feature.name)
    return tuple(user)


def _stop_strings(stop, target, vocab: int, num_prompts: int):
    """``stop`` as a `StopStrings` (built with the target's tokenizer), or None."""
    if stop is None:
        return None
    if isinstance(stop, StopStrings):
        if stop.token_bytes.shape[0] != vocab or stop.active.shape[0] != num_prompts:
            raise ValueError(
                f"stop: a StopStrings built for V = {stop.token_bytes.shape[0]} and "
                f"{stop.active.shape[0]} prompts, but the target has V = {vocab} and there "
                f"are {num_prompts} prompts"
            )
        return stop
    return StopStrings.build(stop, getattr(target, "tokenizer", None), vocab, num_prompts)


def _constraint_table(constraint, vocab: int, num_prompts: int):
    """``constraint`` (one `Constraint` for every prompt, or one or None per prompt) as
    the batch's `ConstraintTable`, or None."""
    if constraint is None:
        return None
    if isinstance(constraint, ConstraintTable):
        if constraint.vocab_size != vocab or constraint.initial.shape != (num_prompts,):
            raise ValueError(
                f"constraint: a ConstraintTable for V = {constraint.vocab_size} and "
                f"{constraint.initial.shape[0]} prompts, but the target has V = {vocab} and "
                f"there are {num_prompts} prompts"
            )
        return constraint
    if isinstance(constraint, Constraint):
        per_prompt = [constraint] * num_prompts
    elif isinstance(constraint, (list, tuple)):
        per_prompt = list(constraint)
        if len(per_prompt) != num_prompts:
            raise ValueError(
                f"constraint: {len(per_prompt)} entries for {num_prompts} prompts (one "
                "Constraint or None per prompt)"
            )
        bad = [
            i for i, c in enumerate(per_prompt) if c is not None and not isinstance(c, Constraint)
        ]
        if bad:
            raise TypeError(
                f"constraint[{bad[0]}] must be a specjax.Constraint or None, got "
                f"{type(per_prompt[bad[0]]).__name__}"
            )
    else:
        raise TypeError(
            "constraint must be a specjax.Constraint (every prompt) or a list with one "
            f"Constraint or None per prompt, got {type(constraint).__name__}"
        )
    if all(c is None for c in per_prompt):
        return None
    return ConstraintTable.build(per_prompt, vocab)


def _eos_array(eos_id, vocab_size: int) -> jax.Array:
    """``int32[K]`` ids, K a multiple of ``EOS_BUCKET``, padded with ``-1`` (never a token)."""
    if eos_id is None:
        ids = np.zeros((0,), np.int32)
    elif np.ndim(eos_id) == 0 and not isinstance(eos_id, (jax.Array, np.ndarray)):
        ids = np.array([check_int("eos_id", eos_id, lo=0, hi=vocab_size - 1)], np.int32)
    else:
        ids = np.reshape(check_int_array("eos_id", eos_id, lo=0, hi=vocab_size - 1), -1)
        if np.ndim(eos_id) > 1:
            raise ValueError(
                f"eos_id must be an int or a list of ids [K], got shape {list(np.shape(eos_id))}"
            )
    width = max(EOS_BUCKET, round_up(len(ids), EOS_BUCKET))
    return jnp.asarray(np.pad(ids, (0, width - len(ids)), constant_values=-1))


def _check_gamma_table(table, max_gamma: int) -> tuple[tuple[int, int], ...]:
    """``gamma_by_active_rows`` as sorted static ``((max_active_rows, γ), ...)`` pairs."""
    if table is None:
        return ()
    name = "gamma_by_active_rows"
    pairs = list(table.items()) if isinstance(table, dict) else table
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
        raise ValueError(
            f"{name} must be a non-empty dict {{max_active_rows: γ}} or list of "
            f"(max_active_rows, γ) pairs, got {table!r:.80}"
        )
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"{name}[{i}] must be a (max_active_rows, γ) pair, got {pair!r:.60}")
        rows = check_int(f"{name}[{i}] max_active_rows", pair[0], lo=1)
        gamma = check_int(f"{name}[{i}] γ", pair[1], lo=0, hi=max_gamma)
        out.append((rows, gamma))
    out.sort()
    if len({rows for rows, _ in out}) != len(out):
        raise ValueError(f"{name} names one max_active_rows twice: {out}")
    return tuple(out)


def _check_confidence(threshold):
    """τ as a traced ``float32[]`` (or None): a probability in ``[0, 1]``."""
    if threshold is None:
        return None
    if is_concrete(threshold):
        if np.ndim(threshold) != 0 or isinstance(threshold, bool):
            raise ValueError(f"draft_confidence must be a float in [0, 1], got {threshold!r:.60}")
        value = float(threshold)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"draft_confidence must be a float in [0, 1], got {value}")
    return jnp.asarray(threshold, jnp.float32)


def state_bytes(decoder: Decoder, inputs: PromptInputs, *, cache_len: int, num_slots: int) -> int:
    """Bytes of the `DecodeState` that `~specjax.decoding.refill.init_state` allocates,
    its `Decoder` (models and tables, which exist already) aside.

    From shapes alone, so nothing is allocated, compiled or run: ``jax.eval_shape`` of
    the state before any model runs, which builds every feature's state and per-prompt
    output (a user's feature too) with the token buffers, settings and queue; then the
    target's cache (`cache_bytes`) and the drafter's own `Drafter.state_bytes`.
    """
    traced = (decoder, inputs)
    shapes = _state_shapes.eval_shape(
        dataclass_types(traced), *traced, cache_len=cache_len, num_slots=num_slots
    )
    target_cache = cache_bytes(decoder.target, num_slots, cache_len)
    return tree_bytes(shapes) + target_cache + decoder.drafter.state_bytes(num_slots, cache_len)


def _state_before_models(types, decoder, inputs, *, cache_len: int, num_slots: int):
    del types  # only part of the trace cache's key
    return init_state(decoder, inputs, cache_len=cache_len, num_slots=num_slots, run_models=False)


# Jitted for its trace cache alone (it is never compiled): a call with the shapes and
# options of an earlier one reuses that trace, about 1 ms against 20 ms to trace it
# again, on every decoder call. The dataclass types are part of the key, as in
# `specjax.core.typed_jit`: two feature classes with the same fields must not share it.
_state_shapes = jax.jit(
    _state_before_models, static_argnums=0, static_argnames=("cache_len", "num_slots")
)
