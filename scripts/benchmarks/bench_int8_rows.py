#!/usr/bin/env python
"""What an int8-weight matmul costs XLA:CPU at 1 to 8 rows, formulation by formulation,
and what a real model's int8 forward costs at widths 1 to 5.

A speculative step verifies γ drafts in one target forward W = γ + 1 tokens wide, and it
pays only if that forward costs about what a one-token forward does. In the ``"int8"``
mode of `specjax.models.quant` every weight product is an int8 matrix times W rows of
activations, and XLA:CPU picks its kernel by the operands' dtypes, layouts and row
count, so the way the product is written sets its cost per row. Three parts:

1. **Per matrix.** Every matmul shape of Qwen2.5-Coder-1.5B (hidden 1536, intermediate
   8960) and of the 0.5B (896, 4864): q/o, k/v, the fused q|k|v and gate|up products
   that specjax runs, gate/up, down and the 151936-row LM head, with random int8
   weights and a float32 scale per output row, at 1, 2, 3, 4, 5 and 8 rows, in each
   formulation of `FORMULATIONS`: quant.py's own product (``current``), the weight
   stored ``[out, in]`` or ``[in, out]``, the weight as the dot's left operand
   (``weight-first``: ``w · xᵀ → [O, M]``, transposed after an optimization barrier),
   the output features split into four products, and the int8 weights converted to
   float32 or bfloat16 inside the jitted product. Reported: the median time, its ratio
   to the formulation's own 1-row time and to ``current``'s 1-row time, whether row i
   of a W-row product is bit-identical to row i computed alone (the exactness between
   widths the int8 decoders rely on), and whether the values are bit-identical to
   ``current``'s. A formulation whose program is ``current``'s (same jaxpr at every row
   count) is not timed again but listed as such; on the LM head, formulations over
   ``--prune`` times ``current`` at 1 and 2 rows on every other matrix are left out.
   The products' times are then summed per model as one forward runs them (each
   layer's q|k|v, o, gate|up and down, plus the head).
2. **XLA:CPU flags.** A few formulations again, in one subprocess per entry of
   `FLAG_SETS` (``XLA_FLAGS`` is read once per process), each with that process's own
   ``current`` as its baseline.
3. **Per model.** specjax's own int8 forward (``Model.__call__``, batch 1, on a KV cache
   holding a 64-token prompt) of the fetched Qwen2.5-Coder models at widths 1 to 5,
   with quant.py's product and with the other formulations of ``--model-forms`` put in
   its place (the same forward; only the product differs; by default the row-first
   ``i8_rowfirst`` and ``i8_weightfirst_to4``, weight-first up to 4 rows), and whether
   the logits are bit-identical to ``current``'s and row 0's to the width-1 forward's.

Timing: a compile and warm-up calls first, then rounds; in each round every case of one
matrix (or one model) is timed once, in a new random order, and the reported time is
the median over rounds. A sample of a very small product is several calls, divided. The
machine may be shared with other work, so only medians are reported and the load
average is recorded before and after; compare formulations within one run.

Writes ``scripts/benchmarks/results/int8_rows/<host-kind>.json`` (host kind from the CPU's
name and core count, e.g. ``cpu-amd-epyc-2core``) with the date, the commit, the
command, the machine and jax's version, and prints the tables. The models are fetched
by ``specjax fetch qwen2.5-coder-1.5b`` (and ``qwen2.5-coder-0.5b``).

    python scripts/benchmarks/bench_int8_rows.py            # full run, 11-15 minutes
    python scripts/benchmarks/bench_int8_rows.py --quick    # 0.5B only, about 5 minutes
    python scripts/benchmarks/bench_int8_rows.py --no-models --no-flags --shapes 1.5b:gate_up
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the checkout
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from harness.machine import RESULTS, cpu_name, run_record  # noqa: E402
from specjax.models import quant  # noqa: E402
from specjax.models.quant import quantize_rows  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 8)
CHECK_ROWS = (0, 1, 2, 3, 4, 7)  # rows compared with the same row computed alone
PROMPT_LEN, CACHE_LEN = 64, 128  # the model part's KV cache
SHARED_NOTE = (
    "The machine may be shared with other work: times are medians over interleaved "
    "rounds; compare formulations within one run, not across runs."
)

# The products quant.py's forward runs, bound now: part 3 puts others in its place.
_CURRENT_PRODUCT = quant._int8_matmul


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The matmul dimensions of one model (from its config)."""

    name: str  # the fetch name
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int

    def matrices(self) -> list[tuple[str, int, int, int]]:
        """``(name, out, in, products per forward)``: the matrices a forward multiplies.

        specjax fuses q|k|v and gate|up (`specjax.models.quant.quantize`); the separate
        q/k/v and gate/up shapes are listed with 0 products per forward (o_proj shares
        q_proj's shape and is counted there).
        """
        e, f, kv = self.hidden, self.intermediate, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        return [
            ("q_proj/o_proj", q, e, self.layers),
            ("k_proj/v_proj", kv, e, 0),
            ("qkv_fused", q + 2 * kv, e, self.layers),
            ("gate_proj/up_proj", f, e, 0),
            ("gate_up_fused", 2 * f, e, self.layers),
            ("down_proj", e, f, self.layers),
            ("lm_head", self.vocab, e, 1),
        ]


