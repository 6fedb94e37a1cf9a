"""What the commands share: `UserError`, flag checks and loading a model."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A mistake in the command line or its inputs, reported without a traceback."""


def model_path(path, flag) -> Path:
    """``path`` if it is a model folder or a GGUF file, else the file of the model *named*
    ``path`` (`specjax.io.fetch.names`), fetched on first use; errors name ``flag``."""
    from specjax.io import fetch

    p = Path(path)
    if p.is_dir() or (p.suffix.lower() == ".gguf" and p.is_file()):
        return p
    if str(path) in fetch.names():
        try:
            return fetch.fetch(str(path))
        except fetch.FetchError as e:
            raise UserError(f"{flag} {path}: {e}") from None
    raise UserError(
        f"{flag} {path}: no such directory or .gguf file, and no model of that name "
        f"(known: {', '.join(fetch.names())})"
    )


def load_folder(path, flag):
    """The model at ``path`` (a Hugging Face folder, a GGUF file or a model name, see
    `model_path`); errors name ``flag``."""
    from specjax.io.hf import load_pretrained

    path = model_path(path, flag)
    try:
        return load_pretrained(path)
    except (FileNotFoundError, ValueError, OSError, KeyError) as e:
        raise UserError(f"{flag} {path}: {e}") from None


def check_flag(flag, check, value, **bounds):
    """``check`` (a :mod:`specjax.core.validation` helper) with the error naming ``flag``."""
    try:
        return check(flag, value, **bounds)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
