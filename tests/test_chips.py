"""`specjax.chips`: compiling for TPUs and GPUs from this CPU host, and its predictions.

The fast tier checks the pieces on small programs whose costs are known by
arithmetic (the HLO walk, the flops, the chip table), the report's keys and its
arithmetic (the predicted speedups recomputed here from the reported step costs with
E(γ) written out, not with `specjax.tuning.choose`), the clear message of a decode too
big for a chip, and the in-place cache write that TPUs and GPUs take. The ``aot``
tier (`tests/test_aot.py`) compiles every decoder configuration.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.chips import CHIPS, compile_for_chip
from specjax.chips.flops import dot_flops
from specjax.chips.hlo import host_transfers, loop_cost, program_cost
from specjax.chips.programs import AnalysisCache
from specjax.chips.table import chip
from specjax.models.attention import write_kv, write_rows

libtpu = pytest.importorskip("libtpu", reason="libtpu (the test extra) compiles for TPUs")

REPORT_KEYS = set(
    "chip devices fits hbm_bytes peak_bytes step_seconds step_bytes min_step_bytes "
    "acceptance predicted_speedup gamma".split()
)


def test_every_chip_has_positive_figures_a_source_and_its_devices():
    from specjax.chips.devices import devices

    for c in CHIPS.values():
        assert c.hbm_bytes > 2**30 and c.hbm_bandwidth > 1e11 and c.peak_flops > 1e13, c.name
        assert c.source.startswith("https://"), c.name
        if c.platform == "tpu":
            found = devices(c)
            assert len(found) == c.devices and {d.platform for d in found} == {"tpu"}
    with pytest.raises(ValueError, match="chip must be one of v5e-1"):
        chip("v9z-1")


def test_hlo_walk_counts_a_matmul_its_loop_trips_and_in_place_writes():
    x = jnp.ones((64, 32), jnp.float32)
    w = jnp.ones((32, 48), jnp.float32)
    cost = program_cost(jax.jit(lambda x, w: x @ w).lower(x, w).compile().as_text())
    assert cost.flops == 2 * 64 * 32 * 48
    assert cost.hbm_bytes == 4 * (64 * 32 + 32 * 48 + 64 * 48)

    def looped(x, w):  # seven trips of the same product
        return jax.lax.fori_loop(0, 7, lambda i, x: jnp.tanh(x @ w), x)

    square = jnp.ones((32, 32), jnp.float32)
    text = jax.jit(looped).lower(jnp.ones((64, 32)), square).compile().as_text()
    assert program_cost(text).flops == 7 * 2 * 64 * 32 * 32
    assert loop_cost(text).flops == 2 * 64 * 32 * 32

    def write(buf, row):  # in place: the row, not the 4 MB buffer
        return jax.lax.dynamic_update_slice(buf, row, (3, 0))

    buf, row = jnp.zeros((1024, 1024)), jnp.ones((1, 1024))
    text = jax.jit(write, donate_argnums=0).lower(buf, row).compile().as_text()
    assert program_cost(text).hbm_bytes <= 4 * 4 * 1024


def test_host_transfers_are_found_inside_loops_only():
    def clean(x):
        return jax.lax.fori_loop(0, 3, lambda i, x: x * 2, x)

    def chatty(x):
        def body(i, x):
            jax.debug.callback(lambda v: None, x)
            return x * 2

        return jax.lax.fori_loop(0, 3, body, x)

    x = jnp.ones(4)
    assert host_transfers(jax.jit(clean).lower(x).compile().as_text()) == []
    found = host_transfers(jax.jit(chatty).lower(x).compile().as_text())
    assert found and "custom-call" in found[0]


def test_dot_flops_counts_scans_and_the_dearest_branch():
    def f(x, w, p):
        y = jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=5)[0]
        return jax.lax.cond(p, lambda y: y @ w @ w, lambda y: y, y)

    x, w = jnp.ones((2, 8)), jnp.ones((8, 8))
    assert dot_flops(jax.make_jaxpr(f)(x, w, True)) == (5 + 2) * 2 * 2 * 8 * 8


@pytest.mark.parametrize("tokens", [1, 3, 5])
def test_the_block_write_equals_the_scatter_for_consecutive_slots(tokens):
    """`write_rows` (TPUs and GPUs) against the scatter (CPUs), rows near and past the
    cache's end included, where slots that do not exist are dropped."""
    rng = np.random.default_rng(tokens)
    layers, rows, heads, dim, slots = 3, 4, 2, 5, 16
    for _ in range(8):
        k = rng.standard_normal((layers, rows, heads, dim, slots)).astype(np.float32)
        v = rng.standard_normal((layers, rows, heads, slots, dim)).astype(np.float32)
        start = rng.integers(0, slots + 3, size=rows).astype(np.int32)
        new_k = rng.standard_normal((rows, tokens, heads, dim)).astype(np.float32)
        new_v = rng.standard_normal((rows, tokens, heads, dim)).astype(np.float32)
        layer = int(rng.integers(0, layers))
        at = start[:, None] + np.arange(tokens)[None]
        want = jax.jit(write_kv, static_argnums=2)(k, v, layer, at, new_k, new_v)
        got = jax.jit(write_rows, static_argnums=2)(k, v, layer, start, new_k, new_v)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_program_compiled_for_a_tpu_takes_the_tpu_forms():
    """The CPU's weight-first product pads and transposes behind a barrier; a program
    compiled on this CPU host for a TPU must not (`specjax.core.platform`)."""
    from jax.sharding import SingleDeviceSharding

    from specjax.chips.devices import devices
    from specjax.models.matmul import matmul_rows

    on_tpu = SingleDeviceSharding(devices(chip("v5e-1"))[0])
    x = jax.ShapeDtypeStruct((3, 128), jnp.float32, sharding=on_tpu)
    w = jax.ShapeDtypeStruct((256, 128), jnp.float32, sharding=on_tpu)
    tpu = jax.jit(matmul_rows).lower(x, w).as_text()
    cpu = jax.jit(matmul_rows).lower(jnp.ones((3, 128)), jnp.ones((256, 128))).as_text()
    assert "optimization_barrier" in cpu and "optimization_barrier" not in tpu


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    target, draft, _ = specjax.default_pair(jnp.bfloat16)
    return compile_for_chip(
        "v5e-1",
        target,
        specjax.DraftModel(draft, num_draft=2),
        prompt_length=16,
        max_new_tokens=32,
        acceptance=(0.9, 0.5),
        cache=AnalysisCache(tmp_path_factory.mktemp("chips")),
        workers=2,
    )


