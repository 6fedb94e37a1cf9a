"""What the commands share: `UserError`, flag checks and loading a model."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A mistake in the command line or its inputs, reported without a traceback."""


def load_folder(path, flag):
    """The model at ``path`` (a Hugging Face folder or a GGUF file); errors name ``flag``."""
    from specjax.io.hf import load_pretrained

    is_gguf = Path(path).suffix.lower() == ".gguf" and Path(path).is_file()
    if not (Path(path).is_dir() or is_gguf):
        raise UserError(f"{flag} {path}: no such directory or .gguf file")
    try:
        return load_pretrained(path)
    except (FileNotFoundError, ValueError, OSError, KeyError) as e:
        raise UserError(f"{flag} {path}: {e}") from None


def check_flag(flag, check, value, **bounds):
    """``check`` (a :mod:`specjax.validation` helper) with the error naming ``flag``."""
    try:
        return check(flag, value, **bounds)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
