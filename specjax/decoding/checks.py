"""Input handling: every check of the decoders' inputs, on the host, before anything compiles.

`_prepare` is the one entry point the decoders call: it checks the key (``None`` when
every row is greedy), the models, the drafter (`check_drafter`), the prompts
(`pad_prompts`), budgets, sampling, EOS ids, seeds, the slot count, the γ table and τ,
resolves the static cache length (`resolve_cache_len`) and the memory it needs, and
returns the traced and static arguments of `specjax.decoding.refill._init_state` with
the output width. A bad input is therefore refused here with a message naming it, never
by a trace-time error.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.validation import (
    INT32_MAX,
    as_prng_key,
    check_fits_memory,
    check_int,
    check_int_array,
    is_concrete,
)
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
from specjax.decoding.numerics import check_forward_width
from specjax.decoding.state import (
    CACHE_BUCKET,
    EOS_BUCKET,
    PROMPT_BUCKET,
    VERIFICATIONS,
    Decoder,
)
from specjax.drafters.base import Drafter, cache_bytes, step_slots
from specjax.models.contract import check_before_compiling
from specjax.sampling import PENALTY_OFF, SamplingConfig, check_sampling_config, per_row
from specjax.sampling.constraints import Constraint, ConstraintTable
from specjax.sampling.penalties import penalties_in_program
from specjax.sampling.stops import StopStrings
from specjax.sampling.vocab import check_drafter_vocab, resolve_vocab_limit
from specjax.verification.tree import Tree


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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


def resolve_cache_len(cache_len, max_prompt_len: int, max_new_tokens, lookahead: int) -> int:
    """The static cache length a decoder uses: ``cache_len`` checked, or the default.

    The default is ``max_prompt_len + max(max_new_tokens) + lookahead`` rounded up to a
    multiple of ``CACHE_BUCKET`` (``lookahead`` is 1 for plain decoding, γ + 1 for
    speculative decoding).
    """
    if cache_len is None:
        if not is_concrete(max_new_tokens):
            raise ValueError(
                "cache_len must be given explicitly when max_new_tokens is traced "
                "(it fixes the static cache shape)"
            )
        needed = max_prompt_len + int(np.max(max_new_tokens)) + lookahead
        return _round_up(needed, CACHE_BUCKET)
    cache_len = check_int("cache_len", cache_len, lo=1)
    if max_prompt_len + lookahead > cache_len:
        raise ValueError(
            f"the longest prompt ({max_prompt_len} tokens) plus the {lookahead} slots one "
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
    width = max(EOS_BUCKET, _round_up(len(ids), EOS_BUCKET))
    return jnp.asarray(np.pad(ids, (0, width - len(ids)), constant_values=-1))


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


def _check_model(name: str, model) -> int:
    """The model contract's static members, checked; returns V."""
    missing = [m for m in ("vocab_size", "init_cache") if not hasattr(model, m)]
    if missing or not callable(model):
        lacks = f" (it has no {' or '.join(missing)})" if missing else " (it is not callable)"
        raise TypeError(
            f"{name} must follow the model contract (callable as model(tokens_BT, "
            f"positions_BT, cache), with vocab_size and init_cache), e.g. a specjax.Model; "
            f"got {type(model).__name__}{lacks}. A module of your own gets the three "
            "members as docs/models.md, 'Bring your own model', shows; "
            "specjax.check_model(model) checks every rule"
        )
    return check_int(f"{name}.vocab_size", model.vocab_size, lo=1)


