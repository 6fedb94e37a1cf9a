"""How ``specjax generate`` spells the `specjax.text.options.GenerationOptions`.

Each field is a flag of the same name (``forward_width`` is ``--forward-width``; a
field's ``flag`` metadata names another), ``sampling`` is one flag per `SAMPLING_FLAGS`
entry, and `as_flags` words the options' errors as flags.
"""

from __future__ import annotations

import dataclasses
import re

from specjax.sampling import PENALTY_OFF, SamplingConfig
from specjax.text.defaults import DEFAULTS
from specjax.text.options import GenerationOptions

__all__ = ["SAMPLING_FLAGS", "as_flags", "flag_of", "sampling_default"]


SAMPLING_FLAGS = {
    "temperature": dict(type=float, metavar="X", help="0 = greedy"),
    "top_k": dict(type=int, metavar="N", help="keep the N most likely tokens (0 = off)"),
    "top_p": dict(type=float, metavar="X", help="nucleus mass to keep (1 = off)"),
    "min_p": dict(type=float, metavar="X", help="drop tokens below X × max prob"),
    "repetition_penalty": dict(
        type=float,
        metavar="X",
        help="transformers' repetition penalty over prompt and output (1 = off)",
    ),
    "presence_penalty": dict(
        type=float,
        metavar="X",
        help="OpenAI's presence penalty over the output, in [-2, 2] (0 = off)",
    ),
    "frequency_penalty": dict(
        type=float,
        metavar="X",
        help="OpenAI's frequency penalty over the output, in [-2, 2] (0 = off)",
    ),
}
"""The flags of `GenerationOptions.sampling`: `specjax.SamplingConfig`'s fields; their
defaults are the config's own (a penalty's is its neutral value)."""


def sampling_default(name: str):
    """The command-line default of the `SAMPLING_FLAGS` entry ``name``."""
    value = getattr(SamplingConfig(temperature=DEFAULTS.temperature), name)
    return PENALTY_OFF[name] if value is None else SAMPLING_FLAGS[name]["type"](value)


def flag_of(field: str) -> str:
    """The ``specjax generate`` flag of the option ``field`` (``--no-eos`` for ``eos_id``)."""
    spec = _fields()[field].metadata
    return spec.get("flag", "--" + field.replace("_", "-"))


def as_flags(message: str) -> str:
    """An error message in the command line's words: ``gamma=3`` reads ``--gamma 3``,
    ``gamma must`` reads ``--gamma must``."""
    names = "|".join(sorted((*_fields(), *SAMPLING_FLAGS), key=len, reverse=True))

    def flag(name):
        return flag_of(name) if name in _fields() else "--" + name.replace("_", "-")

    message = re.sub(
        rf"(?<![\w.-])({names})=('([^']*)'|[^\s,;:)]+)",
        lambda m: f"{flag(m.group(1))} {m.group(3) if m.group(3) is not None else m.group(2)}",
        message,
    )
    bare = (
        rf"(?<![\w.-])({names})(?= must| needs| shortens|:)|(?<=no |op )({names})\b"
        rf"|(?<![\w.-])({names})=(?= )"
    )
    return re.sub(bare, lambda m: flag(m.group(1) or m.group(2) or m.group(3)), message)


def _fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(GenerationOptions)}
