"""Compiles every decoder configuration for one chip; writes a JSON report.

Started by ``tests/test_aot.py`` in a subprocess: a GPU is described by jax's CUDA
plugin, which the suite loads only here (it is put on ``PYTHONPATH`` for this process,
so that no other test process loads it), and jax must not try to run on it
(``JAX_PLATFORMS=cpu``). Runnable by hand::

    JAX_PLATFORMS=cpu python tests/aot_worker.py v5e-1 /tmp/report.json

For each configuration of `CONFIGS` (the bundled pair: plain decoding, every drafter,
a tree, continuous batching, penalties, stop strings, a constraint; bfloat16, float32
and int8) it compiles the decode loop (and prefill once) for the chip and records
whether it compiled, its memory per device, and the host transfers inside its loops;
for each precision, the plain step's HBM bytes against the weights and cache it
must read, with the instructions that read the most.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp

import specjax
from specjax.chips.compile import compile_decoder
from specjax.chips.programs import AnalysisCache, OutOfMemory
from specjax.io.pretrained import default_drafter
from specjax.models import Model, ModelConfig
from specjax.models.quant import quantize
from specjax.verification.tree import Tree

PROMPT, NEW, BATCH = 16, 32, 2
# Random weights (2 MB) and a cache of 16 rows of 8k tokens (1 GB), more than a
# TPU's on-chip memory even split over 4 chips.
LONG_CACHE = Model.random(
    ModelConfig(
        num_layers=8,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=128,
        max_position_embeddings=8192,
    ),
    dtype=jnp.bfloat16,
)
PRECISIONS = {"bfloat16": (jnp.bfloat16, None), "float32": (jnp.float32, None)}
PRECISIONS["int8"] = (jnp.bfloat16, "int8")


def _pair(precision: str):
    dtype, mode = PRECISIONS[precision]
    target, draft, tokenizer = specjax.default_pair(dtype)
    if mode:
        target, draft = quantize(target, mode), quantize(draft, mode)
    return target, draft, tokenizer


def configurations(precision: str):
    """``{name: (target, drafter, options)}`` of the decoders compiled at ``precision``."""
    target, draft, tokenizer = _pair(precision)
    model = specjax.DraftModel(draft, num_draft=3)
    out = {"plain": (target, None, {}), "draft model": (target, model, {})}
    if precision != "bfloat16":
        return out
    dtype = PRECISIONS[precision][0]
    sampled = specjax.SamplingConfig(temperature=1.0, top_p=0.9)
    penalties = specjax.SamplingConfig(
        temperature=0.8, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3
    )
    out |= {
        "block drafter": (target, default_drafter("block", dtype=dtype), {}),
        "EAGLE head": (target, default_drafter("eagle", dtype=dtype), {}),
        "prompt lookup": (target, specjax.PromptLookup(num_draft=3), {}),
        "tree": (target, model.with_tree(Tree.parse("2,2")), {}),
        "refill": (target, model, {"num_prompts": 2 * BATCH}),
        "sampled": (target, model, {"sampling": sampled}),
        "penalties": (target, model, {"sampling": penalties}),
        "stop strings": (target, model, {"stop": ["\n\n", "return"]}),
        "constraint": (
            target,
            model,
            {"constraint": specjax.Constraint.regex(r"[a-z_]+\(", tokenizer, target.vocab_size)},
        ),
    }
    return out


def _result(analysis) -> dict:
    if isinstance(analysis, OutOfMemory):
        return {"out_of_memory": analysis.detail}
    return {
        "peak_bytes": analysis.peak_bytes,
        "hbm_bytes": analysis.hbm_bytes,
        "host_transfers": list(analysis.host_transfers),
        "top_ops": list(analysis.top_ops),
        "compile_seconds": analysis.compile_seconds,
    }


def _rows_split(chip: str):
    """A mesh that splits the rows over the chips of a slice (None: one chip)."""
    from specjax.chips.table import chip as chip_of

    devices = chip_of(chip).devices
    return None if devices == 1 else (devices // 2, 2)


def run(chip: str, cache_dir: str, mesh=None) -> dict:
    cache = AnalysisCache(cache_dir)
    report = {"chip": chip, "configs": {}, "steps": {}, "jax": jax.__version__}
    start = time.perf_counter()
    for precision in PRECISIONS:
        for name, (target, drafter, options) in configurations(precision).items():
            programs = ("init", "run", "step") if name == "plain" else ("run",)
            t0 = time.perf_counter()
            compiled = compile_decoder(
                chip,
                target,
                drafter,
                # The plain step's bytes at batch 1: what a decode must read is the weights.
                batch_size=1 if name == "plain" else BATCH,
                prompt_length=PROMPT,
                max_new_tokens=NEW,
                mesh=mesh,
                programs=programs,
                cache=cache,
                workers=2,
                **options,
            )
            key = f"{precision} {name}"
            report["configs"][key] = {
                program: _result(a) for program, a in compiled.analyses.items() if program != "step"
            }
            report["configs"][key]["seconds"] = time.perf_counter() - t0
            if "step" in compiled.analyses:
                report["steps"][precision] = {
                    "min_bytes": compiled.min_step_bytes,
                    **_result(compiled.analyses["step"]),
                }
            print(f"{chip} {key}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    # Rows of a cache larger than the weights (and than a TPU's on-chip memory), split
    # over the chips of a slice: a write that indexed the rows with a traced number
    # would gather the whole cache at every layer.
    if _rows_split(chip) is not None:
        rows = compile_decoder(
            chip,
            LONG_CACHE,
            None,
            batch_size=16,
            prompt_length=PROMPT,
            max_new_tokens=LONG_CACHE.config.max_position_embeddings - PROMPT,
            mesh=_rows_split(chip) if mesh is None else mesh,
            programs=("step",),
            cache=cache,
        )
        report["steps"]["bfloat16, 16 rows of a long cache"] = {
            "min_bytes": rows.min_step_bytes,
            **_result(rows.analyses["step"]),
        }
    report["seconds"] = time.perf_counter() - start
    return report


def pod_slice(cache_dir: str) -> dict:
    """The sharded decoder on 256 chips of 64 hosts (v5e:16x16), once."""
    target, draft, _ = _pair("bfloat16")
    compiled = compile_decoder(
        "v5e-256",
        target,
        specjax.DraftModel(draft, num_draft=3),
        batch_size=128,
        prompt_length=PROMPT,
        max_new_tokens=NEW,
        mesh=(128, 2),
        programs=("init", "run"),
        cache=AnalysisCache(cache_dir),
        workers=2,
    )
    return {"mesh": list(compiled.mesh), **{p: _result(a) for p, a in compiled.analyses.items()}}


if __name__ == "__main__":
    chip, out, cache_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    if chip == "v5e-256":
        result = pod_slice(cache_dir)
    else:
        result = run(chip, cache_dir)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
