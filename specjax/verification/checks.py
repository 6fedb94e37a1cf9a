"""Trace-time argument checks of the chain verifiers (`specjax.verification.chain`).

Shapes and dtypes are static, so plain Python works under jit and vmap (inside vmap the
per-sequence shapes are checked). Every error names the function that was called.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def shape_error(fn: str, message: str, **arrays) -> ValueError:
    shapes = ", ".join(f"{name}{list(x.shape)}" for name, x in arrays.items())
    return ValueError(f"{fn}: {message}; got {shapes}")


def check_dtypes(fn: str, draft_tokens, **prob_arrays) -> None:
    if not jnp.issubdtype(draft_tokens.dtype, jnp.integer):
        raise TypeError(f"{fn}: draft_tokens must be an integer array, got {draft_tokens.dtype}")
    for name, x in prob_arrays.items():
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{fn}: {name} must be a float array, got {x.dtype}")


def check_shapes(
    fn: str, batch_dims: int, draft_tokens, target, target_name: str, draft_probs=None
) -> None:
    """Checks ``draft_tokens [*B, γ]``, ``draft_probs [*B, γ, V]``, ``target [*B, γ+1, V]``."""
    arrays = {"draft_tokens": draft_tokens}
    if draft_probs is not None:
        arrays["draft_probs"] = draft_probs
    arrays[target_name] = target
    layout = "[B, " if batch_dims else "["
    expected = {
        "draft_tokens": f"{layout}γ]",
        "draft_probs": f"{layout}γ, V]",
        target_name: f"{layout}γ+1, V]",
    }
    for name, x in arrays.items():
        rank = batch_dims + (1 if name == "draft_tokens" else 2)
        if x.ndim != rank:
            raise shape_error(fn, f"{name} must have rank {rank}, {expected[name]}", **arrays)
    if len({x.shape[:batch_dims] for x in arrays.values()}) > 1:
        raise shape_error(fn, "batch sizes B differ", **arrays)
    gamma = draft_tokens.shape[-1]
    if target.shape[-2] != gamma + 1:
        raise shape_error(fn, f"{target_name} must have γ+1 positions", **arrays)
    if draft_probs is not None:
        if draft_probs.shape[-2] != gamma:
            raise shape_error(fn, "draft_probs must have γ positions", **arrays)
        if draft_probs.shape[-1] != target.shape[-1]:
            raise shape_error(fn, "vocabulary sizes V differ", **arrays)
    if target.shape[-1] < 1:
        raise shape_error(fn, "vocabulary size V must be >= 1", **arrays)


def check_concrete_probs(fn: str, **arrays) -> None:
    """Refuses NaN, negative and all-zero distributions when the values are on the host.

    Traced values (under jit or vmap) cannot be checked; the decoders flag a target row
    with no distribution instead (``GenerationResult.invalid``).
    """
    for name, x in arrays.items():
        if isinstance(x, jax.core.Tracer) or x.size == 0:
            continue
        x = np.asarray(x, np.float32)
        if np.isnan(x).any():
            raise ValueError(f"{fn}: {name} holds NaN")
        if (x < 0).any():
            raise ValueError(f"{fn}: {name} holds negative probabilities (min {x.min():.3g})")
        if (x.sum(-1) <= 0).any():
            where = np.argwhere(x.sum(-1) <= 0)[0].tolist()
            raise ValueError(f"{fn}: {name} has a row with no positive probability at {where}")


def checked_args(fn: str, batch_dims: int, draft_tokens, draft_probs, target_probs):
    """``(draft_tokens, draft_probs, target_probs)`` as arrays, checked, for verifiers
    that read the draft distributions q."""
    draft_tokens, draft_probs = jnp.asarray(draft_tokens), jnp.asarray(draft_probs)
    target_probs = jnp.asarray(target_probs)
    check_dtypes(fn, draft_tokens, draft_probs=draft_probs, target_probs=target_probs)
    check_shapes(fn, batch_dims, draft_tokens, target_probs, "target_probs", draft_probs)
    check_concrete_probs(fn, draft_probs=draft_probs, target_probs=target_probs)
    return draft_tokens, draft_probs, target_probs


def checked_onehot_args(fn: str, batch_dims: int, draft_tokens, target_probs):
    """``(draft_tokens, target_probs)`` as arrays, checked, for verifiers that need no q."""
    draft_tokens, target_probs = jnp.asarray(draft_tokens), jnp.asarray(target_probs)
    check_dtypes(fn, draft_tokens, target_probs=target_probs)
    check_shapes(fn, batch_dims, draft_tokens, target_probs, "target_probs")
    check_concrete_probs(fn, target_probs=target_probs)
    return draft_tokens, target_probs
