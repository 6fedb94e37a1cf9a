"""Old import paths that still work, with a warning naming the new one.

A name that moves to a module *above* its old one cannot be imported back by the old
module without an import from a lower layer to a higher one. The new module therefore
registers the alias on the old one (PEP 562's module ``__getattr__``): the old path
resolves once the new module is imported, which the package's ``__init__`` does.
"""

from __future__ import annotations

import types
import warnings

__all__ = ["moved"]


def moved(old: types.ModuleType, name: str, value: object, new_path: str) -> None:
    """Makes ``old.<name>`` give ``value``, warning that it is ``new_path`` now.

    Args:
        old: the module that used to define ``name``.
        name: the attribute's name there.
        value: what it is now.
        new_path: where users import it from now, e.g. ``"specjax.models.Model"``.
    """
    aliases = old.__dict__.setdefault("_moved_names", {})
    aliases[name] = (value, new_path)

    def __getattr__(attr: str):
        if attr in aliases:
            value, path = aliases[attr]
            warnings.warn(
                f"{old.__name__}.{attr} is deprecated; use {path}",
                DeprecationWarning,
                stacklevel=2,
            )
            return value
        raise AttributeError(f"module {old.__name__!r} has no attribute {attr!r}")

    old.__getattr__ = __getattr__
