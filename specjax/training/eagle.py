"""The EAGLE head's objective: EAGLE-3's training-time test (`specjax.EagleDrafter`).

The frozen target scores the sequences once; the head is unrolled ``k`` steps over
all positions in parallel. Step 0 is the head fed the fused target features. Step
``i`` at position ``j`` is what the decoder computes at draft step ``i`` anchored at
``a = j - i``: it is fed ``g`` of step ``i-1`` at ``j-1`` (and the true token ``x_j``),
and attends to step 0's keys at positions ``<= a`` plus one key per step ``m = 1..i``,
step ``m``'s key at position ``a + m`` (the keys a draft chain wrote). Step ``i``'s loss
is the soft cross-entropy against the target's distribution at ``j`` (which predicts
``x_{j+1}``), averaged over valid positions (``j >= i``) and weighted ``0.8^i``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.drafters.eagle import EagleDrafter, shift
from specjax.models.attention import Keys, cache_layout
from specjax.models.forward import prefill_positions, score
from specjax.training.config import EagleTrainConfig

__all__ = ["eagle_objective", "eagle_ttt_loss", "ttt_step_logits"]


def ttt_step_logits(drafter: EagleDrafter, params, tokens_BT, features_BTF, num_steps: int):
    """The head unrolled ``num_steps`` steps over whole sequences (no cache).

    Args:
        drafter: the drafter (its target and static structure).
        params: the head's weights.
        tokens_BT: ``int32[B, T]`` sequences from position 0.
        features_BTF: the target's ``target_layers`` features of them.
        num_steps: k.

    Returns:
        A list of k ``float32[B, T, V]``: step ``i`` at position ``j`` is the draft
        distribution (logits) of the token at ``j + 1`` that a draft chain anchored at
        ``a = j - i`` computes at its step ``i`` (valid for ``j >= i``), fed the true
        tokens ``x_{a+1..j}``.
    """
    target = drafter.target
    net = nnx.merge(drafter.graphdef, params)
    b, t = tokens_BT.shape
    positions = prefill_positions(b, t)
    emb = target.embed(tokens_BT)
    feature = shift(net.fc(features_BTF), 1)
    pos = jnp.arange(t)
    keys, values, out = [], [], []
    for i in range(num_steps):
        x = net.layer_input(emb, feature)
        q, k, v = net.qkv(x, positions)
        keys.append(k)
        values.append(v)
        # Step 0's keys up to the anchor j - i, then step m's key at a + m (m = 1..i).
        context = Keys(*cache_layout(keys[0], values[0]), (pos[None, :] <= pos[:, None] - i)[None])
        chain = [
            Keys(shift(keys[m], i - m), shift(values[m], i - m), per_query=True)
            for m in range(1, i + 1)
        ]
        g = net.finish(x, q, [context, *chain])
        out.append(target.head(net.norm(g)))
        feature = shift(g, 1)  # position j+1 of the next step is fed g_j
    return out


def eagle_ttt_loss(
    params,
    drafter: EagleDrafter,
    tokens_BT: jax.Array,
    *,
    num_steps: int,
    step_weight: float = 0.8,
) -> tuple[jax.Array, dict]:
    """EAGLE-3's training-time-test loss on ``tokens``, with the target frozen.

    The target scores the sequences once (no cache), giving its ``target_layers``
    features and its distribution ``p_j`` (temperature 1) at every position. The head
    is unrolled ``num_steps`` steps (`ttt_step_logits`); step ``i``'s loss is the soft
    cross-entropy ``-Σ_v p_j(v) log q_{i,j}(v)`` averaged over positions ``j >= i``, and

        loss = Σ_i step_weight^i · loss_i / Σ_i step_weight^i.

    The target's weights (embedding and LM head included) are behind a stop-gradient:
    only ``params`` get gradients.

    Args:
        params: the head's weights (differentiated).
        drafter: the drafter (its target and static structure are used).
        tokens_BT: ``int32[B, T]`` training sequences, T > ``num_steps``.
        num_steps: k, steps unrolled (about the γ it will draft).
        step_weight: the per-step decay (EAGLE-3: 0.8).

    Returns:
        ``(loss, metrics)``; metrics hold ``loss``, ``step_losses`` ``[k]``,
        ``accuracy`` ``[k]`` (top-1 agreement with the target's argmax per step) and
        ``tau``: 1 + the mean accepted prefix of greedy k-token chains from every
        anchor, teacher-forced (an estimate of tokens per target call at γ = k).
    """
    b, t = tokens_BT.shape
    if not 1 <= num_steps < t:
        raise ValueError(f"num_steps must be in [1, {t - 1}] for sequences of {t}, got {num_steps}")
    target = drafter.target
    target = target.replace(params=jax.lax.stop_gradient(target.params))
    drafter = drafter.replace(target=target)
    positions = prefill_positions(b, t)
    logits_p, _, features = score(target, tokens_BT, positions, None, drafter.target_layers)
    logp = jax.nn.log_softmax(logits_p.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    best_p = jnp.argmax(logits_p, axis=-1)
    step_losses, correct = [], []
    steps = ttt_step_logits(drafter, params, tokens_BT, features.states, num_steps)
    for i, logits in enumerate(steps):
        logq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        ce_BT = -jnp.sum(jnp.where(p > 0, p * logq, 0.0), axis=-1)
        step_losses.append(jnp.mean(ce_BT[:, i:]))
        correct.append(jnp.argmax(logits, axis=-1) == best_p)
    weights = step_weight ** np.arange(num_steps)
    step_losses = jnp.stack(step_losses)
    loss = jnp.sum(jnp.asarray(weights, jnp.float32) * step_losses) / float(weights.sum())
    accuracy = jnp.stack([jnp.mean(c[:, i:]) for i, c in enumerate(correct)])
    # Anchor a's chain: step i is at position a + i.
    n = t - num_steps + 1
    run = jnp.cumprod(jnp.stack([c[:, i : i + n] for i, c in enumerate(correct)], 0), axis=0)
    tau = 1.0 + jnp.mean(jnp.sum(run, axis=0))
    return loss, {"loss": loss, "step_losses": step_losses, "accuracy": accuracy, "tau": tau}


def eagle_objective(
    params, drafter: EagleDrafter, tokens_BT: jax.Array, key: jax.Array, config: EagleTrainConfig
) -> tuple[jax.Array, dict]:
    """`eagle_ttt_loss` with an `EagleTrainConfig`'s steps and step weight.

    The head is unrolled ``config.ttt_steps`` steps over all positions, step i fed its
    own output features of step i-1 and weighted ``config.step_weight ** i``. Metrics
    (scalars only): ``loss``, ``accuracy`` (step 0's top-1 agreement with the target),
    ``tau`` (teacher-forced greedy tokens per call at γ = ttt_steps) and
    ``loss_step{i}``.
    """
    del key  # the training-time test draws nothing
    loss, metrics = eagle_ttt_loss(
        params, drafter, tokens_BT, num_steps=config.ttt_steps, step_weight=config.step_weight
    )
    # Scalars only in the step's metrics (the per-step vectors are for evaluation).
    return loss, {
        "loss": loss,
        "accuracy": metrics["accuracy"][0],
        "tau": metrics["tau"],
        **{f"loss_step{i}": x for i, x in enumerate(metrics["step_losses"])},
    }
