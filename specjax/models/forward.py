"""The target's forwards as the decoders and the drafters run them.

`score` is the one place that calls the model contract with or without
``feature_layers=`` (a drafter that reads the target's hidden states) and ``tree=``;
`prefill` runs it over the prompts into a fresh cache. A drafter that reads the target
(`specjax.BlockDrafter`, `specjax.EagleDrafter`) receives the requested layers' hidden
states as a `TargetHidden`. `cache_bytes` sizes a model's cache from shapes alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.contract import checked_output


@struct.dataclass
class TargetHidden:
    """Hidden states of the target's ``target_layers``, as handed to a drafter.

    Attributes:
        states: ``[B, T, n·E]`` the outputs of the n requested layers at T positions,
            concatenated in ``target_layers`` order.
        positions: ``int32[B, T]`` the absolute position of each column.
    """

    states: jax.Array
    positions: jax.Array


def prefill_positions(batch_size: int, length: int) -> jax.Array:
    """``int32[B, T]`` positions ``0..T-1`` for every row."""
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length))


def score(
    model, tokens_BT, positions_BT, cache, feature_layers: tuple[int, ...] = (), tree=None
):  # fmt: skip
    """One target forward, collecting a drafter's hidden states when it reads any.

    The one place that calls the model contract with or without ``feature_layers=``
    (and ``tree=``, a `~specjax.models.cache.TreeMask`, for a tree of drafts).

    Returns:
        ``(logits float32[B, T, V], new_cache, hidden)``: ``hidden`` is the
        `TargetHidden` of ``feature_layers`` at ``positions_BT``, or ``None`` when
        ``feature_layers`` is empty (the plain three-argument call).

    Raises:
        ModelContractError: the model returned something other than a
            `~specjax.models.contract.ModelOutput`.
    """
    extra = {} if tree is None else {"tree": tree}
    if feature_layers:
        extra["feature_layers"] = feature_layers
    out = checked_output(model(tokens_BT, positions_BT, cache, **extra), type(model).__name__)
    if not feature_layers:
        return out.logits, out.cache, None
    return out.logits, out.cache, TargetHidden(states=out.features, positions=positions_BT)


def prefill(
    model, prompts_BP: jax.Array, prompt_lengths_B: jax.Array, cache_len: int,
    feature_layers: tuple[int, ...] = (),
):  # fmt: skip
    """Runs ``model`` over right-padded prompts into a fresh cache of ``cache_len`` slots.

    Returns:
        ``(logits float32[B, P, V], cache, hidden)``, ``hidden`` the prompt's
        `TargetHidden` of ``feature_layers`` (``None`` without them). The cache's
        lengths are set to ``prompt_lengths - 1``: the last prompt token stays
        "pending", the same invariant the decode loops keep (the pending token is fed
        next step). The padded slots written here are overwritten before they are read.
    """
    b, p = prompts_BP.shape
    cache = model.init_cache(b, cache_len)
    logits, cache, hidden = score(model, prompts_BP, prefill_positions(b, p), cache, feature_layers)
    return logits, cache.rollback(prompt_lengths_B - 1), hidden


def tree_bytes(tree) -> int:
    """Bytes of a pytree's array leaves, arrays or ``jax.ShapeDtypeStruct`` alike."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def cache_bytes(model, batch_size: int, cache_len: int) -> int:
    """Bytes of ``model.init_cache(batch_size, cache_len)``, from shapes alone."""
    return tree_bytes(jax.eval_shape(lambda: model.init_cache(batch_size, cache_len)))