def check_drafter(target, drafter: Drafter):
    """Raises ValueError/TypeError if ``drafter`` cannot serve ``target``."""
    if not isinstance(drafter, Drafter):
        hint = ""
        if callable(drafter) and hasattr(drafter, "vocab_size"):
            # A draft *model* where a drafter belongs: the commonest slip.
            hint = (
                "; to draft with a smaller model, wrap it: "
                "specjax.DraftModel(draft_model, num_draft=4)"
            )
        raise TypeError(f"drafter must be a specjax Drafter, got {type(drafter).__name__}{hint}")
    gamma = drafter.num_draft
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)):
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    if gamma < 1 and not drafter.null_drafter:
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    _check_contract_signatures(drafter)
    for role, model in drafter.own_models().items():
        _check_model(role, model)
    check_drafter_vocab(target, drafter)
    if drafter.target_layers:
        _check_features(target, drafter)
    drafter.check()  # the drafter's own settings, e.g. γ, mode, layers, tree
    if getattr(drafter, "tree", None) is not None:
        _check_tree(target, drafter)
    # Last: the pair's own rules above name the more specific problem first.
    for role, model in drafter.own_models().items():
        check_before_compiling(model, role)


# The arguments the decoder passes to each method of the drafter contract.
_CONTRACT_CALLS = {
    "init": ("prompts_BS", "seq_lengths_B", "cache_len", "features"),
    "propose": ("keys_BG", "state", "seq_BS", "seq_lengths_B", "sampling"),
    "update": ("state", "seq_lengths_B", "features"),
}


def _check_contract_signatures(drafter: Drafter) -> None:
    """A drafter method that cannot take the decoder's arguments is named here, with
    the call it must accept, instead of failing inside the traced loop."""
    for method, args in _CONTRACT_CALLS.items():
        fn = getattr(drafter, method)
        try:
            inspect.signature(fn).bind(*args)
        except TypeError:
            raise TypeError(
                f"{type(drafter).__name__}.{method}{inspect.signature(fn)} cannot take the "
                f"decoder's call {method}({', '.join(args)}); define it with these "
                f"positional parameters (see specjax.drafters.Drafter.{method})"
            ) from None
        except ValueError:  # no signature to read (a builtin): left to the call itself
            continue


def _check_tree(target, drafter: Drafter) -> None:
    """A tree drafter needs models that take ``tree=`` and a tree that fits them."""
    tree, name = drafter.tree, type(drafter).__name__
    if not isinstance(tree, Tree):
        raise TypeError(
            f"drafter.tree must be a specjax.verification.tree.Tree, got {type(tree).__name__}"
        )
    if drafter.num_draft != tree.depth:
        raise ValueError(
            f"drafter.num_draft (γ) must be the tree's depth {tree.depth}, got "
            f"{drafter.num_draft}: use drafter.with_tree(tree) to set both"
        )
    for role, model in {"target": target, **drafter.own_models()}.items():
        if not getattr(model, "supports_tree", False):
            raise TypeError(
                f"{role} ({type(model).__name__}) does not support tree attention (no "
                f"supports_tree = True and tree= argument), and the {name} proposes a "
                f"{tree!r}: see docs/models.md, 'Bring your own model', or use a chain"
            )
        if role == "target":
            cache = jax.eval_shape(lambda m=model: m.init_cache(1, 8))
            if not callable(getattr(cache, "compact_path", None)):
                raise TypeError(
                    f"the target's cache ({type(cache).__name__}) has no "
                    "compact_path(start_B, path_BD), which moves the accepted path's "
                    f"entries after a tree step, and the {name} proposes a {tree!r}: see "
                    "specjax.KVCache.compact_path, or use a chain"
                )
        windows = [w for w in getattr(getattr(model, "config", None), "layer_windows", ()) if w]
        # Tree keys are masked by slot, which is >= their position; that is exact as long
        # as the whole tree fits in the window (depth < window).
        if windows and min(windows) <= tree.depth:
            raise ValueError(
                f"{role} has a sliding window of {min(windows)} tokens, not deeper than the "
                f"depth {tree.depth} of the {tree!r}: use a shallower tree"
            )


