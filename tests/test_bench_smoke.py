"""scripts/bench_e2e.py: the quick run works end to end, and wrong outputs fail loudly."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_e2e.py"


def _load_script():
    if "bench_e2e" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_e2e"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["bench_e2e"]


def _run_script(path: Path, *args: str) -> str:
    """Runs a script on CPU; its stdout, after asserting it exited 0."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, env=env, timeout=600
    )
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
    results = json.loads((tmp_path / "results.json").read_text())
    systems = {(r["framework"], r["method"], r["batch"]) for r in results["rows"]}
    assert {("transformers", m, 1) for m in ("plain", "draft", "lookup")} <= systems
    assert {("specjax", m, 4) for m in ("plain", "draft", "lookup")} <= systems
    assert [r["gamma"] for r in results["sweep"]] == [1, 2]
    assert all(r["tokens"] == 2 * 12 for r in results["rows"] if r["batch"] == 1)
    for name in ("gamma_sweep.png", "throughput.png", "block_sweep.png", "results.md"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_quick_run_covers_the_block_drafter(quick_run):
    out, tmp_path = quick_run
    assert "Block-size sweep" in out and "block γ=2:" in out  # table and diagnosis
    results = json.loads((tmp_path / "results.json").read_text())
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
    assert (tmp_path / "block_sweep.png").stat().st_size > 0


@pytest.mark.slow
def test_profile_script_quick_run_prints_ops_and_breakdown():
    out = _run_script(SCRIPT.parent / "profile_decode.py", "--quick", "--top", "5")
    assert "draft decoding, batch 1" in out and "ms/step median" in out
    assert "per-op profile" in out and "cost breakdown" in out
    assert "loop machinery (trivial models, min)" in out


@pytest.mark.slow
def test_reproducible_script_quick_run(tmp_path):
    out = _run_script(
        SCRIPT.parent / "bench_reproducible.py", "--quick", "--json", str(tmp_path / "r.json")
    )
    assert "loop  plain" in out and "noise V=" in out and "coupled == plain: True" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert all(r["coupled_equals_plain"] for r in report["coupled"])
    assert {r["decoder"] for r in report["loop"]} == {"plain", "speculative"}


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
    from specjax.benchmarking import draft_cost, interleaved_cost

    target = specjax.testing.tiny_model(seed=0)
    drafter = specjax.BlockDrafter.random(target, key=jax.random.key(0), num_draft=2)
    sampling = specjax.SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="target="):
        draft_cost(drafter, 1, 8, sampling, repeats=1, inner=1)
    seconds = interleaved_cost(target, drafter, 1, 8, sampling, repeats=1, inner=1)
    assert 0 < seconds < 60
