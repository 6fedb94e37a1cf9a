"""Hugging Face checkpoint folders: import and export (safetensors only, never pickle).

:func:`load_pretrained` reads a Hugging Face style folder (``config.json`` plus
``model.safetensors`` or sharded ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, and ``tokenizer.json`` when present) into a
:class:`~specjax.models.model.Model`, and sends a GGUF file to
:func:`specjax.io.gguf.load_gguf`; :func:`save_pretrained` writes a folder that
``transformers.AutoModelForCausalLM.from_pretrained`` loads unchanged.

The ``config.json`` mapping is :mod:`specjax.io.hf_config`, the tensor naming
and checks :mod:`specjax.io.tensors`. Anything the Llama-family decoder here
would not compute exactly like ``transformers`` (a MoE, another activation,
another RoPE scaling, a sliding window on only some layers, a missing, extra or
mis-shaped tensor) is a ``ValueError`` naming the field or tensor; nothing is
skipped silently.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.io import atomic, hub
from specjax.io.folder import read_chat_template, read_json, read_tokenizer
from specjax.io.hf_config import config_from_hf, config_to_hf
from specjax.io.tensors import LazyTensors, host_tensors, model_from_tensors
from specjax.models.model import Model

__all__ = [
    "check_save_target",
    "load_pretrained",
    "read_chat_template",
    "save_pretrained",
    "write_pretrained",
]

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

_SAFETENSORS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

# safetensors dtype codes of the floating types a weight may be stored in; an
# integer or bool tensor where a weight is expected is refused, never cast.
_FLOAT_STORAGE = frozenset({"F16", "BF16", "F32", "F64"})

# What save_pretrained writes. A folder holding only these (and a config.json of
# the same model_type) is a checkpoint of the same family, which a save may
# replace whole; anything else in it would be lost, so needs overwrite=True.
_CHECKPOINT_FILES = frozenset(
    {"config.json", _SAFETENSORS, _INDEX, "tokenizer.json", "chat_template.jinja"}
)


def _weight_files(folder: Path) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files to read and, when sharded, the index's weight map."""
    if (folder / _INDEX).is_file():
        index = read_json(folder / _INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise ValueError(
                f"{folder / _INDEX} has no weight_map object (tensor name -> shard file), "
                f"got {type(weight_map).__name__}"
            )
        shards = sorted(set(weight_map.values()))
        # The index names files inside this folder; a path could point anywhere.
        bad = [f for f in shards if Path(f).name != f or not f.endswith(".safetensors")]
        if bad:
            raise ValueError(f"{folder / _INDEX} weight_map names {bad[0]!r}, not a shard file")
        return shards, weight_map
    if (folder / _SAFETENSORS).is_file():
        return [_SAFETENSORS], None
    pickles = sorted(p.name for p in folder.iterdir() if p.name.endswith(_PICKLE_SUFFIXES))
    if pickles:
        raise ValueError(
            f"{folder} holds only PyTorch pickle weights ({', '.join(pickles)}). specjax "
            "never unpickles (loading a pickle can run arbitrary code); it reads "
            f"{_SAFETENSORS} or a sharded {_INDEX}. Convert once in a trusted "
            "environment, e.g. transformers.AutoModelForCausalLM.from_pretrained(path)"
            ".save_pretrained(out, safe_serialization=True)."
        )
    raise FileNotFoundError(f"{folder} has neither {_SAFETENSORS} nor {_INDEX}")


def load_pretrained(
    path: str | os.PathLike,
    dtype=jnp.float32,
    *,
    scan_layers: bool = False,
    quantize: str | None = None,
) -> Model:
    """Loads a Hugging Face checkpoint folder or a llama.cpp GGUF file.

    Families: Llama, Mistral, Qwen2, Qwen3, Gemma 2 and Gemma 3 (text).

    Args:
        path: a Hugging Face Hub id (``owner/name``, downloaded once into the Hub's
            cache, `specjax.io.hub`), or a folder with ``config.json`` and
            ``model.safetensors`` (or shards
            listed in ``model.safetensors.index.json``); ``tokenizer.json``, if
            present, is loaded into ``Model.tokenizer`` and the chat template
            (``chat_template.jinja`` or ``tokenizer_config.json``) into
            ``Model.chat_template``. Or a ``.gguf`` file, or a folder holding
            exactly one and no ``config.json``: it is dequantized with the
            optional ``gguf`` package (``pip install "specjax[gguf]"``), and its
            tokenizer, chat template and end-of-turn ids come from the file
            (see :func:`specjax.io.gguf.load_gguf`); the converted weights are
            kept once under ``$SPECJAX_CACHE/converted`` so the next load of the
            same file takes seconds (`specjax.io.converted`; set
            ``SPECJAX_WEIGHT_CACHE=off`` to convert every time). Pickle formats
            (``.bin``, ``.pt``, ``.pth``) are refused, never opened.
        dtype: parameter dtype (the checkpoint's tensors are cast to it);
            float32 by default, bfloat16 supported; must be a floating dtype.
            Logits are float32 either way.
        scan_layers: run the layers as one ``lax.scan`` over stacked parameters
            (``ModelConfig.scan_layers``): compile time no longer grows with
            depth. See docs/models.md, "Layer scan", for its cost per step.
        quantize: ``None`` (float weights), or a `specjax.models.quant` mode
            (``"int8"``, ``"int8-weights"``): the model comes back quantized, equal bit
            for bit to ``quantize(load_pretrained(path, dtype), quantize)``, but each
            layer is quantized as it is read, so the whole float model is never in
            memory. A GGUF file's cache entry then holds the quantized model (a quarter
            of the float32 one's size), so the next load reads int8 directly.

    Returns:
        The :class:`Model`. ``config.eos_token_id`` is the first end-of-sequence
        id and ``config.eos_token_ids`` all of them when config.json lists several.

    Raises:
        FileNotFoundError: no ``config.json`` or no weights.
        TypeError: ``dtype`` is not a floating dtype.
        ValueError: a ``config.json`` or index that is not the expected JSON object,
            an unsupported ``model_type`` or config field (a non-positive size
            included), a pickle-only folder, or a missing, unexpected, mis-shaped
            or non-floating tensor (named, with both shapes or its dtype), or a
            ``quantize`` that is not a mode of `specjax.models.quant`.
    """
    from safetensors import safe_open

    _check_float_dtype(dtype)
    _check_quantize(quantize)
    folder = Path(path)
    if not folder.exists() and hub.is_hub_id(path):
        try:
            folder = hub.download(str(path))
        except hub.HubError as e:
            raise FileNotFoundError(str(e)) from None
    gguf_file = _gguf_file(folder)
    if gguf_file is not None:
        from specjax.io.converted import load_gguf_cached

        model = load_gguf_cached(
            gguf_file,
            dtype,
            # Read stacked as asked: restacking a loaded model holds two copies.
            read_folder=lambda folder, dtype: load_pretrained(
                folder, dtype, scan_layers=scan_layers
            ),
            write_folder=lambda model, folder: save_pretrained(model, folder, overwrite=True),
            quantize=quantize,
        )
        return model.with_scan_layers(scan_layers)
    config_path = folder / "config.json"
    if not config_path.is_file():
        hint = ""
        displaced = atomic.find_displaced(folder)
        if not folder.exists() and displaced:
            hint = f"; a save into it was interrupted, the previous checkpoint is {displaced[-1]}"
        raise FileNotFoundError(
            f"{folder} has no config.json (expected a Hugging Face folder){hint}"
        )
    hf_config = read_json(config_path)
    if not isinstance(hf_config, dict):
        raise ValueError(
            f"{config_path} must hold a JSON object (field: value), "
            f"got a {type(hf_config).__name__}"
        )
    config = dataclasses.replace(config_from_hf(hf_config), scan_layers=scan_layers)
    files, weight_map = _weight_files(folder)

    handles = {}
    located = {}  # tensor name -> file
    try:
        for file in files:
            try:
                handles[file] = safe_open(str(folder / file), framework="np")
            except Exception as e:  # the Rust error type is not a public class
                raise ValueError(f"{folder / file} is not a readable safetensors file: {e}") from e
            for name in handles[file].keys():
                located[name] = file
        if weight_map is not None:
            misplaced = [n for n, f in weight_map.items() if located.get(n) != f]
            if misplaced:
                raise ValueError(
                    f"{_INDEX} maps {misplaced[0]!r} to {weight_map[misplaced[0]]!r}, "
                    f"but that file does not hold it"
                )
        storage = {n: handles[f].get_slice(n).get_dtype() for n, f in located.items()}
        bad = [n for n, code in storage.items() if code not in _FLOAT_STORAGE]
        if bad:
            # Casting integers to float would load a model that computes garbage.
            raise ValueError(
                f"tensor {bad[0]} is stored as {storage[bad[0]]}, expected a floating "
                f"dtype ({', '.join(sorted(_FLOAT_STORAGE))})"
            )
        tensors = LazyTensors(
            {n: (lambda n=n: handles[located[n]].get_tensor(n)) for n in located},
            {n: tuple(handles[located[n]].get_slice(n).get_shape()) for n in located},
        )
        model = model_from_tensors(
            config,
            tensors,
            dtype=dtype,
            tokenizer=read_tokenizer(folder),
            chat_template=read_chat_template(folder),
            quantize=quantize,
        )
    finally:
        handles.clear()
    return model


def _gguf_file(path: Path) -> Path | None:
    """``path`` itself if it is a ``.gguf`` file, the one ``.gguf`` of a folder
    without ``config.json``, else ``None``."""
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (expected a GGUF file)")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) > 1:
        raise ValueError(
            f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}); "
            "pass the path of the one to load"
        )
    return found[0] if found else None