MODELS = {
    "1.5b": ModelShape("qwen2.5-coder-1.5b", 1536, 8960, 12, 2, 128, 28, 151936),
    "0.5b": ModelShape("qwen2.5-coder-0.5b", 896, 4864, 14, 2, 64, 24, 151936),
}


# --------------------------------------------------------------------------- formulations


def _pad_to_two(x_MI: jax.Array) -> jax.Array:
    """Two rows for a one-row input (the second zero): XLA:CPU's one-row int8 and bf16
    dots take a path that converts the whole weight first."""
    return jnp.concatenate([x_MI, jnp.zeros_like(x_MI)], axis=0) if x_MI.shape[0] == 1 else x_MI


def _dims(lhs: int, rhs: int):
    return (((lhs,), (rhs,)), ((), ()))


def int8_product(weight_first: bool, layout: str, pad: bool = True, chunks: int = 1):
    """An exact int8 × int8 → int32 product with per-row activation scales.

    Args:
        weight_first: the weight is the dot's left operand (``w · xᵀ → [O, M]``, kept
            apart from the transpose back by an optimization barrier, else XLA folds
            the transpose into the dot and picks the row-first kernel); else
            ``x · wᵀ → [M, O]``.
        layout: ``"OI"`` (the weight stored ``[out, in]``, as specjax stores it) or
            ``"IO"`` (``[in, out]``).
        pad: a one-row input is padded to two rows.
        chunks: the output features are split into this many products.
    """
    w_in = 1 if layout == "OI" else 0  # the weight's contracted axis
    w_out = 1 - w_in

    def product(x_MI, w, scale_O):
        rows = x_MI.shape[0]
        xq_MI, xs_M = quantize_rows(x_MI)
        if pad:
            xq_MI = _pad_to_two(xq_MI)
        accs = []
        for part in jnp.split(w, chunks, axis=w_out) if chunks > 1 else [w]:
            if weight_first:
                acc_OM = jax.lax.dot_general(
                    part, xq_MI, _dims(w_in, 1), preferred_element_type=jnp.int32
                )
                accs.append(jax.lax.optimization_barrier(acc_OM).T)
            else:
                accs.append(
                    jax.lax.dot_general(
                        xq_MI, part, _dims(1, w_in), preferred_element_type=jnp.int32
                    )
                )
        acc_MO = (accs[0] if chunks == 1 else jnp.concatenate(accs, axis=1))[:rows]
        return acc_MO.astype(jnp.float32) * xs_M[:, None] * scale_O[None, :]

    return product


def dequant_product(dtype, weight_first: bool, pad: bool):
    """The int8 weight converted to ``dtype`` inside the product, summed in float32, and
    scaled per output row (``dtype`` float32 unpadded and row-first is quant.py's
    ``"int8-weights"`` mode)."""

    def product(x_MI, w_OI, scale_O):
        rows = x_MI.shape[0]
        x = x_MI.astype(dtype)
        x = _pad_to_two(x) if pad else x
        w = w_OI.astype(dtype)
        if weight_first:
            y_OM = jax.lax.dot_general(w, x, _dims(1, 1), preferred_element_type=jnp.float32)
            y_MO = jax.lax.optimization_barrier(y_OM).T
        else:
            y_MO = jax.lax.dot_general(x, w, _dims(1, 1), preferred_element_type=jnp.float32)
        return y_MO[:rows] * scale_O[None, :]

    return product


def up_to(rows: int, few: Callable, many: Callable) -> Callable:
    """``few`` for at most ``rows`` rows, ``many`` for more."""
    return lambda x_MI, w, scale_O: (few if x_MI.shape[0] <= rows else many)(x_MI, w, scale_O)


def wider_in(wide: Callable, other: Callable) -> Callable:
    """``wide`` for a weight with more inputs than outputs, ``other`` for the rest."""
    return lambda x_MI, w, scale_O: (wide if w.shape[1] > w.shape[0] else other)(x_MI, w, scale_O)


