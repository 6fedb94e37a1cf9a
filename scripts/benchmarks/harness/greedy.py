"""The check that every system's greedy output equals a reference token for token.

Greedy decoders of the same weights must agree; where two frameworks differ, the
logit gap at the first differing token tells a near-tie of the argmax (tolerable,
with ``tie_tol``) from a bug. ``scripts/benchmarks/bench_e2e.py`` runs it before any timing is
reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass
class Mismatch:
    """First token where ``system``'s greedy output for prompt ``prompt`` differs."""

    system: str
    row: int
    prompt: int
    position: int
    expected: int  # the reference token (-1: the reference ended here)
    got: int  # -1: the output ended here
    gaps: dict = dataclasses.field(default_factory=dict)  # framework -> logit[exp] - logit[got]

    def describe(self) -> str:
        gaps = ", ".join(f"{k} {v:+.3e}" for k, v in self.gaps.items()) or "n/a"
        return (
            f"{self.system}: row {self.row} (prompt {self.prompt}) differs at new token "
            f"{self.position}: expected {self.expected}, got {self.got}; "
            f"logit gap (expected - got): {gaps}"
        )


class GreedyMismatchError(RuntimeError):
    """Greedy outputs of two systems on the same weights differ."""

    def __init__(self, mismatches: list[Mismatch]):
        self.mismatches = mismatches
        lines = "\n  ".join(m.describe() for m in mismatches)
        super().__init__(
            f"greedy outputs differ from the reference in {len(mismatches)} row(s):\n  {lines}"
        )


def find_mismatches(reference: list[list[int]], outputs: dict[str, list[list[int]]]):
    """First differing position of every row of every system against ``reference``.

    Row ``r`` of a system is compared with ``reference[r % len(reference)]`` (a
    large batch cycles through the prompts).
    """
    found = []
    for system, rows in outputs.items():
        for r, row in enumerate(rows):
            i = r % len(reference)
            ref = list(reference[i])
            row = [int(t) for t in row]
            if row == ref:
                continue
            n = min(len(row), len(ref))
            pos = next((j for j in range(n) if row[j] != ref[j]), n)
            expected = ref[pos] if pos < len(ref) else -1
            got = row[pos] if pos < len(row) else -1
            found.append(Mismatch(system, r, i, pos, expected, got))
    return found


def check_greedy_outputs(
    reference: list[list[int]],
    outputs: dict[str, list[list[int]]],
    *,
    logit_gaps: Callable[[Mismatch], dict] | None = None,
    tie_tol: float = 0.0,
    strict=(),
) -> list[Mismatch]:
    """Checks every system's greedy output equals ``reference`` token for token.

    Args:
        reference: ``[num_prompts][N]`` the reference system's tokens.
        outputs: system name -> rows of tokens (row ``r`` is prompt ``r % num_prompts``).
        logit_gaps: optional ``mismatch -> {framework: logit[expected] - logit[got]}``
            at the first differing position, to tell a near-tie from a bug.
        tie_tol: a mismatch whose every logit gap is below this in absolute value
            is a near-tie flip of the argmax: it is returned (to be reported)
            instead of raised. 0 (the default) tolerates nothing.
        strict: names of systems whose mismatches are never tolerated, whatever
            their gaps (specjax's own systems: one framework's greedy decoders of
            the same weights must agree exactly, near-ties included).

    Returns:
        The tolerated near-tie mismatches (empty when all outputs are equal).

    Raises:
        GreedyMismatchError: listing every mismatch, if any is not a tolerated tie.
    """
    mismatches = find_mismatches(reference, outputs)
    for m in mismatches:
        if logit_gaps is not None and m.expected >= 0 and m.got >= 0:
            m.gaps = logit_gaps(m)

    def tolerated(m):
        if m.system in strict or not m.gaps:
            return False
        return max(abs(g) for g in m.gaps.values()) < tie_tol

    if any(not tolerated(m) for m in mismatches):
        raise GreedyMismatchError(mismatches)
    return mismatches
