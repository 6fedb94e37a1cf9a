#!/usr/bin/env python
"""Everything specjax checks and measures on a GPU or TPU, in one command of minutes
(it starts nothing new after ``--budget-s``)::

    python scripts/benchmarks/accelerator.py            # on the accelerator
    python scripts/benchmarks/accelerator.py --quick    # a CPU smoke run, seconds

In bfloat16 at jax's default flags it checks exactness (greedy speculative decoding
equals plain decoding at its forward width, the bundled pair, γ = 3; and the joint law
of two tokens of a tiny model under rejection sampling against the exact law,
chi-square, 20,000 rows, false alarm 0.001); measures the step costs per γ
(`specjax.tuning.measure`) of the bundled pair and of the real pair's
shapes (their weights where cached, else random ones: the timings are the same), and
times each pair through ``specjax generate --compare --json`` where its files are here;
and writes each measured step beside what ``specjax compile`` predicted for that chip
(``results/chips/predicted.json``, written by ``--predict`` on any host). On any host
``--error`` does the same against the committed H200 measurement, ``--capacity``
compiles the real pair at 32 rows of 16k tokens on v5e slices.

Writes ``$OUT/accelerator.json`` (or ``--out``) with the date, commit, command and
machine, and exits 1 if an exactness check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import harness  # noqa: F401  (before specjax: a checkout without installing finds its own)
import specjax
from harness import RESULTS, ROOT, first_difference, logger, table, write_results
from specjax import tuning

GAMMA = 3
MAX_GAMMA = 4
PREDICTED = RESULTS / "chips"
CONFIGS = Path(__file__).resolve().parent / "pair_configs"
REAL = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
START = time.perf_counter()
log = logger("accelerator")


def chip_name(device) -> str | None:
    """The `specjax.chips` name of the device this runs on, if it is one of them."""
    kind = getattr(device, "device_kind", "")
    for pattern, name in (
        ("H100", "h100"),
        ("H200", "h200"),
        ("v5 lite", "v5e-1"),
        ("v6 lite", "v6e-1"),
    ):
        if pattern in kind:
            return name
    return None


def pairs(quick: bool):
    """``{name: (target, draft, prompts, real_weights)}`` in bfloat16."""
    target, draft, tokenizer = specjax.default_pair(jnp.bfloat16)
    texts = ["def fibonacci(n):", "import os\n\ndef main():"]
    out = {"bundled": (target, draft, [tokenizer.encode(t).ids for t in texts], True)}
    if quick:
        return out
    from specjax.io.fetch import remote

    if all(remote(name).path().is_file() for name in REAL):
        t, d = (specjax.load_pretrained(remote(n).path(), jnp.bfloat16) for n in REAL)
        out["real"] = (t, d, [t.tokenizer.encode("def quicksort(items):").ids], True)
    else:
        from specjax.io.hf_config import config_from_hf

        def shaped(name):
            config = config_from_hf(json.loads((CONFIGS / f"{name}.json").read_text()))
            return specjax.Model.random(config, dtype=jnp.bfloat16)

        prompt = [[(i * 7919) % 50000 + 10 for i in range(40)]]
        out["real_shapes"] = (shaped(REAL[0]), shaped(REAL[1]), prompt, False)
    return out


def check_greedy(target, draft, prompts, tokens: int) -> dict:
    """Speculative (γ = 3) against plain at width γ + 1, greedy: the first differing
    position per row (None where equal)."""
    kw = dict(max_new_tokens=tokens, forward_width=GAMMA + 1)
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    spec = specjax.speculative_generate(None, target, drafter, prompts, **kw).to_lists()
    plain = specjax.generate(None, target, prompts, **kw).to_lists()
    first = [first_difference(x, y) for x, y in zip(spec, plain, strict=True)]
    return {"first_difference": first, "equal": all(f is None for f in first)}


def check_statistics(rows: int) -> dict:
    """Two tokens sampled by rejection sampling against their exact joint law."""
    from specjax.testing import (
        chi_square_pvalue,
        exact_sequence_probs,
        perturbed,
        sequence_counts,
        tiny_model,
    )

    target = tiny_model(seed=0, vocab_size=16)
    drafter = specjax.DraftModel(perturbed(target, seed=1), num_draft=2)
    sampling = specjax.SamplingConfig(temperature=1.0)
    prompt = [3, 1, 4]
    out = specjax.speculative_generate(
        jax.random.key(0), target, drafter, [prompt] * rows, max_new_tokens=2, sampling=sampling
    )
    counts = sequence_counts(np.asarray(out.tokens), target.vocab_size)
    probs = exact_sequence_probs(target, prompt, 2, sampling)
    p = chi_square_pvalue(counts, probs)
    return {"rows": rows, "pvalue": p, "false_alarm": 1e-3, "exact": bool(p >= 1e-3)}


def measure_steps(target, draft, prompts, tokens: int) -> dict:
    drafter = specjax.DraftModel(draft, num_draft=MAX_GAMMA)
    costs, acceptance, _ = tuning.measure(
        target, drafter, prompts, max_new_tokens=tokens, repeats=3, log=log
    )
    steps = {str(g): costs.step_s(g) for g in range(MAX_GAMMA + 1)}
    widths = {str(w): s for w, s in enumerate(costs.target_s, 1)}
    return {
        "step_seconds": steps,
        "target_step_seconds_by_width": widths,
        "acceptance": list(acceptance),
    }


def through_the_command(name: str, tokens: int) -> dict:
    """``specjax generate --compare --json`` with no tuning flags, T = 0 and T = 1."""
    models = [] if name == "bundled" else ["--model", REAL[0], "--draft", REAL[1]]
    out = {}
    for temperature in ("0", "1"):
        cmd = [
            sys.executable,
            "-m",
            "specjax.cli",
            "generate",
            "def quicksort(items):",
            "--max-new-tokens",
            "128",
            "--compare",
            "--json",
            "--temperature",
            temperature,
            *models,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            out[f"T={temperature}"] = {"error": done.stderr[-500:]}
            continue
        data = json.loads(done.stdout)
        keep = (
            "tokens_per_second",
            "plain_tokens_per_second",
            "speedup",
            "equals_plain_at_width",
            "gamma",
        )
        out[f"T={temperature}"] = {k: data.get(k) for k in keep} | {"auto": data.get("auto")}
        log(f"{name} T={temperature}: {out[f'T={temperature}']}")
    return out


def _learnt_acceptance(prompt: str, temperature: int) -> list[float]:
    """The acceptance by position this host's runs of a pair learnt, from the committed
    CPU results of ``bench_real_pair.py --stages cli`` (acceptance belongs to the
    models and prompts, not to the chip)."""
    runs = json.loads((RESULTS / "real_pair" / "cpu.json").read_text())["cli"]["runs"]
    row = next(r for r in runs if r["prompt"] == prompt and r["temperature"] == temperature)
    return [round(a, 2) for a in row["auto"]["learnt_acceptance_by_position"]]


# What --predict compiles: (chip, pair, flags); the real pair in bfloat16 on every chip
# of the README's table, and in int8 on Colab's v5e-1.
PREDICTIONS = [
    *((chip, "real", ()) for chip in ("v5e-1", "v6e-1", "v5p-8", "h100", "h200")),
    ("v5e-1", "real", ("--quantize", "int8")),
    *((chip, "bundled", ()) for chip in ("v5e-1", "h100")),
]


# What --capacity compiles: the real pair at 32 rows of a 16k context, on more and more
# v5e chips, to the first that fits (the command's message where it does not).
CAPACITY = [
    (chip, "real", ("--batch-size", "32", "--prompt-length", "8192", "--max-new-tokens", "8192"))
    for chip in ("v5e-1", "v5e-4", "v5e-8")
]


# What --error compiles: the real pair on an H200 at the context of the committed H200
# measurement (``bench_pair_gpu.py``: bfloat16, batch 1, 160 tokens).
H200_MEASURED = RESULTS / "real_pair" / "gpu_h200_bfloat16.json"
ERROR = [("h200", "real", ("--prompt-length", "32", "--max-new-tokens", "128"))]


def prediction_error(out: Path) -> None:
    """Predict the H200 at the committed H200 measurement's context, and write measured
    over predicted per forward width, and the speedups `tuning.choose` expects from
    each side's costs at the same acceptance (``results/chips/error_h200.json``)."""
    predict(out, ERROR, "error_h200.json")
    path = out / "error_h200.json"
    record = json.loads(path.read_text())
    report = record["rows"][0]["report"]
    measured = json.loads(H200_MEASURED.read_text())
    widths = sorted(int(w) for w in report["target_step_seconds_by_width"])
    target_s = [measured["target_ms"][str(w)] / 1e3 for w in widths]
    draft_s = measured["draft_step_ms"] / 1e3
    gammas = range(1, len(widths))
    from_measured = tuning.choose(
        tuning.StepCosts(tuple(target_s), tuple(g * draft_s for g in gammas)),
        report["acceptance"],
    )
    record["measured"] = {
        "file": str(H200_MEASURED.relative_to(ROOT)),
        "target_step_seconds_by_width": dict(zip(map(str, widths), target_s, strict=True)),
        "draft_forward_seconds": draft_s,
    }
    record["measured_over_predicted_by_width"] = {
        str(w): t / report["target_step_seconds_by_width"][str(w)]
        for w, t in zip(widths, target_s, strict=True)
    }
    record["speedup_from_measured_costs"] = dict(enumerate(from_measured.speedups))
    record["gamma_from_measured_costs"] = from_measured.gamma
    write_results(path, record)
    ratios = record["measured_over_predicted_by_width"]
    log(f"measured / predicted by width: {ratios}")
    log(
        f"from measured costs: gamma {from_measured.gamma}, speedups "
        f"{[round(s, 2) for s in from_measured.speedups]}; predicted: gamma "
        f"{report['gamma']}, {report['predicted_speedup']}"
    )


