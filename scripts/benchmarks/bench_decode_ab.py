#!/usr/bin/env python
"""Decode speed of two checkouts of specjax, interleaved: does a change keep it?

On the bundled pair, for each drafter (the draft model and the block drafter, γ =
``--gamma``), it times plain and speculative decoding of code prompts (T = 0, median of
``--repeats`` calls after a compiling one; the greedy outputs checked equal first) in a
process per checkout, alternating the checkouts round by round (which goes first
alternates too). Each process runs this file with the checkout first on the import
path and uses specjax's public API only. Reports, per drafter, batch size and decoder,
the median tokens/s over rounds of each checkout and their ratio.

    python scripts/benchmarks/bench_decode_ab.py --before d906af1 --rounds 3

``--before`` is a commit (checked out into a temporary git worktree, given this
checkout's `specjax.core.timing` where it predates it) or a folder.
Writes ``OUT/bundled.json`` (``--out`` default ``scripts/benchmarks/results/decode_ab``)
with the date, both commits, the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import RESULTS, ROOT, table, write_results

CODE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "    for i in range(len(items)):",
]


def child(args) -> None:
    """One checkout's rows, as JSON on stdout."""
    import jax
    import numpy as np

    import specjax
    from specjax.core.timing import time_runs

    target, draft, tokenizer = specjax.default_pair()
    if args.drafter == "block":
        drafter = specjax.io.pretrained.default_drafter("block", num_draft=args.gamma)
    else:
        drafter = specjax.DraftModel(draft, num_draft=args.gamma)
    key, sampling = jax.random.key(0), specjax.SamplingConfig(temperature=0.0)
    rows = []
    for batch in args.batch:
        prompts = [tokenizer.encode(CODE_PROMPTS[i % 4]).ids for i in range(batch)]
        kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
        runs = {
            "plain": lambda p=prompts, kw=kw: specjax.generate(key, target, p, **kw),
            "spec": lambda p=prompts, kw=kw: specjax.speculative_generate(
                key, target, drafter, p, **kw
            ),
        }
        row, outs = {"batch": batch, "drafter": args.drafter}, {}
        for name, run in runs.items():
            outs[name] = jax.block_until_ready(run())  # compiles
            times, _ = time_runs(run, repeats=args.repeats)
            row[f"{name}_tok_s"] = float(np.sum(outs[name].lengths)) / statistics.median(times)
        if not np.array_equal(outs["plain"].tokens, outs["spec"].tokens):
            sys.exit("FAIL: greedy speculative output differs from plain greedy output")
        rows.append(row)
    print(json.dumps(rows))


def _git(*args) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def _run(tree: Path, drafter: str, args) -> list[dict]:
    """One process: this file's `child` with ``tree`` first on the import path."""
    cmd = [sys.executable, __file__, "--child", "--drafter", drafter, "--before", "-"]
    cmd += ["--batch", *map(str, args.batch), "--repeats", str(args.repeats)]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--gamma", str(args.gamma)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parent)])}
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(rows: list[dict]) -> list[dict]:
    """Median tokens/s per (drafter, batch, decoder) of each side, and after / before."""
    table_rows = []
    for drafter, batch in sorted({(r["drafter"], r["batch"]) for r in rows}):
        for decoder in ("plain", "spec"):
            median = {
                side: statistics.median(
                    r[f"{decoder}_tok_s"]
                    for r in rows
                    if (r["side"], r["drafter"], r["batch"]) == (side, drafter, batch)
                )
                for side in ("before", "after")
            }
            name = "plain" if decoder == "plain" else drafter
            ratio = median["after"] / median["before"]
            table_rows.append(
                dict(drafter=drafter, batch=batch, decoder=name, **median, ratio=ratio)
            )
    return table_rows


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--before", required=True, help="commit or folder to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--drafters", nargs="+", default=["model", "block"])
    p.add_argument("--out", type=Path, default=RESULTS / "decode_ab")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--drafter", default="model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        before = Path(args.before).resolve() if Path(args.before).is_dir() else None
        if before is None:
            before = Path(scratch) / "before"
            _git("worktree", "add", "--detach", str(before), args.before)
            timing = Path("specjax", "core", "timing.py")
            if not (before / timing).exists():  # a checkout older than the shared timer
                (before / timing.parent).mkdir(exist_ok=True)
                (before / timing.parent / "__init__.py").touch()
                shutil.copy(ROOT / timing, before / timing)
        sides = {"before": before, "after": ROOT}
        try:
            for r in range(args.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for drafter in args.drafters:
                    for side in order:
                        rows += [
                            {**row, "side": side, "round": r}
                            for row in _run(sides[side], drafter, args)
                        ]
                        print(f"round {r} {drafter} {side} done", flush=True)
        finally:
            if before != Path(args.before).resolve() and before.exists():
                _git("worktree", "remove", "--force", str(before))
    summary = summarize(rows)
    before_id = args.before if Path(args.before).is_dir() else _git("rev-parse", args.before)
    write_results(
        args.out / "bundled.json", {"before": before_id, "summary": summary, "rows": rows}, argv
    )
    print(
        table(
            summary,
            ["drafter", "batch", "decoder", ("before", ".1f"), ("after", ".1f"), ("ratio", ".3f")],
        )
    )


if __name__ == "__main__":
    sys.exit(main())
