#!/usr/bin/env python
"""What one forward width costs plain decoding: a step W tokens wide against one token.

Speculative decoding equals plain decoding token for token at one forward width W
(`specjax.decoding.numerics`); plain decoding's own default, and its fastest, is W = 1.
For each pair, precision, batch size and W this times the decode phase of plain
decoding, the seconds per step: ``generate`` with ``N`` new tokens and with one, at
one cache length (one compiled program: the budget is traced), each the median of
``--repeats`` runs after a warm-up, and ``(t_N - t_1) / (N - 1)``. Rows never stop
early (no EOS id).

Pairs: ``bundled`` (the bundled target, 8 layers, 384 wide, V = 4096) and ``real``
(Qwen2.5-Coder-1.5B-Instruct, fetched once by ``specjax fetch qwen2.5-coder-1.5b``).
Precisions: float32, bfloat16 and int8 (weights and activations).

Writes one file per pair under ``--out`` (default ``scripts/benchmarks/results/width``):
``bundled.json`` and ``qwen2.5-coder-1.5b.json``, each with the date, the commit, the
command and the machine.

    python scripts/benchmarks/bench_width.py
    python scripts/benchmarks/bench_width.py --out /tmp/w --pairs bundled --widths 1 2 --tokens 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[2]  # the checkout
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import specjax  # noqa: E402
from harness.machine import RESULTS, run_record  # noqa: E402
from specjax.models.quant import quantize  # noqa: E402

PROMPT_LEN = 24
FILE_NAMES = {"bundled": "bundled", "real": "qwen2.5-coder-1.5b"}  # results file per pair


def log(msg: str) -> None:
    print(f"[bench_width {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load(pair: str, precision: str):
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    if pair == "bundled":
        model = specjax.default_pair(dtype)[0]
    else:
        model = specjax.load_pretrained(specjax.fetch("qwen2.5-coder-1.5b"), dtype=dtype)
    return quantize(model, "int8") if precision == "int8" else model


def step_seconds(model, batch: int, width: int, tokens: int, repeats: int) -> dict:
    prompts = [[(i * 131 + 17 * r) % 3000 + 5 for i in range(PROMPT_LEN)] for r in range(batch)]
    cache_len = 64 * ((PROMPT_LEN + tokens + width + 63) // 64)
    greedy = specjax.SamplingConfig.greedy()

    def run(n):
        out = specjax.generate(
            jax.random.key(0),
            model,
            prompts,
            max_new_tokens=n,
            sampling=greedy,
            cache_len=cache_len,
            forward_width=width,
        )
        return jax.block_until_ready(out)

    run(tokens)  # compiles (the budget is traced: one program for both lengths)
    run(1)
    times = {1: [], tokens: []}
    for _ in range(repeats):  # interleaved: a drift of the machine hits both alike
        for n in (1, tokens):
            start = time.perf_counter()
            run(n)
            times[n].append(time.perf_counter() - start)
    t1, tn = statistics.median(times[1]), statistics.median(times[tokens])
    return {"step_ms": round(1e3 * (tn - t1) / (tokens - 1), 3), "t1_s": t1, "tn_s": tn}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS / "width")
    p.add_argument("--pairs", nargs="+", default=["bundled", "real"], choices=["bundled", "real"])
    p.add_argument("--precisions", nargs="+", default=["float32", "bfloat16", "int8"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 5])
    p.add_argument("--tokens", type=int, default=16, help="N: new tokens of the long run")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for pair in args.pairs:
        results = {**run_record(argv), "tokens": args.tokens, "repeats": args.repeats, "rows": []}
        path = args.out / f"{FILE_NAMES[pair]}.json"
        for precision in args.precisions:
            model = load(pair, precision)
            for batch in args.batches:
                base = None
                for width in sorted(args.widths):
                    row = {"pair": pair, "precision": precision, "batch": batch, "width": width}
                    row.update(step_seconds(model, batch, width, args.tokens, args.repeats))
                    base = base or row["step_ms"]
                    row["over_width_1"] = round(row["step_ms"] / base, 3)
                    log(str(row))
                    results["rows"].append(row)
                    path.write_text(json.dumps(results, indent=1) + "\n")
            del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
