"""Checks at the public boundary, in one place.

Every public entry point (the decoders, the sampling and verification primitives,
checkpoint I/O, training and the CLI) validates its arguments with these helpers,
on the host and before anything is compiled, so that a bad value gets one clear
error that names the argument, never a silent truncation or a traceback from
inside tracing.

Values that are traced (inside a user's ``jax.jit`` or ``vmap``) cannot be checked;
the helpers check their shape and dtype, which are static, and pass them through.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "INT32_MAX",
    "as_prng_key",
    "as_prng_keys",
    "check_bool",
    "check_float",
    "check_fits_memory",
    "check_int",
    "check_int_array",
    "is_concrete",
    "with_article",
]

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def is_concrete(x) -> bool:
    """Whether ``x`` has a value on the host (is not a tracer)."""
    return not isinstance(x, jax.core.Tracer)


def with_article(noun: str) -> str:
    """``noun`` after "a" or "an", as an error message names it ("an EagleDrafter")."""
    return f"{'an' if noun[:1] in tuple('aeiouAEIOU') else 'a'} {noun}"


def _describe(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} {value.dtype}{list(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def check_bool(name: str, value) -> bool:
    """``value`` as a bool: only ``True`` or ``False`` (a NumPy bool too), never a truthy
    stand-in, refused with a TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r:.40}")
    return bool(value)


def check_int(name: str, value, *, lo: int | None = None, hi: int | None = None) -> int:
    """A concrete integer in ``[lo, hi]`` (and within int32), as a Python int.

    Accepts Python and numpy integers and 0-d integer arrays. Refuses bools, floats
    (even integral ones such as ``3.0``), strings, ``None`` and arrays of another
    rank with a ``TypeError``/``ValueError`` that names ``name``.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got a bool ({value!r})")
    if isinstance(value, (jax.Array, np.ndarray)):
        if not is_concrete(value):
            raise TypeError(f"{name} must be a concrete integer, got a traced {_describe(value)}")
        if value.ndim != 0 or not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{name} must be an integer, got {_describe(value)}")
        value = int(value)
    elif not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {_describe(value)}")
    value = int(value)
    low = INT32_MIN if lo is None else lo
    high = INT32_MAX if hi is None else hi
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_int_array(
    name: str, value, *, lo: int | None = None, hi: int | None = None, ndim: int | None = None
):
    """An integer array (or nested list) with every entry in ``[lo, hi]`` and within int32.

    Returns an ``int32`` numpy array for concrete input, or the traced array unchanged
    (after checking its dtype and rank). Values beyond int32 are refused rather than
    wrapped: ``2**32 + 5`` is not ``5``.
    """
    if not is_concrete(value):
        if not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{name} must hold integers, got {_describe(value)}")
        if ndim is not None and value.ndim != ndim:
            raise ValueError(f"{name} must have rank {ndim}, got {_describe(value)}")
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must hold integers, got a bool")
    try:
        # object dtype first: np.asarray([2**63]) would raise, 2**40 would silently be int64.
        arr = np.asarray(value)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{name} is not a rectangular integer array: {e}") from None
    if arr.dtype == object:
        flat = arr.ravel().tolist()
        if not all(isinstance(v, Integral) and not isinstance(v, bool) for v in flat):
            raise TypeError(f"{name} must hold integers, got {_describe(value)}")
        big = [v for v in flat if not INT32_MIN <= v <= INT32_MAX]
        if big:
            raise ValueError(f"{name} holds {big[0]}, which does not fit in int32")
        arr = np.asarray(flat, np.int64).reshape(arr.shape)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have rank {ndim}, got shape {list(arr.shape)}")
    if arr.size:
        low = INT32_MIN if lo is None else lo
        high = INT32_MAX if hi is None else hi
        vmin, vmax = int(arr.min()), int(arr.max())
        if vmin < low or vmax > high:
            bad = vmin if vmin < low else vmax
            raise ValueError(f"{name} holds {bad}, outside the allowed range [{low}, {high}]")
    return arr.astype(np.int32)


def check_float(
    name: str,
    value,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
) -> float:
    """A concrete real number in the given range (NaN always refused), as a Python float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.ndarray, jax.Array)):
        raise TypeError(f"{name} must be a number, got {_describe(value)}")
    if isinstance(value, (np.ndarray, jax.Array)):
        if value.ndim != 0 or not is_concrete(value):
            raise TypeError(f"{name} must be a concrete scalar, got {_describe(value)}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and (value > hi or (hi_open and value == hi)):
        raise ValueError(f"{name} must be {'<' if hi_open else '<='} {hi}, got {value}")
    return value


def as_prng_key(name: str, key) -> jax.Array:
    """One PRNG key: a typed key scalar (``jax.random.key``) or a raw ``uint32[2]``.

    Returns a typed key. Refuses ints, ``None``, batches of keys and float arrays with a
    ``TypeError`` naming ``name`` (pass ``jax.random.key(0)``, not ``0``).
    """
    hint = f"pass one key such as jax.random.key(0) as {name}"
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise TypeError(f"{name} must be a PRNG key; got {_describe(key)} ({hint})")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(
                f"{name} must be a single PRNG key, got a batch of keys of shape "
                f"{list(key.shape)} ({hint})"
            )
        return key
    if key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(jnp.asarray(key))
    raise TypeError(f"{name} must be a PRNG key; got {_describe(key)} ({hint})")


def as_prng_keys(name: str, key) -> jax.Array:
    """Typed PRNG keys of any batch shape, from typed keys (``jax.random.key``) or raw
    ones (``uint32[..., 2]``, ``jax.random.PRNGKey``). Works on traced keys.

    Refuses anything else (an int seed, floats) with a ``TypeError`` naming ``name`` and
    the fix.
    """
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise TypeError(
            f"{name} must be a PRNG key; got {_describe(key)} "
            f"(pass jax.random.key(seed), or one key per row)"
        )
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if key.dtype == jnp.uint32 and key.ndim >= 1 and key.shape[-1] == 2:
        return jax.random.wrap_key_data(jnp.asarray(key))
    raise TypeError(
        f"{name} must be a PRNG key; got {key.dtype}{list(key.shape)} "
        f"(pass jax.random.key(seed), or one key per row)"
    )


def _available_bytes() -> int | None:
    """Memory of the default device (accelerators), or of the host (CPU)."""
    device = jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without stats raise various errors
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_memory(name: str, nbytes: int, what: str) -> None:
    """Refuses, naming ``name``, buffers that cannot fit in the device's memory.

    Checked before compiling, so that ``cache_len=10**9`` is one clear ``ValueError``
    instead of an out-of-memory error from XLA after a long compile.
    """
    available = _available_bytes()
    if available is not None and nbytes > available:
        raise ValueError(
            f"{name} asks for {what} of {nbytes / 2**30:.1f} GiB, more than the "
            f"{available / 2**30:.1f} GiB this device has"
        )
