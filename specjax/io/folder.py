"""The files of a Hugging Face folder besides its weights: JSON, the tokenizer and the
chat template."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["read_chat_template", "read_json", "read_tokenizer"]


def read_json(path: Path):
    """The JSON at ``path``; a `ValueError` naming the file where it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def read_tokenizer(folder: Path):
    """The ``tokenizers.Tokenizer`` of a folder's ``tokenizer.json``, or ``None``."""
    if not (folder / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"{folder / 'tokenizer.json'} cannot be read: {e}") from e


def read_chat_template(folder: str | os.PathLike) -> str | None:
    """The chat template of a Hugging Face folder, or ``None`` if it has none.

    transformers 5 writes it to ``chat_template.jinja``; older checkpoints keep
    it as ``chat_template`` in ``tokenizer_config.json`` (a string, or a list of
    ``{"name", "template"}`` of which the one named ``default`` is used).
    """
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    template = read_json(config_path)
    template = template.get("chat_template") if isinstance(template, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{config_path} chat_template must be a string, got {template!r}")
    return template
