"""``gamma="auto"``: the cached or freshly timed costs, the choice, and what each run
teaches it.

`tune` chooses γ for a target, a drafter and a batch on this machine; the `Tuned` it
returns pools each run's acceptance into the stored one (`Tuned.learn`), weighted by
the drafts each run judged, so that one short run cannot swing the next choice, and
chooses again from it (`Tuned.rechoose`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specjax.tuning.cache import CostCache, model_id, pair_id
from specjax.tuning.choice import Choice, StepCosts, choose
from specjax.tuning.measure import measure, probe

__all__ = ["DECAY", "PRIOR_ACCEPTANCE", "TUNE_TOKENS", "Tuned", "tune"]

# A stored acceptance's weight (drafts judged) is multiplied by this at each run that
# `Tuned.learn` pools in: the estimate follows what this machine's users decode lately
# (about the last two runs' drafts), while one run moves it only by its share.
DECAY = 0.5

# Tokens per timed run when `tune` measures: enough steps for a stable median, few
# enough that the first ``gamma="auto"`` call stays short on a large target.
TUNE_TOKENS = 16


@dataclasses.dataclass
class Tuned:
    """``gamma="auto"``'s choice for one target, drafter and batch size, the numbers it
    came from, and where they are kept (`tune` makes it).

    Attributes:
        choice: the `Choice` (γ, width, expected speedup, reason).
        costs: the measured `StepCosts`.
        acceptance: α_i by draft position: the choice's, then pooled with every run
            `learn` is given (the next choice's).
        judged: the drafts behind each α_i (their weight when a run is pooled in).
        cache: the `CostCache` holding them.
        key: their key in ``cache``.
        measured: True where this call measured the costs (a cache miss).
        held_width: the forward width the run is held to (`choose`), or ``None``.
        pair: the pair's `pair_id`, stored with each learnt acceptance.
    """

    choice: Choice
    costs: StepCosts
    acceptance: tuple[float, ...]
    judged: tuple[float, ...]
    cache: CostCache
    key: str
    measured: bool = False
    held_width: int | None = None
    pair: str | None = None

    @property
    def gamma(self) -> int:
        """The chosen γ (0: plain decoding)."""
        return self.choice.gamma

    @property
    def forward_width(self) -> int:
        """The chosen width of every target forward of the run."""
        return self.choice.forward_width

    def describe(self) -> dict:
        """The choice and its numbers, as plain JSON values."""
        return {
            "gamma": self.choice.gamma,
            "forward_width": self.choice.forward_width,
            "reason": self.choice.reason,
            "expected_speedup": self.choice.expected_speedup,
            "expected_speedup_by_gamma": list(self.choice.speedups),
            "target_forward_seconds_by_width": list(self.costs.target_s),
            "draft_seconds_by_gamma": list(self.costs.draft_s),
            "acceptance_by_position": list(self.choice.acceptance),
            "learnt_acceptance_by_position": list(self.acceptance),
            "drafts_judged_by_position": list(self.judged),
            "measured_now": self.measured,
            "cache": str(self.cache.path(self.key)),
        }

    def review(self, stats) -> dict:
        """The cost model's account of a finished run (``GenerationStats``).

        Every γ's expected speedup from the measured step costs and the acceptance the
        run achieved, at the positions it judged (the others keep the choice's). Beside
        the achieved speedup it says whether the choice was right for this run, and
        whether any γ could have reached a given speedup on this machine.

        Returns:
            ``{"acceptance_by_position", "expected_speedup_by_gamma",
            "expected_speedup"}`` (the last for the chosen γ), plain JSON values.
        """
        reached = np.asarray(stats.position_reached)
        achieved = np.asarray(stats.acceptance_by_position, np.float64)
        alpha = [
            float(achieved[i]) if i < len(reached) and reached[i] > 0 else float(chosen)
            for i, chosen in enumerate(self.choice.acceptance)
        ]
        speedups = choose(self.costs, alpha, 1.0, forward_width=self.held_width).speedups
        return {
            "acceptance_by_position": alpha,
            "expected_speedup_by_gamma": list(speedups),
            "expected_speedup": speedups[self.gamma],
        }

    def learn(self, stats) -> None:
        """Pools the acceptance a run measured (``GenerationStats``) into the stored one,
        for the next choice: at each position the run judged, the stored α_i with its
        weight times `DECAY` and the run's accepted drafts over its judged ones. The
        costs stay as measured. Runs on the host, after the decode."""
        reached = np.asarray(stats.position_reached, np.float64)
        accepted = np.asarray(stats.position_accepted, np.float64)
        alpha, judged = list(self.acceptance), list(self.judged)
        for i in range(min(len(alpha), len(reached))):
            if reached[i] > 0:
                weight = judged[i] * DECAY
                alpha[i] = float((alpha[i] * weight + accepted[i]) / (weight + reached[i]))
                judged[i] = float(weight + reached[i])
        self.acceptance, self.judged = tuple(alpha), tuple(judged)
        self.cache.store(self.key, self.costs, alpha, judged, pair=self.pair)

    def rechoose(self) -> Choice:
        """Chooses again from the costs and the pooled acceptance (`learn`): a
        `specjax.Sampler` does after each run, so its γ follows what it decodes."""
        self.choice = choose(self.costs, self.acceptance, forward_width=self.held_width)
        return self.choice


def tune(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    forward_width: int | None = None,
    cache: CostCache | None = None,
    log=None,
    method: str = "probe",
) -> Tuned:
    """Chooses γ for ``target`` and ``drafter`` on this machine: from the cache, or
    timed once and stored.

    ``method="probe"`` (default) times the step's parts alone (`probe`: seconds, not a
    minute), with the acceptance this machine's runs of the pair learnt (any precision
    or batch, `CostCache.learnt_acceptance`), else `PRIOR_ACCEPTANCE` until a run
    reports its own (`Tuned.learn`). ``"measure"``, or a drafter `probe` cannot time
    alone, times whole decode loops (`measure`).

    Args:
        target: the target model.
        drafter: a chain drafter; its ``num_draft`` is the largest γ considered.
        prompts: token-id prompts of the run; their number is the batch size the
            costs are for (a miss measures on them).
        forward_width: the width the run is held to, if any (`choose`); one wider than
            every γ measured costs each γ at its own width.
        cache: where costs are kept; default `CostCache()`.
        log: optional ``log(str)``: what is measured and why, one line each.
        method: ``"probe"`` or ``"measure"``: how a miss is timed (above).

    Returns:
        The `Tuned` choice. Decode with ``drafter.with_draft(t.gamma)`` at width
        ``t.forward_width``, or plainly (`specjax.generate`) where ``t.gamma == 0``.

    Raises:
        ValueError: a ``method`` other than ``"probe"`` or ``"measure"``.
    """
    if method not in ("probe", "measure"):
        raise ValueError(f'method must be "probe" or "measure", got {method!r}')
    cache = CostCache() if cache is None else cache
    key = cache.key(
        target=model_id(target),
        drafter=model_id(drafter),
        batch=len(prompts),
        max_gamma=drafter.num_draft,
    )
    hit = cache.load(key)
    measured = hit is None
    pair = pair_id(target, drafter)
    if measured:
        gamma = drafter.num_draft
        costs = None
        if method == "probe":
            if log:
                log(
                    f"timing the target's forward at widths 1..{gamma + 1} and the drafts at "
                    f"gamma 1..{gamma} on this machine, once (kept in {cache.root})"
                )
            costs = probe(target, drafter, prompts, log=log)
        if costs is not None:
            hit = (costs, *_starting_acceptance(cache, pair, gamma))
        else:
            if log:
                log(
                    f"timing plain decoding at widths 1..{gamma + 1} and speculation at "
                    f"gamma 1..{gamma} on this machine, once (kept in {cache.root})"
                )
            hit = measure(target, drafter, prompts, max_new_tokens=TUNE_TOKENS, repeats=2, log=log)
        cache.store(key, *hit, pair=pair)
    if forward_width is not None and forward_width > drafter.num_draft + 1:
        forward_width = None  # wider than any γ measured: each γ costed at its own width
    choice = choose(*hit[:2], forward_width=forward_width)
    if choice.gamma == 0 and drafter.num_draft and not any(hit[2]):
        # No run of this pair has reported its acceptance yet (a prior stands in), and
        # plain decoding would never report one: draft once, the γ best at the prior.
        explore = choose(*hit[:2], min_gain=0.0, forward_width=forward_width)
        reason = f"{explore.reason} (this pair's first run here drafts, to learn its acceptance)"
        choice = dataclasses.replace(explore, reason=reason)
    return Tuned(
        choice,
        *hit,
        cache=cache,
        key=key,
        measured=measured,
        held_width=forward_width,
        pair=pair,
    )


# The acceptance by position assumed before any run of a pair on this machine reported
# its own (`tune` with a probe): a middling drafter's. It weighs nothing against a run's
# (judged 0), so the first run replaces it.
PRIOR_ACCEPTANCE = 0.7


def _starting_acceptance(cache: CostCache, pair: str, gamma: int):
    """``(acceptance, judged)`` for ``gamma`` positions: learnt for the pair, else the prior."""
    learnt = cache.learnt_acceptance(pair)
    alpha, judged = learnt if learnt is not None else ((), ())
    alpha = tuple(alpha[:gamma]) + (PRIOR_ACCEPTANCE,) * max(0, gamma - len(alpha))
    judged = tuple(judged[:gamma]) + (0.0,) * max(0, gamma - len(judged))
    return alpha, judged