def predict(out: Path, rows_to_run=None, name: str = "predicted.json") -> None:
    """``specjax compile --json`` for every row of `PREDICTIONS` (any host; jax's CUDA
    plugin from the specjax cache for the GPUs, as the aot tier fetches it)."""
    from specjax.core.paths import cache_root

    acceptance = {
        "real": _learnt_acceptance("chat", 0),
        "bundled": _learnt_acceptance("bundled-code", 1),
    }
    models = {"real": ["--model", REAL[0], "--draft", REAL[1]], "bundled": []}
    plugin = cache_root() / "jax-cuda-plugin" / jax.__version__
    rows = []
    for chip, pair, flags in PREDICTIONS if rows_to_run is None else rows_to_run:
        alpha = ",".join(map(str, acceptance[pair]))
        cmd = [
            "specjax",
            "compile",
            "--chip",
            chip,
            "--json",
            "--gamma",
            "auto",
            "--acceptance",
            alpha,
            *models[pair],
            *flags,
        ]
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        if chip.startswith("h"):
            env["PYTHONPATH"] = str(plugin)
        done = subprocess.run(
            [sys.executable, "-m", "specjax.cli", *cmd[1:]], capture_output=True, text=True, env=env
        )
        if done.returncode not in (0, 3):
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        report = json.loads(done.stdout)
        rows.append({"command": " ".join(cmd), "pair": pair, "report": report})
        if rows_to_run is not None and report["fits"]:
            break  # capacity: the first slice that fits
        log(f"predicted {chip} {pair} {' '.join(flags)}")
    log(f"wrote {write_results(out / name, {'rows': rows})}")
    print(predicted_table(rows))


