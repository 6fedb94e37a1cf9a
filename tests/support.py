"""Helpers shared by several test modules.

Imported as ``from support import ...``: tests/ has no ``__init__.py``, so pytest's
default (``prepend``) import mode puts tests/ itself on ``sys.path``, in the main
process and in every xdist worker alike. Everything here is deterministic given its
arguments, so a module that moved its own copy here draws exactly the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

import specjax
from specjax.testing import chi_square_pvalue, tiny_model

# Argmax decoding, the reference that every drafter's greedy output equals.
GREEDY = specjax.SamplingConfig.greedy()


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


def ragged_prompts(
    batch: int,
    seed: int | np.random.Generator,
    high: int,
    repeat: int = 1,
    lengths: tuple[int, int] = (1, 8),
) -> list[list[int]]:
    """``batch`` prompts of ``lengths[0]`` to ``lengths[1]`` random tokens from
    ``[0, high)``, each repeated ``repeat`` times (``repeat=2`` makes them repetitive, so
    prompt lookup finds matches). Lengths are drawn first, then each prompt's tokens,
    from ``np.random.default_rng(seed)``: a ``Generator`` passed as ``seed`` is drawn
    from in place, so successive calls give successive batches."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(lengths[0], lengths[1] + 1, size=batch)
    return [rng.integers(0, high, size=n).tolist() * repeat for n in sizes]


def peaked_pair(vocab_size: int = 8):
    """``(target, draft)``: two unrelated tiny models (seeds 11 and 12) at init scale 15,
    so that their next-token laws are peaked and far apart: a drafter that proposes from
    the draft is often rejected, and a wrong verification's law is far from the
    target's. A module's fixture: ``pair = pytest.fixture(peaked_pair, scope="module",
    name="pair")``."""
    target = tiny_model(seed=11, vocab_size=vocab_size, init_scale=15.0)
    draft = tiny_model(seed=12, vocab_size=vocab_size, init_scale=15.0)
    return target, draft


def make_drafter(name: str, target, draft, num_draft: int, *, mode: str = "sample"):
    """The drafter a parametrized test names, drafting ``num_draft`` tokens a step.

    ``"plain"``: ``None`` (no drafter); ``"self"``: the target drafts for itself;
    ``"draft_model"``: ``draft`` drafts; ``"lookup"``: prompt lookup on bigrams;
    ``"tree"``: ``draft`` drafts a tree of two children at depth 1 and one below each
    (depth 2, which becomes its ``num_draft``); ``"eagle"`` and ``"block"``: a random
    EAGLE head (key 4) or block drafter (key 3, ``mode``) on ``target``.
    """
    if name == "plain":
        return None
    if name == "self":
        return specjax.DraftModel(target, num_draft=num_draft)
    if name == "draft_model":
        return specjax.DraftModel(draft, num_draft=num_draft)
    if name == "lookup":
        return specjax.PromptLookup(ngram=2, num_draft=num_draft)
    if name == "tree":
        return specjax.DraftModel(draft, num_draft=num_draft).with_tree((2, 1))
    if name == "eagle":
        return specjax.EagleDrafter.random(target, key=jax.random.key(4), num_draft=num_draft)
    if name == "block":
        return specjax.BlockDrafter.random(
            target, key=jax.random.key(3), num_draft=num_draft, mode=mode
        )
    raise ValueError(f"make_drafter: unknown name {name!r}")


@dataclass(frozen=True)
class RunStats:
    """What `specjax.tuning.Tuned.learn` and ``review`` read of a run's
    `GenerationStats`, written out by a test: per draft position, the acceptance rate,
    how many drafts were judged there, and (for ``learn``) how many were kept."""

    acceptance_by_position: np.ndarray
    position_reached: np.ndarray
    position_accepted: np.ndarray | None = None


def group_rows(tokens, groups, group, shape: tuple[int, ...]) -> np.ndarray:
    """The rows of ``group`` in a batch whose row ``i`` belongs to group
    ``i % len(groups)`` (``groups`` in order: a dict's keys or a sequence); asserts that
    they have ``shape``."""
    groups = list(groups)
    rows = np.asarray(tokens)[groups.index(group) :: len(groups)]
    assert rows.shape == tuple(shape), (group, rows.shape, shape)
    return rows


def peaked_model(seed: int, dtype=None, vocab_size: int = 8, precision: str | None = None):
    """A one-layer tiny model of V = ``vocab_size`` whose matrices are scaled by 15: peaked,
    prefix-dependent next-token laws, so that a wrong decoder's law is far from the
    target's. ``dtype`` (default float32) is its parameters'; ``precision="int8"``
    quantizes it."""
    import jax.numpy as jnp

    from specjax.models.quant import quantize
    from specjax.testing import tiny_config

    dtype = jnp.float32 if dtype is None else dtype
    model = specjax.Model.random(tiny_config(vocab_size, num_layers=1), seed=seed, dtype=dtype)
    scaled = jax.tree.map(lambda p: p * 15.0 if p.ndim == 2 else p, model.params)
    model = model.replace(params=scaled)
    return quantize(model, "int8") if precision == "int8" else model


def patched_runs(owner, name: str, bug, decode, *, m: int, n: int, vocab_size: int):
    """A negative control's samples: ``owner.<name>`` patched to ``bug`` (compiled caches
    cleared before and after), the patched decoder's law estimated from ``m`` rows of
    ``decode(rows, key_seed)`` with another key, and ``n`` rows of it with the test's.

    Returns:
        ``(estimated law [V] * K, tokens int[n, K])``.
    """
    from specjax.testing import sequence_counts

    real = getattr(owner, name)
    jax.clear_caches()
    setattr(owner, name, bug)
    try:
        law = sequence_counts(decode(m, 7), vocab_size) / m
        tokens = decode(n, None)
    finally:
        setattr(owner, name, real)
        jax.clear_caches()
    return law, tokens


def assert_control_rejected(law, buggy_law, tokens, *, vocab_size: int, false_alarm: float):
    """The test at ``len(tokens)`` rows has power >= 0.99 against the bug's estimated law,
    and rejects the bug's own ``tokens`` at ``false_alarm``."""
    from specjax.testing import chi_square_power, chi_square_pvalue, sequence_counts

    assert chi_square_power(law, buggy_law, len(tokens), false_alarm) >= 0.99
    assert chi_square_pvalue(sequence_counts(tokens, vocab_size), law) < false_alarm
