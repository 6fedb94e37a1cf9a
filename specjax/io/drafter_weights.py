"""Saving and loading drafters: the one way, safetensors and JSON, never pickle.

One format for every `~specjax.drafters.features.FeatureDrafter`: a folder holding the
drafter's config file (``block_drafter.json``, ``eagle_drafter.json``: its format name,
the `ModelConfig` of its layers, its target layers, γ, mode, its own fields and the
shape of the target it was built for) and ``model.safetensors`` (its parameters by NNX
path). The target's weights are never written: a drafter is loaded for a target and
reads that one's. `FORMATS` names each class's file. A `~specjax.DraftModel` is loaded
from its model's Hugging Face folder (or ``.gguf`` file). The CLI,
`~specjax.io.pretrained.default_drafter` and training checkpoints all save and load through `save`,
`write` and `load`.

Saving is atomic (`specjax.io.atomic.replace_folder`) and refuses, before anything is
written, a path that is a file, a file-system root or the working directory (the guard
of `specjax.io.hf.check_save_target`), and a folder holding anything but a drafter's
own files, unless ``overwrite``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.core.validation import with_article
from specjax.drafters.block import BlockDrafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle import EagleDrafter
from specjax.io import atomic
from specjax.io.hf import check_save_target, load_pretrained
from specjax.models.config import ModelConfig

__all__ = [
    "FORMATS",
    "WEIGHTS_FILE",
    "DrafterFile",
    "config_file",
    "flat_params",
    "load",
    "save",
    "target_shape",
    "write",
]

WEIGHTS_FILE = "model.safetensors"


def flat_params(params) -> dict[str, np.ndarray]:
    """Host arrays of ``params`` named by ``jax.tree_util.keystr`` of their path."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


@dataclasses.dataclass(frozen=True)
class DrafterFile:
    """How one drafter class is written to a folder.

    Attributes:
        format: what its config file says it is (``"format"``).
        config_file: the config file's name.
        fields: the class's own static fields saved besides the shared ones.
    """

    format: str
    config_file: str
    fields: tuple[str, ...] = ()


FORMATS: dict[type, DrafterFile] = {
    BlockDrafter: DrafterFile("specjax-block-drafter", "block_drafter.json", ("block_size",)),
    EagleDrafter: DrafterFile("specjax-eagle-drafter", "eagle_drafter.json"),
}


def _file_of(cls: type) -> DrafterFile:
    """``cls``'s `DrafterFile` (or that of the class it derives from)."""
    file = next((FORMATS[c] for c in cls.__mro__ if c in FORMATS), None)
    if file is None:
        raise TypeError(f"{cls.__name__} has no weights of its own to save or load")
    return file


def config_file(cls: type) -> str:
    """The config file a folder of ``cls``'s weights holds (``"block_drafter.json"``)."""
    return _file_of(cls).config_file


def target_shape(target) -> dict:
    """What a drafter's weights depend on in its target: width, depth and vocabulary."""
    return {
        "hidden_size": target.config.hidden_size,
        "num_layers": target.config.num_layers,
        "vocab_size": target.vocab_size,
    }


def write(drafter, folder) -> None:
    """Writes the drafter's config file and ``model.safetensors`` into an existing folder."""
    from safetensors.numpy import save_file

    file = _file_of(type(drafter))
    meta = {
        "format": file.format,
        "layers": dataclasses.asdict(drafter.config),
        "target_layers": list(drafter.target_layers),
        **{name: getattr(drafter, name) for name in file.fields},
        "num_draft": drafter.num_draft,
        "mode": drafter.mode,
        "target": target_shape(drafter.target),
    }
    save_file(flat_params(drafter.params), str(Path(folder) / WEIGHTS_FILE))
    (Path(folder) / file.config_file).write_text(json.dumps(meta, indent=2))


