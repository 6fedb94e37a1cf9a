"""`check_model`: every rule of the model contract the decoders rely on, run on a tiny input.

The decoders only see a model through ``model(tokens, positions, cache)`` (which
returns a `~specjax.models.contract.ModelOutput`), ``model.init_cache`` and
``model.vocab_size`` (`specjax.models.contract`; docs/models.md, "Bring your own model"). A
model that breaks a rule does not always fail loudly: one that masks attention by
``cache.lengths`` instead of by position stays exact but can silently lose
acceptance (0.75 instead of 1.00 for one such model drafting for itself), because a
`~specjax.DraftModel` feeds positions ``[last-1, last]`` again. So each rule
is checked here, eagerly and on a batch of two short rows, with an error that names
it.

    >>> import specjax
    >>> specjax.check_model(specjax.testing.tiny_model(seed=0))
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.typed_jit import typed_jit
from specjax.drafters.checks import check_drafter
from specjax.models.contract import (
    ModelContractError,
    check_logits_shape,
    checked_output,
    not_a_pytree,
)

__all__ = ["ModelContractError", "check_model"]

#: Rows and tokens of the probe input: B = 2 so that per-row lengths can differ.
_BATCH, _LENGTH, _CACHE = 2, 6, 16


def _low_precision(model) -> bool:
    leaves = [x for x in jax.tree.leaves(model) if hasattr(x, "dtype")]
    return any(
        jnp.dtype(x.dtype).itemsize < 4 for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)
    )


@typed_jit
def _call(model, tokens_BT, positions_BT, cache):
    # Under jit, as the decoders call it: eager op-by-op dispatch of a real model
    # costs far more than compiling the three probe shapes once.
    return model(tokens_BT, positions_BT, cache)


def _forward(model, tokens, positions, cache, rule):
    """``(logits, new_cache)`` of one call, any failure reported as ``rule``."""
    try:
        out = _call(model, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), cache)
    except Exception as e:  # noqa: BLE001 - any failure of the user's model is reported as this rule
        raise ModelContractError(rule, f"model(tokens, positions, cache) raised {e!r:.300}") from e
    out = checked_output(out)
    return out.logits, out.cache


def _check_logits(logits, tokens, vocab: int) -> np.ndarray:
    check_logits_shape(tuple(np.shape(logits)), np.shape(tokens), vocab)
    dtype = getattr(logits, "dtype", None)
    if dtype != jnp.float32:
        raise ModelContractError(
            "float32 logits", f"logits are {dtype}; probabilities are computed in float32"
        )
    return np.asarray(logits)


def _check_lengths(cache, expected, rule: str) -> None:
    lengths = getattr(cache, "lengths", None)
    got = None if lengths is None else np.asarray(lengths).tolist()
    if lengths is None or not np.array_equal(np.asarray(lengths), np.asarray(expected)):
        ends = np.asarray(expected) - 1
        message = f"after positions ending at {ends}, cache.lengths must be "
        raise ModelContractError(rule, message + f"{np.asarray(expected).tolist()}, got {got}")


def check_model(model, *, drafter=None, seed: int = 0) -> None:
    """Checks, on a tiny input, every rule of the model contract the decoders use.

    Rules, in order (each failure raises `ModelContractError` naming it):

    - ``pytree``: the model is a pytree (``flax.struct.dataclass``, an ``nnx.Module``),
      because it is passed into ``jax.jit``.
    - ``call``: the model is callable as ``model(tokens, positions, cache)`` and returns
      a `~specjax.models.contract.ModelOutput` (not a tuple).
    - ``vocab_size``: a Python int ≥ 1, equal to the logits' width.
    - ``init_cache``: ``model.init_cache(B, S)`` runs under ``jax.eval_shape`` and has
      ``lengths: int32[B]`` (all zero) and ``rollback(lengths)``.
    - ``logits [B, T, V]`` and ``float32 logits`` for T > 1.
    - ``lengths``: ``new_cache.lengths == positions[:, -1] + 1``.
    - ``cached == full``: feeding the tokens one at a time through the cache gives
      the logits of one full forward.
    - ``repeated positions``: feeding positions ``[last-1, last]`` again (what
      `DraftModel` does after each step) gives the full forward's logits. A model
      that masks by ``cache.lengths`` instead of by position fails here.
    - ``rollback``: ``cache.rollback(lengths)`` sets the lengths, and continuing from
      there gives the full forward's logits.
    - With ``drafter``: the checks the decoders run on the pair (features the
      drafter reads, vocabulary, tree support).

    Args:
        model: the model to check.
        drafter: optionally, a `~specjax.drafters.Drafter` to be paired with it.
        seed: seed of the random probe tokens.

    Raises:
        ModelContractError: the first rule the model breaks.
    """
    vocab, cache0 = _check_structure(model)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(_BATCH, _LENGTH))
    positions = np.broadcast_to(np.arange(_LENGTH), (_BATCH, _LENGTH))
    full, cache = _forward(model, tokens, positions, cache0, "call")
    full = _check_logits(full, tokens, vocab)
    _check_lengths(cache, np.full((_BATCH,), _LENGTH), "lengths")
    same = _comparer(model, full)
    cache = _check_one_by_one(model, tokens, positions, cache0, full, vocab, same)
    _check_repeated(model, tokens, positions, cache, full, vocab, same)
    _check_rollback(model, tokens, cache, full, vocab, same)
    if drafter is not None:
        check_drafter(model, drafter)


def _check_structure(model):
    """``(V, empty cache)`` after the rules that need no forward: pytree, call,
    vocab_size, init_cache, rollback."""
    if not_a_pytree(model):
        raise ModelContractError(
            "pytree",
            f"{type(model).__name__} is not a pytree, so jax.jit cannot take it: "
            "make it a flax.struct.dataclass or an nnx.Module, or register it",
        )
    if not callable(model) or not hasattr(model, "init_cache"):
        raise ModelContractError("call", f"{type(model).__name__} needs __call__ and init_cache")
    vocab = getattr(model, "vocab_size", None)
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < 1:
        raise ModelContractError(
            "vocab_size", f"model.vocab_size must be an int >= 1, got {vocab!r}"
        )
    try:
        shapes = jax.eval_shape(lambda: model.init_cache(_BATCH, _CACHE))
    except Exception as e:  # noqa: BLE001 - reported as the rule
        raise ModelContractError(
            "init_cache", f"init_cache(B, S) failed under jax.eval_shape: {e!r:.300}"
        ) from e
    lengths = getattr(shapes, "lengths", None)
    if lengths is None or lengths.shape != (_BATCH,) or lengths.dtype != jnp.int32:
        raise ModelContractError(
            "init_cache", f"the cache needs lengths: int32[B] = int32[{_BATCH}], got {lengths}"
        )
    cache0 = model.init_cache(_BATCH, _CACHE)
    if not callable(getattr(cache0, "rollback", None)):
        raise ModelContractError(
            "rollback",
            f"the cache ({type(cache0).__name__}) needs rollback(lengths) -> cache, "
            "which the decoders call after rejecting drafts",
        )
    return vocab, cache0


def _comparer(model, full):
    """``same(rule, got, want, what)``: raises the rule unless ``got`` is ``want`` within
    the tolerance of the model's precision."""
    scale = 1.0 + float(np.max(np.abs(full)))
    tol = (2e-2 if _low_precision(model) else 1e-4) * scale

    def same(rule, got, want, what):
        err = float(np.max(np.abs(np.asarray(got, np.float32) - want)))
        if not err <= tol:
            raise ModelContractError(
                rule, f"{what} differ from one full forward by {err:.3g} (tolerance {tol:.3g})"
            )

    return same