def _check_features(target, drafter: Drafter) -> None:
    """A drafter that reads target layers needs a target that can return them."""
    layers = drafter.target_layers
    name = type(drafter).__name__
    try:
        params = inspect.signature(target.__call__).parameters
    except (TypeError, ValueError):
        params = {}
    takes = "feature_layers" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    if not takes:
        raise TypeError(
            f"target ({type(target).__name__}) cannot return hidden-state features: its "
            f"__call__ takes no feature_layers= argument, and the {name} reads target "
            f"layers {layers} (see docs/models.md, 'Bring your own model')"
        )
    num_layers = getattr(target, "num_layers", None)
    if num_layers is None:
        num_layers = getattr(getattr(target, "config", None), "num_layers", None)
    if not isinstance(layers, tuple) or not all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers
    ):
        raise TypeError(f"drafter.target_layers must be a tuple of ints, got {layers!r}")
    if num_layers is not None and not all(0 <= i < num_layers for i in layers):
        raise ValueError(
            f"drafter.target_layers {layers} must be layer indices in [0, {num_layers}) of "
            f"the {num_layers}-layer target"
        )
    own = getattr(drafter, "target", None)
    width = lambda m: getattr(getattr(m, "config", None), "hidden_size", None)  # noqa: E731
    if own is not None and width(own) is not None and width(own) != width(target):
        raise ValueError(
            f"the {name} was built for a target of width {width(own)}, but target has "
            f"hidden_size {width(target)}: its features would not fit the drafter"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """A decoder call's options, as `specjax.speculative_generate` documents them."""

    max_new_tokens: object
    sampling: SamplingConfig | None = None
    eos_id: object = None
    seeds: object = None
    cache_len: int | None = None
    verification: str = "rejection"
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


def _check_pair(target, drafter: Drafter, options: DecodeOptions) -> int:
    """Checks the models, the drafter and the options that depend on them; returns V."""
    vocab = _check_model("target", target)
    check_drafter(target, drafter)
    check_before_compiling(target, "target")
    if drafter.tree is not None and (
        options.gamma_by_active_rows is not None or options.draft_confidence is not None
    ):
        raise ValueError(
            "gamma_by_active_rows and draft_confidence adapt a chain's γ; they cannot be "
            f"used with a tree drafter ({drafter.tree!r})"
        )
    if options.verification not in VERIFICATIONS:
        raise ValueError(
            f"verification must be one of {VERIFICATIONS}, got {options.verification!r}"
        )
    return vocab


def _check_prompts(prompts, target, drafter: Drafter, vocab: int):
    """``(int32[B, P], int32[B])``: the prompts, checked against both vocabularies and
    the target's context."""
    prompts_BP, lengths_B = pad_prompts(prompts)
    p = prompts_BP.shape[1]
    _check_tokens_in_vocab(prompts_BP, lengths_B, vocab)
    if drafter.vocab_size is not None and drafter.vocab_size < vocab:
        _check_tokens_in_vocab(prompts_BP, lengths_B, drafter.vocab_size, "drafter's")
    context = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and p > context:
        raise ValueError(
            f"prompts: the longest prompt has {p} tokens, beyond the target's context of "
            f"{context} (config.max_position_embeddings)"
        )
    return prompts_BP, lengths_B


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


def _resolve_cache(options, target, drafter, prompt_width: int, max_new_N, num_slots, n):
    """The static cache length S, checked to fit int32 positions and the memory."""
    lookahead = step_slots(drafter, options.forward_width)
    resolved = resolve_cache_len(options.cache_len, prompt_width, max_new_N, lookahead)
    name = (
        "cache_len"
        if options.cache_len is not None
        else "max_new_tokens (through the default cache_len)"
    )
    if resolved > INT32_MAX // 2:
        raise ValueError(f"{name}: a cache of {resolved} slots does not fit int32 positions")
    # + seq, logprobs and flags per slot (and k top ids and log-probabilities), and the
    # same per prompt for the outputs.
    per_slot = 9 + 8 * options.top_logprobs
    nbytes = cache_bytes(target, num_slots, resolved) + (num_slots + n) * resolved * per_slot
    nbytes += drafter.state_bytes(num_slots, resolved)
    check_fits_memory(name, nbytes, f"caches of {resolved} slots for {num_slots} rows")
    return resolved


def _features(options: DecodeOptions, target, drafter, sampling_N, vocab: int, n: int):
    """The decoder's features: the built-in ones the options ask for, then the user's."""
    features = [
        Statistics(),
        DraftFlags(),
        Logprobs(),
        TopLogprobs(k=options.top_logprobs, raw=options.raw_logprobs),
    ]
    # A tree's penalties are checked off (`_check_logit_transforms`): nothing to count.
    if penalties_in_program(sampling_N) and drafter.tree is None:
        features.append(Penalize(vocab_size=vocab))
    stop = _stop_strings(options.stop, target, vocab, n)
    if stop is not None:
        features.append(StopAtStrings(table=stop))
    constraint = _constraint_table(options.constraint, vocab, n)
    if constraint is not None:
        features.append(Constrain(table=constraint))
    return tuple(features) + _check_user_features(options.features, features)


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


def _prepare(key, target, drafter: Drafter, prompts, options: DecodeOptions):
    """Validates a decoder's inputs on the host, before anything compiles.

    Returns:
        ``(traced, static, width)``: the traced arguments of
        `~specjax.decoding.refill._init_state` (the key, the `Decoder` and the prompts'
        arrays), its static keyword arguments, and the output width.
    """
    key = _check_key(key, options.sampling)
    vocab = _check_pair(target, drafter, options)
    prompts_NP, lengths_N = _check_prompts(prompts, target, drafter, vocab)
    n, p = prompts_NP.shape
    max_new_N = _check_max_new_tokens(options.max_new_tokens, n)
    sampling_N = _check_sampling(options, target, drafter, vocab, n)
    num_slots = _check_num_slots(options.num_slots, n)
    forward_width = check_forward_width(options.forward_width, drafter)
    top_logprobs = _check_top_logprobs(options.top_logprobs, vocab)
    options = dataclasses.replace(options, forward_width=forward_width, top_logprobs=top_logprobs)
    cache_len = _resolve_cache(options, target, drafter, p, max_new_N, num_slots, n)
    decoder = Decoder(
        target=target,
        drafter=drafter,
        features=_features(options, target, drafter, sampling_N, vocab, n),
        eos_ids=_eos_array(options.eos_id, vocab),
        draft_confidence=_check_confidence(options.draft_confidence),
        verification=options.verification,
        gamma_table=_check_gamma_table(options.gamma_by_active_rows, drafter.num_draft),
        forward_width=forward_width,
    )
    _check_bool("raw_logprobs", options.raw_logprobs)
    # Bucket the prompt width like the cache, capped by the cache itself.
    width = min(_round_up(p, PROMPT_BUCKET), cache_len)
    prompts_NP = jnp.pad(prompts_NP, [(0, 0), (0, width - p)])
    seeds_N = _check_seeds(options.seeds, n)
    traced = (key, decoder, prompts_NP, lengths_N, jnp.asarray(max_new_N), sampling_N, seeds_N)
    static = dict(cache_len=cache_len, num_slots=num_slots)
    # From host values (inside a user's jit the arrays above are already traced).
    host_lengths = np.asarray(lengths_N) if is_concrete(lengths_N) else np.full((n,), p)
    return traced, static, _output_width(max_new_N, host_lengths, cache_len)


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


def _check_top_logprobs(k, vocab: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= vocab:
        raise ValueError(
            f"top_logprobs must be an int in [0, V = {vocab}] (0: none), got {k!r:.40}"
        )
    return int(k)


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r:.40}")
    return bool(value)


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


def _output_width(max_new_B, prompt_lengths_B, cache_len: int) -> int:
    """N: the largest budget, or the most a row can hold, whichever is smaller.

    Never a ``[B, 10**9]`` buffer for a 64-slot cache. With traced budgets or prompt
    lengths (inside a user's jit) it is the cache length.
    """
    if not (is_concrete(max_new_B) and is_concrete(prompt_lengths_B)):
        return cache_len
    room = cache_len - int(np.min(prompt_lengths_B))
    return max(0, min(int(np.max(max_new_B)), room))