def _check_float_dtype(dtype):
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype must be a floating dtype such as jnp.float32, got {dtype!r}"
        ) from None
    if not jnp.issubdtype(np_dtype, jnp.floating):
        raise TypeError(
            f"dtype must be a floating dtype such as jnp.float32 or jnp.bfloat16, got {np_dtype}"
        )
    return np_dtype


def _check_quantize(quantize):
    from specjax.models.quant import MODES

    if quantize is not None and quantize not in MODES:
        raise ValueError(
            f"quantize must be one of {MODES}, or None for float weights, got {quantize!r}"
        )


def _parse_size(size: int | str) -> int:
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 1:
            raise ValueError(f"max_shard_size={size} must be a positive number of bytes")
        return size
    if not isinstance(size, str):
        raise TypeError(f"max_shard_size must be an int or a string like '5GB', got {size!r}")
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", size.upper())
    if not match:
        raise ValueError(f"max_shard_size={size!r} is not like 5GB, 500MB or 100KiB")
    number, unit = float(match[1]), match[2]
    base = 1024 if "I" in unit else 1000
    return int(number * base ** "BKMGT".index(unit[0]))


def _folder_contents(folder: Path, keep: Iterable[str]) -> tuple[str | None, list[str]]:
    """The ``model_type`` of the checkpoint in ``folder`` (or ``None``) and its foreign entries.

    Foreign entries are those a save would delete: anything but the files
    :func:`save_pretrained` writes and the names in ``keep``.
    """
    names = sorted(p.name for p in folder.iterdir())
    keep = set(keep)
    foreign = [n for n in names if n not in _CHECKPOINT_FILES and not _SHARD.match(n)]
    foreign = [n for n in foreign if n not in keep]
    model_type = None
    config = folder / "config.json"
    if config.is_file():
        try:
            hf = json.loads(config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            hf = None
        if isinstance(hf, dict) and isinstance(hf.get("model_type"), str):
            model_type = hf["model_type"]
    return model_type, foreign


def check_save_target(
    path: str | os.PathLike, model_type: str, *, overwrite: bool = False, keep: Iterable[str] = ()
) -> None:
    """Refuses a ``path`` that :func:`save_pretrained` must not replace.

    ``path`` may be missing, an empty folder, or a checkpoint of the same family
    (``config.json`` with this ``model_type``, and no files but the ones a save
    writes, plus the names in ``keep``). Anything else (a file, a checkpoint of
    another family, a folder with other files or without ``config.json``) would
    lose data when replaced whole, so it needs ``overwrite=True``; a file, the
    working directory or a file-system root are refused even then.

    Raises:
        ValueError: naming ``path`` and what it holds.
    """
    folder = Path(path).resolve()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"path {folder} is a file, not a folder; a checkpoint is a folder")
    if folder.parent == folder or Path.cwd().resolve().is_relative_to(folder):
        raise ValueError(
            f"path {folder} is a file-system root or holds the working directory; "
            "refusing to replace it"
        )
    if not folder.exists() or overwrite:
        return
    existing, foreign = _folder_contents(folder, keep)
    names = [p.name for p in folder.iterdir()]
    has_checkpoint_files = any(n in _CHECKPOINT_FILES or _SHARD.match(n) for n in names)
    if not foreign and (existing == model_type or not has_checkpoint_files):
        # A checkpoint of this family, or empty but for `keep` entries (a
        # training run that has not exported a model yet).
        return
    parts = []
    if existing is not None:
        other = "" if existing == model_type else f" (the model being saved is a {model_type})"
        parts.append(f"a {existing} checkpoint{other}")
    elif (folder / "config.json").exists():
        parts.append("a config.json without a model_type")
    elif has_checkpoint_files:
        parts.append("weight files without a config.json")
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        parts.append(f"other files ({shown})")
    raise ValueError(
        f"path {folder} holds {' and '.join(parts)}, which saving would delete (a save "
        "replaces the folder whole); pass overwrite=True to replace it, or choose another folder"
    )