def test_report_has_the_stable_json_keys(report):
    data = json.loads(json.dumps(report.to_json()))
    assert REPORT_KEYS <= set(data)
    assert data["chip"] == "v5e-1" and data["devices"] == 1 and data["fits"] is True
    assert data["hbm_bytes"] == 16 * 2**30 and 0 < data["peak_bytes"] < data["hbm_bytes"]
    for key in ("step_seconds", "step_bytes", "min_step_bytes", "predicted_speedup"):
        assert set(data[key]) == {"0", "1", "2"}, key
    assert data["acceptance"] == [0.9, 0.5] and data["gamma"] in (0, 1, 2)
    assert data["host_transfers"] == []
    # The plain step reads the weights and the cache and not much more (less where the
    # weights stay on chip between steps, as a model this small can).
    assert 0 < data["step_bytes"]["0"] <= 1.5 * data["min_step_bytes"]["0"]


def test_predicted_speedup_is_tokens_per_step_over_the_step_cost(report):
    """Recomputed from the reported costs: a γ step costs the target's forward at width
    γ + 1 plus the drafts, and emits E(γ) = 1 + Σ_k Π_{i<=k} α_i tokens."""
    data = report.to_json()
    seconds, alpha = data["step_seconds"], data["acceptance"]
    for g in range(3):
        tokens = 1 + sum(math.prod(alpha[:k]) for k in range(1, g + 1))
        want = tokens / seconds[str(g)] * seconds["0"]
        assert data["predicted_speedup"][str(g)] == pytest.approx(want, rel=1e-9)
    best = max(range(3), key=lambda g: data["predicted_speedup"][str(g)])
    gain = data["predicted_speedup"][str(best)]
    assert data["gamma"] == (best if gain >= specjax.tuning.MIN_GAIN else 0)
    # What gamma="auto" would choose on this machine from the same numbers.
    from specjax.tuning import StepCosts, choose

    target_s = [data["target_step_seconds_by_width"][str(w)] for w in (1, 2, 3)]
    draft_s = [seconds[str(g)] - target_s[g] for g in (1, 2)]
    choice = choose(StepCosts(tuple(target_s), tuple(max(d, 0.0) for d in draft_s)), alpha)
    assert choice.gamma == data["gamma"]
    assert list(choice.speedups) == pytest.approx(
        [data["predicted_speedup"][str(g)] for g in range(3)]
    )


def test_a_decode_too_big_for_the_chip_gets_one_message_naming_what_to_change(tmp_path):
    model = specjax.testing.tiny_model(seed=0)
    big = dict(batch_size=2**17, prompt_length=128, max_new_tokens=128)
    report = compile_for_chip("v5e-1", model, None, cache=AnalysisCache(tmp_path), **big)
    assert not report.fits
    message = report.message
    for words in ("GiB per device", "--batch-size", "--max-new-tokens", "--chip v5e-4"):
        assert words in message, message
    assert report.to_json()["fits"] is False


@pytest.mark.slow
def test_the_command_reports_json_and_refuses_bad_flags_in_one_line(capsys, tmp_path, monkeypatch):
    from specjax.cli import main

    monkeypatch.setenv("SPECJAX_CHIP_CACHE", str(tmp_path))
    assert main(["compile", "--chip", "v9z-1"]) == 2
    assert "--chip must be one of" in capsys.readouterr().err
    assert main(["compile", "--acceptance", "0.5,2"]) == 2
    assert "--acceptance takes probabilities in [0, 1]" in capsys.readouterr().err
    args = ["compile", "--gamma", "1", "--acceptance", "0.7", "--json", "--quiet"]
    args += ["--prompt-length", "8", "--max-new-tokens", "8"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert REPORT_KEYS <= set(data) and set(data["step_seconds"]) == {"0", "1"}


def test_abstract_models_have_the_loaded_models_shapes():
    from specjax.io.abstract import abstract_pretrained
    from specjax.io.hf import load_pretrained
    from specjax.io.pretrained import default_pair_path
    from specjax.models.quant import quantize

    folder = default_pair_path() / "target"
    for mode in (None, "int8"):
        weightless = abstract_pretrained(folder, jnp.bfloat16, quantize=mode)
        loaded = load_pretrained(folder, jnp.bfloat16)
        loaded = quantize(loaded, mode) if mode else loaded
        shapes = lambda m: jax.tree.map(lambda x: (x.shape, x.dtype), m.params)  # noqa: E731
        assert shapes(weightless) == shapes(loaded)
        assert weightless.graphdef == loaded.graphdef
