#!/usr/bin/env python
"""The forward-width guarantee on an accelerator, in bfloat16, with timings.

One prepared run for a GPU or a TPU, about 5 minutes (it prints its progress and
stops starting new work after ``--budget-s``). In bfloat16 at jax's default flags:

* **equality**: speculative decoding (a draft model, γ = 3, coupled verification;
  rows greedy and at temperature 1) against plain decoding at the same forward width
  W = γ + 1, token for token, for two pairs: the bundled pair (its trained weights)
  and random weights of the real pair's shapes (Qwen2.5-Coder-1.5B target, 0.5B
  draft, from ``scripts/benchmarks/pair_configs``). It also records where plain decoding one
  token wide parts from plain decoding W wide on the device (the gap the width closes);
* **timings**: tokens per second of plain decoding at width 1, plain decoding at W,
  and speculative decoding at W, batch 1, after a warm-up, median of ``--repeats``.

The random pair's drafts are rarely accepted, so its speculative timing measures the
machinery; its flat random logits are full of near-ties, which makes it the harder
equality test. Writes JSON to ``--out`` (default: ``$OUT/accelerator_check.json``
when ``$OUT`` is set, else ``accelerator_check.json``) and exits 1 if an equality
fails; the JSON records the date, the commit, the command and the machine (the
accelerator included). On a CPU it runs as a smoke test (``--quick``: the bundled pair
only).

    python scripts/benchmarks/accelerator_check.py
    python scripts/benchmarks/accelerator_check.py --quick --out /tmp/check.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[2]  # the checkout
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import specjax  # noqa: E402
from harness.machine import run_record  # noqa: E402
from specjax.io.hf_config import config_from_hf  # noqa: E402
from specjax.models import Model  # noqa: E402

GAMMA = 3
WIDTH = GAMMA + 1
CONFIGS = Path(__file__).resolve().parent / "pair_configs"
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[accelerator_check {time.perf_counter() - START:6.1f} s] {msg}", flush=True)


def first_difference(a_rows, b_rows):
    out = []
    for a, b in zip(a_rows, b_rows, strict=True):
        diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        out.append(min(len(a), len(b)) if diff is None and len(a) != len(b) else diff)
    return out


def bundled_pair():
    target, draft, tokenizer = specjax.default_pair(jnp.bfloat16)
    texts = ["def fibonacci(n):", "import os\n\ndef main():", "class Stack:", "for i in "]
    return target, draft, [tokenizer.encode(t).ids for t in texts]


def random_pair():
    load = lambda name: Model.random(  # noqa: E731
        config_from_hf(json.loads((CONFIGS / f"{name}.json").read_text())),
        seed=0,
        dtype=jnp.bfloat16,
    )
    target, draft = load("qwen2.5-coder-1.5b"), load("qwen2.5-coder-0.5b")
    prompts = [[(i * 7919 + 13 * r) % 50000 + 10 for i in range(40)] for r in range(4)]
    return target, draft, prompts


def run(target, drafter, prompts, sampling, tokens, width):
    key = jax.random.key(0)
    kw = dict(max_new_tokens=tokens, sampling=sampling, forward_width=width)
    if drafter is None:
        out = specjax.generate(key, target, prompts, **kw)
    else:
        out = specjax.speculative_generate(
            key, target, drafter, prompts, verification="coupled", **kw
        )
    return jax.block_until_ready(out)


def timed(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # compile and warm up
    seconds = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds), out


def check_pair(name, target, draft, prompts, args) -> dict:
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    rows = len(prompts)
    # Half the rows greedy, half at temperature 1: one program checks both guarantees.
    sampling = specjax.SamplingConfig(temperature=jnp.array([0.0, 1.0] * (rows // 2)))
    log(f"{name}: equality, {rows} rows, {args.tokens} tokens, W = {WIDTH}")
    plain_w = run(target, None, prompts, sampling, args.tokens, WIDTH).to_lists()
    spec = run(target, drafter, prompts, sampling, args.tokens, WIDTH)
    plain_1 = run(target, None, prompts, sampling, args.tokens, None).to_lists()
    result = {
        "first_difference_speculative_vs_plain_at_W": first_difference(plain_w, spec.to_lists()),
        "first_difference_plain_1_vs_plain_at_W": first_difference(plain_w, plain_1),
        "tokens_per_target_call": float(spec.tokens_per_call),
    }
    result["equal"] = all(d is None for d in result["first_difference_speculative_vs_plain_at_W"])
    log(
        f"{name}: equal {result['equal']}; plain 1 vs W parts at "
        f"{result['first_difference_plain_1_vs_plain_at_W']}"
    )
    greedy = specjax.SamplingConfig.greedy()
    one = prompts[:1]
    timings = {}
    for label, d, width in (
        ("plain_1", None, None),
        ("plain_W", None, WIDTH),
        ("speculative_W", drafter, WIDTH),
    ):
        if time.perf_counter() - START > args.budget_s:
            log(f"{name}: budget spent, {label} not timed")
            break
        seconds, out = timed(
            lambda d=d, w=width: run(target, d, one, greedy, args.tokens, w), args.repeats
        )
        timings[label] = {
            "seconds": seconds,
            "tokens_per_second": int(out.lengths[0]) / seconds,
            "tokens_per_target_call": float(out.tokens_per_call),
        }
        log(f"{name}: {label} {timings[label]['tokens_per_second']:.1f} tok/s")
    result["timings_batch_1_greedy"] = timings
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_out = Path(os.environ.get("OUT", ".")) / "accelerator_check.json"
    p.add_argument("--out", type=Path, default=default_out)
    p.add_argument("--tokens", type=int, default=64, help="new tokens per row")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after a warm-up")
    p.add_argument("--budget-s", type=float, default=420.0, help="start nothing new after")
    p.add_argument("--quick", action="store_true", help="the bundled pair only (a CPU smoke)")
    args = p.parse_args(argv)
    device = jax.devices()[0]
    report = {
        **run_record(argv),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "dtype": "bfloat16",
        "gamma": GAMMA,
        "forward_width": WIDTH,
        "pairs": {},
    }
    log(f"{report['backend']} {report['device']}, jax {report['jax']}")
    pairs = [("bundled", bundled_pair)]
    if not args.quick:
        pairs.append(("random_real_shapes", random_pair))
    for name, load in pairs:
        report["pairs"][name] = check_pair(name, *load(), args)
    report["seconds"] = time.perf_counter() - START
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    log(f"wrote {args.out}")
    return 0 if all(r["equal"] for r in report["pairs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
