"""Choosing γ from step costs measured on this machine and the acceptance the loop sees.

A speculative step with γ drafts costs one proposal of γ drafts and one target forward
``W = γ + 1`` tokens wide, and emits on average

    E(γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} α_i

tokens, where ``α_i`` is the probability that draft ``i`` is accepted given that the
drafts before it were. Plain decoding (γ = 0) costs one forward one token wide per
token. Which γ is fastest therefore depends on the machine (what a W-wide forward
costs against a one-wide one: about the same on one CPU, twice as much on another)
and on the prompt (the α_i), so it is measured rather than assumed:

* `measure` times the decoders themselves on this machine: plain decoding at every
  width W from 1 to γ_max + 1 (the target's forward cost at W) and speculative
  decoding at every γ (the step cost, less the target's forward at γ + 1, is the
  proposal's cost), and reads the acceptance by position off the largest γ's run
  (``GenerationStats.acceptance_by_position``);
* `choose` picks the γ that maximises expected tokens per second, γ = 0 (plain
  decoding) included, and says why; speculation must beat plain decoding by
  ``min_gain`` to be chosen, so a choice is never expected to be slower than plain;
* `CostCache` keeps measured costs in ``<cache>/tuning/``, keyed by the machine, the
  backend, the jax version, the models (configuration, precision, parameter shapes)
  and the batch, so that later runs choose for free and a change of any of those
  measures again.

The output does not depend on the choice's being right: whatever γ is chosen,
decoding at the chosen forward width is exact (`specjax.decoding.numerics`).

Examples:
    >>> from specjax.decoding.cost_model import StepCosts, choose
    >>> costs = StepCosts(target_s=(0.010, 0.011, 0.012), draft_s=(0.001, 0.002))
    >>> choose(costs, acceptance=(0.8, 0.7)).gamma
    2
    >>> choose(StepCosts((0.010, 0.020, 0.030), (0.001, 0.002)), (0.8, 0.7)).gamma
    0
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

__all__ = [
    "Choice",
    "CostCache",
    "StepCosts",
    "choose",
    "expected_tokens",
    "machine_id",
    "measure",
    "model_id",
]

# Speculation is chosen only where it is expected to beat plain decoding by this much:
# the costs are medians of a few runs, and a choice within noise of plain gains
# nothing while it risks a loss.
MIN_GAIN = 1.05


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Measured seconds of one decoding step's parts, at one batch size.

    Attributes:
        target_s: ``target_s[w - 1]``: one target forward ``w`` tokens wide (with the
            loop's own work per step), for ``w`` in ``1..len(target_s)``.
        draft_s: ``draft_s[g - 1]``: one proposal of ``g`` drafts, for ``g`` in
            ``1..len(draft_s)``; ``len(draft_s) + 1 <= len(target_s)``.
    """

    target_s: tuple[float, ...]
    draft_s: tuple[float, ...]

    def __post_init__(self):
        if not self.target_s or any(not (t > 0) for t in self.target_s):
            raise ValueError(f"target_s must be positive seconds, got {self.target_s}")
        if any(not (d >= 0) for d in self.draft_s):
            raise ValueError(f"draft_s must be non-negative seconds, got {self.draft_s}")
        if len(self.draft_s) + 1 > len(self.target_s):
            raise ValueError(
                f"draft_s covers γ up to {len(self.draft_s)}, which needs target_s up to "
                f"width {len(self.draft_s) + 1}; target_s has {len(self.target_s)}"
            )

    @property
    def max_gamma(self) -> int:
        """The largest γ these costs cover."""
        return len(self.draft_s)

    def step_s(self, gamma: int) -> float:
        """Seconds of one step with ``gamma`` drafts (γ = 0: a plain one-wide step)."""
        return self.target_s[gamma] + (self.draft_s[gamma - 1] if gamma else 0.0)

    def to_json(self) -> dict:
        """``{"target_s": [...], "draft_s": [...]}``, as `CostCache` stores it."""
        return {"target_s": list(self.target_s), "draft_s": list(self.draft_s)}

    @classmethod
    def from_json(cls, data: dict) -> StepCosts:
        """The costs `to_json` wrote."""
        return cls(tuple(map(float, data["target_s"])), tuple(map(float, data["draft_s"])))


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `choose` picked, and the numbers it picked it from.

    Attributes:
        gamma: drafts per step; 0 decodes plainly.
        forward_width: W = γ + 1, every target forward's width for the run.
        tokens_per_step: E(γ), expected tokens one step emits.
        expected_speedup: expected tokens per second over plain decoding's.
        speedups: the expected speedup of every γ from 0 to the largest measured.
        reason: one line for users: why this γ.
    """

    gamma: int
    forward_width: int
    tokens_per_step: float
    expected_speedup: float
    speedups: tuple[float, ...]
    reason: str


def expected_tokens(acceptance: Sequence[float], gamma: int) -> float:
    """E(γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} α_i: tokens one step emits on average.

    Args:
        acceptance: α_1, α_2, ...: draft i's acceptance given drafts 1..i-1 were
            accepted, each in [0, 1]; positions past its end count as 0.
        gamma: drafts per step, >= 0.
    """
    total, reach = 1.0, 1.0
    for i in range(gamma):
        reach *= acceptance[i] if i < len(acceptance) else 0.0
        total += reach
    return total


def choose(costs: StepCosts, acceptance: Sequence[float], min_gain: float = MIN_GAIN) -> Choice:
    """The γ in ``0..costs.max_gamma`` with the most expected tokens per second.

    Args:
        costs: measured step costs (`measure`, or a `CostCache` hit).
        acceptance: α_i by draft position (``GenerationStats.acceptance_by_position``).
        min_gain: a γ > 0 is chosen only if its expected speedup over plain decoding
            is at least this; otherwise γ = 0.

    Returns:
        The `Choice`, with every γ's expected speedup and the reason in words.
    """
    alpha = [float(a) for a in acceptance]
    if any(not (0.0 <= a <= 1.0) for a in alpha):
        raise ValueError(f"acceptance must hold probabilities in [0, 1], got {alpha}")
    plain_rate = 1.0 / costs.step_s(0)
    speedups = tuple(
        expected_tokens(alpha, g) / costs.step_s(g) / plain_rate for g in range(costs.max_gamma + 1)
    )
    best = 0
    if costs.max_gamma:
        spec = max(range(1, len(speedups)), key=lambda g: (speedups[g], -g))
        if speedups[spec] >= min_gain:
            best = spec
    if best:
        reason = (
            f"gamma {best}: {expected_tokens(alpha, best):.2f} tokens a step expected for "
            f"{costs.step_s(best) / costs.step_s(0):.2f}x a plain step's time, "
            f"{speedups[best]:.2f}x plain"
        )
    elif costs.max_gamma:
        width_cost = costs.target_s[spec] / costs.target_s[0]
        reason = (
            f"plain decoding: the best speculation, gamma {spec}, is expected at "
            f"{speedups[spec]:.2f}x plain, under the {min_gain:.2f}x it must reach (a "
            f"{spec + 1}-wide target forward costs {width_cost:.2f}x a one-wide one here, "
            f"and {expected_tokens(alpha, spec):.2f} tokens a step are expected)"
        )
    else:
        reason = "plain decoding: no drafts were measured"
    return Choice(
        gamma=best,
        forward_width=best + 1,
        tokens_per_step=expected_tokens(alpha, best),
        expected_speedup=speedups[best],
        speedups=speedups,
        reason=reason,
    )


def machine_id() -> dict:
    """What makes step costs differ between machines: CPU model, cores, backend, jax."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    devices = jax.devices()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "device": devices[0].device_kind if devices else "",
        "jax": jax.__version__,
    }


