"""Writing a folder so that a reader sees the old one or the new one, never a mix.

Every checkpoint writer (:func:`specjax.save_pretrained` and the training
checkpoints of :mod:`specjax.training`) goes through :func:`replace_folder`: the new
folder is written in full under a hidden temporary name next to the target (same
parent, so same file system and ``rename`` is atomic), its files and the folder
itself are ``fsync``-ed, and only then is it renamed into place. An existing
target is first renamed away and deleted only once the new folder is in place,
so a failure at any point (a full disk, a permission error, a crash) leaves the
old folder loadable and untouched.

POSIX cannot atomically swap two non-empty folders with ``rename``, so between
the two renames the target briefly does not exist. A crash in exactly that
window leaves the old folder complete under ``.NAME.old-*`` next to the target,
where :func:`find_displaced` finds it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["find_displaced", "fsync_tree", "replace_folder"]


def _fsync_dir(path: Path) -> None:
    # Windows cannot open a directory for fsync; its renames are journaled anyway.
    if os.name == "nt":
        return
    _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_file_modes(root: Path) -> None:
    """Gives the files under ``root`` the mode ``open()`` would (``0o666 & ~umask``).

    safetensors writes its files ``0o600``, so a checkpoint saved on a shared
    machine could not be read by the rest of the group.
    """
    # The mode a plain open() gives, read off a probe file: asking os.umask would
    # set the process-wide umask for a moment, which other threads would see.
    probe = root / ".mode-probe"
    probe.touch()
    mode = probe.stat().st_mode & 0o777
    probe.unlink()
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            file = Path(dirpath) / name
            if not file.is_symlink():
                os.chmod(file, mode)


def fsync_tree(path: str | os.PathLike) -> None:
    """Flushes every file and folder under ``path`` (and ``path``) to stable storage.

    Without it a rename can reach the disk before the data it names, and a power
    cut after the rename would leave an empty or truncated file under the final name.
    """
    root = Path(path)
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            file = Path(dirpath) / name
            if file.is_symlink():
                continue
            _fsync(file)
        _fsync_dir(Path(dirpath))


def _stamp() -> str:
    return f"{os.getpid()}-{time.time_ns()}"


def find_displaced(target: str | os.PathLike) -> list[Path]:
    """Old copies of ``target`` left next to it by a :func:`replace_folder` that crashed.

    Only a crash between renaming the old folder away and renaming the new one
    in leaves one; each is complete (it was the previous, intact folder).
    """
    target = Path(target)
    if not target.parent.is_dir():
        return []
    prefix = f".{target.name}.old-"
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(prefix) and p.is_dir())


def replace_folder(
    target: str | os.PathLike, write: Callable[[Path], None], *, keep: Iterable[str] = ()
) -> Path:
    """Atomically replaces (or creates) folder ``target`` with what ``write`` produces.

    Args:
        target: the folder to create or replace. Its parent is created if missing.
        write: called with an empty temporary folder next to ``target``; it must
            write the complete new contents there.
        keep: names of entries of an existing ``target`` to move into the new one
            after the swap (for example a training run's ``checkpoints`` folder).
            They are renamed, not copied, so nothing large is rewritten.

    Returns:
        ``target`` as a ``Path``.

    Raises:
        OSError: whatever writing or renaming raised (``ENOSPC``, ``EACCES``, ...).
            The old ``target``, if there was one, is then still in place and
            unchanged, and the temporary folder is removed.
    """
    target = Path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    stamp = _stamp()
    tmp = parent / f".{target.name}.tmp-{stamp}"
    # Not tempfile.mkdtemp: its 0700 mode would stick to the renamed folder.
    tmp.mkdir()
    try:
        write(tmp)
        _default_file_modes(tmp)
        fsync_tree(tmp)
        if not (target.exists() or target.is_symlink()):
            os.replace(tmp, target)
            _fsync_dir(parent)
            return target
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    old = parent / f".{target.name}.old-{stamp}"
    try:
        os.replace(target, old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, target)
    except BaseException as e:
        # Put the old folder back before anything else, so that it stays loadable.
        try:
            os.replace(old, target)
        except OSError as restore_error:
            raise OSError(
                e.errno if isinstance(e, OSError) else None,
                f"could not rename the new {target.name} into place ({e}), nor the old one "
                f"back ({restore_error}); the old folder is intact at {old}",
            ) from e
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(parent)

    kept_all = True
    for name in keep:
        src = old / name
        if src.exists() or src.is_symlink():
            try:
                os.replace(src, target / name)
            except OSError:
                kept_all = False
    if not kept_all:
        # Never delete what could not be carried over.
        raise OSError(
            f"{target} was replaced, but some of {sorted(keep)} could not be moved into it; "
            f"they are still in {old}"
        )
    _fsync_dir(target)
    shutil.rmtree(old, ignore_errors=True)
    return target
