"""The scripts under scripts/: bench_e2e.py's quick run works end to end and wrong outputs
fail loudly; the other benchmarks' and the training recipes' quick runs and helpers."""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

BENCHMARKS = Path(__file__).resolve().parent.parent / "scripts" / "benchmarks"
TRAINING = BENCHMARKS.parent / "training"
SCRIPT = BENCHMARKS / "bench_e2e.py"
# The benchmarks import their harness (scripts/benchmarks/harness/) from their own
# folder, which a script run as a file has on its path; loaded here, it needs this.
sys.path.insert(0, str(BENCHMARKS))


def _load_script(name: str = "bench_e2e", folder: Path = BENCHMARKS):
    """``folder/<name>.py`` as a module, loaded once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def _run_script(path: Path, *args: str, timeout: float = 600) -> str:
    """Runs a script on CPU; its stdout, after asserting it exited 0."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, str(path), *args]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_e2e_quick_run_checks_times_and_predicts(tmp_path):
    """bench_e2e.py --quick: every drafter at T = 0 and 1, both sweeps, greedy outputs
    checked equal to plain decoding, the cost model's prediction at batch 1, and the
    results file's record."""
    out = _run_script(SCRIPT, "--quick", "--out", str(tmp_path))
    assert "| method | gamma | batch | temperature | tok_s |" in out
    assert "γ sweep" in out and "Block-size sweep" in out
    results = json.loads((tmp_path / "quick.json").read_text())
    assert results["commit"] and results["date"] and results["machine"]["jax"]
    systems = {(r["method"], r["batch"], r["temperature"]) for r in results["rows"]}
    for t in (0.0, 1.0):
        assert {(m, b, t) for m in ("plain", "draft", "lookup") for b in (1, 4)} <= systems
        assert ("block", 1, t) in systems
    assert "block γ=2 b=1 T=0" in results["greedy_checked"]
    assert [r["gamma"] for r in results["sweep"]] == [1, 2]
    assert [r["gamma"] for r in results["block_sweep"]] == [2]
    for r in results["rows"]:
        if r["method"] == "plain":
            assert r["acceptance_by_position"] is None and r["speedup"] is None
            continue
        assert len(r["acceptance_by_position"]) == r["gamma"]
        assert (r["predicted_speedup"] is not None) == (r["batch"] == 1), r
    assert set(results["step_costs"]) == {"draft", "lookup", "block"}
    assert (tmp_path / "quick.md").read_text().strip() == out.strip()


@pytest.mark.real
def test_e2e_quick_run_on_smollm2(smollm2_path, tmp_path):
    """``--quick --target``: the real model's chat template, no draft model."""
    _run_script(
        SCRIPT, "--quick", "--target", str(smollm2_path), "--out", str(tmp_path), timeout=2400
    )
    results = json.loads((tmp_path / "quick.json").read_text())
    assert set(results["config"]["workloads"]) == {"chat", "code-edit"}
    assert {r["method"] for r in results["rows"]} == {"plain", "lookup", "block"}


@pytest.mark.slow
def test_train_block_drafter_script_quick_run(tmp_path):
    """The script that made the shipped drafters runs every stage (bundled target)."""
    out_dir = tmp_path / "block"
    _run_script(
        TRAINING / "train_block_drafter.py", "--quick", "--no-progress", "--out", str(out_dir)
    )
    report = json.loads((out_dir / "train_report.json").read_text())
    assert report["target"] == "bundled" and report["steps"] == 20
    assert {"T0_gamma1", "T1_gamma3"} <= set(report["evaluation"])
    import specjax
    from specjax.drafters.block import BlockDrafter
    from specjax.io import drafter_weights

    drafter = drafter_weights.load(BlockDrafter, out_dir, specjax.default_pair()[0])
    assert drafter.num_draft == 7


def test_instruction_prompts_for_chat_targets():
    module = _load_script("train_block_drafter", TRAINING)
    doc = "import os\n\ndef f(x):\n    # twice\n    return 2 * x\n\nX = 1\ndef g():\n    pass\n"
    assert module.code_snippets([doc]) == ["def f(x):\n    # twice\n    return 2 * x"]
    prompts = module.instruction_prompts(module.code_snippets([doc]), 8, np.random.default_rng(0))
    assert len(prompts) == 8 and sum("```python\ndef f(x):" in p for p in prompts) == 4
    assert all(p.strip() and "{}" not in p for p in prompts)


@pytest.mark.slow
def test_throughput_script_quick_run(tmp_path):
    """bench_throughput.py --quick (about 12 small compiles, ~1 min): every system's
    greedy output is checked against plain greedy inside the script, which exits 1 on
    any difference; here its tables and the adaptive table it derives are checked."""
    out = _run_script(BENCHMARKS / "bench_throughput.py", "--quick", "--out", str(tmp_path))
    assert "adaptive table" in out
    report = json.loads((tmp_path / "quick.json").read_text())
    systems = {(r["system"], r["slots"]) for r in report["slots"]}
    for slots in (1, 3):
        for system in ("plain static batch", "plain refill", "spec γ=1 refill"):
            assert (system, slots) in systems
        assert ("spec adaptive refill", slots) in systems
    assert set(report["table"]) == {"1", "3"} and set(report["table"].values()) <= {0, 1}
    by = {(r["system"], r["slots"]): r for r in report["slots"]}
    # With one slot nothing idles; refill never idles more than a static batch.
    assert by["plain refill", 1]["idle"] == 0.0
    assert by["plain refill", 3]["idle"] <= by["plain static batch", 3]["idle"]
    assert {r["system"] for r in report["sampled"]} == {
        "plain",
        "draft q",
        "draft argmax",
        "draft q, τ=0.3",
    }
    assert (tmp_path / "quick.md").read_text().count("|") > 20


