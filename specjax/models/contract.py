"""The model contract: what every model gives specjax, and the rules checked before compiling.

A model is a pytree (it is passed into ``jax.jit``) with

* ``model(tokens_BT, positions_BT, cache) -> ModelOutput``: ``tokens`` and ``positions``
  are ``int32[B, T]``, and the `ModelOutput` holds ``logits float32[B, T, V]`` (row t
  scores the token after ``tokens[:, t]``) and the new cache, whose ``lengths`` are
  ``positions[:, -1] + 1``;
* ``model.init_cache(batch_size, max_len)``: an empty cache, a pytree with
  ``lengths: int32[B]`` and ``rollback(lengths) -> cache``;
* ``model.vocab_size``: V, a Python int.

Two extensions: a target of a drafter that reads its hidden states takes
``feature_layers=`` and fills `ModelOutput.features`; a model used with a tree drafter
sets ``supports_tree = True`` and takes ``tree=`` (`specjax.models.cache.TreeMask`).
docs/models.md, "Bring your own model", has the whole contract.

`ModelContractError` names the broken rule. The decoders call
`check_before_compiling` on every model they are given (under ``jax.eval_shape``,
nothing runs); `specjax.check_model` runs these and the rules that need values. This
module imports no other part of specjax, so both can use it without an import circle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class ModelOutput:
    """What a model call returns (``model(tokens_BT, positions_BT, cache, ...)``).

    Attributes:
        logits: ``float32[B, T, V]``; row t scores the token after ``tokens[:, t]``.
        cache: the new cache, with ``lengths == positions[:, -1] + 1`` (or the tree's
            last slot + 1 with ``tree=``); ``None`` when called with ``cache=None``.
        features: ``[B, T, n·E]`` the outputs (residual stream) of the decoder layers
            asked for with ``feature_layers=(l, ...)``, concatenated in that order;
            ``None`` when none were asked for.
        hidden: ``[B, T, E]`` the final normalised hidden states (what the LM head
            reads), or ``None`` for a model that does not give them.
    """

    logits: jax.Array
    cache: object = None
    features: jax.Array | None = None
    hidden: jax.Array | None = None


# The probe's batch and cache length: small, and B = 2 so that per-row shapes show.
PROBE_BATCH, PROBE_CACHE = 2, 16


class ModelContractError(TypeError):
    """A model breaks a rule of the model contract; the message names the rule."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        super().__init__(
            f"model contract, rule '{rule}': {message} (see docs/models.md, 'Bring your own "
            "model'; specjax.check_model(model) checks every rule)"
        )


def check_logits_shape(shape: tuple, tokens_shape: tuple, vocab: int) -> None:
    """Rules ``logits [B, T, V]`` and ``vocab_size`` on the logits' shape."""
    b, t = tokens_shape
    if len(shape) != 3 or shape[:2] != (b, t):
        raise ModelContractError(
            "logits [B, T, V]",
            f"tokens of shape {(b, t)} gave logits of shape {shape}; every "
            "position needs its own row of logits, also for T > 1 (prefill, verification)",
        )
    if shape[2] != vocab:
        raise ModelContractError(
            "vocab_size", f"model.vocab_size is {vocab} but the logits are {shape[2]} wide"
        )


def checked_output(out, name: str = "the model") -> ModelOutput:
    """``out`` if it is a `ModelOutput`, else the rule ``call``'s error naming the fix.

    Args:
        out: what ``model(tokens, positions, cache)`` returned.
        name: the model, as messages call it.

    Raises:
        ModelContractError: ``out`` is not a `ModelOutput` (a ``(logits, cache)``
            tuple, say).
    """
    if isinstance(out, ModelOutput):
        return out
    got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
    raise ModelContractError(
        "call",
        f"{name}'s __call__(tokens, positions, cache) returned {got}; return "
        "specjax.ModelOutput(logits=logits, cache=new_cache) instead (with features=... "
        "when it is asked for feature_layers)",
    )


def not_a_pytree(model) -> bool:
    """True when jax sees ``model`` as one opaque leaf (an unregistered class)."""
    leaves = jax.tree.leaves(model)
    return len(leaves) == 1 and leaves[0] is model


# Signatures (type, tree structure, leaf shapes) already probed by `check_before_compiling`:
# a host-side memo like jit's own cache, so repeated calls with one model trace it once.
_PROBED: set = set()


def check_before_compiling(model, role: str) -> None:
    """The contract rules a decoder can check from shapes alone, before it compiles.

    ``pytree``, ``init_cache`` (``lengths: int32[B]``), ``rollback`` and
    ``logits [B, T, V]`` with ``vocab_size`` equal to their width, all under
    ``jax.eval_shape`` (nothing runs). Where the model itself raises on the probe's
    shapes, nothing is checked: the decoder's own call then reports that error.
    `check_model` runs these and the rules that need values (``cached == full``,
    ``repeated positions``, ...). Each model signature is probed once per process.

    Args:
        model: a model with ``__call__``, ``init_cache`` and an int ``vocab_size``.
        role: what the caller calls it in messages, e.g. ``"target"``.

    Raises:
        ModelContractError: naming the rule and pointing to `check_model`.
    """
    name = f"{role} ({type(model).__name__})"
    if not_a_pytree(model):
        raise ModelContractError(
            "pytree",
            f"{name} is not a pytree, so jax.jit cannot take it: make it a "
            "flax.struct.dataclass or an nnx.Module, or register it",
        )
    leaves, treedef = jax.tree.flatten(model)
    try:
        shapes = tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in leaves)
        signature = (type(model), treedef, shapes)
        if signature in _PROBED:
            return
    except TypeError:  # an unhashable static field: probe every time
        signature = None
    # The model's own errors are left to the real call, which raises them with the
    # real shapes (a sharded model, say, may refuse a probe batch its mesh cannot split).
    try:
        cache = jax.eval_shape(lambda: model.init_cache(PROBE_BATCH, PROBE_CACHE))
    except Exception:  # noqa: BLE001 - not a contract rule: the decoder's call reports it
        return
    lengths = getattr(cache, "lengths", None)
    if getattr(lengths, "shape", None) != (PROBE_BATCH,) or lengths.dtype != jnp.int32:
        raise ModelContractError(
            "init_cache",
            f"{name}'s cache needs lengths: int32[B] = int32[{PROBE_BATCH}], got {lengths}",
        )
    if not callable(getattr(cache, "rollback", None)):
        raise ModelContractError(
            "rollback",
            f"{name}'s cache ({type(cache).__name__}) needs rollback(lengths) -> "
            "cache, which the decoders call after rejecting drafts",
        )
    tokens = jax.ShapeDtypeStruct((PROBE_BATCH, 2), jnp.int32)
    try:
        out = jax.eval_shape(lambda m, c, x: m(x, x, c), model, cache, tokens)
    except Exception:  # noqa: BLE001 - as above
        return
    out = checked_output(out, name)
    check_logits_shape(tuple(out.logits.shape), (PROBE_BATCH, 2), int(model.vocab_size))
    if signature is not None:
        _PROBED.add(signature)
