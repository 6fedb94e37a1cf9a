"""A GGUF file's converted weights, kept once as a safetensors folder.

Loading a GGUF dequantizes every block on the host with the ``gguf`` package
(numpy), about 95 s for a 1.5B Q4_K_M file on a 2-core CPU; the result is the
same every time. `load_gguf_cached` therefore writes the converted model once, as
a Hugging Face folder (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``chat_template.jinja``; the round trip `specjax.save_pretrained` →
`specjax.load_pretrained` is exact), under ``$SPECJAX_CACHE/converted/``, and
later loads read that folder instead, in seconds.

A load that quantizes (``load_pretrained(path, quantize="int8")``, the mode of
`specjax.models.quant`) keeps the quantized model instead: int8 matrices, their
float32 scales, norms and biases (`write_quantized`), read back by `read_quantized`
without ever building the float model. Its first load dequantizes and quantizes one
layer at a time. For Qwen2.5-Coder-1.5B (Q4_K_M, 1.1 GB), the float32 entry takes
7.1 GB and the int8 one 2.5 GB (1.6 GB of int8 matrices and scales, and the untied
input embedding, 0.9 GB, which `~specjax.models.quant.quantize` leaves in float32);
both loads equal ``quantize(load_pretrained(path), mode)`` bit for bit.

An entry's name holds the file's stem, the dtype, the quantization mode (if any) and
a key hashed from what decides the converted values: the GGUF file's resolved path,
size, modification time and first megabyte, the dtype, the mode, the ``gguf``
package's version and `CONVERSION_VERSION` (raised whenever the conversion's output
changes). A changed file, another dtype or mode or another converter is therefore a
miss, never a stale hit. An entry that cannot be read (truncated, edited) is reported
with a warning, removed and written anew; writing an entry that fails (a full disk)
is reported with a warning and the converted model is returned anyway: the cache
never breaks a load.

The environment variable ``SPECJAX_WEIGHT_CACHE`` decides, read at each load:
unset, the default folder above; ``0``, ``off``, ``false`` or ``no``, no cache
(every load converts); any other value, that folder. Entries are never deleted
for you: one per file, dtype and mode stays until you delete it (a float32 entry
left from loads without ``quantize`` included). Delete an entry's folder, or the
whole folder, to reclaim the space.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ENV_VAR = "SPECJAX_WEIGHT_CACHE"
_OFF = ("0", "off", "false", "no")

#: Raised whenever the GGUF conversion's output changes, so older entries are misses.
CONVERSION_VERSION = 1

__all__ = [
    "CONVERSION_VERSION",
    "ENV_VAR",
    "cache_dir",
    "entry_for",
    "load_gguf_cached",
    "read_quantized",
    "write_quantized",
]


def cache_dir() -> Path | None:
    """The folder of converted weights, or ``None`` when ``SPECJAX_WEIGHT_CACHE`` is off."""
    from specjax.core.paths import cache_root

    value = os.environ.get(ENV_VAR)
    if value is None:
        return cache_root() / "converted"
    if value.strip().lower() in _OFF:
        return None
    return Path(value)


def entry_for(gguf_path: str | os.PathLike, dtype, root: Path, quantize: str | None = None) -> Path:
    """The cache entry (a folder under ``root``) of ``gguf_path`` converted to ``dtype``
    and, unless ``quantize`` is None, quantized to that `specjax.models.quant` mode."""
    from specjax.io.gguf import _gguf_version

    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = hashlib.sha256()
    for part in (
        str(path),
        stat.st_size,
        stat.st_mtime_ns,
        jnp.dtype(dtype).name,
        _gguf_version(),
        CONVERSION_VERSION,
    ):
        key.update(f"{part}\0".encode())
    if quantize is not None:  # float entries keep the key they always had
        key.update(f"quantize={quantize}\0".encode())
    with open(path, "rb") as f:
        key.update(f.read(1 << 20))
    mode = "" if quantize is None else f"-{quantize}"
    return root / f"{path.stem}-{jnp.dtype(dtype).name}{mode}-{key.hexdigest()[:16]}"


def load_gguf_cached(
    gguf_path: str | os.PathLike,
    dtype,
    *,
    read_folder,
    write_folder,
    log=None,
    quantize: str | None = None,
):
    """`~specjax.io.gguf.load_gguf`, through the converted-weights cache.

    Args:
        gguf_path: the ``.gguf`` file.
        dtype: the parameter dtype (part of the cache key).
        read_folder: ``read_folder(folder, dtype) -> Model``, the Hugging Face folder
            reader (`specjax.io.hf` passes its own: entries are its format, and this
            module does not import it, so the two stay out of a circle).
        write_folder: ``write_folder(model, folder)``, writing one atomically.
        log: called with one line when an entry is written or read (default:
            stderr; pass ``lambda msg: None`` for silence).
        quantize: None, or a `specjax.models.quant` mode: the entry then holds the
            quantized model (`write_quantized`), read back by `read_quantized`;
            ``read_folder`` and ``write_folder`` are not used.

    Returns:
        The same `~specjax.models.Model` as ``load_gguf(gguf_path, dtype,
        quantize=quantize)``: the same config, parameters, tokenizer and chat template.
    """
    from specjax.io.gguf import load_gguf

    log = log or _stderr
    root = cache_dir()
    if root is None:
        return load_gguf(gguf_path, dtype=dtype, quantize=quantize)
    entry = entry_for(gguf_path, dtype, root, quantize)
    if quantize is not None:
        read_folder = lambda folder, dtype: read_quantized(folder, dtype, quantize)  # noqa: E731
        write_folder = lambda model, folder: write_quantized(model, folder, dtype)  # noqa: E731
    if (entry / "config.json").is_file():
        try:
            model = read_folder(entry, dtype)
        except Exception as e:  # noqa: BLE001  any unreadable entry is a miss, never a failure
            warnings.warn(
                f"unreadable converted-weights entry {entry} ({type(e).__name__}: {e}); "
                "removing it and converting the GGUF file again",
                stacklevel=2,
            )
            shutil.rmtree(entry, ignore_errors=True)
        else:
            log(f"loaded the converted weights of {Path(gguf_path).name} from {entry}")
            return model
    model = load_gguf(gguf_path, dtype=dtype, quantize=quantize)
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_folder(model, entry)
    except (OSError, ValueError) as e:
        warnings.warn(
            f"could not keep the converted weights in {entry} ({e}); the next load converts again",
            stacklevel=2,
        )
    else:
        size = sum(f.stat().st_size for f in entry.iterdir()) / 1e9
        log(f"kept the converted weights of {Path(gguf_path).name} in {entry} ({size:.1f} GB)")
    return model


def write_quantized(model, folder: Path, dtype) -> None:
    """Writes a quantized ``model``, loaded in ``dtype``, into ``folder``, atomically.

    ``config.json`` (the float model's Hugging Face config), ``quantization.json``
    (the mode and the load dtype), ``quantized.safetensors`` (every leaf under its
    parameter path, ``layers.0.self_attn.qkv_proj.weight``: int8 weights, float32
    scales, norms and biases), ``tokenizer.json`` and ``chat_template.jinja``. It is
    no Hugging Face checkpoint (`specjax.load_pretrained` does not read it).

    Raises:
        OSError: writing failed; an earlier ``folder`` is then unchanged.
        KeyError: a leaf of a dtype the file format here does not write.
    """
    from specjax.io import atomic
    from specjax.io.hf_config import config_to_hf

    unrolled = model.with_scan_layers(False)
    info = {"mode": model.quantization, "dtype": jnp.dtype(dtype).name}

    def write(tmp: Path) -> None:
        leaves = [(_leaf_name(p), v.get_value()) for p, v in nnx.to_flat_state(unrolled.params)]
        _write_safetensors(leaves, tmp / _QUANTIZED_WEIGHTS)
        hf = config_to_hf(model.config, info["dtype"])
        (tmp / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
        (tmp / _QUANTIZED_INFO).write_text(json.dumps(info) + "\n")
        if model.tokenizer is not None:
            model.tokenizer.save(str(tmp / "tokenizer.json"))
        if model.chat_template is not None:
            (tmp / "chat_template.jinja").write_text(model.chat_template, encoding="utf-8")

    atomic.replace_folder(folder, write)


def read_quantized(folder: Path, dtype, mode: str):
    """The quantized `~specjax.models.Model` that `write_quantized` wrote into ``folder``.

    Every leaf is checked against the model that loading the same config with
    ``dtype`` and ``mode`` builds (`specjax.io.tensors.abstract_quantized`).

    Raises:
        ValueError: the folder holds another mode or dtype, or a missing, extra or
            mis-shaped leaf (named).
    """
    from specjax.io.folder import read_chat_template, read_tokenizer
    from specjax.io.hf_config import config_from_hf
    from specjax.io.tensors import abstract_quantized

    info = json.loads((folder / _QUANTIZED_INFO).read_text())
    want = {"mode": mode, "dtype": jnp.dtype(dtype).name}
    if info != want:
        raise ValueError(f"{folder / _QUANTIZED_INFO} holds {info}, expected {want}")
    config = config_from_hf(json.loads((folder / "config.json").read_text()))
    abstract = abstract_quantized(config, dtype, mode)
    path = folder / _QUANTIZED_WEIGHTS
    leaves = []
    with open(path, "rb") as f:
        header_bytes = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_bytes))
        header.pop("__metadata__", None)
        for p, var in nnx.to_flat_state(abstract.params):
            name, spec = _leaf_name(p), var.get_value()
            if name not in header:
                raise ValueError(f"{path} has no tensor {name}")
            entry = header.pop(name)
            stored_dtype, shape = jnp.dtype(_DTYPES[entry["dtype"]]), tuple(entry["shape"])
            if shape != spec.shape or stored_dtype != spec.dtype:
                raise ValueError(
                    f"{path}: tensor {name} is {stored_dtype}{list(shape)}, "
                    f"expected {spec.dtype}{list(spec.shape)}"
                )
            begin, end = entry["data_offsets"]
            f.seek(8 + header_bytes + begin)
            array = np.fromfile(f, stored_dtype, count=(end - begin) // stored_dtype.itemsize)
            if array.nbytes != end - begin or array.size != math.prod(shape):
                raise ValueError(f"{path} is truncated in tensor {name}")
            leaves.append((p, var.replace(jnp.asarray(array.reshape(shape)))))
    if header:
        raise ValueError(f"{path} has unexpected tensor(s) {sorted(header)}")
    return abstract.replace(
        params=nnx.from_flat_state(leaves),
        tokenizer=read_tokenizer(folder),
        chat_template=read_chat_template(folder),
    )


_QUANTIZED_WEIGHTS = "quantized.safetensors"
_QUANTIZED_INFO = "quantization.json"


def _leaf_name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


# safetensors' dtype codes of the leaves a quantized model holds.
_CODES = {"int8": "I8", "int32": "I32", "float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_DTYPES = {code: name for name, code in _CODES.items()}


def _write_safetensors(leaves: list[tuple[str, jax.Array]], path: Path) -> None:
    """Writes ``leaves`` as a safetensors file, one leaf's host copy at a time.

    ``safetensors.numpy.save_file`` takes every array at once, a host copy of the
    whole model next to the model itself; the format (an 8-byte header length, a
    JSON header of dtypes, shapes and byte offsets, then the raw data) is written
    here directly instead.
    """
    header, offset = {"__metadata__": {"format": "specjax"}}, 0
    for name, x in leaves:
        nbytes = x.size * x.dtype.itemsize
        code = _CODES[jnp.dtype(x.dtype).name]
        header[name] = {
            "dtype": code,
            "shape": list(x.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for _, x in leaves:
            np.ascontiguousarray(jax.device_get(x)).tofile(f)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
