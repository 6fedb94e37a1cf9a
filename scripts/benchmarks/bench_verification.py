#!/usr/bin/env python
"""Block against token-wise verification: drafts kept per target call at T = 1.

Both verifiers are exact; block verification keeps at least as many drafts on average.
This measures how many more on the bundled pair (γ = 4, `BUNDLED_PROMPTS`) and, where
its files are cached, the real pair (Qwen2.5-Coder 1.5B and 0.5B, int8 as its preset,
γ = 2, two chat and two code-edit prompts of ``prompts/real_prompts.json``). Each
prompt is decoded by ``--rows`` seeded rows, by both verifiers with the same key; a
row's accepted drafts per target call is one unit: mean, standard error, and the paired
difference (block - token-wise). Acceptance only, not time.

    python scripts/benchmarks/bench_verification.py
    python scripts/benchmarks/bench_verification.py --quick   # the bundled pair, seconds
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from harness import RESULTS, ROOT, logger, table, write_results

BUNDLED_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "def parse_args(argv):",
    "with open(path) as f:",
    "def merge_sort(items):",
]
REAL = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
log = logger("bench_verification")


def pairs(quick: bool, only=None):
    """``{name: (target, drafter, [prompt ids])}`` (``only``: those names)."""
    target, draft, tokenizer = specjax.default_pair()
    out = {
        "bundled": (
            target,
            specjax.DraftModel(draft, num_draft=4),
            [tokenizer.encode(t).ids for t in BUNDLED_PROMPTS[: 2 if quick else None]],
        )
    }
    if quick or only == ["bundled"]:
        return out
    if only == ["real"]:
        out = {}
    from specjax.io.fetch import remote
    from specjax.io.presets import load_pair

    if all(remote(name).path().is_file() for name in REAL):
        target, drafter, _ = load_pair(*REAL)
        sets = json.loads((ROOT / "prompts" / "real_prompts.json").read_text())
        texts = [p["text"] for p in sets["chat"][:2] + sets["code-edit"][:2]]
        messages = [[{"role": "user", "content": t}] for t in texts]
        prompts = [
            target.tokenizer.encode(
                specjax.apply_chat_template(target, m), add_special_tokens=False
            ).ids
            for m in messages
        ]
        out["real"] = (target, drafter.with_draft(2), prompts)
    else:
        log("the real pair is not in the specjax cache: bundled pair only")
    return out


def units(target, drafter, prompts, verification: str, rows: int, tokens: int) -> np.ndarray:
    """Accepted drafts per target call of every (prompt, seed) row."""
    out = []
    sampling = specjax.SamplingConfig(temperature=1.0)
    for prompt in prompts:
        result = specjax.speculative_generate(
            jax.random.key(0),
            target,
            drafter,
            [prompt] * rows,
            max_new_tokens=tokens,
            sampling=sampling,
            verification=verification,
            seeds=jnp.arange(rows),
        )
        stats = jax.device_get(result.stats)
        calls = np.maximum(np.asarray(stats.row_target_calls), 1)
        out.append(np.asarray(stats.accepted) / calls)
    return np.concatenate(out)


def summary(values: np.ndarray) -> dict:
    return {
        "mean": float(values.mean()),
        "standard_error": float(values.std(ddof=1) / np.sqrt(len(values))),
        "units": len(values),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=16, help="seeds per prompt")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per row")
    p.add_argument("--quick", action="store_true", help="the bundled pair, 2 prompts, 4 rows")
    p.add_argument("--only", nargs="+", choices=["bundled", "real"], help="these pairs only")
    p.add_argument("--out", type=Path, default=RESULTS / "verification" / "cpu.json")
    args = p.parse_args(argv)
    rows, tokens = (4, 16) if args.quick else (args.rows, args.tokens)
    report = {"temperature": 1.0, "rows_per_prompt": rows, "pairs": {}}
    previous = json.loads(args.out.read_text())["pairs"] if args.out.exists() else {}
    report["pairs"] = {k: v for k, v in previous.items() if args.only and k not in args.only}
    for name, (target, drafter, prompts) in pairs(args.quick, args.only).items():
        kept = {v: units(target, drafter, prompts, v, rows, tokens) for v in ("rejection", "block")}
        entry = {v: summary(x) for v, x in kept.items()}
        entry["difference"] = summary(kept["block"] - kept["rejection"])
        entry["gamma"], entry["prompts"] = drafter.num_draft, len(prompts)
        report["pairs"][name] = entry
        log(f"{name}: block - token-wise {entry['difference']['mean']:.3f}")
    cell = lambda s: f"{s['mean']:.3f} ± {s['standard_error']:.3f}"  # noqa: E731
    rows_out = [
        {
            "pair": n,
            "γ": e["gamma"],
            "token-wise": cell(e["rejection"]),
            "block": cell(e["block"]),
            "block - token-wise": cell(e["difference"]),
        }
        for n, e in report["pairs"].items()
    ]
    print(table(rows_out, ["pair", "γ", "token-wise", "block", "block - token-wise"]))
    write_results(args.out, report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