@dataclasses.dataclass(frozen=True)
class Formulation:
    fn: Callable  # (x float32[M, I], weight, scale float32[O]) -> float32[M, O]
    layout: str  # the weight's storage: "OI" ([out, in]) or "IO" ([in, out])
    about: str


FORMULATIONS = {
    "current": Formulation(
        lambda x, w, s: _CURRENT_PRODUCT(x, w, s), "OI", "quant.py's own int8 product"
    ),
    "i8_rowfirst": Formulation(
        int8_product(False, "OI"), "OI", "x_q · qᵀ, q [O,I], int32; 1 row padded to 2"
    ),
    "i8_rowfirst_nopad": Formulation(
        int8_product(False, "OI", pad=False), "OI", "as i8_rowfirst, 1 row not padded"
    ),
    "i8_weightfirst": Formulation(
        int8_product(True, "OI"), "OI", "q · x_qᵀ → [O,M], barrier, transpose; 1 row → 2"
    ),
    "i8_weightfirst_to4": Formulation(
        up_to(4, int8_product(True, "OI"), int8_product(False, "OI")),
        "OI",
        "i8_weightfirst for 1-4 rows, i8_rowfirst for more (whole models only by default)",
    ),
    "i8_weightfirst_to4_wide": Formulation(
        wider_in(
            up_to(4, int8_product(True, "OI"), int8_product(False, "OI")), int8_product(False, "OI")
        ),
        "OI",
        "i8_weightfirst_to4 where in > out (down_proj), i8_rowfirst elsewhere (models only)",
    ),
    "i8_rowfirst_IO": Formulation(
        int8_product(False, "IO"), "IO", "x_q · q, q stored [I,O]; 1 row padded to 2"
    ),
    "i8_weightfirst_IO": Formulation(
        int8_product(True, "IO"), "IO", "qᵀ · x_qᵀ, q stored [I,O]; 1 row padded to 2"
    ),
    "i8_rowfirst_chunk4": Formulation(
        int8_product(False, "OI", chunks=4), "OI", "i8_rowfirst as 4 products of O/4 rows"
    ),
    "i8_weightfirst_chunk4": Formulation(
        int8_product(True, "OI", chunks=4), "OI", "i8_weightfirst as 4 products of O/4 rows"
    ),
    "f32_dequant_rowfirst": Formulation(
        dequant_product(jnp.float32, False, pad=False), "OI", "x · f32(q)ᵀ (int8-weights mode)"
    ),
    "f32_dequant_weightfirst": Formulation(
        dequant_product(jnp.float32, True, pad=True), "OI", "f32(q) · xᵀ, barrier; 1 row → 2"
    ),
    "bf16_dequant_rowfirst": Formulation(
        dequant_product(jnp.bfloat16, False, pad=True),
        "OI",
        "bf16(x) · bf16(q)ᵀ → f32; 1 row → 2",
    ),
}

# Part 1's default: every formulation but those made of others.
MATRIX_FORMS = [f for f in FORMULATIONS if not f.startswith("i8_weightfirst_to4")]

# XLA:CPU flags tried in a subprocess each: (XLA_FLAGS, formulations run under them).
FLAG_SETS = {
    "ynn_dot": (
        "--xla_cpu_experimental_ynn_fusion_type=dot",
        ["current", "i8_weightfirst", "f32_dequant_rowfirst", "f32_dequant_weightfirst"],
    ),
    "eigen_single_thread": (
        "--xla_cpu_multi_thread_eigen=false",
        ["current", "i8_weightfirst", "i8_rowfirst_nopad", "f32_dequant_rowfirst"],
    ),
    "xnnpack": ("--xla_cpu_use_xnnpack=true", ["current", "i8_weightfirst"]),
    "onednn": ("--xla_cpu_use_onednn=true", ["current", "i8_weightfirst"]),
}


