"""Token distributions from logits, and sampling from them.

The same two functions serve the drafter and the target, so that speculative decoding
compares like with like:

* `probs_from_logits` turns logits ``[B, ..., V]`` into float32 probabilities after
  the vocabulary limit (padded embedding rows are never tokens), temperature, top-k,
  top-p and min-p (in that order), or into a one-hot of the argmax when the
  temperature is zero.
* `sample` draws one token per row of a ``[..., V]`` array of non-negative weights by
  an exponential race, ``argmax_i w_i / E_i`` with ``E_i ~ Exp(1)``, from one key or
  from one key per row.

Every knob of `SamplingConfig` is an array leaf, a scalar or one value per row
(``[B]``), so a jitted decoder is compiled once and serves any temperature or
truncation, greedy and sampled rows in one batch. Leaves are read along the
*leading* axis of the logits: ``[B]`` settings apply to row b of the target's
``[B, γ+1, V]`` logits and of the draft's ``[B, V]`` logits alike.

Top-k and top-p need a threshold (the k-th largest probability, or the probability at
which the sorted cumulative mass reaches ``top_p``). Sorting 128k entries per position is
the obvious way and the slow one; here the threshold is found exactly by bisection over
the int32 bit pattern of the probabilities (a non-negative float32's bits order the same
way as its value), 30 passes of compare-and-reduce per row.
``scripts/benchmarks/bench_verify.py`` measures the difference.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from specjax.core.validation import INT32_MAX, as_prng_keys, is_concrete
from specjax.sampling import noise
from specjax.sampling.penalties import apply_logit_transforms, history

__all__ = [
    "RowSampling",
    "SamplingConfig",
    "apply_sampling",
    "check_sampling_config",
    "greedy_tokens",
    "mask_vocab",
    "per_row",
    "probs_from_logits",
    "sample",
]

# Bits of float32 1.0 plus one: no probability reaches it, so it is a strict upper bound.
_PROB_BITS_UPPER = 0x3F800001
# Bisection halves [0, 0x3F800001) to width 1 in ceil(log2(0x3F800001)) = 30 steps.
_BISECTION_STEPS = 30
# Above this vocabulary size `sample` races blocks, then a token inside the chosen block,
# which needs ~2*sqrt(V) exponential variates per row instead of V (random bits
# dominate a flat race).
_FLAT_SAMPLING_MAX_V = 2048
_SAMPLING_BLOCK = 256

_PENALTY_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", *_PENALTY_FIELDS)
_FIELDS = ("temperature", "top_k", "top_p", "min_p")
#: The value of each penalty that turns it off.
PENALTY_OFF = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
_DTYPES = dict(
    temperature=jnp.float32, top_k=jnp.int32, top_p=jnp.float32, min_p=jnp.float32,
    vocab_limit=jnp.int32, repetition_penalty=jnp.float32, presence_penalty=jnp.float32,
    frequency_penalty=jnp.float32,
)  # fmt: skip


def _is_host_value(value) -> bool:
    # Not tuples: pytree utilities rebuild configs with other leaves (PartitionSpecs,
    # None, sentinels), which must pass through __post_init__ untouched.
    return isinstance(value, (bool, int, float, list, np.ndarray, np.generic))


@struct.dataclass
class SamplingConfig:
    """How logits become a token distribution. Every field is a traced array leaf.

    Each leaf is a scalar (every row) or an array ``[B]`` (one value per row), read
    along the leading axis of the logits: with ``[B, γ+1, V]`` target logits and
    ``[B, V]`` draft logits, row b gets ``temperature[b]`` in both. Any other shape is
    refused by `check_sampling_config`, and by `probs_from_logits` at trace time, with
    an error naming the field. Host values (Python numbers, lists, numpy arrays) are
    stored as numpy arrays of a fixed dtype (float32, and int32 for ``top_k``), so
    ``SamplingConfig(temperature=0.7)`` and ``SamplingConfig(temperature=np.float32(0.9))``
    hit the same jit cache entry; the decoders also broadcast every leaf to ``[B]``, so
    scalar and per-row settings share one compiled program.

    Call `validate` (or `check_sampling_config`) on the host before jitting; traced
    values cannot be checked and are used as given.

    The default is greedy decoding (temperature 0), as on the command line;
    ``SamplingConfig(temperature=1.0)`` samples from the model's distribution.

    Attributes:
        temperature: logits are divided by it; ``0`` (the default) means greedy: the
            most probable token, lowest id on ties (so do a negative or NaN value
            traced inside jit, where it is not checked).
        top_k: keep the ``top_k`` most probable tokens (all ties at the k-th probability
            included); ``0`` disables it.
        top_p: nucleus sampling: keep the smallest set of most probable tokens whose mass
            reaches ``top_p`` (all ties at the boundary included); ``1`` disables it.
        min_p: keep tokens whose probability is at least ``min_p`` times the largest;
            ``0`` disables it.
        vocab_limit: ids ``>= vocab_limit`` are never tokens: their logits are masked to
            ``-inf`` before anything else, so they are neither sampled nor chosen
            greedily (the padded embedding rows of a checkpoint whose tokenizer is
            smaller than its V). An integer ``>= 1``, scalar or ``[B]``, traced like the
            other fields. ``None`` (default): `probs_from_logits` masks nothing, and the
            decoders use the target's real vocabulary
            (`specjax.sampling.vocab.default_vocab_limit`: its tokenizer's size when smaller than
            V, else V).
        repetition_penalty: transformers' repetition penalty: a token that occurs in
            the prompt or in the generated tokens before a position has its logit
            divided by it when positive, multiplied by it when negative; ``> 0``,
            ``1`` disables it.
        presence_penalty: OpenAI's presence penalty: subtracted from the logit of every
            token that occurs in the *generated* tokens (not the prompt); in
            ``[-2, 2]``, ``0`` disables it.
        frequency_penalty: OpenAI's frequency penalty: subtracted once per occurrence
            in the generated tokens; in ``[-2, 2]``, ``0`` disables it.

            The three penalties default to ``None``: no penalty code in the compiled
            program (the decoders then count no tokens). Setting any of them compiles
            the program with penalties once; their values are traced like every
            setting (the unset ones act as off).
        logit_bias: ``None``, or an additive bias ``float32[V]`` (every row) or
            ``[B, V]`` (one per row); ``-inf`` forbids an id. Its width must be the
            target's V (checked by the decoders).
        forbidden_ids: ``None``, or ids that are never tokens: ``[K]`` (every row), or
            one list per row (ragged lists are padded with ``-1``, which forbids
            nothing).

    The logit transforms (forbidden ids, bias, penalties) act before the temperature
    and the filters; `specjax.sampling.penalties` says in which order and why speculation
    stays exact with them.
    """

    temperature: jax.Array | float = 0.0
    top_k: jax.Array | int = 0
    top_p: jax.Array | float = 1.0
    min_p: jax.Array | float = 0.0
    vocab_limit: jax.Array | int | None = None
    repetition_penalty: jax.Array | float | None = None
    presence_penalty: jax.Array | float | None = None
    frequency_penalty: jax.Array | float | None = None
    logit_bias: jax.Array | None = None
    forbidden_ids: jax.Array | None = None

    def __post_init__(self):
        # A Python float and a float32 array are different jit signatures; storing one
        # canonical host array keeps a single compiled program for every value.
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if value is not None and _is_host_value(value):
                arr = np.asarray(value)
                if arr.dtype == object or not (
                    np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
                ):
                    raise TypeError(
                        f"SamplingConfig.{name} must be a number or an array of numbers, "
                        f"got {value!r:.60}"
                    )
                object.__setattr__(self, name, arr.astype(np.float32))
        if _is_host_value(self.top_k):
            object.__setattr__(self, "top_k", _host_top_k(self.top_k))
        if _is_host_value(self.vocab_limit):
            object.__setattr__(self, "vocab_limit", _host_vocab_limit(self.vocab_limit))
        if _is_host_value(self.logit_bias):
            object.__setattr__(self, "logit_bias", _host_logit_bias(self.logit_bias))
        if _is_host_value(self.forbidden_ids):
            object.__setattr__(self, "forbidden_ids", _host_forbidden_ids(self.forbidden_ids))

    @classmethod
    def greedy(cls) -> SamplingConfig:
        """Argmax decoding (temperature 0), the default."""
        return cls(temperature=0.0)

    def validate(self, batch_size: int | None = None) -> SamplingConfig:
        """Raises ValueError for out-of-range concrete values or bad shapes; returns ``self``."""
        check_sampling_config(self, batch_size)
        return self


@struct.dataclass
class RowSampling(SamplingConfig):
    """A user's `SamplingConfig` plus each row's token history, as the decoders hand it on.

    The penalties and a constraint read the tokens before the position being scored.
    The decoders build one of these for every step (users never construct it) and pass
    it to the drafter's ``propose`` and to the verification's `probs_from_logits`, so
    that the drafter's q and the target's p read the same history. A drafter passes it
    on unchanged to `probs_from_logits` and `specjax.drafters.base.draw_draft`, and
    advances it between drafts drawn one by one with
    `specjax.sampling.penalties.after_token`. Given a plain `SamplingConfig` instead,
    every function treats it as a `RowSampling` without history.

    Attributes:
        counts: the token counts the penalties read
            (`specjax.sampling.penalties.TokenCounts`), ``None`` when no row has a
            penalty in the program: the penalties are then not applied.
        automaton: the rows' constraint states at the scored positions
            (`specjax.sampling.constraints.AutomatonCursor`), ``None`` when no row has a
            constraint. Ids the constraint does not allow there get ``-inf`` before
            every other transform.
    """

    counts: object = None
    automaton: object = None

    @classmethod
    def of(cls, config: SamplingConfig, **history) -> RowSampling:
        """``config``'s settings with the fields in ``history`` set (``counts=``,
        ``automaton=``, or a setting a decoder feature changes for the step).

        History ``config`` already carries (when it is a `RowSampling`) is kept unless
        ``history`` replaces it.
        """
        if isinstance(config, RowSampling):
            return config.replace(**history)
        settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        return cls(**{**settings, **history})


def _host_top_k(value) -> np.ndarray:
    """``top_k`` as int32, refusing non-integers and values beyond int32 (never wrapped)."""
    arr = np.asarray(value)
    if (
        arr.dtype == object
        or arr.dtype == np.bool_
        or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating))
    ):
        raise TypeError(f"SamplingConfig.top_k must be an integer, got {value!r:.60}")
    if np.issubdtype(arr.dtype, np.floating) and not np.all(arr == np.round(arr)):
        raise ValueError(f"SamplingConfig.top_k must be an integer, got {value!r:.60}")
    if arr.size and (np.max(arr) > INT32_MAX or np.min(arr) < -INT32_MAX):
        raise ValueError(
            f"SamplingConfig.top_k must fit in int32 (0 disables it), got {value!r:.60}"
        )
    return arr.astype(np.int32)


def _host_vocab_limit(value) -> np.ndarray:
    """``vocab_limit`` as int32: integers only (a float limit is a mistake, not a rounding)."""
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"SamplingConfig.vocab_limit must be an integer (or one per row), got {value!r:.60}"
        )
    if arr.size and (np.max(arr) > INT32_MAX or np.min(arr) < -INT32_MAX):
        raise ValueError(f"SamplingConfig.vocab_limit must fit in int32, got {value!r:.60}")
    return arr.astype(np.int32)


def _host_logit_bias(value) -> np.ndarray:
    """``logit_bias`` as float32 ``[V]`` or ``[B, V]``."""
    try:
        arr = np.asarray(value, np.float32)
    except (TypeError, ValueError):
        raise TypeError(
            f"SamplingConfig.logit_bias must be a float array [V] or [B, V], got {value!r:.60}"
        ) from None
    if arr.ndim not in (1, 2):
        raise ValueError(
            f"SamplingConfig.logit_bias must be [V] (every row) or [B, V] (one per row), "
            f"got shape {list(arr.shape)}"
        )
    if np.any(np.isnan(arr) | (arr == np.inf)):
        raise ValueError("SamplingConfig.logit_bias must not hold NaN or +inf (-inf forbids an id)")
    return arr


def _host_forbidden_ids(value) -> np.ndarray:
    """``forbidden_ids`` as int32 ``[K]`` or ``[B, K]``; ragged per-row lists padded with -1."""
    if isinstance(value, list) and value and all(isinstance(r, (list, tuple)) for r in value):
        width = max((len(r) for r in value), default=0)
        value = [list(r) + [-1] * (width - len(r)) for r in value]
    arr = np.asarray(value)
    if arr.size == 0:
        arr = arr.astype(np.int32)
    if arr.dtype == object or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"SamplingConfig.forbidden_ids must be integer ids [K] or one list per row, "
            f"got {value!r:.60}"
        )
    if arr.ndim not in (1, 2):
        raise ValueError(
            f"SamplingConfig.forbidden_ids must be [K] (every row) or one list per row [B, K], "
            f"got shape {list(arr.shape)}"
        )
    if arr.size and (np.min(arr) < -1 or np.max(arr) > INT32_MAX):
        raise ValueError(
            f"SamplingConfig.forbidden_ids must be ids >= 0 (-1 pads a row), got {value!r:.60}"
        )
    return arr.astype(np.int32)


def _shown(value: np.ndarray) -> str:
    """A concrete setting as a user writes it: ``-1.0``, or ``[0.5, 2.0]`` for one per row
    (not ``array(-1., dtype=float32)``)."""
    return f"{value.item() if value.ndim == 0 else value.tolist()!r:.80}"


def check_sampling_config(config: SamplingConfig, batch_size: int | None = None) -> None:
    """Raises ValueError naming the first field with a bad shape or out-of-range value.

    Valid ranges: ``temperature >= 0``, ``top_k >= 0``, ``0 < top_p <= 1``,
    ``0 <= min_p < 1`` and ``vocab_limit >= 1`` (or ``None``; its upper bound, the
    model's V, is checked by the decoders). Valid shapes: a scalar, or
    ``[batch_size]`` when ``batch_size`` is given (any rank-1 shape otherwise). Shapes
    are checked for traced fields too; traced values (inside jit or vmap) are not, since
    they are unknown: call this on the host before jitting.
    """
    if not isinstance(config, SamplingConfig):
        raise TypeError(
            f"sampling must be a specjax.SamplingConfig, got {type(config).__name__} "
            "(e.g. SamplingConfig(temperature=0.7))"
        )
    checks = {
        "temperature": (lambda v: v >= 0, "must be >= 0 (0 means greedy)"),
        "top_k": (lambda v: v >= 0, "must be >= 0 (0 disables top-k)"),
        "top_p": (lambda v: (v > 0) & (v <= 1), "must be in (0, 1] (1 disables top-p)"),
        "min_p": (lambda v: (v >= 0) & (v < 1), "must be in [0, 1) (0 disables min-p)"),
        "vocab_limit": (lambda v: v >= 1, "must be >= 1 (ids >= vocab_limit are masked)"),
        "repetition_penalty": (
            lambda v: (v > 0) & (v < np.inf),
            "must be > 0 and finite (1 disables it)",
        ),
        "presence_penalty": (lambda v: (v >= -2) & (v <= 2), "must be in [-2, 2] (0 disables it)"),
        "frequency_penalty": (lambda v: (v >= -2) & (v <= 2), "must be in [-2, 2] (0 disables it)"),
    }
    for name, (is_valid, requirement) in checks.items():
        value = getattr(config, name)
        if name in _PENALTY_FIELDS and value is None:
            continue
        if name == "vocab_limit" and value is None:
            continue
        dtype = getattr(value, "dtype", None)
        numeric = isinstance(value, (jax.Array, np.ndarray, np.generic, int, float)) and not (
            isinstance(value, bool) or dtype == np.bool_
        )
        # A float top_k is accepted when integral (and checked below); a vocab_limit
        # must be an integer.
        kinds = (jnp.integer,) if name == "vocab_limit" else (jnp.integer, jnp.floating)
        if not numeric or not (dtype is None or any(jnp.issubdtype(dtype, k) for k in kinds)):
            kind = "an integer" if name in ("top_k", "vocab_limit") else "a number"
            raise TypeError(
                f"SamplingConfig.{name} must be {kind} or an array of one per row, "
                f"got {value!r:.60}"
            )
        shape = tuple(jnp.shape(value))
        if len(shape) > 1 or (batch_size is not None and shape not in ((), (batch_size,))):
            rows = f"[{batch_size}]" if batch_size is not None else "[B]"
            raise ValueError(
                f"SamplingConfig.{name} has shape {list(shape)}; each setting must be a "
                f"scalar or one value per row, {rows}"
            )
        if not is_concrete(value):
            continue
        value = np.asarray(value)
        # Written as "all valid" rather than "any invalid" so that NaN fails.
        if not np.all(is_valid(value)):
            raise ValueError(f"SamplingConfig.{name} {requirement}; got {_shown(value)}")
        if name == "top_k" and not np.issubdtype(value.dtype, np.integer):
            if not np.all(value == np.round(value)):
                raise ValueError(f"SamplingConfig.top_k must be an integer; got {_shown(value)}")
    for name in ("logit_bias", "forbidden_ids"):
        value = getattr(config, name)
        if value is None:
            continue
        shape = tuple(jnp.shape(value))
        if len(shape) == 2 and batch_size is not None and shape[0] != batch_size:
            raise ValueError(
                f"SamplingConfig.{name} has shape {list(shape)}: a per-row {name} needs one "
                f"row per prompt, [{batch_size}, ...]"
            )
        if len(shape) not in (1, 2):
            raise ValueError(
                f"SamplingConfig.{name} has shape {list(shape)}; it must be rank 1 (every "
                "row) or rank 2 (one row per prompt)"
            )


def per_row(config: SamplingConfig, batch_size: int) -> SamplingConfig:
    """``config`` checked, with every leaf broadcast to ``[batch_size]``.

    The decoders call this on the host, so that a scalar setting and a per-row array
    are one jit signature: greedy and sampled rows share one compiled program. A
    ``vocab_limit`` of ``None`` stays ``None`` (the decoders resolve it first).
    """
    check_sampling_config(config, batch_size)
    broadcast = lambda name: jnp.broadcast_to(  # noqa: E731
        jnp.asarray(getattr(config, name), _DTYPES[name]), (batch_size,)
    )
    limit = None if config.vocab_limit is None else broadcast("vocab_limit")
    # The bias and the forbidden ids become one row per prompt too ([B, V], [B, K]): the
    # decoders gather every leaf by prompt along its leading axis, which must never be V.
    rows = lambda x, dtype: (
        None
        if x is None
        else jnp.broadcast_to(  # noqa: E731
            jnp.asarray(x, dtype), (batch_size, jnp.shape(x)[-1])
        )
    )
    # Penalties: all None (none in the program), or all [B] (the unset ones off).
    penalties = {name: getattr(config, name) for name in _PENALTY_FIELDS}
    if any(v is not None for v in penalties.values()):
        penalties = {
            name: jnp.broadcast_to(
                jnp.asarray(PENALTY_OFF[name] if v is None else v, jnp.float32), (batch_size,)
            )
            for name, v in penalties.items()
        }
    return SamplingConfig(
        **{name: broadcast(name) for name in _FIELDS}, vocab_limit=limit, **penalties,
        logit_bias=rows(config.logit_bias, jnp.float32),
        forbidden_ids=rows(config.forbidden_ids, jnp.int32),
    )  # fmt: skip


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """Argmax over the last axis: ``[..., V] -> int32[...]``.

    NaN is treated as ``-inf``, and ties go to the lowest index, so a row with no usable
    logit (all ``-inf`` or NaN) yields token 0. Works on logits or probabilities.
    """
    logits = jnp.asarray(logits)
    return _first_argmax(jnp.where(jnp.isnan(logits), -jnp.inf, logits))


def _first_argmax(x: jax.Array) -> jax.Array:
    """``argmax`` over the last axis (lowest index on ties) of NaN-free ``x``, as int32.

    Written as a max, then the lowest index holding it: two plain reductions that
    XLA:CPU vectorises. ``jnp.argmax`` lowers to one reduction over (value, index)
    pairs that it does not, and measured 3-10x slower (18.8 us against 1.9 us for
    one row of V = 4096; it ran several times per decode step).
    """
    max_R1 = jnp.max(x, axis=-1, keepdims=True)
    ids = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == max_R1, ids, x.shape[-1] - 1), axis=-1)


def _per_row(name: str, value, batch_shape: tuple[int, ...], dtype) -> jax.Array:
    """A config leaf (scalar or ``[B]``) broadcast to ``batch_shape + (1,)`` by its leading axis.

    ``[B]`` leaves meet ``batch_shape = (B, ...)`` along B, whatever else follows (γ+1
    target positions, nothing for the draft): rank promotion's trailing alignment would
    read them along the wrong axis.
    """
    value = jnp.asarray(value).astype(dtype)
    if value.ndim == 0:
        return jnp.broadcast_to(value, batch_shape)[..., None]
    if value.ndim != 1 or not batch_shape or value.shape[0] != batch_shape[0]:
        rows = f"[{batch_shape[0]}]" if batch_shape else "a scalar (the logits have no batch axis)"
        raise ValueError(
            f"SamplingConfig.{name} has shape {list(value.shape)}, but logits with batch shape "
            f"{list(batch_shape)} need a scalar or {rows}: one value per row of the leading axis"
        )
    value = value.reshape(value.shape + (1,) * len(batch_shape))
    return jnp.broadcast_to(value, batch_shape + (1,))


def greedy_rows(config: SamplingConfig, batch_size: int) -> jax.Array:
    """``bool[B]``: the rows `probs_from_logits` makes one-hot (temperature ``<= 0`` or NaN)."""
    return ~(_per_row("temperature", config.temperature, (batch_size,), jnp.float32)[:, 0] > 0)


def mask_vocab(logits: jax.Array, vocab_limit) -> jax.Array:
    """``logits`` with every id ``>= vocab_limit`` set to ``-inf``: ``[B, ..., V]`` in, same out.

    Args:
        logits: ``[B, ..., V]`` float array.
        vocab_limit: ``None`` (nothing is masked), or an integer scalar or ``[B]``, read
            along the leading axis like every `SamplingConfig` field.
    """
    if vocab_limit is None:
        return logits
    limit_R1 = _per_row("vocab_limit", vocab_limit, logits.shape[:-1], jnp.int32)
    ids_RxV = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.where(ids_RxV < limit_R1, logits, -jnp.inf)


def _bisect_threshold(predicate, lo_R1: jax.Array, hi_R1: jax.Array) -> jax.Array:
    """Largest int32 ``t`` in ``[lo, hi)`` with ``predicate(t)`` true, per row.

    ``predicate`` must be monotone (true then false as ``t`` grows), true at ``lo`` and
    false at ``hi``; ``hi - lo <= 2**30``.
    """

    def step(_, bracket):
        lo, hi = bracket
        mid = lo + (hi - lo) // 2
        ok = predicate(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo_R1, _ = lax.fori_loop(0, _BISECTION_STEPS, step, (lo_R1, hi_R1))
    return lo_R1


def _truncate(probs_RxV: jax.Array, top_k_R1, top_p_R1, min_p_R1) -> jax.Array:
    """Top-k, then top-p on the renormalised survivors, then min-p; renormalised."""
    vocab = probs_RxV.shape[-1]
    bits_RxV = lax.bitcast_convert_type(probs_RxV, jnp.int32)
    max_prob_R1 = jnp.max(probs_RxV, axis=-1, keepdims=True)
    # The most probable token survives every filter, so the renormaliser is >= max_prob.
    hi_R1 = lax.bitcast_convert_type(max_prob_R1, jnp.int32) + 1
    zero_R1 = jnp.zeros_like(hi_R1)

    def top_k_threshold():
        k_R1 = jnp.clip(top_k_R1, 1, vocab)
        count_at_least = lambda t: jnp.sum(bits_RxV >= t, axis=-1, keepdims=True) >= k_R1
        return jnp.where(top_k_R1 > 0, _bisect_threshold(count_at_least, zero_R1, hi_R1), 0)

    k_bits_R1 = lax.cond(jnp.any(top_k_R1 > 0), top_k_threshold, lambda: zero_R1)

    def top_p_threshold():
        kept_mass = lambda t: jnp.sum(
            jnp.where(bits_RxV >= t, probs_RxV, 0.0), axis=-1, keepdims=True
        )
        # Top-p acts on the top-k survivors renormalised, i.e. on mass top_p * M_k.
        target_R1 = top_p_R1 * kept_mass(k_bits_R1)
        bits = _bisect_threshold(lambda t: kept_mass(t) >= target_R1, k_bits_R1, hi_R1)
        # top_p == 1 must keep everything; a mass test could drop tokens lost to rounding.
        return jnp.where(top_p_R1 < 1, bits, k_bits_R1)

    p_bits_R1 = lax.cond(jnp.any(top_p_R1 < 1), top_p_threshold, lambda: k_bits_R1)

    # The most probable token always survives (even a min_p > 1 given inside jit, where it
    # is not checked), so the renormaliser is never 0 and no NaN comes out.
    is_max_RxV = probs_RxV == max_prob_R1
    keep_RxV = (bits_RxV >= p_bits_R1) & ((probs_RxV >= min_p_R1 * max_prob_R1) | is_max_RxV)
    kept_RxV = jnp.where(keep_RxV, probs_RxV, 0.0)
    return kept_RxV / jnp.sum(kept_RxV, axis=-1, keepdims=True)


def probs_from_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """Float32 token probabilities ``[B, ..., V]`` from logits ``[B, ..., V]`` of any float dtype.

    Steps, each on the previous step's (renormalised) output:

    0. vocabulary limit: logits at ids ``>= config.vocab_limit`` become ``-inf`` (when it
       is set), so those ids get probability 0 in every later step and in the
       degenerate cases below; then the logit transforms of `specjax.sampling.penalties`
       (a constraint's mask, forbidden ids, logit bias, then the penalties; the
       constraint and the penalties need the rows' history, which only a `RowSampling`
       from the decoders carries);
    1. temperature: ``softmax(logits / temperature)``; a temperature ``<= 0`` or NaN
       returns the one-hot of `greedy_tokens` (lowest index on ties) instead, chosen per
       row by a traced select, so greedy and sampled rows share one compiled program;
    2. top-k: keep every token whose probability is ``>=`` the k-th largest (ties at the
       threshold are all kept, so more than k tokens can survive);
    3. top-p: keep every token whose probability is ``>=`` the largest threshold ``t``
       such that the tokens ``>= t`` carry at least ``top_p`` of the mass: the smallest
       set of most probable tokens reaching ``top_p``, plus all ties at its boundary;
    4. min-p: keep tokens with probability ``>= min_p * max probability``;
    5. renormalise.

    Thresholds are found by an exact bisection over the float32 bit patterns rather than
    a sort; disabled filters (``top_k == 0``, ``top_p == 1``) cost nothing when disabled
    for every row.

    Degenerate logits never produce NaN: NaN logits are treated as ``-inf`` (the token
    gets probability 0); if any logit is ``+inf`` the distribution is uniform over the
    ``+inf`` tokens; a row with no usable logit (all ``-inf`` or NaN) yields the uniform
    distribution over all V tokens, or over the ids below ``vocab_limit`` (its greedy
    one-hot is token 0).

    Args:
        logits: ``[B, ..., V]`` float array (bf16, f16, f32, ...).
        config: a `SamplingConfig` (or the decoders' `RowSampling`); each setting a
            scalar or ``[B]`` (one value per row of the leading axis); any other shape
            raises ValueError naming the field.

    Returns:
        float32 ``[..., V]``, non-negative, each row summing to 1 up to rounding.
    """
    logits = jnp.asarray(logits)
    if logits.ndim < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(
            f"probs_from_logits: logits must be a float array [..., V], got "
            f"{logits.dtype}{list(logits.shape)}"
        )
    if logits.shape[-1] == 0:
        raise ValueError(
            f"probs_from_logits: logits have no tokens (shape {list(logits.shape)}); "
            "the last axis is the vocabulary, V >= 1"
        )
    # Concrete settings are range-checked here (traced ones cannot be): a min_p above 1,
    # say, would otherwise silently keep only the most probable token.
    check_sampling_config(config)
    batch_shape = logits.shape[:-1]
    temperature_R1 = _per_row("temperature", config.temperature, batch_shape, jnp.float32)
    top_k_R1 = _per_row("top_k", config.top_k, batch_shape, jnp.int32)
    top_p_R1 = _per_row("top_p", config.top_p, batch_shape, jnp.float32)
    min_p_R1 = _per_row("min_p", config.min_p, batch_shape, jnp.float32)

    x_RxV = logits.astype(jnp.float32)
    x_RxV = mask_vocab(jnp.where(jnp.isnan(x_RxV), -jnp.inf, x_RxV), config.vocab_limit)
    x_RxV = apply_logit_transforms(x_RxV, config, history(config)[0])
    greedy_R1 = ~(temperature_R1 > 0)

    def greedy():
        vocab_ids_RxV = lax.broadcasted_iota(jnp.int32, x_RxV.shape, x_RxV.ndim - 1)
        return (vocab_ids_RxV == greedy_tokens(x_RxV)[..., None]).astype(jnp.float32)

    def sampled():
        max_R1 = jnp.max(x_RxV, axis=-1, keepdims=True)
        # Shift before dividing so nothing overflows to +inf. The where()s cover the
        # degenerate rows: max == +inf (inf - inf is NaN), max == -inf (all -inf), and
        # -inf logits at temperature inf (-inf / inf is NaN).
        safe_temperature_R1 = jnp.where(greedy_R1, 1.0, temperature_R1)
        shifted_RxV = jnp.where(x_RxV == -jnp.inf, -jnp.inf, (x_RxV - max_R1) / safe_temperature_R1)
        z_RxV = jnp.where(x_RxV == max_R1, 0.0, shifted_RxV)
        # A row with no usable logit is uniform over the ids that may be tokens, never
        # over masked ones (which are -inf like the rest, so equal to the max).
        z_RxV = mask_vocab(z_RxV, config.vocab_limit)
        e_RxV = jnp.exp(z_RxV)
        probs_RxV = e_RxV / jnp.sum(e_RxV, axis=-1, keepdims=True)
        return _truncate(probs_RxV, top_k_R1, top_p_R1, min_p_R1)

    # The sampled rows cost a few passes over V, so a batch of greedy rows (the common
    # case) computes only their one-hots. Otherwise a sampled row's probabilities come
    # out of one program whatever the other rows' temperatures, and the greedy one-hots,
    # one more pass, are selected per row.
    mixed = lambda: jnp.where(greedy_R1, greedy(), sampled())
    return lax.cond(jnp.all(greedy_R1), greedy, mixed)


def _race_argmax(noise_RxV: jax.Array, weights_RxV: jax.Array) -> jax.Array:
    """``argmax_i w_i / E_i`` per row (an exponential race); entries ``w <= 0`` never win.

    Weights are scaled by their row maximum first, so that ``w / E`` neither overflows
    nor loses a small weight to an underflow that matters (the top token scores at least
    ``1 / max E``).
    """
    positive_RxV = weights_RxV > 0
    max_R1 = jnp.max(jnp.where(positive_RxV, weights_RxV, 0.0), axis=-1, keepdims=True)
    scaled_RxV = weights_RxV / jnp.where(max_R1 > 0, max_R1, 1.0)
    return _first_argmax(jnp.where(positive_RxV, scaled_RxV / noise_RxV, -1.0))


def _row_keys_for(key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    """Keys ``[R]`` for the ``R = prod(batch_shape)`` rows: given per row, or folded from one."""
    if key.shape == batch_shape:
        return key.reshape(-1)
    if key.shape == ():
        # One key for all rows: row r uses fold_in(key, r), independent of the others.
        num_rows = int(np.prod(batch_shape, dtype=np.int64))
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_rows))
    raise ValueError(
        f"sample: key must be one key or one key per row, of shape {list(batch_shape)}; "
        f"got keys of shape {list(key.shape)}"
    )


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draws one token per row: ``[..., V]`` weights -> ``int32[...]``.

    Token ``i`` is drawn with probability ``probs[i] / sum(probs)`` by an exponential
    race, ``argmax_i probs[i] / E_i`` with ``E_i ~ Exp(1)`` drawn from 64 random bits
    (`specjax.sampling.noise.exponential`), so the weights need not be normalised and tokens are
    drawn at their rate down to float32 resolution: a token 1e-12 as likely as the top
    one is drawn at rate 1e-12, not never (the Gumbel-max tail problem). Entries that
    are zero, negative or NaN are never drawn; a row with no positive entry returns
    token 0. Denormal weights (below 1.2e-38) may count as zero: XLA on CPU flushes
    denormals to zero. Weights must be finite.

    For ``V > 2048`` the draw is two-stage, with the same distribution: a block of 256
    tokens is raced in proportion to its mass, then a token inside the block. This needs
    ``V/256 + 256`` variates per row instead of V.

    The noise of a row is a function of that row's key only, so two calls with the same
    key and the same V use the same noise: this is what coupled verification relies on.

    Args:
        key: one PRNG key (row ``r`` of the flattened batch uses ``fold_in(key, r)``), or
            one key per row, of shape ``probs.shape[:-1]``.
        probs: ``[..., V]`` non-negative weights of any float dtype.

    Returns:
        int32 ``[...]`` token ids in ``[0, V)``.
    """
    weights = jnp.asarray(probs).astype(jnp.float32)
    if weights.ndim < 1 or weights.shape[-1] == 0:
        raise ValueError(
            f"sample: probs must be [..., V] with V >= 1 tokens, got shape {list(weights.shape)}"
        )
    batch_shape, vocab = weights.shape[:-1], weights.shape[-1]
    keys_R = _row_keys_for(as_prng_keys("sample: key", key), batch_shape)
    weights_RxV = weights.reshape(-1, vocab)
    if vocab <= _FLAT_SAMPLING_MAX_V:
        noise_RxV = jax.vmap(lambda k: noise.exponential(k, (vocab,)))(keys_R)
        return _race_argmax(noise_RxV, weights_RxV).reshape(batch_shape)

    num_blocks = -(-vocab // _SAMPLING_BLOCK)
    padded_RxV = jnp.pad(weights_RxV, [(0, 0), (0, num_blocks * _SAMPLING_BLOCK - vocab)])
    blocks_RxNxK = padded_RxV.reshape(-1, num_blocks, _SAMPLING_BLOCK)
    # Non-positive and NaN entries must not contribute mass to their block.
    blocks_RxNxK = jnp.where(blocks_RxNxK > 0, blocks_RxNxK, 0.0)

    # One draw per row serves both stages (independent variates, one random-bits call).
    noise_RxNK = jax.vmap(lambda k: noise.exponential(k, (num_blocks + _SAMPLING_BLOCK,)))(keys_R)
    block_noise_RxN, token_noise_RxK = noise_RxNK[:, :num_blocks], noise_RxNK[:, num_blocks:]
    block_R = _race_argmax(block_noise_RxN, jnp.sum(blocks_RxNxK, axis=-1))
    chosen_RxK = jnp.take_along_axis(blocks_RxNxK, block_R[:, None, None], axis=1)[:, 0]
    tokens_R = block_R * _SAMPLING_BLOCK + _race_argmax(token_noise_RxK, chosen_RxK)
    return tokens_R.reshape(batch_shape)


def apply_sampling(key: jax.Array, logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """``sample(key, probs_from_logits(logits, config))``: ``[B, ..., V]`` -> ``int32[B, ...]``."""
    return sample(key, probs_from_logits(logits, config))
