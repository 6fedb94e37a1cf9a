"""The ``aot`` tier: every decoder configuration compiled for a TPU, a TPU slice and a GPU.

``pytest -m aot`` (CI runs it after the slow tier). Each chip is compiled for in a
process of its own (`tests/aot_worker.py`): Colab's ``v5e-1``, a sharded ``v5e-4``
(specjax's own sharding rules over its 2 x 2 mesh) and an ``h100``, plus the
sharded decoder once on a 256-chip, 64-host ``v5e:16x16`` slice. For every
configuration (plain decoding, the draft model, the block drafter, the EAGLE head,
prompt lookup, a tree, continuous batching with refill, sampling, penalties, stop
strings, a constraint; bfloat16, float32 and int8) it asserts that the decoder
compiles within the chip's memory and that its loops hold no host callback or
transfer; for each precision, and on the slice in bfloat16 for 16 rows of a cache
larger than the weights split over its chips, that the plain step reads at most 1.5
times the weights and the cache it must read, naming the instructions that read the
most where it does not.

libtpu comes with the test extra. jax's CUDA plugin is downloaded once into the
specjax cache (``pip download``) and put on this tier's GPU worker's ``PYTHONPATH``
only: loaded in every process, it would print its missing-driver notices in each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import jax
import pytest

pytestmark = pytest.mark.aot

WORKER = Path(__file__).with_name("aot_worker.py")
TPU_CHIPS = ["v5e-1", "v5e-4"]
STEP_BOUND = 1.5  # the plain step's HBM bytes over its weights and cache, at most


def _cuda_plugin() -> Path:
    """A folder holding jax's CUDA plugin for this jax, fetched once into the cache."""
    from specjax.core.paths import cache_root

    folder = cache_root() / "jax-cuda-plugin" / jax.__version__
    if (folder / "jax_plugins" / "xla_cuda12").is_dir():
        return folder
    wheels = folder.with_name(f"{jax.__version__}.wheels")
    wheels.mkdir(parents=True, exist_ok=True)
    packages = [f"jax-cuda12-plugin=={jax.__version__}", f"jax-cuda12-pjrt=={jax.__version__}"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)] + packages,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot fetch jax's CUDA plugin ({' '.join(packages)}): {done.stderr[-300:]}")
    partial = folder.with_name(f"{jax.__version__}.partial")
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial)
    partial.rename(folder)
    return folder


def _run_worker(chip: str, tmp_path: Path, extra_path: Path | None = None) -> dict:
    pytest.importorskip("libtpu", reason="libtpu (the test extra) compiles for TPUs")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    out = tmp_path / f"{chip}.json"
    cache = tmp_path / "analyses"
    done = subprocess.run(
        [sys.executable, str(WORKER), chip, str(out), str(cache)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def _check(report: dict) -> None:
    problems = []
    for name, programs in report["configs"].items():
        for program, result in programs.items():
            if not isinstance(result, dict):
                continue
            if "out_of_memory" in result:
                problems.append(f"{name} {program}: does not fit: {result['out_of_memory']}")
            elif result["host_transfers"]:
                problems.append(f"{name} {program}: host transfers {result['host_transfers']}")
    for precision, step in report["steps"].items():
        ratio = step["hbm_bytes"] / step["min_bytes"]
        # A GPU keeps no weights on chip between steps: a step reads them all (a TPU
        # may keep a model this small in its on-chip memory).
        if report["chip"].startswith("h") and ratio < 0.9:
            problems.append(f"{precision} plain step reads {ratio:.2f}x its weights and cache")
        if ratio > STEP_BOUND:
            top = "\n    ".join(step["top_ops"])
            problems.append(
                f"{precision} plain step reads {ratio:.2f}x its weights and cache "
                f"({step['hbm_bytes'] / 1e6:.1f} MB); the most:\n    {top}"
            )
    assert not problems, f"{report['chip']}:\n" + "\n".join(problems)
    expected = {"bfloat16", "float32", "int8"}
    if report["chip"] == "v5e-4":
        expected.add("bfloat16, 16 rows of a long cache")
    assert set(report["steps"]) == expected
    names = {name.split(" ", 1)[1] for name in report["configs"]}
    configs = "plain|draft model|block drafter|EAGLE head|prompt lookup|tree|refill|penalties"
    for config in [*configs.split("|"), "stop strings", "constraint"]:
        assert config in names, config


# One xdist group each: the chips compile on as many cores as there are.
@pytest.mark.parametrize(
    "chip", [pytest.param(c, marks=pytest.mark.xdist_group(c)) for c in TPU_CHIPS]
)
def test_every_configuration_compiles_for_a_tpu(chip, tmp_path):
    _check(_run_worker(chip, tmp_path))


@pytest.mark.xdist_group("h100")
def test_every_configuration_compiles_for_an_h100(tmp_path):
    _check(_run_worker("h100", tmp_path, _cuda_plugin()))


@pytest.mark.xdist_group("v5e-256")
def test_the_sharded_decoder_compiles_for_a_pod_slice_of_64_hosts(tmp_path):
    report = _run_worker("v5e-256", tmp_path)
    assert report["mesh"] == [128, 2]
    for program in ("init", "run"):
        result = report[program]
        assert "out_of_memory" not in result, result
        assert 0 < result["peak_bytes"] < 16 * 2**30
        assert result["host_transfers"] == []
        print(f"v5e-256 {program}: {result['peak_bytes'] / 2**20:.1f} MiB per device")
