"""The language-model objectives (cross-entropy and distillation) and evaluation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.models.model import Model
from specjax.training import data as data_lib


def forward(model: Model, tokens_BT: jax.Array) -> jax.Array:
    """Full causal forward from position 0, without a KV cache.

    The model's own forward with ``cache=None``: it skips writing keys and
    values into a cache (on CPU that scatter and its gradient cost about a
    third of a training step).

    Args:
        model: the decoder.
        tokens_BT: ``int32[B, T]`` token ids at positions ``0 .. T-1``.

    Returns:
        ``float32[B, T, V]`` next-token logits.
    """
    b, t = tokens_BT.shape
    positions_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return model(tokens_BT, positions_BT, None).logits


def cross_entropy(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats, computed in float32."""
    logits_BTV = logits_BTV.astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT).mean()


def distill_losses(student_logits_BTV: jax.Array, teacher_logits_BTV: jax.Array) -> dict:
    """Per-token divergences of the student ``q`` from the teacher ``p``, in float32.

    Args:
        student_logits_BTV: draft logits ``[B, T, V]``.
        teacher_logits_BTV: target logits ``[B, T, V]`` (treated as constants).

    Returns:
        ``{"kl": mean KL(p || q), "tvd": mean TV(p, q)}`` as float32 scalars.
    """
    logq = jax.nn.log_softmax(student_logits_BTV.astype(jnp.float32), axis=-1)
    logp = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits_BTV).astype(jnp.float32), -1)
    p = jnp.exp(logp)
    # xlogy-style guard: where p underflows to 0 its term is 0, not 0 * -inf.
    kl_BT = jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1)
    tvd_BT = 0.5 * jnp.sum(jnp.abs(p - jnp.exp(logq)), axis=-1)
    return {"kl": kl_BT.mean(), "tvd": tvd_BT.mean()}


def lm_loss(params, batch_BT1, *, model, teacher_params, teacher, config):
    """The loss of ``model`` with ``params``: cross-entropy, or distillation from ``teacher``.

    Returns:
        ``(loss, metrics)``; metrics hold ``loss``, ``ce`` and, when distilling, ``kl``
        and ``tvd``.
    """
    inputs_BT, targets_BT = batch_BT1[:, :-1], batch_BT1[:, 1:]
    logits_BTV = forward(model.replace(params=params), inputs_BT)
    ce = cross_entropy(logits_BTV, targets_BT)
    if teacher is None:
        return ce, {"loss": ce, "ce": ce}
    teacher_logits = forward(teacher.replace(params=teacher_params), inputs_BT)
    d = distill_losses(logits_BTV, teacher_logits)
    loss = config.kl_weight * d["kl"] + config.tvd_weight * d["tvd"] + config.ce_weight * ce
    return loss, {"loss": loss, "ce": ce, **d}


# ---------------------------------------------------------------------------
# Evaluation.


@jax.jit
def _eval_batch(model: Model, windows_BT1: jax.Array) -> jax.Array:
    logits_BTV = forward(model, windows_BT1[:, :-1])
    targets_BT = windows_BT1[:, 1:]
    nll_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT)
    return nll_BT.sum()


def evaluate(
    model: Model,
    tokens: np.ndarray,
    *,
    seq_len: int = 256,
    batch_size: int = 8,
    max_windows: int | None = None,
) -> float:
    """Mean next-token cross-entropy (nats/token) on held-out ``tokens``.

    The stream is cut into consecutive windows of ``seq_len`` predictions
    (see :func:`specjax.training.data.eval_windows`); each window starts with an empty
    context, as in training.

    Args:
        model: the model to score.
        tokens: ``int32[N]`` token stream.
        seq_len: window length T.
        batch_size: windows per forward call.
        max_windows: score only the first this many windows.

    Returns:
        The mean loss as a Python float; ``exp`` of it is the perplexity.
    """
    windows = data_lib.eval_windows(tokens, seq_len, max_windows)
    total = 0.0
    for i in range(0, len(windows), batch_size):
        total += float(_eval_batch(model, jnp.asarray(windows[i : i + batch_size])))
    return total / (windows.shape[0] * seq_len)
