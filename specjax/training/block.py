"""The block drafter's objective: DFlash's anchored blocks (`specjax.BlockDrafter`).

In each training sequence, ``num_anchors`` random anchors each start a block
``[token at anchor, MASK × (block_size - 1)]``; a block sees only the target features
strictly before its anchor (as in decoding, where the pending token has no features
yet); block position k predicts the token at anchor + k, with cross-entropy weight
``exp(-(k-1)/decay)``. Block lengths are also drawn at random up to ``block_size``, so
that one drafter serves every γ below it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.drafters.block import BlockDrafter
from specjax.models.attention import cache_layout
from specjax.models.forward import prefill_positions, score
from specjax.training.config import BlockTrainConfig

__all__ = ["anchored_block_loss", "block_objective"]


def anchored_block_loss(
    params,
    drafter: BlockDrafter,
    tokens_BT: jax.Array,
    key: jax.Array,
    *,
    num_anchors: int,
    decay: float,
) -> tuple[jax.Array, dict]:
    """DFlash's anchored-block cross-entropy on ``tokens``, with the target frozen.

    The target scores the sequences once (no cache) and its ``target_layers``
    features are computed inside the same call; gradients reach only ``params``.

    Args:
        params: the drafter's weights (differentiated).
        drafter: the drafter (its target and static structure are used).
        tokens_BT: ``int32[B, T]`` training sequences.
        key: PRNG key for the anchors and block lengths.
        num_anchors: A anchors per sequence.
        decay: w in the weight ``exp(-(k-1)/w)`` of block position k.

    Returns:
        ``(loss, metrics)``; metrics hold ``loss``, ``accuracy`` (top-1 over
        weighted positions) and ``tau``: the mean accepted-prefix length + 1 a
        greedy verifier would get from the full-length blocks.
    """
    target = drafter.target
    b, t = tokens_BT.shape
    g1 = drafter.block_size
    positions_BT = prefill_positions(b, t)
    _, _, features = score(target, tokens_BT, positions_BT, None, drafter.target_layers)
    features = jax.lax.stop_gradient(features.states)
    net = nnx.merge(drafter.graphdef, params)
    kv = [cache_layout(k, v) for k, v in net.context_keys_values(features, positions_BT)]
    ctx_k = jnp.stack([k for k, _ in kv])  # [L, B, K, D, T]
    ctx_v = jnp.stack([v for _, v in kv])  # [L, B, K, T, D]

    anchor_key, length_key, full_key = jax.random.split(key, 3)
    anchors_BA = jax.random.randint(anchor_key, (b, num_anchors), 0, t - 1)
    # Half the blocks full length, half of a random length in [2, g1]: one drafter then
    # serves every γ < g1 without ever having seen a shorter block.
    random_len = jax.random.randint(length_key, (b, num_anchors), 2, g1 + 1)
    full = jax.random.bernoulli(full_key, 0.5, (b, num_anchors))
    block_len_BA = jnp.where(full, g1, random_len)

    k_idx = jnp.arange(g1)
    positions_BAG = anchors_BA[..., None] + k_idx[None, None]
    first = jax.lax.stop_gradient(target.embed(jnp.take_along_axis(tokens_BT, anchors_BA, 1)))
    x = jax.vmap(net.block_input, in_axes=(1, None), out_axes=1)(first, g1)  # [B, A, G1, E]
    q = num_anchors * g1
    x = x.reshape(b, q, -1)
    positions_BQ = positions_BAG.reshape(b, q)
    anchor_of_q = jnp.repeat(anchors_BA, g1, axis=1)
    ctx_visible = jnp.arange(t)[None, None] < anchor_of_q[..., None]  # strictly before
    block_of_q = jnp.repeat(jnp.arange(num_anchors), g1)
    k_of_q = jnp.tile(k_idx, num_anchors)
    len_of_q = jnp.repeat(block_len_BA, g1, axis=1)
    block_visible = (block_of_q[:, None] == block_of_q[None])[None] & (
        k_of_q[None, None, :] < len_of_q[:, :, None]
    )
    block_visible |= jnp.eye(q, dtype=bool)[None]
    hidden = net(x, positions_BQ, ctx_k, ctx_v, ctx_visible, block_visible)
    logits = target.head(hidden).reshape(b, num_anchors, g1, -1)

    label_pos = jnp.minimum(positions_BAG, t - 1)
    labels = jnp.take_along_axis(tokens_BT, label_pos.reshape(b, -1), 1).reshape(label_pos.shape)
    k_BAG = k_idx[None, None]
    valid = (k_BAG >= 1) & (positions_BAG < t) & (k_BAG < block_len_BA[..., None])
    weight = jnp.where(valid, jnp.exp(-(k_BAG - 1.0) / decay), 0.0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    loss = jnp.sum(weight * nll) / jnp.maximum(jnp.sum(weight), 1e-9)

    correct = jnp.argmax(logits, -1) == labels
    accuracy = jnp.sum(weight * correct) / jnp.maximum(jnp.sum(weight), 1e-9)
    in_range = (k_BAG >= 1) & (positions_BAG < t)
    full_blocks = jnp.all(in_range | (k_BAG == 0), axis=-1) & (block_len_BA == g1)
    run = jnp.cumprod(jnp.where(k_BAG >= 1, correct, True), axis=-1)[..., 1:]
    tau = jnp.sum(jnp.where(full_blocks, run.sum(-1) + 1.0, 0.0)) / jnp.maximum(
        jnp.sum(full_blocks), 1
    )
    return loss, {"loss": loss, "accuracy": accuracy, "tau": tau}


def block_objective(
    params, drafter: BlockDrafter, tokens_BT: jax.Array, key: jax.Array, config: BlockTrainConfig
) -> tuple[jax.Array, dict]:
    """`anchored_block_loss` with a `BlockTrainConfig`'s anchors and decay.

    Metrics: ``loss``, ``accuracy`` and ``tau`` (greedy accepted length + 1 on full
    blocks).
    """
    return anchored_block_loss(
        params, drafter, tokens_BT, key, num_anchors=config.num_anchors, decay=config.decay
    )