def save(drafter, path, *, overwrite: bool = False, dtype=None, keep=()) -> Path:
    """Writes the drafter's own weights (not the target's) atomically to folder ``path``.

    The folder holds the drafter's config file and ``model.safetensors`` (in ``dtype``,
    default the weights' own; loading casts to the target's dtype). A non-empty folder
    that holds anything but this drafter's files is refused unless ``overwrite``;
    entries named in ``keep`` (e.g. a training run's checkpoint folder) are carried over.

    Returns:
        ``path`` as a `Path`.

    Raises:
        ValueError: ``path`` is a file, a file-system root or holds the working
            directory (even with ``overwrite``).
        FileExistsError: ``path`` holds other files, without ``overwrite``.
    """
    file = _file_of(type(drafter))
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"path {path} is a file; pass a folder to hold the drafter")
    # The checkpoints' guard, whatever the folder holds: never replace a root or the
    # working directory whole.
    check_save_target(path, file.format, overwrite=True)
    if path.is_dir() and not overwrite:
        # Only a drafter's own files (and the entries carried over) may be replaced
        # silently; anything else in the folder would be lost with it.
        ours = {file.config_file, WEIGHTS_FILE, *keep}
        foreign = sorted(p.name for p in path.iterdir() if p.name not in ours)
        if foreign:
            what = (
                f"{with_article(drafter.noun)} and other files"
                if (path / file.config_file).is_file()
                else f"files but no {drafter.noun}"
            )
            raise FileExistsError(
                f"path {path} holds {what} ({', '.join(foreign[:5])}); saving would delete "
                "them: pass overwrite=True to replace the folder whole"
            )
    if dtype is not None:
        drafter = drafter.replace(params=jax.tree.map(lambda x: x.astype(dtype), drafter.params))
    atomic.replace_folder(path, lambda tmp: write(drafter, tmp), keep=keep)
    return path


def load(
    cls, path: str | os.PathLike, target, *, num_draft: int | None = None, mode: str | None = None
):
    """Loads a drafter of class ``cls`` from ``path`` for ``target``.

    A drafter with weights of its own (a key of `FORMATS`) reads the folder `save`
    wrote; a `~specjax.DraftModel` reads its model's Hugging Face folder (or ``.gguf``
    file), cast to the target's dtype, with γ 4 unless ``num_draft`` says otherwise.

    Args:
        cls: the drafter class saved there.
        path: the folder.
        target: the target to bind it to, shaped like the one it was built for.
        num_draft, mode: override the saved γ and mode.

    Raises:
        FileNotFoundError: ``path`` holds no drafter of this class.
        ValueError: it was built for a target of another shape, its files disagree,
            or an override is refused by the drafter's check.
        TypeError: ``cls`` has no files to load.
    """
    if issubclass(cls, DraftModel):
        return cls(load_pretrained(path, dtype=target.dtype)).with_draft(num_draft, mode)
    file = _file_of(cls)
    path = Path(path)
    if not (path / file.config_file).is_file():
        raise FileNotFoundError(
            f"path {path} holds no {file.config_file}: not {with_article(cls.noun)}"
        )
    meta = json.loads((path / file.config_file).read_text())
    if meta.get("format") != file.format:
        raise ValueError(f"path {path}: {file.config_file} is not a {file.format} file")
    want, have = meta["target"], target_shape(target)
    if want != have:
        raise ValueError(
            f"target: the drafter in {path} was built for a target with {want}, "
            f"this target has {have}"
        )
    config = _config_from(meta["layers"])
    target_layers = tuple(meta["target_layers"])
    graphdef, params = _read_params(cls, path, config, len(target_layers), target.dtype, file)
    return cls.of_weights(
        target,
        graphdef,
        params,
        config,
        target_layers,
        **{f: meta[f] for f in file.fields},
        num_draft=int(meta["num_draft"] if num_draft is None else num_draft),
        mode=meta["mode"] if mode is None else mode,
    )


def _config_from(fields: dict) -> ModelConfig:
    """The `ModelConfig` a config file's ``layers`` entry holds (JSON lists as tuples)."""
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in fields.items()}
    if fields.get("rope_scaling") is not None:
        fields["rope_scaling"] = tuple(tuple(p) for p in fields["rope_scaling"])
    return ModelConfig(**fields)


def _read_params(cls, path: Path, config: ModelConfig, num_features: int, dtype, file):
    """``(graphdef, params)`` of ``cls``'s network, its weights read from ``path``."""
    from safetensors.numpy import load_file

    net = cls.net_type(config, num_features, dtype=dtype, rngs=nnx.Rngs(0))
    graphdef, template = nnx.split(net)
    arrays = load_file(str(path / WEIGHTS_FILE))
    expected = flat_params(template)
    if set(arrays) != set(expected) or any(arrays[k].shape != expected[k].shape for k in expected):
        raise ValueError(f"path {path}: {WEIGHTS_FILE} does not match {file.config_file}")
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = [jnp.asarray(arrays[jax.tree_util.keystr(p)], leaf.dtype) for p, leaf in paths_leaves]
    return graphdef, jax.tree_util.tree_unflatten(treedef, leaves)
