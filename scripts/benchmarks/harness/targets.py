"""bench_e2e's performance targets (`TARGETS`, `REAL_TARGETS`) and their verdicts."""

from __future__ import annotations

from typing import NamedTuple


class Target(NamedTuple):
    """A performance target: ``value >= threshold`` (``value <= threshold`` if ``at_most``)."""

    key: str
    what: str
    threshold: float
    at_most: bool = False


TARGETS = [
    Target(
        "spec_over_plain", "specjax speculative (draft) / specjax plain tok/s, T=0, batch 1", 2.0
    ),
    Target("realized_over_predicted", "realized / predicted speedup, same run", 0.85),
    Target(
        "spec_over_hf_fastest",
        "specjax speculative / transformers' fastest (plain, assisted, lookup) tok/s, T=0, b=1",
        3.0,
    ),
    Target("large_over_b1", "specjax speculative total tok/s, batch 16 / batch 1, T=0", 8.0),
    # The block drafter's (issue's targets on the bundled pair, batch 1).
    Target("block_over_plain", "specjax block drafter / specjax plain tok/s, T=0, batch 1", 2.5),
    Target("block_over_plain_t1", "specjax block drafter / specjax plain tok/s, T=1, batch 1", 2.0),
    Target("block_tau", "block drafter tokens per target call (τ), block 8 (γ=7), T=0, b=1", 5.0),
    Target("block_realized_over_predicted", "block drafter realized / predicted, T=0, b=1", 0.9),
]

# The targets for a real model (any --target), at batch 1, over all workloads.
# Each is reported for the fastest speculative method at its temperature ("best", the
# one a user would pick) and for each method on its own; "{m}" names the method.
REAL_TARGETS = [
    Target("over_plain", "specjax {m} / specjax plain tok/s, T=0, b=1", 2.0),
    Target("over_hf_fastest", "specjax {m} / transformers' fastest tok/s, T=0, b=1", 4.0),
    Target("over_plain_t1", "specjax {m} / specjax plain tok/s, T=1, b=1", 1.6),
    Target("realized_over_predicted", "specjax {m}: realized / predicted speedup, T=0, b=1", 0.9),
]
# Verifying this many tokens (prompt lookup's γ=4, plus one) should cost little more
# than one decoding step: the premise of every speculative speedup above.
VERIFY_WIDTH = 5
VERIFY_TARGET = Target(
    "verify_over_step",
    f"specjax target forward of {VERIFY_WIDTH} tokens / of 1 token (a verify / a step), b=1",
    1.3,
    at_most=True,
)
SPECULATIVE = ("draft", "lookup", "block")


def find_row(rows, framework, method, batch, temperature) -> dict | None:
    """The row of that system (None if it did not run)."""
    want = (framework, method, batch, temperature)
    keys = ("framework", "method", "batch", "temperature")
    return next((r for r in rows if tuple(r[k] for k in keys) == want), None)


def fastest_peer(rows, temperature: float = 0.0) -> dict | None:
    """transformers' fastest system at batch 1 (plain decoding included), or None.

    A ratio against one of its methods alone (say assisted generation, slower than
    its plain decoding on a CPU) would flatter specjax.
    """
    found = [
        r
        for m in ("plain", "draft", "lookup")
        if (r := find_row(rows, "transformers", m, 1, temperature))
    ]
    return max(found, key=lambda r: r["tok_s"], default=None)


def judge(target: Target, value, **extra) -> dict:
    """A target's result: ``met`` is None when nothing was measured."""
    met = None
    if value is not None:
        met = bool(value <= target.threshold if target.at_most else value >= target.threshold)
    return dict(
        target=target.key,
        what=target.what,
        threshold=target.threshold,
        at_most=target.at_most,
        value=value,
        met=met,
        **extra,
    )


def targets_of(rows, large, block_sweep=()) -> list[dict]:
    """The bundled pair's targets (`TARGETS`), at temperature 0 (and 1 for block).

    τ at block 8 comes from the block row or block-sweep row with γ = 7 (None if
    neither ran at γ = 7).
    """
    spec = find_row(rows, "specjax", "draft", 1, 0.0)
    hf = fastest_peer(rows)
    spec_large = find_row(rows, "specjax", "draft", large, 0.0) if large > 1 else None
    block = find_row(rows, "specjax", "block", 1, 0.0) or {}
    block_t1 = find_row(rows, "specjax", "block", 1, 1.0) or {}
    block8 = next((r for r in [block, *block_sweep] if r.get("gamma") == 7), {})
    measured = {
        "spec_over_plain": spec["speedup"],
        "realized_over_predicted": spec["realized_over_predicted"],
        "spec_over_hf_fastest": spec["tok_s"] / hf["tok_s"] if hf else None,
        "large_over_b1": spec_large["tok_s"] / spec["tok_s"] if spec_large else None,
        "block_over_plain": block.get("speedup"),
        "block_over_plain_t1": block_t1.get("speedup"),
        "block_tau": block8.get("tokens_per_call"),
        "block_realized_over_predicted": block.get("realized_over_predicted"),
    }
    out = []
    for target in TARGETS:
        if target.key == "large_over_b1":
            target = target._replace(what=target.what.replace("batch 16", f"batch {large}"))
        out.append(judge(target, measured[target.key]))
    return out


def real_targets_of(rows, forward_ms: dict) -> list[dict]:
    """The real-model targets (`REAL_TARGETS`, `VERIFY_TARGET`), at batch 1.

    Each target of `REAL_TARGETS` is judged for the fastest speculative method at its
    temperature ("best") and for each method that ran; ``forward_ms`` is the batch-1
    target forward's cost by width (``{"1": ms, ...}``).
    """
    hf = fastest_peer(rows)
    speculative = {}  # T -> [(label, row)], the best first
    for t in (0.0, 1.0):
        found = [r for m in SPECULATIVE if (r := find_row(rows, "specjax", m, 1, t))]
        labels = [f"{r['method']} γ={r['gamma']}" for r in found]
        pairs = list(zip(labels, found, strict=True))
        best = max(pairs, key=lambda p: p[1]["tok_s"], default=None)
        speculative[t] = ([(f"best ({best[0]})", best[1])] if best else []) + pairs
    measure = {
        "over_plain": lambda r: r["speedup"],
        "over_hf_fastest": lambda r: r["tok_s"] / hf["tok_s"] if hf else None,
        "over_plain_t1": lambda r: r["speedup"],
        "realized_over_predicted": lambda r: r["realized_over_predicted"],
    }
    out = []
    for target in REAL_TARGETS:
        t = 1.0 if target.key.endswith("_t1") else 0.0
        for label, r in speculative[t]:
            method = "best" if label.startswith("best") else r["method"]
            one = target._replace(key=f"{target.key}:{method}", what=target.what.format(m=label))
            out.append(judge(one, measure[target.key](r), system=label))
    verify = forward_ms.get(str(VERIFY_WIDTH)), forward_ms.get("1")
    ratio = verify[0] / verify[1] if None not in verify else None
    out.append(judge(VERIFY_TARGET, ratio))
    return out
