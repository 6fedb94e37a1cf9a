"""The bundled default target/draft pair (a code-completion pair trained on the stdlib)."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import jax.numpy as jnp

DEFAULT_PAIR_DIR = "default"


def default_pair_path() -> Path:
    """Folder holding the bundled ``target/`` and ``draft/`` Hugging Face folders."""
    return Path(str(importlib.resources.files("specjax") / "assets" / DEFAULT_PAIR_DIR))


@functools.lru_cache(maxsize=2)
def default_pair(dtype=jnp.float32):
    """Loads the bundled pair, offline.

    The weights are stored in bfloat16 and cast to ``dtype`` (float32 by
    default: bf16 matmuls are slow on CPUs). See the README for how the pair
    was trained and how well it does.

    Returns:
        ``(target, draft, tokenizer)``: two :class:`specjax.Model` sharing one
        vocabulary, and their ``tokenizers.Tokenizer``.

    Raises:
        FileNotFoundError: the package was installed without its assets.
    """
    from specjax.models.hf import load_pretrained

    root = default_pair_path()
    for name in ("target", "draft"):
        if not (root / name / "config.json").is_file():
            raise FileNotFoundError(
                f"bundled model {name!r} is missing from {root}; reinstall specjax "
                "or pass --model/--draft folders"
            )
    target = load_pretrained(root / "target", dtype=dtype)
    draft = load_pretrained(root / "draft", dtype=dtype)
    return target, draft, target.tokenizer
