"""bench_e2e's results as Markdown: what ran, the tables, the diagnosis, the targets."""

from __future__ import annotations

from pathlib import Path

from .targets import VERIFY_WIDTH, find_row


def _fmt(value, spec="{:.2f}") -> str:
    if value is None:
        return "—"
    return spec.format(value)


def describe_workloads(workloads: dict) -> str:
    """``chat: 12 of 39–52 tokens; code-edit: ...`` from the config's ``workloads``."""
    parts = []
    for w, d in workloads.items():
        lo, hi = min(d["prompt_tokens"]), max(d["prompt_tokens"])
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        parts.append(f"{w}: {d['num_prompts']} of {span} tokens")
    return "; ".join(parts)


def header(results: dict) -> list[str]:
    """What ran, where, and the greedy check's verdict."""
    m, c = results["machine"], results["config"]
    drafts = "draft model and prompt lookup" if c["draft_dir"] else "prompt lookup"
    names = {"draft": "assisted generation", "lookup": "prompt lookup"}
    probe = "; ".join(f"{names[k]} -> {v}" for k, v in results["hf_batch_probe"].items())
    lines = [
        f"Models: {c['pair']}. {c['num_prompts']} prompts from {Path(c['prompts_file']).name} "
        f"({describe_workloads(c['workloads'])}; {c['prompt_encoding']}), "
        f"{c['max_new_tokens']} new tokens each, EOS disabled, γ={c['gamma']} ({drafts}), "
        f"prompt lookup n-gram {c['ngram']}, block drafter γ={c['block_gamma']} "
        f"(block size {c['block_gamma'] + 1}), medians of {c['repeats']} passes.",
        f"Block drafter: {c['block_drafter']}.",
        f"Machine: {m['cpu']}, {m['cores']} cores, 1-min load average "
        f"{m['load_average_1m_start']:.1f} at the start, {m['load_average_1m']:.1f} at the end; "
        f"jax {m['jax']} ({m['platform']}), torch {m['torch']} "
        f"({c['torch_threads']} thread(s)), transformers {m['transformers']}.",
        f"Command: `{c['command']}` ({results['wall_s'] / 60:.1f} min).",
        "",
        "Greedy outputs (T=0) of every system below agree token for token, workload by "
        f"workload ({len(results['near_ties'])} tolerated near-ties).",
        f"transformers with batch 2: {probe}. "
        "transformers has no block drafter: the block rows have no transformers counterpart.",
    ]
    if c.get("assisted_generation"):
        lines.append(c["assisted_generation"])
    return lines