def predicted_table(rows: list[dict]) -> str:
    """The predictions as Markdown, one line per chip and pair."""
    lines = []
    for row in rows:
        r, gib = row["report"], 2**30
        line = {"chip": r["chip"], "pair": row["pair"], "auto's γ": r.get("gamma")}
        line["weights"] = "int8" if "--quantize" in row["command"] else "bfloat16"
        line["fits: peak / usable per chip"] = f"no: {r.get('message', '')[:160]}"
        if r["fits"]:
            steps, speedups = r["step_seconds"], r["predicted_speedup"]
            line["fits: peak / usable per chip"] = (
                f"yes: {r['peak_bytes'] / gib:.2f} / {r['usable_bytes'] / gib:.2f} GiB"
            )
            line["plain step"] = f"{1e3 * steps['0']:.2f} ms ({r['step_bytes']['0'] / 1e9:.2f} GB)"
            later = sorted(steps, key=int)[1:]
            line["step at γ = 1..4"] = " / ".join(f"{1e3 * steps[g]:.2f}" for g in later) + " ms"
            line["predicted speedup at γ = 1..4"] = " / ".join(
                f"{speedups[g]:.2f}x" for g in sorted(speedups, key=int)[1:]
            )
        lines.append(line)
    columns = ["chip", "pair", "weights", "fits: peak / usable per chip", "plain step"]
    return table(lines, [*columns, "step at γ = 1..4", "predicted speedup at γ = 1..4", "auto's γ"])


