"""A GGUF file's converted weights, kept once as a safetensors folder.

Loading a GGUF dequantizes every block on the host with the ``gguf`` package
(numpy), about 95 s for a 1.5B Q4_K_M file on a 2-core CPU; the result is the
same every time. `load_gguf_cached` therefore writes the converted model once, as
a Hugging Face folder (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``chat_template.jinja``; the round trip `specjax.save_pretrained` →
`specjax.load_pretrained` is exact), under ``$SPECJAX_CACHE/converted/``, and
later loads read that folder instead, in seconds.

An entry's name holds the file's stem and a key hashed from what decides the
converted values: the GGUF file's resolved path, size, modification time and first
megabyte, the dtype, the ``gguf`` package's version and `CONVERSION_VERSION`
(raised whenever the conversion's output changes). A changed file, another dtype
or another converter is therefore a miss, never a stale hit. An entry that cannot
be read (truncated, edited) is reported with a warning, removed and written anew;
writing an entry that fails (a full disk) is reported with a warning and the
converted model is returned anyway: the cache never breaks a load.

The environment variable ``SPECJAX_WEIGHT_CACHE`` decides, read at each load:
unset, the default folder above; ``0``, ``off``, ``false`` or ``no``, no cache
(every load converts); any other value, that folder. Entries are as large as the
weights in their dtype (6.2 GB for the 1.5B in float32): delete the folder to
reclaim the space.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import warnings
from pathlib import Path

import jax.numpy as jnp

ENV_VAR = "SPECJAX_WEIGHT_CACHE"
_OFF = ("0", "off", "false", "no")

#: Raised whenever the GGUF conversion's output changes, so older entries are misses.
CONVERSION_VERSION = 1

__all__ = ["CONVERSION_VERSION", "ENV_VAR", "cache_dir", "entry_for", "load_gguf_cached"]


def cache_dir() -> Path | None:
    """The folder of converted weights, or ``None`` when ``SPECJAX_WEIGHT_CACHE`` is off."""
    from specjax.core.paths import cache_root

    value = os.environ.get(ENV_VAR)
    if value is None:
        return cache_root() / "converted"
    if value.strip().lower() in _OFF:
        return None
    return Path(value)


def entry_for(gguf_path: str | os.PathLike, dtype, root: Path) -> Path:
    """The cache entry (a folder under ``root``) of ``gguf_path`` converted to ``dtype``."""
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
    with open(path, "rb") as f:
        key.update(f.read(1 << 20))
    return root / f"{path.stem}-{jnp.dtype(dtype).name}-{key.hexdigest()[:16]}"


def load_gguf_cached(gguf_path: str | os.PathLike, dtype, *, read_folder, write_folder, log=None):
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

    Returns:
        The same `~specjax.models.Model` as ``load_gguf(gguf_path, dtype)``: the same
        config, parameters, tokenizer and chat template.
    """
    from specjax.io.gguf import load_gguf

    log = log or _stderr
    root = cache_dir()
    if root is None:
        return load_gguf(gguf_path, dtype=dtype)
    entry = entry_for(gguf_path, dtype, root)
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
    model = load_gguf(gguf_path, dtype=dtype)
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


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
