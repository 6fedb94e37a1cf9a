"""The generation defaults that `specjax.Sampler` and ``specjax generate`` share.

Both read `DEFAULTS`, so the library and the command decode alike when nothing is set:
greedy, 64 new tokens, the drafter ``auto`` picks, γ of the drafter's own.
"""

from __future__ import annotations

import dataclasses

from specjax.drafters.block import DEFAULT_MODE

__all__ = ["DEFAULTS", "Defaults", "auto_drafter"]


@dataclasses.dataclass(frozen=True)
class Defaults:
    """What `specjax.Sampler` and ``specjax generate`` use where nothing is set.

    Attributes:
        max_new_tokens: tokens generated per prompt (EOS included).
        temperature: 0 is greedy: the same text every run, and no PRNG key needed.
        seed: ``specjax generate --seed`` (greedy tokens do not depend on it).
        drafter: who drafts; ``"auto"`` resolves with `auto_drafter`.
        bundled_drafter: what ``"auto"`` picks for the bundled pair: the draft model
            (BENCHMARKS.md compares the bundled drafters end to end).
        gamma: tokens drafted per target call for drafters without a γ of their own
            (a block drafter keeps its trained γ).
        draft_mode: how drafters that read the target's hidden states (block, EAGLE)
            draft: ``"sample"`` draws each draft from the drafter's distribution and
            verifies it against that distribution (``"argmax"`` verifies a one-hot q);
            at temperature 0 both modes give the same drafts. `specjax.BlockDrafter`
            defaults to the same value.
        ngram: the longest n-gram prompt lookup matches.
        verification: ``None``: block verification for a chain of drafts, token-wise
            rejection sampling for a tree (`specjax.speculative_generate`).
        steps_per_chunk: decode-loop iterations between two streamed text pieces.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    drafter: str = "auto"
    bundled_drafter: str = "model"
    gamma: int = 4
    draft_mode: str = DEFAULT_MODE
    ngram: int = 3
    verification: str | None = None
    steps_per_chunk: int = 4


DEFAULTS = Defaults()
"""The one set of defaults; read it, never copy its values."""


def auto_drafter(*, bundled: bool, draft: bool = False, block_drafter: bool = False) -> str:
    """The drafter name ``"auto"`` stands for.

    Args:
        bundled: the target is the bundled one (`specjax.default_pair`).
        draft: a draft model was given.
        block_drafter: a block drafter folder was given.

    Returns:
        for the bundled pair, ``DEFAULTS.bundled_drafter`` (the draft model);
        for another target, ``"model"`` with a draft model, else ``"block"`` with a
        block drafter, else ``"lookup"`` (prompt lookup, which needs no weights).

    Examples:
        >>> from specjax.text.defaults import auto_drafter
        >>> auto_drafter(bundled=False)
        'lookup'
    """
    if bundled:
        return DEFAULTS.bundled_drafter
    return "model" if draft else "block" if block_drafter else "lookup"
