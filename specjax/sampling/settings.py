"""The sampling settings: `SamplingConfig`, what a user asks for, and their checks.

Every knob of `SamplingConfig` is an array leaf, a scalar or one value per row
(``[B]``), so a jitted decoder is compiled once and serves any temperature or
truncation, greedy and sampled rows in one batch. Leaves are read along the
*leading* axis of the logits: ``[B]`` settings apply to row b of the target's
``[B, γ+1, V]`` logits and of the draft's ``[B, V]`` logits alike.

* `SamplingConfig`: the user's settings, stored as host arrays of fixed dtypes;
* `RowSampling`: those settings plus each row's token history, as the decoders hand
  them on;
* `check_sampling_config`: ranges and shapes, on the host, before anything compiles;
* `per_row`: every leaf broadcast to one value per row, the decoders' jit signature.

What the settings do to logits is `specjax.sampling.distributions`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.validation import INT32_MAX, is_concrete

__all__ = [
    "PENALTY_OFF",
    "RowSampling",
    "SamplingConfig",
    "check_sampling_config",
    "per_row",
]

_PENALTY_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", *_PENALTY_FIELDS)
_FIELDS = ("temperature", "top_k", "top_p", "min_p")
#: The value of each penalty that turns it off.
PENALTY_OFF = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
_DTYPES = dict.fromkeys(_FLOAT_FIELDS, jnp.float32) | dict(top_k=jnp.int32, vocab_limit=jnp.int32)


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
    """A user's `SamplingConfig` plus each row's history, as the decoders hand it on.

    The decoders build one of these for every step (users never construct it) and pass
    it to the drafter's ``propose`` and to the verification's `probs_from_logits`, so
    that the drafter's q and the target's p read the same history. A drafter passes it
    on unchanged to `probs_from_logits` and `specjax.drafters.base.draw_draft`, and
    advances it between drafts drawn one by one with
    `specjax.sampling.penalties.after_token`. Given a plain `SamplingConfig` instead,
    every function treats it as a `RowSampling` without history.

    Attributes:
        histories: one `~specjax.sampling.history.RowHistory` per decoder feature that
            changes the distributions (the penalties' token counts, a constraint's
            automaton states, a user's), applied in order after the other logit
            transforms; ``()`` when none.
    """

    histories: tuple = ()

    @classmethod
    def of(cls, config: SamplingConfig, histories: tuple | None = None) -> RowSampling:
        """``config``'s settings with ``histories`` (``None``: those ``config`` already
        carries when it is a `RowSampling`, else none)."""
        if isinstance(config, RowSampling):
            return config if histories is None else config.replace(histories=tuple(histories))
        settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        return cls(**settings, histories=tuple(histories or ()))


def histories_of(config) -> tuple:
    """The `RowHistory` objects ``config`` carries (``()`` for a user's `SamplingConfig`)."""
    return getattr(config, "histories", ())


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
        **{name: broadcast(name) for name in _FIELDS},
        vocab_limit=limit,
        **penalties,
        logit_bias=rows(config.logit_bias, jnp.float32),
        forbidden_ids=rows(config.forbidden_ids, jnp.int32),
    )
