"""The training loop: checks every input, then steps, logs and checkpoints.

`train` refuses garbage before its first step (and before anything is written), runs
the jitted step (`specjax.training.step`) under a time budget with a progress bar,
stops on a non-finite loss or gradient before any checkpoint of it, and resumes
bit-identically from its newest checkpoint (`specjax.training.checkpoints`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.timing import Stopwatch
from specjax.core.validation import check_int_array, with_article
from specjax.models.model import Model
from specjax.training.checkpoints import list_checkpoints, load_checkpoint, save_checkpoint
from specjax.training.config import TrainConfig, _static_config
from specjax.training.objectives import objective_of
from specjax.training.step import _jit_train_step, init_train_state, trains_drafter


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


def _newest_checkpoint_note(checkpoint_dir) -> str:
    if checkpoint_dir is None:
        return ""
    ckpts = list_checkpoints(checkpoint_dir)
    return f" (newest checkpoint: {ckpts[-1]})" if ckpts else " (no checkpoint was written)"


def _check_type(name: str, value, kind: type, what: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")


def _check_inputs(model, tokens, config, teacher, checkpoint_dir) -> jax.Array:
    """Everything :func:`train` can refuse before its first step; returns the token stream."""
    if trains_drafter(model):
        want = objective_of(model).config_type
        if not isinstance(config, want):
            raise TypeError(
                f"config must be {with_article(want.__name__)} to train "
                f"{with_article(type(model).__name__)}, got {type(config).__name__}"
            )
        if teacher is not model.target:
            raise ValueError(
                f"teacher must be the {type(model).__name__}'s own target (model.target)"
            )
    else:
        _check_type("model", model, Model, "a specjax Model")
    _check_type("config", config, TrainConfig, "a TrainConfig")
    if teacher is not None:
        _check_type("teacher", teacher, Model, "a specjax Model or None")
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
    if trains_drafter(model):
        static_model = static_model.replace(target=None)  # arrays; passed as the teacher
    step_fn = functools.partial(
        _jit_train_step,
        model=static_model,
        config=_static_config(config),
        teacher=None if teacher is None else teacher.replace(params=None),
    )
    teacher_params = None if teacher is None else teacher.params

    start = int(state.step)
    budget_s = None if config.max_minutes is None else 60 * config.max_minutes
    since_start = Stopwatch()
    tokens_per_step = config.batch_size * config.seq_len
    pending: list[tuple[jax.Array, jax.Array]] = []  # (loss, grad norm) not yet fetched
    # Imported here, not at the top: `import specjax` imports this module, and tqdm.auto
    # warns at import in a Jupyter kernel without ipywidgets.
    from tqdm.auto import tqdm

    bar = tqdm(
        total=config.steps, initial=start, disable=not config.progress, unit="step", smoothing=0.1
    )
    clock = None  # started after the first (compiling) step: throughput is measured from there
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
            if clock is None:
                jax.block_until_ready(metrics["loss"])
                clock, steps_timed = Stopwatch(), 0
            else:
                steps_timed += 1
            if step % config.log_every == 0 or step == config.steps:
                flush()
                elapsed = clock.elapsed()
                tps = steps_timed * tokens_per_step / elapsed if elapsed > 0 else 0.0
                bar.set_postfix(loss=f"{losses[-1]:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
            out_of_time = budget_s is not None and since_start.elapsed() > budget_s
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
    elapsed = clock.elapsed() if clock is not None else 0.0
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