def _check_one_by_one(model, tokens, positions, cache, full, vocab, same):
    """``cached == full``: one token at a time through the cache; returns the cache."""
    for i in range(tokens.shape[1]):
        logits, cache = _forward(
            model, tokens[:, i : i + 1], positions[:, i : i + 1], cache, "cached == full"
        )
        step = _check_logits(logits, tokens[:, i : i + 1], vocab)
        same("cached == full", step, full[:, i : i + 1], f"logits of token {i} fed one by one")
    _check_lengths(cache, np.full((tokens.shape[0],), tokens.shape[1]), "lengths")
    return cache


def _check_repeated(model, tokens, positions, cache, full, vocab, same):
    """``repeated positions``: DraftModel's feed, the last two positions again."""
    b, t = tokens.shape
    rule = "repeated positions"
    again, cache2 = _forward(model, tokens[:, t - 2 :], positions[:, t - 2 :], cache, rule)
    again = _check_logits(again, tokens[:, t - 2 :], vocab)
    same(rule, again, full[:, t - 2 :], "logits of positions [last-1, last] fed again")
    _check_lengths(cache2, np.full((b,), t), "lengths")


def _check_rollback(model, tokens, cache, full, vocab, same):
    """``rollback``: roll back to per-row lengths, then continue each row from there."""
    b = tokens.shape[0]
    keep = np.asarray([2, 4], np.int32)
    try:
        rolled = cache.rollback(jnp.asarray(keep))
    except Exception as e:  # noqa: BLE001 - reported as the rule
        raise ModelContractError("rollback", f"cache.rollback(lengths) raised {e!r:.300}") from e
    _check_lengths(rolled, keep, "rollback")
    nxt = np.stack([tokens[r, keep[r] : keep[r] + 2] for r in range(b)])
    pos = np.stack([np.arange(keep[r], keep[r] + 2) for r in range(b)])
    logits, _ = _forward(model, nxt, pos, rolled, "rollback")
    logits = _check_logits(logits, nxt, vocab)
    want = np.stack([full[r, keep[r] : keep[r] + 2] for r in range(b)])
    same("rollback", logits, want, "logits after rollback(lengths) and continuing")