def log(msg: str) -> None:
    print(f"[bench_int8_rows {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def host_kind() -> str:
    """``cpu-<vendor-model>-<n>core`` from the CPU's name, e.g. ``cpu-amd-epyc-2core``."""
    name = re.sub(r"\((R|TM|r|tm)\)", "", cpu_name("unknown"))
    name = re.sub(r"@.*$|\bCPU\b|\bProcessor\b|\b\d+-Core\b", "", name, flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"
    return f"cpu-{slug}-{os.cpu_count()}core"


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def distinct_forms(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """``names`` less those whose jaxpr equals ``current``'s (they run the same program),
    and ``{dropped: "current"}``."""
    if "current" not in names:
        return names, {}

    def program(name):
        fn = FORMULATIONS[name].fn
        shapes = [(32, 64), (64, 32)]  # fewer and more outputs than inputs
        return [
            str(jax.make_jaxpr(fn)(jnp.ones((m, i)), jnp.ones((o, i), jnp.int8), jnp.ones(o)))
            for m in ROWS
            for o, i in shapes
        ]

    ref = program("current")
    same = {n: "current" for n in names if n != "current" and FORMULATIONS[n].layout == "OI"}
    same = {n: c for n, c in same.items() if program(n) == ref}
    return [n for n in names if n not in same], same


# ------------------------------------------------------------------------------ timing


def time_rounds(cases: dict, rounds: int, budget_s: float, min_sample_s: float, seed: int):
    """Median seconds per call of each ``cases[key] = (call, warm_s)``.

    A sample is ``inner`` calls (enough to last ``min_sample_s``); a case gets ``rounds``
    samples, or fewer (at least 3) where they would take over ``budget_s``. Every round
    times each case still sampling once, in a new random order.
    """
    plan = {}
    for key, (_, warm_s) in cases.items():
        inner = max(1, math.ceil(min_sample_s / max(warm_s, 1e-6)))
        n = rounds if warm_s * inner * rounds <= budget_s else int(budget_s / (warm_s * inner))
        plan[key] = (inner, max(3, min(rounds, n)))
    samples = {key: [] for key in cases}
    rng = random.Random(seed)
    for r in range(max((n for _, n in plan.values()), default=0)):
        keys = [k for k in cases if plan[k][1] > r]
        rng.shuffle(keys)
        for key in keys:
            call, inner = cases[key][0], plan[key][0]
            start = time.perf_counter()
            for _ in range(inner):
                out = call()
            jax.block_until_ready(out)
            samples[key].append((time.perf_counter() - start) / inner)
    return {
        k: (statistics.median(v), len(v), plan[k][0], float(np.percentile(v, 25)))
        for k, v in samples.items()
    }


def bench_matrix(model: str, matrix: str, n_out: int, n_in: int, forms: list[str], args, seed: int):
    """Rows of part 1 for one matrix: every formulation in ``forms`` at every row count."""
    rng = np.random.default_rng(seed)
    q_OI = jnp.asarray(rng.integers(-127, 128, (n_out, n_in), dtype=np.int8))
    scale = jnp.asarray(rng.uniform(1e-3, 2e-2, n_out).astype(np.float32))
    q_IO = None
    if any(FORMULATIONS[f].layout == "IO" for f in forms):
        q_IO = jnp.asarray(np.ascontiguousarray(np.asarray(q_OI).T))
    x = rng.standard_normal((max(ROWS), n_in)).astype(np.float32)
    inputs = {m: jnp.asarray(x[:m]) for m in ROWS}
    singles = [jnp.asarray(x[i : i + 1]) for i in CHECK_ROWS]
    cases, info, outputs = {}, {}, {}
    for form in forms:
        w = q_IO if FORMULATIONS[form].layout == "IO" else q_OI
        jitted = jax.jit(FORMULATIONS[form].fn)
        outs = {}
        for m in ROWS:
            key = (form, m)
            try:
                start = time.perf_counter()
                exe = jitted.lower(inputs[m], w, scale).compile()
                compile_s = time.perf_counter() - start
                outs[m] = np.asarray(exe(inputs[m], w, scale))  # first call
                start = time.perf_counter()
                jax.block_until_ready(exe(inputs[m], w, scale))
                warm_s = time.perf_counter() - start
            except Exception as e:  # a kernel XLA:CPU lacks: recorded, not fatal
                info[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            if m == 1:
                alone = {
                    i: np.asarray(exe(s, w, scale))[0]
                    for i, s in zip(CHECK_ROWS, singles, strict=True)
                }
            info[key] = {"compile_s": round(compile_s, 3)}
            cases[key] = (lambda exe=exe, a=inputs[m], w=w: exe(a, w, scale), warm_s)
        if 1 in outs:  # row i of every width against row i alone
            for m, out in outs.items():
                exact = all(same_bits(out[i], alone[i]) for i in CHECK_ROWS if i < m)
                info[(form, m)]["exact_vs_1row"] = exact
        outputs[form] = outs
    ref = outputs.get("current", {})
    times = time_rounds(cases, args.rounds, args.budget, args.min_sample, seed)
    rows = []
    for form in forms:
        outs = outputs[form]
        for m in ROWS:
            row = {"model": model, "matrix": matrix, "out": n_out, "in": n_in}
            row.update(formulation=form, rows=m, **info[(form, m)])
            if (form, m) in times:
                t, n, inner, p25 = times[(form, m)]
                row.update(median_ms=round(1e3 * t, 4), p25_ms=round(1e3 * p25, 4))
                row.update(samples=n, inner=inner)
                if m in ref and m in outs:
                    row["same_as_current"] = same_bits(outs[m], ref[m])
                    row["max_abs_diff_vs_current"] = float(np.max(np.abs(outs[m] - ref[m])))
            rows.append(row)
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict], key: str = "median_ms", by: str = "rows") -> None:
    """``over_own_1`` and ``over_current_1``: each time over its formulation's time at 1
    (rows or width) and over ``current``'s, within rows of one matrix or model."""
    base = {(r["formulation"], r.get("xla_flags", "")): r.get(key) for r in rows if r[by] == 1}
    for r in rows:
        if r.get(key) is None:
            continue
        own, cur = (
            base.get((r["formulation"], r.get("xla_flags", ""))),
            base.get(("current", r.get("xla_flags", ""))),
        )
        r["over_own_1"] = round(r[key] / own, 3) if own else None
        r["over_current_1"] = round(r[key] / cur, 3) if cur else None


def selected_matrices(spec: list[str] | None):
    """``[(ModelShape, matrix, O, I, per_forward)]`` chosen by ``--shapes`` (``1.5b`` or
    ``1.5b:gate_up``, a prefix of a matrix name), all by default."""
    out = []
    for key, shape in MODELS.items():
        for name, n_out, n_in, count in shape.matrices():
            wanted = spec is None or any(
                s == key or (s.startswith(key + ":") and name.startswith(s.split(":", 1)[1]))
                for s in spec
            )
            if wanted:
                out.append((shape, name, n_out, n_in, count))
    return out


def outpaced(rows: list[dict], model: str, form: str, factor: float) -> bool:
    """Whether ``form`` took over ``factor`` times current's time at 1 and at 2 rows on every
    matrix of ``model`` measured so far (the LM head leaves such formulations out: it is
    the largest matrix, and a product that converts the whole weight costs seconds)."""
    at = {(r["matrix"], r["formulation"], r["rows"]): r.get("median_ms") for r in rows
          if r["model"] == model}  # fmt: skip
    matrices = {m for m, f, _ in at if f == form}
    if form == "current" or not matrices:
        return False
    for matrix in matrices:
        for m in (1, 2):
            t, ref = at.get((matrix, form, m)), at.get((matrix, "current", m))
            if t is None or ref is None or t <= factor * ref:
                return False
    return True


def bench_layers(args, forms: list[str], shapes: list[str] | None, flags: str = "") -> list:
    forms, same = distinct_forms(forms)
    if same:
        log(f"same program as current (not timed again): {sorted(same)}")
    rows = []
    for n, (shape, name, n_out, n_in, _) in enumerate(selected_matrices(shapes)):
        start = time.perf_counter()
        kept = forms
        if name == "lm_head":
            kept = [f for f in forms if not outpaced(rows, shape.name, f, args.prune)]
            for f in sorted(set(forms) - set(kept)):
                log(f"{shape.name} lm_head: {f} left out (over {args.prune}x current at 1 and 2 "
                    "rows on every other matrix)")  # fmt: skip
                rows.append({"model": shape.name, "matrix": name, "out": n_out, "in": n_in,
                             "formulation": f, "rows": None, "pruned": args.prune})  # fmt: skip
        got = bench_matrix(shape.name, name, n_out, n_in, kept, args, seed=n)
        for r in got:
            r["xla_flags"] = flags
        rows += got
        log(f"{shape.name} {name} [{n_out},{n_in}]{' ' + flags if flags else ''}: "
            f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    for form, twin in same.items():
        rows += [{**r, "formulation": form, "same_program_as": twin}
                 for r in rows if r["formulation"] == twin]  # fmt: skip
    return rows


def per_forward(rows: list[dict]) -> list[dict]:
    """Each model's products summed as one forward runs them, per formulation and rows."""
    out = []
    counts = {(s.name, name): c for s in MODELS.values() for name, _, _, c in s.matrices() if c}
    by = {}
    for r in rows:
        c = counts.get((r["model"], r["matrix"]))
        if c and r.get("median_ms") is not None:
            by.setdefault((r["model"], r["formulation"], r["xla_flags"], r["rows"]), []).append(
                (r["matrix"], c * r["median_ms"])
            )
    for (model, form, flags, m), parts in sorted(by.items()):
        needed = sum(1 for (mod, _), c in counts.items() if mod == model)
        if len(parts) == needed:
            total = sum(t for _, t in parts)
            out.append({"model": model, "formulation": form, "xla_flags": flags, "rows": m,
                        "median_ms": round(total, 3)})  # fmt: skip
    for model in {r["model"] for r in out}:
        add_ratios([r for r in out if r["model"] == model])
    return out


# ------------------------------------------------------------------------- XLA flags


def bench_flags(args, names: list[str], shapes: list[str] | None) -> list[dict]:
    """Part 2: a subprocess per flag set (``XLA_FLAGS`` is read once per process)."""
    rows = []
    for name in names:
        flags, forms = FLAG_SETS[name]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            command = [sys.executable, __file__, "--worker-out", str(out), "--forms", *forms,
                       "--rounds", str(args.rounds), "--budget", str(args.budget),
                       "--prune", str(args.prune)]  # fmt: skip
            if shapes:
                command += ["--shapes", *shapes]
            env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
            log(f"flag set {name}: XLA_FLAGS={env['XLA_FLAGS']}")
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                log(f"flag set {name} failed: {proc.stderr[-600:]}")
                rows.append({"flag_set": name, "xla_flags": flags, "error": proc.stderr[-600:]})
                continue
            got = json.loads(out.read_text())
        for r in got:
            r.update(flag_set=name, xla_flags=flags)
        rows += got
    return rows


# ----------------------------------------------------------------------------- models


@contextlib.contextmanager
def product(form: str):
    """quant.py's forward with ``form``'s product in place of its own, while inside."""
    quant._int8_matmul = FORMULATIONS[form].fn
    try:
        yield
    finally:
        quant._int8_matmul = _CURRENT_PRODUCT


def bench_models(args) -> list[dict]:
    """Part 3: the int8 forward of each fetched model at every width, per formulation."""
    from specjax.io.fetch import fetch
    from specjax.io.hf import load_pretrained
    from specjax.models.quant import quantize

    forms, same = distinct_forms(args.model_forms)
    rows = []

    def new_forward():
        # A new function each time: jax caches a function's trace, and the product is
        # read when the forward is traced.
        def forward(model, tokens, positions, cache):
            out = model(tokens, positions, cache)
            return out.logits, out.cache

        return forward

    jitted = jax.jit(new_forward())
    for key in args.models:
        start = time.perf_counter()
        model = quantize(load_pretrained(fetch(MODELS[key].name), dtype=jnp.float32), "int8")
        log(f"{MODELS[key].name}: loaded and quantized in {time.perf_counter() - start:.0f} s")
        prompt = jnp.asarray([[(i * 131) % 3000 + 5 for i in range(PROMPT_LEN)]], jnp.int32)
        _, cache = jitted(
            model, prompt, jnp.arange(PROMPT_LEN)[None], model.init_cache(1, CACHE_LEN)
        )
        cases, logits, compile_s, programs = {}, {}, {}, {}
        for width in args.widths:
            tokens = jnp.asarray([[(1000 + 7919 * i) % 30000 + 5 for i in range(width)]], jnp.int32)
            positions = PROMPT_LEN + jnp.arange(width, dtype=jnp.int32)[None]
            call_args = (model, tokens, positions, cache)
            for form in forms:
                start = time.perf_counter()
                with product(form):
                    exe = jax.jit(new_forward()).lower(*call_args).compile()
                compile_s[(form, width)] = time.perf_counter() - start
                programs[(form, width)] = hash(exe.as_text())
                logits[(form, width)] = np.asarray(exe(*call_args)[0])[0]
                start = time.perf_counter()
                jax.block_until_ready(exe(*call_args))
                cases[(form, width)] = (
                    lambda exe=exe, a=call_args: exe(*a),
                    time.perf_counter() - start,
                )
            log(f"{MODELS[key].name}: width {width} compiled")
        times = time_rounds(cases, args.model_rounds, 1e9, 0.0, seed=1)
        got = []
        for (form, width), (t, n, _, p25) in times.items():
            row = {"model": MODELS[key].name, "formulation": form, "width": width,
                   "median_ms": round(1e3 * t, 3), "p25_ms": round(1e3 * p25, 3), "samples": n,
                   "compile_s": round(compile_s[(form, width)], 1)}  # fmt: skip
            if ("current", width) in logits:
                row["program_same_as_current"] = (
                    programs[(form, width)] == programs[("current", width)]
                )
                row["logits_same_as_current"] = same_bits(
                    logits[(form, width)], logits[("current", width)]
                )
            if (form, 1) in logits:
                row["row0_same_as_width1"] = same_bits(
                    logits[(form, width)][0], logits[(form, 1)][0]
                )
            got.append(row)
        add_ratios(got, by="width")
        for form, twin in same.items():
            got += [{**r, "formulation": form, "same_program_as": twin}
                    for r in got if r["formulation"] == twin]  # fmt: skip
        rows += sorted(got, key=lambda r: (r["formulation"], r["width"]))
        del model, cache, cases, logits
    return rows


# ----------------------------------------------------------------------------- report


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_ms(v):
    return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def table(rows: list[dict], group: tuple[str, ...], by: str, values: tuple[int, ...]) -> str:
    """One markdown table per ``group`` key: a line per formulation, the time at 1, each
    value's ratio to its own 1 and to current's 1, and the exactness checks."""
    lines = []
    groups = {}
    for r in rows:
        if "formulation" in r:
            groups.setdefault(tuple(r.get(g) for g in group), []).append(r)
    for key, rs in groups.items():
        head = " ".join(str(k) for k in key if k)
        lines.append(f"\n{head}")
        cols = " ".join(f"{v}" for v in values[1:])
        lines.append(f"| formulation | ms at 1 | × own 1, at {cols} | × current 1, at {cols} | "
                     f"ms at {cols} | checks |")  # fmt: skip
        lines.append("|" + "---|" * 6)
        forms = list(dict.fromkeys(r["formulation"] for r in rs))
        for form in forms:
            at = {r[by]: r for r in rs if r["formulation"] == form}
            one = at.get(values[0], {})
            own = " ".join(fmt(at.get(v, {}).get("over_own_1")) for v in values[1:])
            cur = " ".join(fmt(at.get(v, {}).get("over_current_1")) for v in values[1:])
            ms = " ".join(fmt_ms(at.get(v, {}).get("median_ms")) for v in values[1:])
            checks = []
            if any("exact_vs_1row" in r for r in at.values()):
                ok = all(r.get("exact_vs_1row", False) for r in at.values())
                checks.append("widths" if ok else "NOT across widths")
            if any("row0_same_as_width1" in r for r in at.values()):
                ok = all(r.get("row0_same_as_width1", False) for r in at.values())
                checks.append("row0=W1" if ok else "row0≠W1")
            same = [r.get("same_as_current", r.get("logits_same_as_current")) for r in at.values()]
            if form != "current" and any(s is not None for s in same):
                checks.append("=current" if all(same) else "≠current")
            pruned = [r["pruned"] for r in at.values() if r.get("pruned")]
            if pruned:
                checks.append(f"left out: over {pruned[0]}x current on the other matrices")
            if any(r.get("program_same_as_current") for r in at.values()) and form != "current":
                checks.append("compiled to current's program")
            if any("error" in r for r in at.values()):
                checks.append("errors")
            if "same_program_as" in one:
                checks.append(f"same program as {one['same_program_as']}")
            name = form
            lines.append(f"| {name} | {fmt_ms(one.get('median_ms'))} | {own} | {cur} | {ms} | "
                         f"{', '.join(checks)} |")  # fmt: skip
    return "\n".join(lines)


def analysis(layer_rows: list[dict], forward_rows: list[dict], model_rows: list[dict]) -> dict:
    """Per model: the fastest formulation at 1 row, those whose 2-4 rows stay within 1.2x
    their 1-row time, and those faster than current at 1 row and at 2, 3 and 4 rows, all
    read off the per-forward sums of part 1; and the same read off part 3's forwards."""
    found = {}
    for model in dict.fromkeys(r["model"] for r in forward_rows):
        rs = [r for r in forward_rows if r["model"] == model and not r["xla_flags"]]
        at = {(r["formulation"], r["rows"]): r for r in rs}
        forms = sorted({f for f, _ in at})
        one = {f: at[(f, 1)]["median_ms"] for f in forms if (f, 1) in at}
        flat = [f for f in forms if all(at.get((f, m), {}).get("over_own_1", 9) <= 1.2
                                        for m in (2, 3, 4))]  # fmt: skip
        exact = {f: all(r.get("exact_vs_1row", False) for r in layer_rows
                        if r["model"] == model and r["formulation"] == f and r["rows"])
                 for f in forms}  # fmt: skip
        better = [
            f for f in forms
            if f != "current" and all((f, m) in at and ("current", m) in at
                                      and at[(f, m)]["median_ms"] < at[("current", m)]["median_ms"]
                                      for m in (1, 2, 3, 4))
        ]  # fmt: skip
        found[model] = {
            "fastest_at_1_row": min(one, key=one.get) if one else None,
            "ms_at_1_row": {f: round(t, 2) for f, t in sorted(one.items(), key=lambda i: i[1])},
            "within_1.2x_at_2_to_4_rows": flat,
            "faster_than_current_at_1_to_4_rows": better,
            "exact_across_widths": exact,
        }
        ms = [r for r in model_rows if r["model"] == model]
        if ms:
            found[model]["forward_ms"] = {
                f: {r["width"]: r["median_ms"] for r in ms if r["formulation"] == f}
                for f in dict.fromkeys(r["formulation"] for r in ms)
            }
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="0.5B only, fewer rounds and flags")
    p.add_argument("--out", type=Path, default=None, help="the results file")
    p.add_argument("--host-kind", default=None, help="the results file's name (no .json)")
    p.add_argument("--forms", nargs="+", default=MATRIX_FORMS, choices=list(FORMULATIONS))
    p.add_argument("--shapes", nargs="+", default=None, help="e.g. 1.5b 0.5b:gate_up")
    p.add_argument("--rounds", type=int, default=None, help="samples per matmul case")
    p.add_argument("--budget", type=float, default=None, help="seconds of samples per case")
    p.add_argument("--min-sample", type=float, default=2e-3, help="seconds a sample lasts")
    p.add_argument("--prune", type=float, default=3.0, help="see `outpaced`")
    p.add_argument("--flag-sets", nargs="*", default=None, choices=list(FLAG_SETS))
    p.add_argument("--flag-shapes", nargs="+", default=None, help="--shapes for the flag sets")
    p.add_argument("--no-matrices", action="store_true", help="parts 2 and 3 only")
    p.add_argument("--no-flags", action="store_true")
    p.add_argument("--models", nargs="+", default=None, choices=list(MODELS))
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--widths", type=int, nargs="+", default=None)
    p.add_argument("--model-forms", nargs="+", default=None, choices=list(FORMULATIONS))
    p.add_argument("--model-rounds", type=int, default=None)
    p.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (5 if quick else 15)
    args.budget = args.budget or (0.15 if quick else 0.6)
    if args.worker_out:  # part 2's subprocess: part 1 under this process's XLA_FLAGS
        rows = bench_layers(args, args.forms, args.shapes, os.environ.get("XLA_FLAGS", ""))
        args.worker_out.write_text(json.dumps(rows))
        return 0
    if args.shapes is None and quick:
        args.shapes = ["0.5b"]
    args.flag_sets = (["eigen_single_thread"] if quick else list(FLAG_SETS)) if (
        args.flag_sets is None) else args.flag_sets  # fmt: skip
    flag_shapes = args.flag_shapes or (
        ["0.5b:qkv", "0.5b:gate_up"] if quick
        else ["1.5b:qkv", "1.5b:gate_up", "1.5b:down"]
    )  # fmt: skip
    args.models = args.models or (["0.5b"] if quick else ["0.5b", "1.5b"])
    args.widths = args.widths or ([1, 2] if quick else [1, 2, 3, 4, 5])
    args.model_forms = args.model_forms or ["current", "i8_rowfirst", "i8_weightfirst_to4"]
    args.model_rounds = args.model_rounds or (3 if quick else 7)
    kind = args.host_kind or host_kind()
    out = args.out or RESULTS / "int8_rows" / f"{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    record = run_record(argv)
    results = {**record, "host_kind": kind, "note": SHARED_NOTE, "quick": quick,
               "settings": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items() if k != "worker_out"},
               "formulations": {n: f.about for n, f in FORMULATIONS.items()},
               "flag_sets": {n: {"xla_flags": f, "formulations": fs}
                             for n, (f, fs) in FLAG_SETS.items()}}  # fmt: skip
    print(f"# int8 matmul rows on {kind} ({record['machine']['cpu']}, jax {jax.__version__})")
    print(SHARED_NOTE)

    def save():
        results["seconds"] = round(time.perf_counter() - started, 1)
        results["load_average_1m_end"] = os.getloadavg()[0]
        out.write_text(json.dumps(results, indent=1) + "\n")

    layer_rows = [] if args.no_matrices else bench_layers(args, args.forms, args.shapes)
    forward_rows = per_forward(layer_rows)
    results["layers"], results["per_forward"] = layer_rows, forward_rows
    save()
    print("\n## Per matrix (ms; ratios of the median time)")
    print(table(layer_rows, ("model", "matrix", "out", "in"), "rows", ROWS))
    print("\n## Products of one forward, summed (ms)")
    print(table(forward_rows, ("model", "xla_flags"), "rows", ROWS))

    flag_rows = [] if args.no_flags else bench_flags(args, args.flag_sets, flag_shapes)
    results["flags"] = flag_rows
    save()
    if flag_rows:
        print("\n## XLA:CPU flags (each against current under the same flags)")
        print(table(flag_rows, ("xla_flags", "model", "matrix"), "rows", ROWS))

    model_rows = [] if args.no_models else bench_models(args)
    results["models"] = model_rows
    if model_rows:
        print("\n## Whole int8 forward (ms, batch 1, cache of 64 tokens)")
        print(table(model_rows, ("model",), "width", tuple(sorted(args.widths))))
    results["analysis"] = analysis(layer_rows, forward_rows, model_rows)
    save()
    print("\n## Analysis")
    print(json.dumps(results["analysis"], indent=1))
    print(f"\nwrote {out} in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
