"""Sharded decoding: same tokens as one device, and arrays sharded as documented.

The mesh checks need 8 devices, and XLA fixes the device count when JAX
starts, so they run in one subprocess (``tests/sharding_worker.py``) with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``; this process keeps
its single CPU device. The subprocess writes a JSON report that the tests
below read, one assertion topic per test. They are marked slow (about a
minute of compiling, shared by all of them); the rule checks at the end are not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from specjax.models import sharding
from specjax.testing import tiny_model

WORKER = Path(__file__).with_name("sharding_worker.py")
# Pure data, mixed and pure model parallel (a second mixed shape, 2x4, cost a quarter
# of the worker's compile time and no rule these three leave unchecked).
MESHES = ["8x1", "4x2", "1x8"]
# The worker compiles ~10 decode programs. XLA's CPU backend optimisations
# only cost compile time here (tiny shapes), so they are turned off; both the
# sharded and the single-device programs are compiled the same way.
XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 "
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharding") / "report.json"
    env = dict(os.environ, XLA_FLAGS=XLA_FLAGS, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"sharding worker failed:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    return json.loads(path.read_text())


@pytest.mark.slow
def test_worker_saw_eight_devices(report):
    assert report["devices"] == 8


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_sharded_decoding_matches_single_device(report, mesh):
    """Plain and speculative (DraftModel), greedy and sampled with one key: same tokens."""
    match = report["meshes"][mesh]["match"]
    assert set(match) == {
        "generate_greedy",
        "generate_sampled",
        "speculative_greedy",
        "speculative_sampled",
    }
    assert all(match.values()), match


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_params_placed_by_rules(report, mesh):
    rec = report["meshes"][mesh]
    assert all(rec["params_ok"].values()), rec["params_spec"]
    assert rec["draft_q_ok"] and rec["draft_embed_ok"] and rec["prompts_ok"]
    # The q projection [H*D, E] really is split into H*D / model-size rows per device.
    model_size = rec["shape"][1]
    assert rec["q_shard_shape"] == [rec["q_shape"][0] // model_size, rec["q_shape"][1]]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_caches_sharded_under_jit(report, mesh):
    """Caches built by init_cache under jit, and carried out of both decode loops."""
    rec = report["meshes"][mesh]
    assert rec["init_cache_ok"], rec["init_cache_spec"]
    assert all(rec["loop_cache_ok"].values()), rec["loop_cache_spec"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_a_split_cache_is_written_row_by_row_on_each_chip(report, mesh):
    """TPUs and GPUs write a cache's rows in place one by one; on rows split over chips
    each chip writes its own (`split_cache_writes`), equal to the scatter."""
    assert report["meshes"][mesh]["split_write_equal"]


@pytest.mark.slow
def test_cache_split_by_batch_and_heads(report):
    rec = report["meshes"]["4x2"]
    assert rec["init_cache_spec"] == "P(None, 'data', 'model')"
    assert rec["loop_cache_spec"]["target"] == "P(None, 'data', 'model')"


@pytest.mark.slow
def test_indivisible_kv_heads_raise_by_default_then_replicate(report):
    rec = report["meshes"]["1x8"]
    assert rec["default_error"].startswith(
        "num_kv_heads=4 is not divisible by mesh axis 'model' of size 8"
    )
    # Fallback: only the k/v projections and the cache's head axis are whole.
    assert sorted(rec["replicated"]) == sorted(
        [f"layers/{i}/self_attn/{p}_proj/weight" for i in range(2) for p in "kv"] + ["kv_cache"]
    )
    assert rec["params_spec"]["layers/0/self_attn/q_proj/weight"] == "P('model', None)"
    assert rec["params_spec"]["layers/0/self_attn/k_proj/weight"] == "P(None, None)"


@pytest.mark.slow
def test_batch_and_axis_errors(report):
    errors = report["errors"]
    expected = "batch_size=6 is not divisible by mesh axis 'data' of size 4"
    assert errors["shard_prompts_batch"].startswith(expected)
    assert errors["cache_batch"].startswith(expected)
    assert "equal length" in errors["ragged"]
    assert errors["axis_name"] == "model axis 'tp' is not an axis of the mesh ('data', 'model')"
    # indivisible="replicate" keeps such a batch whole and still splits the heads.
    assert errors["replicated_batch_spec"] == "P(None, None, 'model')"


# ----------------------------------------------------------------------------
# Rules alone, in this process (an abstract mesh needs no devices).


def test_partition_specs_follow_rules_and_name_the_dimension():
    model = tiny_model(seed=0, num_heads=8, num_kv_heads=2, hidden_size=32)
    mesh = AbstractMesh((2, 4), ("data", "model"))
    with pytest.raises(ValueError, match="num_kv_heads=2 is not divisible by mesh axis 'model'"):
        sharding.param_partition_specs(model.params, mesh, config=model.config)
    specs, replicated = sharding.param_partition_specs(
        model.params, mesh, config=model.config, indivisible="replicate"
    )
    attn = specs["layers"][1]["self_attn"]
    assert attn["q_proj"]["weight"].get_value() == P("model", None)
    assert attn["k_proj"]["weight"].get_value() == P(None, None)
    assert specs["layers"][1]["mlp"]["down_proj"]["weight"].get_value() == P(None, "model")
    assert specs["norm"]["weight"].get_value() == P()
    assert "layers/1/self_attn/v_proj/weight" in replicated
    specs, replicated = sharding.param_partition_specs(model.params, mesh, model_axis=None)
    assert replicated == () and specs["lm_head"]["weight"].get_value() == P()
    # Scanned, every layer leaf has a leading [L] axis, which is never split.
    scanned = model.with_scan_layers()
    specs, _ = sharding.param_partition_specs(
        scanned.params, mesh, config=model.config, indivisible="replicate"
    )
    attn = specs["layers"]["self_attn"]
    assert attn["q_proj"]["weight"].get_value() == P(None, "model", None)
    assert specs["layers"]["mlp"]["down_proj"]["weight"].get_value() == P(None, None, "model")


def test_error_names_every_indivisible_dimension():
    model = tiny_model(seed=0, vocab_size=60)  # 4 heads, 2 kv heads, F=64
    mesh = AbstractMesh((1, 8), ("data", "model"))
    with pytest.raises(ValueError) as info:
        sharding.param_partition_specs(model.params, mesh, config=model.config)
    msg = str(info.value)
    for dim in ("num_heads=4", "num_kv_heads=2"):
        assert f"{dim} is not divisible by mesh axis 'model' of size 8" in msg
    assert "intermediate_size" not in msg
    assert "vocab_size=60 is not divisible by mesh axis 'model' of size 8 (parameter embed_" in msg
    with pytest.raises(ValueError, match="indivisible must be one of"):
        sharding.param_partition_specs(model.params, mesh, indivisible="ignore")


def test_make_mesh_checks_sizes():
    mesh = sharding.make_mesh()
    assert mesh.axis_names == ("data", "model") and mesh.devices.size >= 1
    with pytest.raises(ValueError, match="needs 2 devices"):
        sharding.make_mesh(2, 1, devices=mesh.devices.flat[:1])
