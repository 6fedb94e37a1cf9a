"""Helpers shared by several test modules.

Imported as ``from support import ...``: tests/ has no ``__init__.py``, so pytest's
default (``prepend``) import mode puts tests/ itself on ``sys.path``, in the main
process and in every xdist worker alike. Everything here is deterministic given its
arguments, so a module that moved its own copy here draws exactly the same inputs.
"""

from __future__ import annotations

import numpy as np

from specjax.testing import chi_square_pvalue


def samples_chi2_pvalue(samples, probs) -> float:
    """Chi-square goodness-of-fit p-value of integer ``samples`` (one token each) against
    ``probs`` (``[V]``, non-negative, normalised here).

    The statistic is `specjax.testing.chi_square_pvalue`'s on the samples' counts: cells
    expecting fewer than 5 hits are pooled into one cell, zero-probability cells left
    out, and fewer than two cells left give 1.0. Two things are stricter here: a sample
    outside ``[0, V)`` or a hit on a zero-probability cell fails an assertion that names
    the tokens (the library returns p = 0 for the latter, which fails the same checks),
    and ``probs`` must hold no negative or NaN entry (map unnormalised weights that
    `specjax.sampling.sample` never draws to 0 first).
    """
    probs = np.asarray(probs, np.float64)
    assert probs.ndim == 1 and np.all(probs >= 0), "probs must be a [V] array, >= 0, no NaN"
    samples = np.asarray(samples)
    assert samples.ndim == 1 and np.issubdtype(samples.dtype, np.integer), samples.dtype
    assert samples.size == 0 or 0 <= samples.min() <= samples.max() < probs.shape[0], (
        "sample outside the vocabulary"
    )
    counts = np.bincount(samples, minlength=probs.shape[0])
    impossible = probs == 0
    assert counts[impossible].sum() == 0, (
        f"drew zero-probability tokens {np.flatnonzero(counts * impossible)}"
    )
    return chi_square_pvalue(counts, probs)


def ragged_prompts(batch: int, seed: int, high: int, repeat: int = 1) -> list[list[int]]:
    """``batch`` prompts of 1 to 8 random tokens from ``[0, high)``, each repeated
    ``repeat`` times (``repeat=2`` makes them repetitive, so prompt lookup finds
    matches). Lengths are drawn first, then each prompt's tokens, from
    ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=batch)
    return [rng.integers(0, high, size=n).tolist() * repeat for n in lengths]


def group_rows(tokens, groups, group, shape: tuple[int, ...]) -> np.ndarray:
    """The rows of ``group`` in a batch whose row ``i`` belongs to group
    ``i % len(groups)`` (``groups`` in order: a dict's keys or a sequence); asserts that
    they have ``shape``."""
    groups = list(groups)
    rows = np.asarray(tokens)[groups.index(group) :: len(groups)]
    assert rows.shape == tuple(shape), (group, rows.shape, shape)
    return rows
