"""Training decoder LMs: next-token pre-training and draft distillation.

One jitted, donated step function does everything on device: it samples the
step's batch from the token stream with ``fold_in(key, step)``, computes the
loss in float32, and applies AdamW (warmup + cosine learning rate, global-norm
clipping). Because the batch is a function of the step and the state holds the
step, a run resumed from a checkpoint produces bit-identical losses and
parameters to an uninterrupted one.

Two objectives:

* **Language modelling**: cross-entropy of the next token.
* **Distillation** (``teacher=...``): the draft ``q`` is trained towards the
  frozen target's distribution ``p`` at temperature 1 with forward
  ``KL(p || q)`` and, optionally, the total-variation distance
  ``TV(p, q) = 1/2 sum |p - q|``, whose complement ``1 - TV`` is exactly the
  per-token acceptance probability of speculative sampling (DistillSpec, Zhou
  et al. 2024). Teacher logits are computed on the fly inside the same jit.

Drafters that read the target's hidden states are trained the same way, the frozen
target scoring each batch inside the step: `train_block_drafter` (DFlash's anchored
blocks) and `train_eagle` (EAGLE-3's training-time test).

Checkpoints are Hugging Face folders (``save_pretrained``: ``config.json``,
``model.safetensors``, ``tokenizer.json``) in the training dtype, plus
``train_state.safetensors`` holding the optimizer state, step, data key and
loss history. Nothing is pickled. Each checkpoint is written to a temporary
directory, flushed to disk and renamed into place (:mod:`specjax.io.atomic`), so a
crash never leaves a half-written checkpoint that ``resume=True`` would pick up.

Garbage is refused, not trained on: :class:`TrainConfig` checks every field when
it is built, :func:`train` checks the token ids against the vocabulary before
the first step, and a non-finite loss or gradient stops the run with a
``FloatingPointError`` naming the step, before any checkpoint of it is written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file
from tqdm.auto import tqdm

from specjax import data as data_lib
from specjax.io import atomic
from specjax.models.llama import Model, upgrade_legacy_layout
from specjax.validation import check_float, check_int, check_int_array

TRAIN_STATE_FILE = "train_state.safetensors"
_CKPT_PREFIX = "step_"

# Fields of TrainConfig that do not change the trajectory of a run, and so may
# differ between an interrupted run and its resumption.
_RESUMABLE_FIELDS = frozenset(
    {"max_minutes", "checkpoint_every", "keep_checkpoints", "log_every", "progress"}
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run.

    Attributes:
        steps: total optimizer steps; also the length of the cosine schedule.
        batch_size: B sequences per step.
        seq_len: T tokens per sequence (tokens per step = B * T).
        learning_rate: peak learning rate, reached after ``warmup_steps``.
        warmup_steps: linear warmup from 0.
        min_lr_ratio: the cosine decays to ``learning_rate * min_lr_ratio``.
        weight_decay: decoupled AdamW decay, applied to matrices only (not to
            norm scales).
        b1: Adam first-moment decay.
        b2: Adam second-moment decay.
        eps: Adam epsilon.
        grad_clip: global gradient norm clip (``None`` disables clipping).
        seed: seed of the data-order key.
        kl_weight: distillation weight of ``KL(p_teacher || q)``.
        tvd_weight: distillation weight of ``TV(p_teacher, q)``.
        ce_weight: distillation weight of the data cross-entropy (ignored
            without a teacher, where the loss is the cross-entropy).
        checkpoint_every: save a checkpoint every this many steps (and always
            at the end); 0 saves only at the end.
        keep_checkpoints: how many of the newest checkpoints to keep.
        max_minutes: wall-clock budget; training stops after the step that
            crosses it and saves a final checkpoint. ``None`` means no limit.
        log_every: steps between progress-bar updates (each one syncs).
        progress: show a tqdm progress bar.

    Raises:
        TypeError, ValueError: on construction, naming the field, for a value
            of the wrong type or outside its range (for example ``steps=0``,
            ``batch_size=0``, ``learning_rate=nan`` or ``b2=1``).
    """

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    seed: int = 0
    kl_weight: float = 1.0
    tvd_weight: float = 0.0
    ce_weight: float = 0.0
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    max_minutes: float | None = None
    log_every: int = 10
    progress: bool = True

    def __post_init__(self):
        # Normalised to Python ints/floats as well as checked: the config is a
        # static jit argument and is written to JSON with each checkpoint.
        set_ = lambda name, value: object.__setattr__(self, name, value)
        for name, lo in (
            ("steps", 1), ("batch_size", 1), ("seq_len", 1), ("warmup_steps", 0),
            ("checkpoint_every", 0), ("keep_checkpoints", 1), ("log_every", 1),
        ):  # fmt: skip
            set_(name, check_int(name, getattr(self, name), lo=lo))
        set_("seed", check_int("seed", self.seed))
        positive = dict(lo=0.0, lo_open=True)
        unit = dict(lo=0.0, hi=1.0, hi_open=True)
        for name, bounds in (
            ("learning_rate", positive), ("min_lr_ratio", dict(lo=0.0, hi=1.0)),
            ("weight_decay", dict(lo=0.0)), ("b1", unit), ("b2", unit), ("eps", positive),
            ("kl_weight", dict(lo=0.0)), ("tvd_weight", dict(lo=0.0)),
            ("ce_weight", dict(lo=0.0)),
        ):  # fmt: skip
            set_(name, check_float(name, getattr(self, name), **bounds))
        if self.grad_clip is not None:
            set_("grad_clip", check_float("grad_clip", self.grad_clip, **positive))
        if self.max_minutes is not None:
            # inf is a valid "no limit"; NaN and negative budgets are not.
            set_("max_minutes", check_float("max_minutes", self.max_minutes, lo=0.0, finite=False))
        if not isinstance(self.progress, (bool, np.bool_)):
            raise TypeError(f"progress must be a bool, got {self.progress!r}")
        set_("progress", bool(self.progress))