def rows_table(rows) -> list[str]:
    """The main table: every system over all workloads."""
    lines = [
        "| system | method | batch | T | tok/s | speedup vs own plain | acceptance | "
        "tokens/call | predicted | realized/pred | ms/step | model ms/step | "
        "steady s | first pass s | compile s |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        method = r["method"] + (f" γ={r['gamma']}" if r["gamma"] else "")
        lines.append(
            f"| {r['framework']} | {method} | {r['batch']} | {r['temperature']:g} | "
            f"{r['tok_s']:.1f} | {_fmt(r['speedup'])} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{r['tokens_per_call']:.2f} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {r['step_ms']:.2f} | "
            f"{_fmt(r['model_step_ms'])} | {r['median_s']:.2f} | {r['first_s']:.2f} | "
            f"{_fmt(r['compile_s'], '{:.1f}')} |"
        )
    return lines


def workload_table(rows) -> list[str]:
    """Every system on each workload, against its own plain decoding of that workload."""
    lines = [
        "Per workload (speedup: against the same framework's plain decoding of the same "
        "workload, batch and T):",
        "",
        "| system | method | batch | T | workload | tok/s | speedup vs own plain | acceptance | "
        "tokens/call | predicted | realized/pred |",
        "|" + "---|" * 11,
    ]
    for r in sorted(rows, key=lambda r: r["workload"]):  # stable: system order kept
        method = r["method"] + (f" γ={r['gamma']}" if r["gamma"] else "")
        lines.append(
            f"| {r['framework']} | {method} | {r['batch']} | {r['temperature']:g} | "
            f"{r['workload']} | {r['tok_s']:.1f} | {_fmt(r['speedup'])} | "
            f"{_fmt(r['acceptance_rate'], '{:.3f}')} | {r['tokens_per_call']:.2f} | "
            f"{_fmt(r['predicted_speedup'])} | {_fmt(r['realized_over_predicted'])} |"
        )
    return lines


def sweep_tables(results: dict) -> list[str]:
    """The draft model's γ sweep (or why there is none) and the block-size sweep."""
    if results["sweep"]:
        lines = [
            "γ sweep (specjax, draft model, T=0, batch 1):",
            "",
            "| γ | acceptance | α | tokens/call | tok/s | speedup | predicted | realized/pred | "
            "draft ms | verify ms | ms/step |",
            "|" + "---|" * 11,
        ]
    else:
        lines = ["No γ sweep of a draft model: none was given (--draft)."]
    for r in results["sweep"]:
        lines.append(
            f"| {r['gamma']} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{_fmt(r['alpha'], '{:.3f}')} | {r['tokens_per_call']:.2f} | {r['tok_s']:.1f} | "
            f"{_fmt(r['speedup'])} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {r['cost_draft_ms']:.2f} | "
            f"{r['cost_verify_ms']:.2f} | {r['step_ms']:.2f} |"
        )
    lines += [
        "",
        "Block-size sweep (specjax, block drafter, T=0, batch 1; τ = tokens per target call):",
        "",
        "| γ | block | acceptance | α | τ | tok/s | speedup | predicted | realized/pred | "
        "proposal ms | verify ms | ms/step |",
        "|" + "---|" * 12,
    ]
    for r in results.get("block_sweep", []):
        lines.append(
            f"| {r['gamma']} | {r['gamma'] + 1} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{_fmt(r['alpha'], '{:.3f}')} | {r['tokens_per_call']:.2f} | {r['tok_s']:.1f} | "
            f"{_fmt(r['speedup'])} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {_fmt(r.get('cost_draft_ms'))} | "
            f"{_fmt(r.get('cost_verify_ms'))} | {r['step_ms']:.2f} |"
        )
    return lines


def targets_table(targets) -> list[str]:
    """Each target's requirement, measured value and verdict."""
    lines = ["Targets:", "", "| target | required | measured | met |", "|---|---|---|---|"]
    for t in targets:
        met = {True: "yes", False: "**no**", None: "—"}[t["met"]]
        required = f"{'≤' if t.get('at_most') else '≥'} {t['threshold']:g}"
        lines.append(f"| {t['what']} | {required} | {_fmt(t['value'])} | {met} |")
    return lines


def markdown(results: dict) -> str:
    """The whole report (what the script prints and writes to ``results.md``)."""
    lines = [*header(results), "", *rows_table(results["rows"])]
    if len(results["config"]["workloads"]) > 1:
        lines += ["", *workload_table(results.get("workload_rows", []))]
    lines += ["", *sweep_tables(results)]
    lines += ["", *diagnosis(results["rows"], results.get("forward_ms", {}).get("1", {}))]
    lines += ["", *targets_table(results["targets"])]
    return "\n".join(lines)


def diagnosis(rows, forward_ms: dict | None = None) -> list[str]:
    """Splits realized / predicted of each batch-1 greedy speculative row into its factors.

    At batch 1, realized / predicted = (tokens per call / E(α, γ))
    × (draft + verify cost / measured step) × (plain measured step / forward cost).
    ``forward_ms`` (the batch-1 target forward's ms by width) adds what verifying
    `VERIFY_WIDTH` tokens costs against one.
    """
    plain = find_row(rows, "specjax", "plain", 1, 0.0)
    out = ["Where realized / predicted goes (specjax, batch 1, T=0):", ""]
    one, wide = (forward_ms or {}).get("1"), (forward_ms or {}).get(str(VERIFY_WIDTH))
    if one and wide:
        out.append(
            f"* A target forward of {VERIFY_WIDTH} tokens (a verification at γ="
            f"{VERIFY_WIDTH - 1}) costs {wide:.2f} ms, {wide / one:.2f}× one of 1 token "
            f"({one:.2f} ms, a decoding step)."
        )
    proposal = {
        "draft": "a draft proposal",
        "lookup": "a lookup proposal",
        "block": "a block proposal (one drafter forward + its context update)",
    }
    for method in ("draft", "lookup", "block"):
        r = find_row(rows, "specjax", method, 1, 0.0)
        if r is None or r.get("expected_tokens_per_call") is None:
            continue
        e, tpc = r["expected_tokens_per_call"], r["tokens_per_call"]
        step, model = r["step_ms"], r["model_step_ms"]
        p_step, p_model = plain["step_ms"], plain["model_step_ms"]
        verify, draft = (
            r["cost_verify_ms"] / r["cost_step_ms"],
            r["cost_draft_ms"] / r["cost_step_ms"],
        )
        out.append(
            f"* {method} γ={r['gamma']}: {r['realized_over_predicted']:.2f} = "
            f"tokens/call {tpc:.2f} / E(α={r['alpha']:.3f}) {e:.2f} (×{tpc / e:.2f}) "
            f"· draft+verify {model:.2f} ms / measured step {step:.2f} ms (×{model / step:.2f}) "
            f"· plain: measured step {p_step:.2f} ms / forward {p_model:.2f} ms "
            f"(×{p_step / p_model:.2f}). A verify forward (T={r['gamma'] + 1}) costs "
            f"{verify:.2f}× a T=1 forward, {proposal[method]} {draft:.2f}×."
        )
        if r.get("cost_verify_features_ms") is not None:
            out[-1] += (
                f" The verify forward returning the drafter's features costs "
                f"{r['cost_verify_features_ms']:.2f} ms against {r['cost_verify_ms']:.2f} ms "
                f"without (the prediction uses the latter)."
            )
        out[-1] += (
            f" The {step:.2f} ms step: proposal {r['cost_draft_ms']:.2f} ms "
            f"({r['cost_draft_ms'] / step:.0%}), verify {r['cost_verify_ms']:.2f} ms "
            f"({r['cost_verify_ms'] / step:.0%}), the rest {step - model:+.2f} ms (the loop's "
            f"work, less what the two calls lose or gain from running back to back)."
        )
        if r.get("interleaved_ms") is not None:
            both = r["interleaved_ms"]
            out[-1] += (
                f" Run back to back in one loop (no acceptance or bookkeeping), the proposal "
                f"and the verification cost {both:.2f} ms, against {model:.2f} ms apart: "
                f"{both - model:+.2f} ms is what the two calls cost each other (on a CPU, "
                f"mostly weights they evict from the caches); the loop's own work (acceptance, "
                f"sampling, buffers) is the remaining {step - both:+.2f} ms of the "
                f"{step:.2f} ms step."
            )
    large = [r for r in rows if r["framework"] == "specjax" and r["batch"] > 1]
    for r in large:
        if r["method"] in ("draft", "block") and r["temperature"] == 0 and r.get("verify_gflops"):
            out.append(
                f"* batch {r['batch']}, {r['method']} γ={r['gamma']}: the verification forward "
                f"({r['batch']}×{r['gamma'] + 1} "
                f"tokens) runs at {r['verify_gflops']:.0f} GFLOP/s, "
                f"{r['verify_gflops'] / r['peak_gflops']:.0%} of this machine's measured "
                f"float32 matmul peak ({r['peak_gflops']:.0f} GFLOP/s): at this batch the step "
                f"is compute-bound, so tokens that are drafted and rejected cost real time."
            )
    return out
