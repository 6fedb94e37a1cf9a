"""Where specjax keeps what it caches (fetched checkpoints, converted weights, programs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``cache_dir``, else ``$SPECJAX_CACHE``, else ``~/.cache/specjax``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("SPECJAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specjax"