@dataclasses.dataclass(frozen=True)
class BlockTrainConfig(TrainConfig):
    """A `TrainConfig` for `specjax.BlockDrafter`'s anchored-block objective.

    Attributes:
        num_anchors: A random anchors per training sequence (each one block).
        decay: w of the per-position weight ``exp(-(k-1)/w)`` (DFlash uses about
            block_size / 2).
    """

    num_anchors: int = 32
    decay: float = 4.0

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "num_anchors", check_int("num_anchors", self.num_anchors, lo=1))
        object.__setattr__(self, "decay", check_float("decay", self.decay, lo=0.0, lo_open=True))


@dataclasses.dataclass(frozen=True)
class EagleTrainConfig(TrainConfig):
    """A `TrainConfig` for `specjax.EagleDrafter`'s training-time-test objective.

    Attributes:
        ttt_steps: k, head steps unrolled per position (about the γ it will draft).
        step_weight: step i's loss is weighted ``step_weight ** i`` (EAGLE-3: 0.8).
    """

    ttt_steps: int = 4
    step_weight: float = 0.8

    def __post_init__(self):
        super().__post_init__()
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("ttt_steps", check_int("ttt_steps", self.ttt_steps, lo=1))
        set_("step_weight", check_float("step_weight", self.step_weight, lo=0.0, lo_open=True))
        if self.ttt_steps > self.seq_len:
            raise ValueError(
                f"ttt_steps={self.ttt_steps} must be at most seq_len={self.seq_len}: step i "
                "predicts from positions >= i of each sequence"
            )


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


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (the input model with new params).
        losses: the training loss of every step since step 0, including steps
            run before a resume.
        steps: steps completed (``== config.steps`` unless stopped early).
        start_step: the step this call started from (> 0 after a resume).
        stopped_early: the time budget ran out before ``config.steps``.
        tokens_per_second: training throughput of this call, excluding the
            first (compiling) step.
        checkpoint: path of the last checkpoint written, if any.
    """

    model: Model
    losses: list[float]
    steps: int
    start_step: int
    stopped_early: bool
    tokens_per_second: float
    checkpoint: str | None = None


# ---------------------------------------------------------------------------
# Losses.


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
    return model(tokens_BT, positions_BT, None)[0]


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


def _is_block_drafter(model) -> bool:
    from specjax.block_drafter import BlockDrafter

    return isinstance(model, BlockDrafter)


def _is_eagle(model) -> bool:
    from specjax.eagle import EagleDrafter

    return isinstance(model, EagleDrafter)


def _reads_target(model) -> bool:
    """A drafter trained on its frozen target's features (the target is its teacher)."""
    return _is_block_drafter(model) or _is_eagle(model)


