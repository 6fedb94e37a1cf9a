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


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """``(stdout, out folder)`` of one ``--quick`` run, shared by the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("e2e_quick")
    return _run_script(SCRIPT, "--quick", "--out", str(tmp_path)), tmp_path


@pytest.mark.slow
def test_quick_run_prints_tables_and_writes_results(quick_run):
    out, tmp_path = quick_run
    assert "| system | method | batch | T | tok/s |" in out
    assert "γ sweep" in out and "Targets:" in out
    assert "agree token for token" in out
    results = json.loads((tmp_path / "quick.json").read_text())
    systems = {(r["framework"], r["method"], r["batch"]) for r in results["rows"]}
    assert {("transformers", m, 1) for m in ("plain", "draft", "lookup")} <= systems
    assert {("specjax", m, 4) for m in ("plain", "draft", "lookup")} <= systems
    assert [r["gamma"] for r in results["sweep"]] == [1, 2]
    assert all(r["tokens"] == 2 * 12 for r in results["rows"] if r["batch"] == 1)
    for name in ("quick_gamma_sweep.png", "quick_throughput.png", "quick_block_sweep.png",
                 "quick.md", "quick_acceptance_by_position.png"):  # fmt: skip
        assert (tmp_path / name).stat().st_size > 0
    assert results["commit"] and results["date"] and results["machine"]["jax"]
    for r in results["rows"]:  # α_i per draft position for specjax's drafters only
        by_position = r["acceptance_by_position"]
        if r["framework"] == "specjax" and r["method"] != "plain":
            assert len(by_position) == r["gamma"], r
            assert all(a is None or 0.0 <= a <= 1.0 for a in by_position)
        else:
            assert by_position is None, r


@pytest.mark.slow
def test_quick_run_covers_the_block_drafter(quick_run):
    out, tmp_path = quick_run
    assert "Block-size sweep" in out and "block γ=2:" in out  # table and diagnosis
    results = json.loads((tmp_path / "quick.json").read_text())
    assert results["config"]["block_drafter"].startswith("random weights")
    block = [r for r in results["rows"] if r["method"] == "block"]
    # specjax only (transformers has no block drafter), at T=0 and 1; batch 1 only in
    # --quick (its large batch would be one more decode loop to compile).
    assert {(r["framework"], r["batch"], r["temperature"]) for r in block} == {
        ("specjax", 1, 0.0),
        ("specjax", 1, 1.0),
    }
    # Their greedy outputs went through the equality check with every other system.
    assert "specjax block γ=2 b=1 T=0" in results["greedy_checked"]
    for r in block:
        if r["batch"] == 1:  # costs measured: a prediction to compare with
            assert r["predicted_speedup"] > 0 and r["realized_over_predicted"] > 0
            assert r["cost_draft_ms"] > 0 and r["cost_verify_features_ms"] > 0
    assert [r["gamma"] for r in results["block_sweep"]] == [2]
    assert all(r["predicted_speedup"] is not None for r in results["block_sweep"])
    keys = {t["target"] for t in results["targets"]}
    assert {"block_over_plain", "block_over_plain_t1", "block_tau"} <= keys
    assert (tmp_path / "quick_block_sweep.png").stat().st_size > 0


@pytest.mark.real
def test_quick_run_on_smollm2(smollm2_path, tmp_path):
    """``--quick --target`` benchmarks the real model end to end: every system at T=0
    and 1 on both workloads, greedy outputs equal, the real-model targets reported.

    Measured: 430 s under this suite's XLA flags on a 2-core Xeon shared with a
    training job (load average 5); most of it compiles the 30-layer model's decode
    loops (one per prompt width, system and batch) and cost probes. Its settings are
    the fewest that reach every system: see ``quick_real`` in the script.
    """
    out = _run_script(
        SCRIPT, "--quick", "--target", str(smollm2_path), "--out", str(tmp_path), timeout=2400
    )
    results = json.loads((tmp_path / "quick.json").read_text())
    assert results["config"]["real_model"] and results["config"]["draft_dir"] is None
    assert results["config"]["block_drafter"].startswith("random weights")
    five = {("specjax", m) for m in ("plain", "block", "lookup")}
    five |= {("transformers", m) for m in ("plain", "lookup")}
    for rows in (results["rows"], results["workload_rows"]):
        found = {(r["framework"], r["method"], r["temperature"]) for r in rows if r["batch"] == 1}
        assert found == {(*s, t) for s in five for t in (0.0, 1.0)}
    assert not any(r["method"] == "draft" for r in results["rows"])  # no draft model
    assert {r["workload"] for r in results["workload_rows"]} == {"chat", "code-edit"}
    assert any(r["batch"] == 2 for r in results["rows"])
    assert all(r["tokens"] == 2 * 8 for r in results["rows"] if r["batch"] == 1)
    # The greedy check ran on every T=0 system and passed (the script exits 1 on a
    # mismatch), with no near-tie tolerated.
    checked = results["greedy_checked"]
    for fw, m in five:
        assert any(n.startswith(f"{fw} {m} ") and n.endswith(" T=0") for n in checked), (fw, m)
    assert results["near_ties"] == []
    keys = {t["target"] for t in results["targets"]}
    assert {"over_plain:best", "over_hf_fastest:best", "over_plain_t1:best"} <= keys
    assert {"realized_over_predicted:lookup", "verify_over_step"} <= keys
    assert all(t["value"] is not None for t in results["targets"])
    text = (tmp_path / "quick.md").read_text()
    assert text.strip() == out.strip()
    assert "agree token for token" in text
    assert "Targets:" in text and "| target | required | measured | met |" in text
    assert "| specjax target forward of 5 tokens / of 1 token" in text
    assert (
        "Assisted generation needs an assistant model; there is none for SmolLM2-135M, "
        "so it is not measured."
    ) in text
    assert (tmp_path / "quick_workloads.png").stat().st_size > 0


@pytest.mark.slow
def test_train_block_drafter_script_quick_run(tmp_path):
    """The script that made the shipped drafters runs every stage (bundled target)."""
    out_dir = tmp_path / "block"
    _run_script(TRAINING / "train_block_drafter.py", "--quick", "--no-progress",
                "--out", str(out_dir))  # fmt: skip
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
        for system in ("plain static batch", "plain refill", "spec γ=1 refill",
                       "spec adaptive refill"):  # fmt: skip
            assert (system, slots) in systems
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


def test_equal_outputs_pass():
    bench = _load_script()
    reference = [[1, 2, 3], [4, 5, 6]]
    # A large batch cycles through the prompts: row 2 is prompt 0 again.
    outputs = {"a": [[1, 2, 3], [4, 5, 6]], "b": [[1, 2, 3], [4, 5, 6], [1, 2, 3]]}
    assert bench.check_greedy_outputs(reference, outputs) == []


def test_mismatched_outputs_fail_loudly():
    bench = _load_script()
    reference = [[1, 2, 3], [4, 5, 6]]
    outputs = {"good": [[1, 2, 3], [4, 5, 6]], "bad": [[1, 2, 3], [4, 9, 6]], "short": [[1, 2]]}
    with pytest.raises(bench.GreedyMismatchError) as info:
        bench.check_greedy_outputs(reference, outputs, logit_gaps=lambda m: {"specjax": 0.5})
    found = {(m.system, m.prompt, m.position, m.expected, m.got) for m in info.value.mismatches}
    assert found == {("bad", 1, 1, 5, 9), ("short", 0, 2, 3, -1)}
    message = str(info.value)
    assert "bad: row 1 (prompt 1) differs at new token 1: expected 5, got 9" in message
    assert "specjax +5.000e-01" in message


def test_near_ties_are_tolerated_only_below_tie_tol():
    bench = _load_script()
    reference, outputs = [[1, 2, 3]], {"flip": [[1, 7, 7]]}

    def gaps(m):
        return {"specjax": 2e-6, "transformers": -1e-6}

    with pytest.raises(bench.GreedyMismatchError):
        bench.check_greedy_outputs(reference, outputs, logit_gaps=gaps)  # strict by default
    ties = bench.check_greedy_outputs(reference, outputs, logit_gaps=gaps, tie_tol=1e-5)
    assert [(m.position, m.expected, m.got) for m in ties] == [(1, 2, 7)]
    with pytest.raises(bench.GreedyMismatchError):  # no gap known: never a tolerated tie
        bench.check_greedy_outputs(reference, outputs, tie_tol=1e-5)


def test_main_exits_nonzero_on_mismatch(monkeypatch, capsys):
    bench = _load_script()

    def wrong(args):
        bench.check_greedy_outputs([[1, 2]], {"x": [[1, 3]]})

    monkeypatch.setattr(bench, "run_benchmark", wrong)
    assert bench.main(["--quick"]) == 1
    err = capsys.readouterr().err
    assert "FAIL" in err and "x: row 0 (prompt 0) differs at new token 1" in err


def test_costs_of_a_feature_drafter():
    """draft_cost / interleaved_cost build a feature drafter's state from the target's."""
    import jax

    import specjax
    from harness import draft_cost, interleaved_cost

    target = specjax.testing.tiny_model(seed=0)
    drafter = specjax.BlockDrafter.random(target, key=jax.random.key(0), num_draft=2)
    sampling = specjax.SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="target="):
        draft_cost(drafter, 1, 8, sampling, repeats=1, inner=1)
    seconds = interleaved_cost(target, drafter, 1, 8, sampling, repeats=1, inner=1)
    assert 0 < seconds < 60


def test_specjax_mismatches_are_never_tolerated_as_ties():
    bench = _load_script()
    reference, gaps = [[1, 2, 3]], (lambda m: {"specjax": 2e-6, "transformers": -1e-6})
    outputs = {"transformers lookup": [[1, 7, 7]], "specjax lookup": [[1, 2, 3]]}
    ties = bench.check_greedy_outputs(
        reference, outputs, logit_gaps=gaps, tie_tol=1e-5, strict={"specjax lookup"}
    )
    assert [m.system for m in ties] == ["transformers lookup"]
    outputs["specjax lookup"] = [[1, 7, 7]]  # the same near-tie, but within specjax
    with pytest.raises(bench.GreedyMismatchError, match="specjax lookup"):
        bench.check_greedy_outputs(
            reference, outputs, logit_gaps=gaps, tie_tol=1e-5, strict={"specjax lookup"}
        )


def test_helpers_for_real_targets():
    bench = _load_script()
    assert bench.model_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M"
    assert bench.model_name(Path("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf")) == "Qwen2.5-0.5B"
    # A large batch cycles through a workload's prompts to fill its last batch.
    assert bench.batches_of([1, 2, 3], 2) == [[1, 2], [3, 1]]
    assert bench.batches_of([1, 2, 3], 1) == [[1], [2], [3]]


def test_real_targets_judge_the_best_method_and_each():
    bench = _load_script()

    def row(framework, method, t, tok_s, speedup=None, rp=None):
        gamma = None if method == "plain" else 4
        keys = ("framework", "method", "temperature", "gamma", "tok_s", "speedup")
        values = (framework, method, t, gamma, tok_s, speedup)
        return dict(zip(keys, values, strict=True), batch=1, realized_over_predicted=rp)

    rows = [
        row("specjax", "plain", 0.0, 10.0),
        row("transformers", "plain", 0.0, 4.0),
        row("transformers", "lookup", 0.0, 5.0),  # transformers' fastest: the reference
        row("specjax", "lookup", 0.0, 25.0, 2.5, 0.95),
        row("specjax", "block", 0.0, 15.0, 1.5, 0.8),
        row("specjax", "plain", 1.0, 10.0),
        row("specjax", "lookup", 1.0, 11.0, 1.1),
        row("specjax", "block", 1.0, 17.0, 1.7),
    ]
    found = {t["target"]: t for t in bench.real_targets_of(rows, {"1": 10.0, "5": 12.0})}
    assert found["over_plain:best"]["system"] == "best (lookup γ=4)"
    assert found["over_plain:best"]["value"] == 2.5 and found["over_plain:best"]["met"]
    assert found["over_plain:block"]["met"] is False
    assert found["over_hf_fastest:best"]["value"] == 25.0 / 5.0
    assert found["over_plain_t1:best"]["system"] == "best (block γ=4)"  # fastest at T=1
    assert found["realized_over_predicted:best"]["value"] == 0.95
    verify = found["verify_over_step"]
    assert verify["value"] == 1.2 and verify["at_most"] and verify["met"]


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