def write_pretrained(model: Model, folder: Path, max_shard_size: int | str = "5GB") -> None:
    """Writes the checkpoint files into the existing, empty ``folder`` (not atomic)."""
    from safetensors.numpy import save_file

    hf_config = config_to_hf(model.config, model.dtype)
    limit = _parse_size(max_shard_size)
    tensors = host_tensors(model)
    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, array in tensors.items():
        if shards[-1] and shard_bytes + array.nbytes > limit:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = array
        shard_bytes += array.nbytes

    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    if len(shards) == 1:
        save_file(shards[0], str(folder / _SAFETENSORS), metadata=metadata)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / file), metadata=metadata)
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(a.nbytes for a in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save(str(folder / "tokenizer.json"))
    if model.chat_template is not None:
        (folder / "chat_template.jinja").write_text(model.chat_template, encoding="utf-8")


def save_pretrained(
    model: Model,
    path: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    keep: Iterable[str] = (),
) -> None:
    """Writes ``model`` as a Hugging Face checkpoint folder, atomically.

    ``config.json`` (with ``architectures``, ``model_type`` and ``dtype`` /
    ``torch_dtype``), the weights as ``model.safetensors`` (or, above
    ``max_shard_size``, shards plus ``model.safetensors.index.json``), and
    ``tokenizer.json`` when ``model.tokenizer`` is set.
    ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads the result
    and computes the same logits.

    The folder is written under a temporary name next to ``path``, flushed to
    disk and renamed into place (see :func:`specjax.io.atomic.replace_folder`); an
    existing folder is replaced whole, so no stale file of an earlier save
    remains. A failure at any point (a full disk, a permission error) leaves
    the old folder loadable and unchanged.

    Args:
        model: the model to write.
        path: the checkpoint folder. It may be missing, empty, or a checkpoint of
            the same ``model_type`` holding only files a save writes; anything
            else is refused unless ``overwrite`` is set.
        max_shard_size: largest shard, as bytes or a string like ``"5GB"``.
        overwrite: replace ``path`` whole whatever it holds (a checkpoint of
            another family, other files).
        keep: names of entries of an existing ``path`` to carry over into the new
            folder instead of deleting them (e.g. a training run's ``checkpoints``).

    Raises:
        ValueError: if the config has no exact transformers counterpart (e.g. a
            Qwen2 without q/k/v bias), naming the field; or ``path`` is a file or
            holds something other than a checkpoint of this family (without
            ``overwrite``).
        OSError: writing failed; the old folder, if any, is intact.
    """
    # Everything that can be refused is refused before the disk is touched.
    if getattr(model, "quantization", None) is not None:
        raise ValueError(
            f"model is quantized ({model.quantization!r}) and has no Hugging Face form: "
            "save the float model and quantize it after loading (specjax.models.quant)"
        )
    config_to_hf(model.config, model.dtype)
    _parse_size(max_shard_size)
    keep = tuple(keep)
    folder = Path(path).resolve()
    check_save_target(folder, model.config.model_type, overwrite=overwrite, keep=keep)
    atomic.replace_folder(
        folder, lambda tmp: write_pretrained(model, tmp, max_shard_size), keep=keep
    )
