"""The choice of γ: a step's cost, the tokens it is expected to emit, and the speedup.

A speculative step with γ drafts costs one proposal of γ drafts and one target forward
``W = γ + 1`` tokens wide, and emits on average

    E(γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} α_i

tokens, where ``α_i`` is the probability that draft ``i`` is accepted given that the
drafts before it were. Plain decoding (γ = 0) costs one forward one token wide per
token. `choose` picks the γ with the most expected tokens per second.

Examples:
    >>> from specjax.tuning.choice import StepCosts, choose
    >>> costs = StepCosts(target_s=(0.010, 0.011, 0.012), draft_s=(0.001, 0.002))
    >>> choose(costs, acceptance=(0.8, 0.7)).gamma
    2
    >>> choose(StepCosts((0.010, 0.020, 0.030), (0.001, 0.002)), (0.8, 0.7)).gamma
    0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["MIN_GAIN", "Choice", "StepCosts", "choose", "expected_tokens"]

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
        acceptance: the α_i by draft position it chose from.
    """

    gamma: int
    forward_width: int
    tokens_per_step: float
    expected_speedup: float
    speedups: tuple[float, ...]
    reason: str
    acceptance: tuple[float, ...]


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


def choose(
    costs: StepCosts,
    acceptance: Sequence[float],
    min_gain: float = MIN_GAIN,
    *,
    forward_width: int | None = None,
) -> Choice:
    """The γ in ``0..costs.max_gamma`` with the most expected tokens per second.

    Args:
        costs: measured step costs (`measure`, or a `CostCache` hit).
        acceptance: α_i by draft position (``GenerationStats.acceptance_by_position``).
        min_gain: a γ > 0 is chosen only if its expected speedup over plain decoding
            is at least this; otherwise γ = 0.
        forward_width: a width W the run is held to (every target forward W wide, so
            that the output equals plain decoding's at W): then γ is at most W - 1 and
            every γ, 0 included, pays a W-wide forward. Default: each γ at γ + 1, and
            γ = 0 at width 1. Speedups are always over plain decoding at width 1.

    Returns:
        The `Choice`, with every γ's expected speedup and the reason in words.

    Raises:
        ValueError: acceptance outside [0, 1], or a ``forward_width`` wider than the
            costs measured.
    """
    alpha = [float(a) for a in acceptance]
    if any(not (0.0 <= a <= 1.0) for a in alpha):
        raise ValueError(f"acceptance must hold probabilities in [0, 1], got {alpha}")
    if forward_width is not None and not 1 <= forward_width <= len(costs.target_s):
        raise ValueError(
            f"forward_width={forward_width}: the costs cover widths 1..{len(costs.target_s)}"
        )
    plain_rate = 1.0 / costs.step_s(0)

    def step_s(g: int) -> float:
        if forward_width is None:
            return costs.step_s(g)
        return costs.target_s[forward_width - 1] + (costs.draft_s[g - 1] if g else 0.0)

    top = costs.max_gamma if forward_width is None else min(costs.max_gamma, forward_width - 1)
    speedups = tuple(expected_tokens(alpha, g) / step_s(g) / plain_rate for g in range(top + 1))
    best = 0
    if top:
        spec = max(range(1, len(speedups)), key=lambda g: (speedups[g], -g))
        if speedups[spec] >= min_gain:
            best = spec
    if best:
        reason = (
            f"gamma {best}: {expected_tokens(alpha, best):.2f} tokens a step expected for "
            f"{step_s(best) / costs.step_s(0):.2f}x a plain step's time, "
            f"{speedups[best]:.2f}x plain"
        )
    elif top:
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
        forward_width=best + 1 if forward_width is None else forward_width,
        tokens_per_step=expected_tokens(alpha, best),
        expected_speedup=speedups[best],
        speedups=speedups,
        reason=reason,
        acceptance=tuple(alpha),
    )
