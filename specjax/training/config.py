"""What a training run is: its hyper-parameters, checked when they are built.

`TrainConfig` serves every objective; a drafter's objective may need more fields, in
its own subclass (`specjax.training.objectives` names which): `BlockTrainConfig`
(anchored blocks) and `EagleTrainConfig` (the training-time test).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.core.validation import check_float, check_int

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
            ("steps", 1),
            ("batch_size", 1),
            ("seq_len", 1),
            ("warmup_steps", 0),
            ("checkpoint_every", 0),
            ("keep_checkpoints", 1),
            ("log_every", 1),
        ):
            set_(name, check_int(name, getattr(self, name), lo=lo))
        set_("seed", check_int("seed", self.seed))
        positive = dict(lo=0.0, lo_open=True)
        unit = dict(lo=0.0, hi=1.0, hi_open=True)
        for name, bounds in (
            ("learning_rate", positive),
            ("min_lr_ratio", dict(lo=0.0, hi=1.0)),
            ("weight_decay", dict(lo=0.0)),
            ("b1", unit),
            ("b2", unit),
            ("eps", positive),
            ("kl_weight", dict(lo=0.0)),
            ("tvd_weight", dict(lo=0.0)),
            ("ce_weight", dict(lo=0.0)),
        ):
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


def _trajectory_config(config: TrainConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _RESUMABLE_FIELDS}
