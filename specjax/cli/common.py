"""What the commands share: `UserError`, flag checks and loading a model."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A mistake in the command line or its inputs, reported without a traceback."""


def model_path(path, flag) -> Path:
    """``path`` if it is a model folder or a GGUF file, else the file of the model *named*
    ``path`` (`specjax.text.loading.model_path`); errors name ``flag``."""
    from specjax.text import loading

    try:
        return loading.model_path(path, flag)
    except ValueError as e:
        raise UserError(str(e)) from None


def load_folder(path, flag, gguf_file: str | None = None):
    """The model at ``path`` (a Hugging Face folder, a GGUF file, a model name or a Hub
    id, `specjax.text.loading.load_model`); errors name ``flag``."""
    from specjax.text import loading

    try:
        return loading.load_model(path, flag, gguf_file=gguf_file)
    except ValueError as e:
        raise UserError(str(e)) from None


def check_flag(flag, check, value, **bounds):
    """``check`` (a :mod:`specjax.core.validation` helper) with the error naming ``flag``."""
    try:
        return check(flag, value, **bounds)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
