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


def score(model, tokens_BT, positions_BT, cache, feature_layers: tuple[int, ...] = (), tree=None):
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


# Prompts longer than this are prefilled this many tokens at a time: a forward's
# attention scores are float32[B, H, T, S] over the cache's S slots, so one forward over
# a long prompt would hold T · S of them per head (an 8k prompt into a 16k cache: 0.5 GB
# per row and head), more than a chip's memory at a real batch.
PREFILL_CHUNK = 512


def prefill(
    model,
    prompts_BP: jax.Array,
    prompt_lengths_B: jax.Array,
    cache_len: int,
    feature_layers: tuple[int, ...] = (),
    chunk: int = PREFILL_CHUNK,
):
    """Runs ``model`` over right-padded prompts into a fresh cache of ``cache_len`` slots.

    A prompt of at most ``chunk`` tokens is one forward; a longer one is a loop of
    forwards ``chunk`` tokens wide, each attending to the cache the earlier ones wrote,
    so the scores held at once are ``chunk`` tokens' (the padded tail past ``P`` is
    written and overwritten before it is read, like every padded slot).

    Returns:
        ``(cache, hidden)``, ``hidden`` the prompt's `TargetHidden` of
        ``feature_layers`` (``None`` without them). The cache's lengths are set to
        ``prompt_lengths - 1``: the last prompt token stays "pending", the same
        invariant the decode loops keep (the pending token is fed next step), so no
        logits of the prompt are read.
    """
    b, p = prompts_BP.shape
    cache = model.init_cache(b, cache_len)
    if p <= chunk:
        _, cache, hidden = score(model, prompts_BP, prefill_positions(b, p), cache, feature_layers)
        return cache.rollback(prompt_lengths_B - 1), hidden
    n = -(-p // chunk)
    padded_BP = jnp.pad(prompts_BP, ((0, 0), (0, n * chunk - p)))
    tokens_NBC = padded_BP.reshape(b, n, chunk).transpose(1, 0, 2)

    def one(cache, i_tokens):
        i, tokens_BC = i_tokens
        positions_BC = i * chunk + prefill_positions(b, chunk)
        _, cache, hidden = score(model, tokens_BC, positions_BC, cache, feature_layers)
        return cache, None if hidden is None else hidden.states

    cache, states_NBCF = jax.lax.scan(one, cache, (jnp.arange(n, dtype=jnp.int32), tokens_NBC))
    hidden = None
    if states_NBCF is not None:
        states_BPF = states_NBCF.transpose(1, 0, 2, 3).reshape(b, n * chunk, -1)[:, :p]
        hidden = TargetHidden(states=states_BPF, positions=prefill_positions(b, p))
    return cache.rollback(prompt_lengths_B - 1), hidden


def tree_bytes(tree) -> int:
    """Bytes of a pytree's array leaves, arrays or ``jax.ShapeDtypeStruct`` alike."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def cache_bytes(model, batch_size: int, cache_len: int) -> int:
    """Bytes of ``model.init_cache(batch_size, cache_len)``, from shapes alone."""
    return tree_bytes(jax.eval_shape(lambda: model.init_cache(batch_size, cache_len)))
