"""Training checkpoints: atomic, resumable, safetensors only; and the export cast.

A checkpoint is the trained model's own folder (a Hugging Face checkpoint, or a
drafter's files, `specjax.io.drafter_weights`) plus ``train_state.safetensors``:
the optimizer state, step, data key, loss history and the run's trajectory config.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from specjax.io import atomic, drafter_weights
from specjax.models.model import Model
from specjax.training.config import TrainConfig, _trajectory_config
from specjax.training.step import TrainState, make_optimizer, trains_drafter

TRAIN_STATE_FILE = "train_state.safetensors"
_CKPT_PREFIX = "step_"


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
        if trains_drafter(model):
            # The drafter's own files.
            drafter_weights.write(model.replace(params=state.params), tmp)
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

    if trains_drafter(model):
        loaded = drafter_weights.load(type(model), path, model.target)
    else:
        loaded = load_pretrained(path, dtype=model.dtype)
    params = _unflatten_named(model.params, _flatten_named(loaded.params), "params")
    template = make_optimizer(config).init(model.params)
    opt = {k[len("opt_state/") :]: v for k, v in arrays.items() if k.startswith("opt_state/")}
    state = TrainState(
        params=params,
        opt_state=_unflatten_named(template, opt, "opt_state"),
        step=jnp.asarray(arrays["step"], jnp.int32),
        key=jax.random.wrap_key_data(jnp.asarray(arrays["key"])),
    )
    return state, [float(x) for x in arrays["losses"]]


def cast_params(model: Model, dtype) -> Model:
    """The model with floating-point params cast to ``dtype`` (e.g. bf16 for export)."""
    cast = lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p
    return model.replace(params=jax.tree.map(cast, model.params))