class _Decoded:
    """What `bench_e2e.System.tokens` reads: a system's greedy rows per workload."""

    def __init__(self, name, method, rows, batch=1):
        self.name, self.method, self.batch, self.temperature = name, method, batch, 0.0
        self.outputs, self.rows = {"code": None}, rows

    def tokens(self, workload):
        return self.rows


def test_greedy_check_names_the_system_row_and_token():
    bench = _load_script()
    plain = _Decoded("plain b=1 T=0", "plain", [[1, 2, 3], [4, 5, 6]])
    good = _Decoded("draft γ=2 b=1 T=0", "draft", [[1, 2, 3], [4, 5, 6]])
    bad = _Decoded("lookup γ=2 b=1 T=0", "lookup", [[1, 2, 3], [4, 9, 6]])
    short = _Decoded("block γ=2 b=1 T=0", "block", [[1, 2], [4, 5, 6]])
    assert bench.check_greedy([plain, good], {1: plain}) == []
    failures = bench.check_greedy([plain, good, bad, short], {1: plain})
    assert failures == [
        "lookup γ=2 b=1 T=0 [code]: row 1 differs from plain decoding at new token 1: "
        "expected 5, got 9",
        "block γ=2 b=1 T=0 [code]: row 0 differs from plain decoding at new token 2: "
        "expected 3, got None",
    ]


def test_batches_cycle_through_the_prompts():
    bench = _load_script()
    assert bench.batches_of([1, 2, 3], 2) == [[1, 2], [3, 1]]
    assert bench.batches_of([1, 2, 3], 1) == [[1], [2], [3]]


def test_results_record_and_markdown_table(tmp_path):
    from harness import first_difference, table, write_results

    path = write_results(tmp_path / "x" / "r.json", {"rows": [1]}, ["--quick"])
    written = json.loads(path.read_text())
    assert written["rows"] == [1] and written["machine"]["jax"] and written["date"]
    assert written["command"].endswith("--quick") and written["commit"]
    rows = [{"a": 1, "b": 0.12345}, {"a": 2, "b": None}]
    assert table(rows, ["a", ("b", ".2f")]).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | 0.12 |",
        "| 2 | — |",
    ]
    assert first_difference([1, 2], [1, 2]) is None
    assert first_difference([1, 2], [1, 3]) == 1 and first_difference([1, 2], [1]) == 1


def test_real_pair_rounds_and_summary_from_fake_servers(monkeypatch):
    """bench_real_pair's coordinator, with servers that answer at known rates: a warm-up
    round (transformers' systems warmed once), timed rounds in turn, per-row medians,
    and the fastest of each kind per workload."""
    bench = _load_script("bench_real_pair")
    monkeypatch.setattr(bench, "prompt_texts", lambda: {"chat": "hi", "code": "def f():"})
    rate = {"spec": 4.0, "plain": 2.0, "hf-float32-plain": 2.5, "hf-bfloat16-lookup": 1.0}
    calls = []

    class Fake:
        def run(self, job):
            calls.append(job["system"])
            n = job["tokens"]
            return {"seconds": n / rate[job["system"]], "ids": [7] * n}

    systems = list(rate)
    workloads = [
        dict(prompt=p, tokens=n, temperature=t, hf=t == 0)
        for p, n, t in itertools.product(("chat", "code"), (4, 8), (0.0, 1.0))
    ]
    rows = bench.interleaved({s: Fake() for s in systems}, systems, workloads, rounds=2)
    # Warm-up: specjax's systems on every workload, transformers' once each.
    assert calls.count("spec") == 8 * 3 and calls.count("hf-float32-plain") == 1 + 4 * 2
    assert [r["tok_s"] for r in rows] == [rate[r["system"]] for r in rows]
    assert {r["tokens"] for r in rows} == {4, 8} and all(len(r["generated"]) == 2 for r in rows)
    summary = bench.summarize(rows, ["spec"], ["plain"], ["hf-float32-plain", "hf-bfloat16-lookup"])
    assert len(summary) == 8
    greedy = [e for e in summary if e["temperature"] == 0]
    assert all(e["speculative_over_plain"] == 2.0 for e in summary)
    assert all(e["fastest_peer"] == "hf-float32-plain" for e in greedy)
    assert all(e["speculative_over_peer"] == 1.6 for e in greedy)
    assert all("fastest_peer" not in e for e in summary if e["temperature"] > 0)


@pytest.mark.slow
def test_accelerator_script_quick_run_checks_and_measures(tmp_path):
    """The one command for a GPU or TPU runs on a CPU at small settings: its exactness
    checks pass, the steps are measured, and a prediction error is computed where a
    prediction for the chip is committed."""
    out = tmp_path / "accelerator.json"
    _run_script(BENCHMARKS / "accelerator.py", "--quick", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["statistics"]["exact"] and report["statistics"]["rows"] >= 1000
    bundled = report["pairs"]["bundled"]
    assert bundled["greedy_equals_plain_at_width"]["equal"]
    steps = bundled["measured"]["step_seconds"]
    assert set(steps) == {"0", "1", "2", "3", "4"} and all(s > 0 for s in steps.values())
    for key in ("date", "commit", "command", "machine"):
        assert key in report, key
    accelerator = _load_script("accelerator")
    measured = {"step_seconds": {"0": 2.0, "1": 3.0}}
    assert accelerator.errors(measured, {"step_seconds": {"0": 1.0, "1": 1.5}}) == {
        "0": 2.0,
        "1": 2.0,
    }