def errors(measured: dict, predicted: dict | None) -> dict | None:
    """Measured over predicted seconds per step, per γ."""
    if predicted is None:
        return None
    steps = predicted["step_seconds"]
    return {
        g: measured["step_seconds"][g] / steps[g] for g in measured["step_seconds"] if g in steps
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "accelerator.json"
    )
    p.add_argument("--quick", action="store_true", help="small settings: a CPU smoke run")
    p.add_argument("--budget-s", type=float, default=420.0, help="start nothing new after")
    p.add_argument(
        "--predict",
        action="store_true",
        help="write specjax compile's predictions (results/chips/predicted.json), then stop",
    )
    p.add_argument(
        "--capacity",
        action="store_true",
        help="compile the real pair at 32 rows of 16k tokens on v5e slices up to the first "
        "that fits (results/chips/capacity.json), then stop",
    )
    p.add_argument(
        "--error",
        action="store_true",
        help="predict the H200 at the committed H200 measurement's context and write the "
        "prediction's error (results/chips/error_h200.json), then stop",
    )
    args = p.parse_args(argv)
    if args.error:
        prediction_error(PREDICTED)
        return 0
    if args.predict:
        predict(PREDICTED)
        return 0
    if args.capacity:
        predict(PREDICTED, CAPACITY, "capacity.json")
        return 0
    device = jax.devices()[0]
    chip = chip_name(device)
    tokens = 16 if args.quick else 64
    report = {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "chip": chip,
        "dtype": "bfloat16",
        "pairs": {},
    }
    log(f"{report['backend']} {report['device']} (chip {chip}), jax {jax.__version__}")
    report["statistics"] = check_statistics(2_000 if args.quick else 20_000)
    log(f"statistical test: {report['statistics']}")
    predicted = {}  # pair -> the bfloat16 report for this chip
    if (PREDICTED / "predicted.json").is_file():
        for row in json.loads((PREDICTED / "predicted.json").read_text())["rows"]:
            if row["report"]["chip"] == chip and "--quantize" not in row["command"]:
                predicted[row["pair"]] = row["report"]
    ok = report["statistics"]["exact"]
    for name, (target, draft, prompts, real_weights) in pairs(args.quick).items():
        if time.perf_counter() - START > args.budget_s:
            log(f"budget spent: {name} not measured")
            break
        entry = {"greedy_equals_plain_at_width": check_greedy(target, draft, prompts, tokens)}
        ok &= entry["greedy_equals_plain_at_width"]["equal"]
        entry["measured"] = measure_steps(target, draft, prompts[:1], tokens)
        forecast = predicted.get("real" if name.startswith("real") else name)
        entry["predicted"] = forecast and {k: forecast[k] for k in ("step_seconds", "gamma")}
        entry["measured_over_predicted"] = errors(entry["measured"], forecast)
        if real_weights and not args.quick:
            entry["command"] = through_the_command(name, tokens)
        report["pairs"][name] = entry
        log(f"{name}: {json.dumps(entry['measured_over_predicted'])}")
    report["seconds"] = time.perf_counter() - START
    log(f"wrote {write_results(args.out, report, argv)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
