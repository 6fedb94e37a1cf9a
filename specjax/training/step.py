"""One optimizer step: the objective of what is trained, AdamW, and the jitted step.

What is trained is a `specjax.Model` (its objective is `specjax.training.losses`) or a
trainable drafter, whose objective `specjax.training.objectives` names; nothing here
knows which drafters exist.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import struct

from specjax.core.typed_jit import typed_jit
from specjax.models.model import Model
from specjax.training import data as data_lib
from specjax.training.config import TrainConfig
from specjax.training.losses import lm_loss
from specjax.training.objectives import objective_of


@struct.dataclass
class TrainState:
    """Everything that evolves during training.

    Attributes:
        params: the model's ``nnx.State`` being trained.
        opt_state: the optax optimizer state.
        step: ``int32[]`` number of optimizer steps taken.
        key: data-order PRNG key; the batch of step ``s`` uses ``fold_in(key, s)``.
    """

    params: object
    opt_state: object
    step: jax.Array
    key: jax.Array


def trains_drafter(model) -> bool:
    """A drafter trained on its frozen target's features (the target is its teacher)."""
    return objective_of(model) is not None


def _loss_fn(params, batch_BT1, key, *, model, teacher_params, teacher, config):
    objective = objective_of(model)
    if objective is not None:
        # The frozen target is the "teacher": its params come in traced, like a
        # distillation teacher's, and only the drafter's are differentiated.
        drafter = model.replace(target=teacher.replace(params=teacher_params))
        return objective.loss(params, drafter, batch_BT1, key, config)
    del key
    return lm_loss(
        params,
        batch_BT1,
        model=model,
        teacher_params=teacher_params,
        teacher=teacher,
        config=config,
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """AdamW with linear warmup, cosine decay and global-norm clipping."""
    warmup = max(0, min(config.warmup_steps, config.steps - 1))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(config.steps, warmup + 1),
        end_value=config.learning_rate * config.min_lr_ratio,
    )
    adamw = optax.adamw(
        schedule,
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        # Decay weight matrices and embeddings only; decaying RMSNorm scales
        # towards 0 fights the normalisation.
        mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    )
    if config.grad_clip is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw)


def init_train_state(model: Model, config: TrainConfig) -> TrainState:
    """Step-0 state: the model's params, a fresh optimizer state and the data key."""
    # A copy, because train() donates the state: the caller's model must stay valid.
    params = jax.tree.map(jnp.copy, model.params)
    return TrainState(
        params=params,
        opt_state=make_optimizer(config).init(params),
        step=jnp.zeros((), jnp.int32),
        key=jax.random.key(config.seed),
    )


def train_step(
    state: TrainState,
    tokens_N: jax.Array,
    teacher_params=None,
    *,
    model: Model,
    config: TrainConfig,
    teacher: Model | None = None,
) -> tuple[TrainState, dict]:
    """One optimizer step on the batch of ``state.step``. Pure; jit it.

    Args:
        state: current :class:`TrainState`.
        tokens_N: ``int32[N]`` training token stream (stays on device).
        teacher_params: the frozen teacher's params (distillation only). Passed
            as an argument, not closed over, so they are not baked into the
            compiled program as constants.
        model: the model being trained (only its static structure is used).
        config: the :class:`TrainConfig`.
        teacher: the teacher model's static structure, or ``None``.

    Returns:
        ``(new_state, metrics)`` where metrics holds float32 scalars ``loss``,
        ``ce``, ``grad_norm`` and, when distilling, ``kl`` and ``tvd``.
    """
    batch_BT1 = data_lib.batch_for_step(
        tokens_N, state.key, state.step, config.batch_size, config.seq_len
    )
    loss_fn = functools.partial(
        _loss_fn, model=model, teacher_params=teacher_params, teacher=teacher, config=config
    )
    # A stream of its own for objectives that draw (e.g. a drafter's anchors).
    objective_key = jax.random.fold_in(jax.random.fold_in(state.key, state.step), 1)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch_BT1, objective_key)
    updates, opt_state = make_optimizer(config).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics


# The state is donated: params and both Adam moments are updated in place
# instead of holding two copies of each at the step boundary.
_jit_train_step = typed_jit(
    train_step, static_argnames=("model", "config", "teacher"), donate_argnums=0
)
