"""jax's persistent compilation cache under the specjax cache folder.

Compiling the decode loop takes most of a short run's time (about 25 s for the
bundled pair on a 2-core CPU, against under a second of decoding), and nothing
of it is kept between processes unless jax is told where to keep it. The
``specjax`` command turns jax's persistent compilation cache on in
``$SPECJAX_CACHE/jax`` (default ``~/.cache/specjax/jax``), so the second run of
the same call loads its programs from disk instead of compiling them.
``import specjax`` changes no jax setting: a library user turns the same cache on
with one call, :func:`enable` (a folder of one's choosing, or the default) or
:func:`enable_from_environment` (the command's rule below)::

    import specjax
    specjax.core.compilation_cache.enable()

The environment variable ``SPECJAX_COMPILATION_CACHE`` decides, for the command and
for :func:`enable_from_environment`:

* unset: the default folder above;
* ``0``, ``off``, ``false`` or ``no``: no persistent cache (jax's default);
* any other value: that folder.

A cache folder the user already gave jax (``jax_compilation_cache_dir``, or the
``JAX_COMPILATION_CACHE_DIR`` variable) is left alone. :func:`enable` and
:func:`disable` change the setting at run time; the CLI's
``--no-compilation-cache`` calls :func:`disable`.

What can go wrong with a cache, and why it never breaks a run:

* An entry written by another jax or jaxlib version, other XLA flags or another
  backend is never read: jax's cache key hashes all of them (and the program),
  so such entries are misses, and the program is compiled and written anew.
* A corrupted entry (a truncated or overwritten file) fails jax's decompression
  or XLA's deserialization; jax warns ("Error reading persistent compilation
  cache entry ...") and compiles instead. jax never overwrites an existing
  entry, so such an entry would cost a compile on every later run:
  :func:`repairing` (the CLI runs under it) deletes the entries jax could not
  read, and the next run caches those programs again.

The cache is trusted code: as jax's documentation warns, whoever can write to
the folder can make a jax process run arbitrary code. Keep it private to you.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import warnings
import zlib
from pathlib import Path

import jax

ENV_VAR = "SPECJAX_COMPILATION_CACHE"
_OFF = ("0", "off", "false", "no")
_SUFFIX = "-cache"  # jax's LRUCache file suffix

# What jax warns when it cannot read an entry; the quoted name is the program's
# (entries are files "<program>-<key hash>-cache").
_READ_ERROR = re.compile(r"Error reading persistent compilation cache entry for '([^']+)'")

__all__ = [
    "ENV_VAR",
    "default_dir",
    "disable",
    "enable",
    "enabled_dir",
    "remove_unreadable_entries",
    "repairing",
]


def default_dir() -> Path:
    """``$SPECJAX_CACHE/jax``, or ``~/.cache/specjax/jax``."""
    from specjax.core.paths import cache_root

    return cache_root() / "jax"


def _reset_jax_cache() -> None:
    # jax opens its cache once, at the first compile; a later change of folder
    # only takes effect after a reset.
    from jax.experimental.compilation_cache import compilation_cache as jax_cc

    jax_cc.reset_cache()


def enable(path: str | os.PathLike | None = None) -> Path:
    """Keeps compiled programs in ``path`` (default :func:`default_dir`) across processes.

    Every program is cached, however fast it compiled: the decode loop is a few
    large programs and many small ones, and a run that still compiles the small
    ones does not start in seconds.

    Args:
        path: the cache folder; created if missing.

    Returns:
        The folder in use.

    Raises:
        OSError: the folder cannot be created.
    """
    folder = Path(path) if path is not None else default_dir()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", os.fspath(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _reset_jax_cache()
    return folder


def disable() -> None:
    """Turns jax's persistent compilation cache off for this process."""
    jax.config.update("jax_compilation_cache_dir", None)
    _reset_jax_cache()


def enabled_dir() -> Path | None:
    """The persistent cache folder jax uses now, or ``None`` when there is none."""
    path = jax.config.jax_compilation_cache_dir
    return Path(path) if path else None


def remove_unreadable_entries(path: str | os.PathLike | None = None) -> list[Path]:
    """Deletes cache entries that cannot be decompressed; returns what it removed.

    jax compresses each entry (zlib, whose checksum catches a flipped or
    truncated file), reads an entry it cannot decompress as a miss with a
    warning, and never replaces it; removing it lets the next compile write a
    good one. Entries written by other jax versions are kept: they are valid,
    only never looked up by this one.

    Args:
        path: the cache folder; default the one in use (nothing is done if none).
    """
    folder = Path(path) if path is not None else enabled_dir()
    if folder is None or not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.glob(f"*{_SUFFIX}")):
        try:
            data = entry.read_bytes()
        except OSError:
            continue
        if _decompresses(data):
            continue
        try:
            entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


@contextlib.contextmanager
def repairing():
    """Runs the body; afterwards deletes the cache entries jax could not read.

    jax reads an unreadable entry as a miss and warns; this context turns each
    such warning into one ``specjax:`` warning and removes the entries of the
    programs it names (every entry of that program: which of them was bad is
    not known, and the good ones are simply compiled and cached again), plus
    any entry that does not decompress. Other warnings pass through unchanged.
    """
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            yield
    finally:
        _repair(caught)  # outside the recording, so its own warning reaches the caller


def _repair(caught) -> None:
    programs = set()
    for w in caught:
        match = _READ_ERROR.search(str(w.message))
        if match:
            programs.add(match.group(1))
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    folder = enabled_dir()
    if not programs or folder is None:
        return
    removed = set(remove_unreadable_entries(folder))
    for program in programs:
        # jax names either the program ("jit_f") or the whole key ("jit_f-<hash>").
        name = glob.escape(program)
        for entry in [*folder.glob(f"{name}-*{_SUFFIX}"), *folder.glob(f"{name}{_SUFFIX}")]:
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.add(entry)
    warnings.warn(
        f"specjax: {len(programs)} compiled program(s) in the compilation cache {folder} "
        f"could not be read ({', '.join(sorted(programs))}); they were compiled instead, "
        f"and {len(removed)} unreadable entr{'y was' if len(removed) == 1 else 'ies were'} "
        "removed, so the next run caches them again",
        stacklevel=3,
    )


def _decompresses(data: bytes) -> bool:
    try:
        zlib.decompress(data)
        return True
    except zlib.error:
        pass
    try:  # newer jax may compress with zstandard when it is installed
        import zstandard

        zstandard.ZstdDecompressor().decompress(data)
        return True
    except Exception:  # noqa: BLE001 (no zstandard, or not a zstd frame either)
        return False


def enable_from_environment() -> Path | None:
    """Applies ``SPECJAX_COMPILATION_CACHE`` (see the module docstring), as the
    ``specjax`` command does before it runs; returns the folder in use, or None."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in _OFF:
        return None
    if enabled_dir() is not None and not value:
        return enabled_dir()  # the user's own jax setting wins over our default
    try:
        return enable(value or None)
    except OSError as e:
        # A read-only home must not make a run fail: run uncached.
        warnings.warn(
            f"specjax: no persistent compilation cache ({e}); set {ENV_VAR}=off to "
            "silence this, or to a writable folder",
            stacklevel=2,
        )
        return None