def model_id(model) -> str:
    """A fingerprint of a model (or drafter): its class, configuration, precision and
    every parameter's shape and dtype. Changing any of them measures again."""
    leaves = jax.tree_util.tree_flatten_with_path(model)[0]
    parts = [
        type(model).__qualname__,
        repr(getattr(model, "config", None)),
        str(getattr(model, "quantization", None)),
        *(
            f"{jax.tree_util.keystr(path)}:{getattr(x, 'shape', ())}:"
            f"{getattr(x, 'dtype', type(x).__name__)}"
            for path, x in leaves
        ),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class CostCache:
    """Measured `StepCosts` on disk, one JSON file per key, in ``<cache>/tuning/``.

    Args:
        root: the folder; default ``<specjax cache>/tuning`` (`specjax.core.paths`).
    """

    def __init__(self, root: str | os.PathLike | None = None):
        from specjax.core.paths import cache_root

        self.root = Path(root) if root is not None else cache_root() / "tuning"

    @staticmethod
    def key(**parts) -> str:
        """The key of a measurement: ``machine_id()`` plus the given parts (models'
        `model_id`, batch, the largest γ, ...)."""
        blob = json.dumps({"machine": machine_id(), **parts}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def path(self, key: str) -> Path:
        """The file of ``key``'s entry."""
        return self.root / f"{key}.json"

    def load(self, key: str) -> tuple[StepCosts, tuple[float, ...]] | None:
        """``(costs, acceptance)`` stored under ``key``, or None (missing or unreadable)."""
        try:
            data = json.loads(self.path(key).read_text())
            return StepCosts.from_json(data["costs"]), tuple(map(float, data["acceptance"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: str, costs: StepCosts, acceptance: Sequence[float]) -> Path:
        """Writes atomically: a reader sees the old entry or the new one, never a part."""
        self.root.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine_id(), "costs": costs.to_json(), "acceptance": list(acceptance)}
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.path(key))
        return self.path(key)


def measure(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    repeats: int = 3,
    log=None,
) -> tuple[StepCosts, tuple[float, ...]]:
    """Times the decoders on this machine: ``(StepCosts, acceptance by position)``.

    Plain decoding at each width W in ``1..γ + 1`` gives the target's forward cost at
    W (one forward a token); speculative decoding greedy at each γ' in ``1..γ``, at
    width γ' + 1, gives a step's cost, and the step less the target's forward is the
    proposal's. Each program runs once to compile, then ``repeats`` times; the median
    counts. The acceptance is read off the γ run.

    Args:
        target: the target model.
        drafter: a drafter with ``num_draft`` = γ, the largest γ to measure.
        prompts: token-id prompts, their number the batch size the costs are for.
        max_new_tokens: tokens per timed run.
        repeats: timed runs per program.
        log: optional ``log(str)`` for progress, one line a program.
    """
    from specjax.core.timing import time_runs
    from specjax.decoding.api import generate, speculative_generate
    from specjax.sampling import SamplingConfig

    greedy = SamplingConfig.greedy()
    max_gamma = drafter.num_draft
    if max_gamma < 1:
        raise ValueError(f"drafter.num_draft must be >= 1 to measure, got {max_gamma}")

    def median_s(run) -> tuple[float, object]:
        times, out = time_runs(run, repeats=repeats, warmup=1)
        return float(np.median(times)), out

    target_s = []
    for width in range(1, max_gamma + 2):
        seconds, out = median_s(
            lambda w=width: generate(
                None, target, prompts, max_new_tokens=max_new_tokens, sampling=greedy,
                forward_width=w,
            )
        )  # fmt: skip
        calls = int(jax.device_get(out.stats.target_calls))
        target_s.append(seconds / max(calls, 1))
        if log:
            log(f"plain, forward width {width}: {1e3 * target_s[-1]:.2f} ms a step")
    draft_s, acceptance = [], ()
    for gamma in range(1, max_gamma + 1):
        seconds, out = median_s(
            lambda g=gamma: speculative_generate(
                None, target, drafter.with_draft(g), prompts, max_new_tokens=max_new_tokens,
                sampling=greedy, forward_width=g + 1,
            )
        )  # fmt: skip
        stats = jax.device_get(out.stats)
        step = seconds / max(int(stats.target_calls), 1)
        draft_s.append(max(step - target_s[gamma], 0.0))
        if gamma == max_gamma:
            acceptance = tuple(float(a) for a in np.asarray(stats.acceptance_by_position))
        if log:
            log(f"gamma {gamma}: {1e3 * step:.2f} ms a step, drafts {1e3 * draft_s[-1]:.2f} ms")
    return StepCosts(tuple(target_s), tuple(draft_s)), acceptance
