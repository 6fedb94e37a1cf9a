"""bench_e2e's figures (matplotlib, imported when plotting)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .targets import find_row


def _save(fig, path: Path, plt) -> Path:
    """Writes ``fig`` to ``path`` and closes it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(results: dict, out: Path, name: str) -> list[Path]:
    """Writes every figure the results allow into ``out`` as ``<name>_<figure>.png``;
    returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if results["sweep"]:
        paths.append(plot_gamma_sweep(results["sweep"], out / f"{name}_gamma_sweep.png", plt))
    if results.get("block_sweep"):
        paths.append(plot_block_sweep(results, out / f"{name}_block_sweep.png", plt))
    paths.append(plot_throughput(results, out / f"{name}_throughput.png", plt))
    if len(results["config"]["workloads"]) > 1:
        paths.append(plot_workloads(results, out / f"{name}_workloads.png", plt))
    if any(r.get("acceptance_by_position") for r in results["rows"]):
        paths.append(
            plot_acceptance_by_position(results, out / f"{name}_acceptance_by_position.png", plt)
        )
    return paths


def plot_acceptance_by_position(results: dict, path: Path, plt) -> Path:
    """α_i (accepted / judged) at each draft position, per batch-1 specjax system and T."""
    rows = [r for r in results["rows"] if r["batch"] == 1 and r.get("acceptance_by_position")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        alpha = [np.nan if a is None else a for a in r["acceptance_by_position"]]
        ax.plot(range(1, len(alpha) + 1), alpha, "o-",
                label=f"{r['method']} γ={r['gamma']} T={r['temperature']:g}")  # fmt: skip
    ax.set(xlabel="draft position", ylabel="α_i = accepted / judged", ylim=(0, 1.05))
    ax.legend(fontsize=8)
    fig.suptitle("acceptance by draft position, batch 1")
    return _save(fig, path, plt)


def plot_gamma_sweep(sweep, path: Path, plt) -> Path:
    """Acceptance and speedup against the draft model's γ."""
    gammas = [r["gamma"] for r in sweep]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(gammas, [r["acceptance_rate"] for r in sweep], "o-", label="acceptance rate")
    ax1.plot(gammas, [r["alpha"] for r in sweep], "s--", label="α (per-token MLE)")
    ax1.set(xlabel="γ (draft tokens per step)", ylabel="rate", ylim=(0, 1.05), xticks=gammas)
    ax1.legend()
    ax2.plot(gammas, [r["speedup"] for r in sweep], "o-", label="realized")
    ax2.plot(gammas, [r["predicted_speedup"] for r in sweep], "s--", label="predicted")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(xlabel="γ (draft tokens per step)", ylabel="speedup over plain", xticks=gammas)
    ax2.legend()
    fig.suptitle("specjax speculative decoding, draft model, T=0, batch 1")
    return _save(fig, path, plt)


def plot_throughput(results: dict, path: Path, plt) -> Path:
    """tok/s of every system at batch 1 and at the large batch, T=0 and 1."""
    rows = results["rows"]
    groups = [(1, "batch 1"), (results["config"]["large_batch"], "total, large batch")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for ax, (batch, title) in zip(axes, groups, strict=True):
        systems = [(r["framework"], r["method"]) for r in rows if r["batch"] == batch]
        systems = list(dict.fromkeys(systems))
        x = np.arange(len(systems))
        for k, t in enumerate((0.0, 1.0)):
            values = [find_row(rows, *s, batch, t)["tok_s"] for s in systems]
            ax.bar(x + (k - 0.5) * 0.4, values, 0.4, label=f"T={t:g}")
        ax.set_xticks(x, [f"{fw}\n{m}" for fw, m in systems], fontsize=8)
        ax.set(ylabel="tokens/s", title=f"{title} (b={batch})")
        ax.legend()
    return _save(fig, path, plt)


def plot_workloads(results: dict, path: Path, plt) -> Path:
    """tok/s of every batch-1 system on each workload, T=0 and 1."""
    rows = [r for r in results["workload_rows"] if r["batch"] == 1]
    workloads = list(results["config"]["workloads"])
    systems = list(dict.fromkeys((r["framework"], r["method"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    x = np.arange(len(systems))
    width = 0.8 / len(workloads)
    for ax, t in zip(axes, (0.0, 1.0), strict=True):
        for k, w in enumerate(workloads):
            here = [r for r in rows if r["workload"] == w and r["temperature"] == t]
            by_system = {(r["framework"], r["method"]): r["tok_s"] for r in here}
            values = [by_system.get(s, np.nan) for s in systems]
            ax.bar(x + (k - (len(workloads) - 1) / 2) * width, values, width, label=w)
        ax.set_xticks(x, [f"{fw}\n{m}" for fw, m in systems], fontsize=8)
        ax.set(ylabel="tokens/s", title=f"batch 1, T={t:g}")
        ax.legend()
    fig.suptitle("throughput by workload")
    return _save(fig, path, plt)


def plot_block_sweep(results: dict, path: Path, plt) -> Path:
    """τ and speedup against block size γ+1, the draft model's γ sweep on the same axes."""
    block, draft = results["block_sweep"], results["sweep"]
    bx = [r["gamma"] + 1 for r in block]
    dx = [r["gamma"] + 1 for r in draft]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(bx, [r["tokens_per_call"] for r in block], "o-", color="C0", label="block drafter")
    ax1.plot(dx, [r["tokens_per_call"] for r in draft], "s--", color="C1", label="draft model")
    ax1.plot(bx, bx, ":", color="gray", lw=0.8, label="ceiling (γ+1)")
    ax1.set(xlabel="γ + 1 (block size)", ylabel="τ (tokens per target call)")
    ax1.legend()
    predicted = [r["predicted_speedup"] or np.nan for r in block]
    ax2.plot(bx, [r["speedup"] for r in block], "o-", color="C0", label="block, realized")
    ax2.plot(bx, predicted, "o:", color="C0", alpha=0.6, label="block, predicted")
    ax2.plot(dx, [r["speedup"] for r in draft], "s--", color="C1", label="draft model, realized")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(xlabel="γ + 1 (block size)", ylabel="speedup over plain")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({*bx, *dx}))
    fig.suptitle("specjax speculative decoding, block drafter vs draft model, T=0, batch 1")
    return _save(fig, path, plt)