def _loss_fn(params, batch_BT1, key, *, model, teacher_params, teacher, config):
    if _is_block_drafter(model):
        # The frozen target is the "teacher": its params come in traced, like a
        # distillation teacher's, and only the drafter's are differentiated.
        from specjax.block_drafter import anchored_block_loss

        drafter = model.replace(target=teacher.replace(params=teacher_params))
        return anchored_block_loss(
            params, drafter, batch_BT1, key, num_anchors=config.num_anchors, decay=config.decay
        )
    if _is_eagle(model):
        from specjax.eagle import eagle_ttt_loss

        drafter = model.replace(target=teacher.replace(params=teacher_params))
        loss, metrics = eagle_ttt_loss(
            params, drafter, batch_BT1, num_steps=config.ttt_steps, step_weight=config.step_weight
        )
        # Scalars only in the step's metrics (the per-step vectors are for evaluation).
        return loss, {
            "loss": loss, "accuracy": metrics["accuracy"][0], "tau": metrics["tau"],
            **{f"loss_step{i}": x for i, x in enumerate(metrics["step_losses"])},
        }  # fmt: skip
    del key
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
# Optimizer and step.


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
    # A stream of its own for objectives that draw (the block drafter's anchors).
    objective_key = jax.random.fold_in(jax.random.fold_in(state.key, state.step), 1)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch_BT1, objective_key)
    updates, opt_state = make_optimizer(config).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics


# The state is donated: params and both Adam moments are updated in place
# instead of holding two copies of each at the step boundary.
_jit_train_step = jax.jit(
    train_step, static_argnames=("model", "config", "teacher"), donate_argnums=0
)


def _static_config(config: TrainConfig) -> TrainConfig:
    # Budget and logging fields do not enter the step; normalising them avoids
    # recompiling when only they change.
    return dataclasses.replace(
        config,
        max_minutes=None,
        checkpoint_every=0,
        keep_checkpoints=1,
        log_every=1,
        progress=False,
    )


# ---------------------------------------------------------------------------
# Checkpoints.


def _flatten_named(tree) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def _unflatten_named(template, arrays: dict[str, np.ndarray], what: str):
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = []
    for path, leaf in paths_leaves:
        name = jax.tree_util.keystr(path)
        if name not in arrays:
            raise ValueError(f"{what}: checkpoint lacks {name}")
        a = arrays[name]
        if a.shape != leaf.shape or a.dtype != leaf.dtype:
            raise ValueError(
                f"{what}: {name} is {a.dtype}{list(a.shape)} in the checkpoint, "
                f"expected {leaf.dtype}{list(leaf.shape)}"
            )
        leaves.append(jnp.asarray(a))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _trajectory_config(config: TrainConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _RESUMABLE_FIELDS}


