"""Decode speed of two checkouts of specjax, interleaved: does a change keep it?

Runs `bench_decode.py --no-predict` (this checkout's copy of the script, public API
only) on the bundled pair for each drafter, alternating the checkouts round by round
(which goes first alternates too), each run in its own process. Reports, per drafter,
batch size and decoder, the median tokens/s over rounds of each checkout and their
ratio.

    python scripts/benchmarks/bench_decode_ab.py --before f268c2a

Writes ``OUT/bundled.json`` (``--out`` default ``scripts/benchmarks/results/decode_ab``)
with the date, both commits, the command and the machine.

``--before`` is a commit (checked out into a temporary git worktree) or a folder. A
checkout older than `specjax.core.timing` gets this checkout's copy of that module (a timer,
no decoding code), so that the script runs there unchanged.
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

from harness.machine import RESULTS, run_record

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("bench_decode.py")


def _git(*args, cwd=ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def _checkout(before: str, scratch: Path) -> Path:
    """A folder holding the ``before`` tree: the folder itself, or a new worktree."""
    if Path(before).is_dir():
        return Path(before).resolve()
    tree = scratch / "before"
    _git("worktree", "add", "--detach", str(tree), before)
    timing = Path("specjax", "core", "timing.py")
    if not (tree / timing).exists():
        (tree / timing.parent).mkdir(exist_ok=True)
        (tree / timing.parent / "__init__.py").touch()
        shutil.copy(ROOT / timing, tree / timing)
    return tree


def _run(tree: Path, drafter: str, args, out: Path) -> list[dict]:
    """One process: `bench_decode.py` with ``tree`` first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(SCRIPT), "--no-predict", "--drafter", drafter, "--json", str(out)]
    cmd += ["--batch", *map(str, args.batch), "--repeats", str(args.repeats)]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--gamma", str(args.gamma)]
    subprocess.run(cmd, env=env, check=True, cwd=tree)
    return json.loads(out.read_text())["rows"]


def _summary(rows: list[dict]) -> list[dict]:
    """Median tokens/s per (drafter, batch, decoder) of each side, and after / before."""
    keys = sorted({(r["drafter"], r["batch"]) for r in rows})
    table = []
    for drafter, batch in keys:
        for decoder in ("plain", "spec"):
            median = {
                side: statistics.median(
                    r[f"{decoder}_tok_s"]
                    for r in rows
                    if r["side"] == side and (r["drafter"], r["batch"]) == (drafter, batch)
                )
                for side in ("before", "after")
            }
            name = "plain" if decoder == "plain" else drafter
            ratio = median["after"] / median["before"]
            table.append(dict(drafter=drafter, batch=batch, decoder=name, **median, ratio=ratio))
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="commit or folder to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--drafters", nargs="+", default=["model", "block"])
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "decode_ab",
        help="folder for bundled.json (default: %(default)s)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        before = _checkout(args.before, Path(scratch))
        sides = {"before": before, "after": ROOT}
        try:
            for r in range(args.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for drafter in args.drafters:
                    for side in order:
                        out = Path(scratch) / f"{side}-{drafter}-{r}.json"
                        for row in _run(sides[side], drafter, args, out):
                            rows.append({**row, "side": side, "round": r})
                        print(f"round {r} {drafter} {side} done", flush=True)
        finally:
            if before != Path(args.before).resolve() and before.exists():
                _git("worktree", "remove", "--force", str(before))
    summary = _summary(rows)
    before_id = args.before if Path(args.before).is_dir() else _git("rev-parse", args.before)
    record = run_record(argv)
    result = {
        "command": record["command"],
        "date": record["date"],
        "commit": record["commit"],
        "before": before_id.strip(),
        "after": record["commit"],
        "machine": record["machine"],
        "summary": summary,
        "rows": rows,
    }
    (args.out / "bundled.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| drafter | batch | decoder | before tok/s | after tok/s | after / before |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        print(
            f"| {s['drafter']} | {s['batch']} | {s['decoder']} | {s['before']:.1f} | "
            f"{s['after']:.1f} | {s['ratio']:.3f} |"
        )


if __name__ == "__main__":
    main()
