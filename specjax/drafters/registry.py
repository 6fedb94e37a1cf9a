"""The drafters by name: ``specjax generate --drafter NAME``, ``default_drafter(NAME)``.

Each `Entry` names a drafter class and the folder of the bundled pair holding the
default one (its ``asset``), which `specjax.io.drafter_weights.load` reads for a
target. The CLI, `~specjax.io.pretrained.default_drafter`, the training scripts and
the benchmarks look drafters up here instead of switching on their names, so a new
drafter is one file and one `register` line below.
"""

from __future__ import annotations

import dataclasses

from specjax.drafters.base import Drafter
from specjax.drafters.block import BlockDrafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle import EagleDrafter
from specjax.drafters.lookup import PromptLookup
from specjax.drafters.suffix import SuffixDrafter

__all__ = ["Entry", "get", "names", "register"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One drafter by name.

    Attributes:
        name: what ``--drafter`` and `~specjax.io.pretrained.default_drafter` call it.
        cls: the `~specjax.drafters.base.Drafter` subclass.
        asset: the folder under `specjax.io.pretrained.default_pair_path` holding the
            bundled one for the bundled target, or ``None`` for a drafter without
            weights (built as ``cls(num_draft=...)``).
    """

    name: str
    cls: type[Drafter]
    asset: str | None = None

    @property
    def has_weights(self) -> bool:
        """Whether the drafter is loaded from a folder (else built from its fields)."""
        return self.asset is not None


_ENTRIES: dict[str, Entry] = {}


def register(name: str, cls: type[Drafter], *, asset: str | None = None) -> Entry:
    """Makes ``cls`` reachable as ``name`` (replacing an entry of that name).

    Raises:
        TypeError: ``cls`` is not a `~specjax.drafters.base.Drafter` subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise TypeError(f"cls must be a Drafter subclass, got {cls!r}")
    entry = Entry(name=name, cls=cls, asset=asset)
    _ENTRIES[name] = entry
    return entry


def get(name: str) -> Entry:
    """The entry called ``name``.

    Raises:
        ValueError: no drafter has that name; the message lists those that do.
    """
    if name not in _ENTRIES:
        raise ValueError(f"no drafter is called {name!r}; one of {names()}")
    return _ENTRIES[name]


def names() -> tuple[str, ...]:
    """Every registered name, in registration order."""
    return tuple(_ENTRIES)


# The order is the CLI's and `default_drafter`'s (their help and errors list it).
register("block", BlockDrafter, asset="block_drafter")
register("eagle", EagleDrafter, asset="eagle_drafter")
register("model", DraftModel, asset="draft")
register("lookup", PromptLookup)
register("suffix", SuffixDrafter)