def save_checkpoint(
    checkpoint_dir: str | os.PathLike,
    model: Model,
    state: TrainState,
    config: TrainConfig,
    losses: list[float],
    *,
    keep: int | None = None,
) -> str:
    """Atomically writes checkpoint ``step_XXXXXXXX`` under ``checkpoint_dir``.

    The folder is a Hugging Face checkpoint (loadable with ``load_pretrained``
    or ``transformers``) plus ``train_state.safetensors``. It is written under a
    temporary name, flushed to disk and renamed when complete
    (:func:`specjax.io.atomic.replace_folder`); re-saving the same step replaces
    the old folder only once the new one is complete. Older checkpoints beyond
    the newest ``keep`` are then deleted.

    Returns:
        The path of the new checkpoint folder.

    Raises:
        FloatingPointError: a parameter is NaN or infinite; nothing is written,
            so the previous checkpoint stays the newest.
        OSError: writing failed; earlier checkpoints are untouched.
    """
    from specjax.io.hf import write_pretrained

    checkpoint_dir = Path(checkpoint_dir)
    step = int(state.step)
    # One device reduction: a NaN weight must never become the checkpoint a
    # resume or an export picks up.
    finite = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(state.params)]
    if finite and not bool(jnp.all(jnp.stack(finite))):
        raise FloatingPointError(
            f"parameters after step {step} are not finite; checkpoint not saved"
        )
    final = checkpoint_dir / f"{_CKPT_PREFIX}{step:08d}"

    def write(tmp: Path) -> None:
        if _is_block_drafter(model):
            from specjax.block_drafter import write_block_drafter

            write_block_drafter(model.replace(params=state.params), tmp)
        elif _is_eagle(model):
            from specjax.eagle import write_eagle_drafter

            write_eagle_drafter(model.replace(params=state.params), tmp)
        else:
            write_pretrained(model.replace(params=state.params), tmp)
        arrays = {f"opt_state/{k}": v for k, v in _flatten_named(state.opt_state).items()}
        arrays["step"] = np.asarray(step, np.int64)
        arrays["key"] = np.asarray(jax.random.key_data(state.key))
        arrays["losses"] = np.asarray(losses[:step], np.float32)
        metadata = {"train_config": json.dumps(_trajectory_config(config), sort_keys=True)}
        save_file(arrays, str(tmp / TRAIN_STATE_FILE), metadata=metadata)

    atomic.replace_folder(final, write)
    if keep is not None:
        for old in list_checkpoints(checkpoint_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return str(final)


def list_checkpoints(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``checkpoint_dir``, oldest first."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    found = [
        p
        for p in checkpoint_dir.iterdir()
        if p.is_dir() and p.name.startswith(_CKPT_PREFIX) and (p / TRAIN_STATE_FILE).exists()
    ]
    return sorted(found, key=lambda p: int(p.name[len(_CKPT_PREFIX) :]))


def load_checkpoint(
    path: str | os.PathLike, model: Model, config: TrainConfig
) -> tuple[TrainState, list[float]]:
    """Reads a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the checkpoint folder.
        model: a model of the same architecture and dtype (its params give the
            expected structure; its values are not used).
        config: the run's config; must match the checkpoint's on every field
            that shapes the trajectory (all but budget/logging fields).

    Returns:
        ``(state, losses)``.
    """
    from specjax.io.hf import load_pretrained

    path = Path(path)
    try:
        arrays = load_file(str(path / TRAIN_STATE_FILE))
    except SafetensorError as e:
        # Refuse rather than delete: the user decides whether this checkpoint is lost.
        raise ValueError(
            f"cannot resume {path}: {path / TRAIN_STATE_FILE} is corrupt or truncated ({e}); "
            "delete that checkpoint folder to resume from an earlier one, or start afresh"
        ) from None
    missing = [k for k in ("step", "key", "losses") if k not in arrays]
    if missing:
        raise ValueError(f"cannot resume {path}: {TRAIN_STATE_FILE} lacks {missing}")
    with open(path / TRAIN_STATE_FILE, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        metadata = json.loads(f.read(header_len)).get("__metadata__", {})
    saved = json.loads(metadata.get("train_config", "{}"))
    current = json.loads(json.dumps(_trajectory_config(config), sort_keys=True))
    diff = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
    if diff:
        raise ValueError(f"cannot resume {path}: config differs (saved, now): {diff}")

    if _is_block_drafter(model):
        from specjax.block_drafter import load_block_drafter

        loaded = load_block_drafter(path, model.target)
    elif _is_eagle(model):
        from specjax.eagle import load_eagle_drafter

        loaded = load_eagle_drafter(path, model.target)
    else:
        loaded = load_pretrained(path, dtype=model.dtype)
    params = _unflatten_named(model.params, _flatten_named(loaded.params), "params")
    template = make_optimizer(config).init(model.params)
    opt = {k[len("opt_state/") :]: v for k, v in arrays.items() if k.startswith("opt_state/")}
    opt = upgrade_legacy_layout(opt)  # a checkpoint from before the [out, in] layout
    state = TrainState(
        params=params,
        opt_state=_unflatten_named(template, opt, "opt_state"),
        step=jnp.asarray(arrays["step"], jnp.int32),
        key=jax.random.wrap_key_data(jnp.asarray(arrays["key"])),
    )
    return state, [float(x) for x in arrays["losses"]]


# ---------------------------------------------------------------------------
# The loop.


def _newest_checkpoint_note(checkpoint_dir) -> str:
    if checkpoint_dir is None:
        return ""
    ckpts = list_checkpoints(checkpoint_dir)
    return f" (newest checkpoint: {ckpts[-1]})" if ckpts else " (no checkpoint was written)"


def _check_inputs(model, tokens, config, teacher, checkpoint_dir) -> jax.Array:
    """Everything :func:`train` can refuse before its first step; returns the token stream."""
    if _is_block_drafter(model):
        if not isinstance(config, BlockTrainConfig):
            raise TypeError(
                f"config must be a BlockTrainConfig to train a BlockDrafter, got "
                f"{type(config).__name__}"
            )
        if teacher is not model.target:
            raise ValueError("teacher must be the BlockDrafter's own target (model.target)")
    elif _is_eagle(model):
        if not isinstance(config, EagleTrainConfig):
            raise TypeError(
                f"config must be an EagleTrainConfig to train an EagleDrafter, got "
                f"{type(config).__name__}"
            )
        if teacher is not model.target:
            raise ValueError("teacher must be the EagleDrafter's own target (model.target)")
    elif not isinstance(model, Model):
        raise TypeError(f"model must be a specjax Model, got {type(model).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if teacher is not None:
        if not isinstance(teacher, Model):
            raise TypeError(
                f"teacher must be a specjax Model or None, got {type(teacher).__name__}"
            )
        if teacher.vocab_size != model.vocab_size:
            raise ValueError(
                f"teacher has a vocabulary of {teacher.vocab_size} tokens but the model has "
                f"{model.vocab_size}; distillation compares the two distributions token by "
                "token, so both must share one vocabulary (tokenizer)"
            )
    for who, m in (("model", model), ("teacher", teacher)):
        if m is not None and config.seq_len > m.config.max_position_embeddings:
            raise ValueError(
                f"seq_len={config.seq_len} is beyond the {who}'s context "
                f"(max_position_embeddings={m.config.max_position_embeddings})"
            )
    v = model.vocab_size
    if isinstance(tokens, (list, tuple)) and not tokens:
        raise ValueError(f"tokens is empty; need more than seq_len={config.seq_len} ids")
    if isinstance(tokens, jax.Array):
        # Checked on device: copying a large stream to the host just to check it is waste.
        if not jnp.issubdtype(tokens.dtype, jnp.integer) or tokens.ndim != 1:
            raise TypeError(
                f"tokens must be a 1-D integer array, got {tokens.dtype}{list(tokens.shape)}"
            )
        if tokens.size:
            lo, hi = (int(x) for x in jax.device_get((tokens.min(), tokens.max())))
            if lo < 0 or hi >= v:
                raise ValueError(
                    f"tokens holds {lo if lo < 0 else hi}, outside the vocabulary [0, {v - 1}]"
                )
        tokens_N = tokens.astype(jnp.int32)
    else:
        # Refused rather than cast: a float would be truncated, a negative id would
        # wrap to the end of the embedding table, an id >= V would be clamped.
        tokens_N = jnp.asarray(check_int_array("tokens", tokens, lo=0, hi=v - 1, ndim=1))
    if tokens_N.shape[0] <= config.seq_len:
        raise ValueError(
            f"tokens holds {tokens_N.shape[0]} ids, too few for one window of "
            f"seq_len={config.seq_len} (need more than seq_len)"
        )
    if checkpoint_dir is not None and Path(checkpoint_dir).exists():
        if not Path(checkpoint_dir).is_dir():
            raise ValueError(f"checkpoint_dir {checkpoint_dir} is a file, not a folder")
    return tokens_N


def train(
    model: Model,
    tokens: np.ndarray | jax.Array,
    config: TrainConfig,
    *,
    teacher: Model | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    callback: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Trains ``model`` on windows of ``tokens`` (or distils ``teacher`` into it).

    Args:
        model: initial model (e.g. ``Model.random(...)``); its dtype is the
            training dtype (use float32).
        tokens: ``int32[N]`` training token stream, N > ``config.seq_len``.
        config: the :class:`TrainConfig`.
        teacher: frozen target model to distil from; ``None`` trains on the
            data with cross-entropy. Must share the tokenizer/vocabulary.
        checkpoint_dir: where checkpoints go; ``None`` disables them. Without
            ``resume`` it must not already hold checkpoints.
        resume: continue from the newest checkpoint in ``checkpoint_dir`` if
            there is one (otherwise start from step 0). The continuation is
            bit-identical to an uninterrupted run with the same config.
        callback: called as ``callback(step, metrics)`` after every step, with
            ``step`` the number of steps done and ``metrics`` device scalars.

    Returns:
        A :class:`TrainResult`.

    Raises:
        TypeError, ValueError: before the first step (and before anything is
            written), naming the argument: ``model``, ``config`` or ``teacher``
            of the wrong type; ``tokens`` that are not a 1-D integer array, hold
            an id outside ``[0, V)`` or are too short for ``seq_len``;
            ``config.seq_len`` beyond the model's ``max_position_embeddings``;
            a teacher with another vocabulary size; a ``checkpoint_dir`` that is a
            file, holds another run (without ``resume``) or a run with another
            config (with ``resume``).
        FloatingPointError: a step's loss or gradient norm is NaN or infinite.
            It names the first such step; no checkpoint at or after it is
            written, so the newest checkpoint is the last good one.
    """
    tokens_N = _check_inputs(model, tokens, config, teacher, checkpoint_dir)
    state, losses = init_train_state(model, config), []
    ckpts = [] if checkpoint_dir is None else list_checkpoints(checkpoint_dir)
    if ckpts and not resume:
        # Mixing runs in one folder would let pruning delete the new run's
        # checkpoints and a later resume pick up the old run's.
        raise ValueError(
            f"{checkpoint_dir} already holds checkpoints ({ckpts[-1].name}); "
            "pass resume=True to continue that run, or use an empty folder"
        )
    if ckpts:
        state, losses = load_checkpoint(ckpts[-1], model, config)

    # Static parts only (params=None), so that the compiled step is cached
    # across calls that share architecture and trajectory settings.
    static_model = model.replace(params=None)
    if _reads_target(model):
        static_model = static_model.replace(target=None)  # arrays; passed as the teacher
    step_fn = functools.partial(
        _jit_train_step,
        model=static_model,
        config=_static_config(config),
        teacher=None if teacher is None else teacher.replace(params=None),
    )
    teacher_params = None if teacher is None else teacher.params

    start = int(state.step)
    deadline = None if config.max_minutes is None else time.monotonic() + 60 * config.max_minutes
    tokens_per_step = config.batch_size * config.seq_len
    pending: list[tuple[jax.Array, jax.Array]] = []  # (loss, grad norm) not yet fetched
    bar = tqdm(
        total=config.steps, initial=start, disable=not config.progress, unit="step", smoothing=0.1
    )
    t_first = None  # end of the first (compiling) step; throughput is measured from here
    steps_timed = 0
    last_ckpt = None
    stopped_early = False

    def flush():
        # Every flush precedes any checkpoint, so a bad step is caught before it is saved.
        fetched = jax.device_get(pending)
        pending.clear()
        for loss, grad_norm in fetched:
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                bad_step = len(losses) + 1
                raise FloatingPointError(
                    f"training stopped at step {bad_step}: the loss or its gradient is not finite "
                    f"(loss {float(loss)}, gradient norm {float(grad_norm)}); no checkpoint of "
                    "this or a later step was saved"
                    + _newest_checkpoint_note(checkpoint_dir)
                    + ". Lower learning_rate, or check the data and the initial weights"
                )
            losses.append(float(loss))

    try:
        step = start
        while step < config.steps:
            state, metrics = step_fn(state, tokens_N, teacher_params)
            step += 1
            pending.append((metrics["loss"], metrics["grad_norm"]))
            if callback is not None:
                callback(step, metrics)
            if t_first is None:
                jax.block_until_ready(metrics["loss"])
                t_first, steps_timed = time.perf_counter(), 0
            else:
                steps_timed += 1
            if step % config.log_every == 0 or step == config.steps:
                flush()
                elapsed = time.perf_counter() - t_first
                tps = steps_timed * tokens_per_step / elapsed if elapsed > 0 else 0.0
                bar.set_postfix(loss=f"{losses[-1]:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
            out_of_time = deadline is not None and time.monotonic() > deadline
            if checkpoint_dir is not None and (
                (config.checkpoint_every and step % config.checkpoint_every == 0)
                or step == config.steps
                or out_of_time
            ):
                flush()
                last_ckpt = save_checkpoint(
                    checkpoint_dir,
                    model,
                    state,
                    config,
                    losses,
                    keep=config.keep_checkpoints,
                )
            if out_of_time and step < config.steps:
                stopped_early = True
                break
    except KeyboardInterrupt:
        # Stop cleanly on Ctrl-C: the state of the last finished step is saved,
        # unless the interrupt landed after that state was donated to a step
        # whose result never arrived; then the previous checkpoint stands.
        donated = any(x.is_deleted() for x in jax.tree.leaves(state))
        if checkpoint_dir is not None and not donated and int(state.step) > start:
            flush()
            save_checkpoint(
                checkpoint_dir, model, state, config, losses, keep=config.keep_checkpoints
            )
        raise
    finally:
        bar.close()
    flush()
    jax.block_until_ready(state.params)
    elapsed = time.perf_counter() - t_first if t_first is not None else 0.0
    tps = steps_timed * tokens_per_step / elapsed if elapsed > 0 else 0.0
    return TrainResult(
        model=model.replace(params=state.params),
        losses=losses,
        steps=int(state.step),
        start_step=start,
        stopped_early=stopped_early,
        tokens_per_second=tps,
        checkpoint=last_ckpt,
    )


def train_block_drafter(
    drafter,
    tokens: np.ndarray | jax.Array,
    config: BlockTrainConfig,
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    callback: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Trains a `specjax.BlockDrafter` for its (frozen) target on windows of ``tokens``.

    The objective is DFlash's anchored blocks (`specjax.block_drafter.anchored_block_loss`):
    ``config.num_anchors`` random anchors per sequence, each block seeing only the
    target features strictly before its anchor, block position k predicting the token
    at anchor + k with weight ``exp(-(k-1)/config.decay)``. The target's features are
    computed on the fly inside the same jitted step. Everything else is :func:`train`:
    the same optimizer, time budget, progress bar, atomic safetensors checkpoints
    (``block_drafter.json`` + ``model.safetensors`` + ``train_state.safetensors``) and
    bit-identical resume.

    Args:
        drafter: the `BlockDrafter` to train (e.g. ``BlockDrafter.random(target, ...)``).
        tokens: ``int32[N]`` training stream in the target's vocabulary (the corpus,
            or continuations generated by the target).
        config: a :class:`BlockTrainConfig`; ``seq_len + 1`` tokens per sequence.
        checkpoint_dir, resume, callback: as for :func:`train`.

    Returns:
        A :class:`TrainResult` whose ``model`` is the trained drafter; metrics passed
        to ``callback`` also hold ``accuracy`` and ``tau`` (greedy accepted length + 1
        on full blocks of the training batch).

    Example:
        >>> import jax, numpy as np, specjax
        >>> from specjax.train import BlockTrainConfig, train_block_drafter
        >>> target = specjax.testing.tiny_model(seed=0, num_layers=4)
        >>> drafter = specjax.BlockDrafter.random(target, key=jax.random.key(0), num_draft=3)
        >>> tokens = np.arange(2000) % 64
        >>> config = BlockTrainConfig(steps=2, batch_size=2, seq_len=32, num_anchors=4,
        ...                           progress=False)
        >>> train_block_drafter(drafter, tokens, config).steps
        2
    """
    return train(
        drafter, tokens, config, teacher=getattr(drafter, "target", None),
        checkpoint_dir=checkpoint_dir, resume=resume, callback=callback,
    )  # fmt: skip


def train_eagle(
    drafter,
    tokens: np.ndarray | jax.Array,
    config: EagleTrainConfig,
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    callback: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Trains a `specjax.EagleDrafter` head for its (frozen) target on windows of ``tokens``.

    The objective is EAGLE-3's training-time test (`specjax.eagle.eagle_ttt_loss`): the
    target scores each sequence once inside the jitted step, and the head is unrolled
    ``config.ttt_steps`` steps over all positions, step i fed its own output features of
    step i-1 and weighted ``config.step_weight ** i``. Everything else is :func:`train`:
    the same optimizer, time budget, progress bar, atomic safetensors checkpoints
    (``eagle_drafter.json`` + ``model.safetensors`` + ``train_state.safetensors``) and
    bit-identical resume.

    Args:
        drafter: the `EagleDrafter` to train (e.g. ``EagleDrafter.random(target, ...)``).
        tokens: ``int32[N]`` training stream in the target's vocabulary.
        config: an :class:`EagleTrainConfig`; ``seq_len + 1`` tokens per sequence.
        checkpoint_dir, resume, callback: as for :func:`train`.

    Returns:
        A :class:`TrainResult` whose ``model`` is the trained drafter; metrics passed to
        ``callback`` also hold ``accuracy`` (step 0's top-1 agreement with the target),
        ``tau`` (teacher-forced greedy tokens per call at γ = ttt_steps) and
        ``loss_step{i}``.

    Example:
        >>> import jax, numpy as np, specjax
        >>> from specjax.train import EagleTrainConfig, train_eagle
        >>> target = specjax.testing.tiny_model(seed=0, num_layers=4)
        >>> drafter = specjax.EagleDrafter.random(target, key=jax.random.key(0), num_draft=3)
        >>> tokens = np.arange(2000) % 64
        >>> config = EagleTrainConfig(steps=2, batch_size=2, seq_len=32, ttt_steps=3,
        ...                           progress=False)
        >>> train_eagle(drafter, tokens, config).steps
        2
    """
    return train(
        drafter, tokens, config, teacher=getattr(drafter, "target", None),
        checkpoint_dir=checkpoint_dir, resume=resume, callback=callback,
    )  # fmt: skip


# ---------------------------------------------------------------------------
# Evaluation and export.


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
    (see :func:`specjax.data.eval_windows`); each window starts with an empty
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


def cast_params(model: Model, dtype) -> Model:
    """The model with floating-point params cast to ``dtype`` (e.g. bf16 for export)."""
    cast = lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p
    return model.replace(params=jax.tree.map(cast, model.params))
