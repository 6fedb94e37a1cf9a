#!/usr/bin/env python
"""How long ``specjax generate`` takes to show its first token, first and second call.

Each call is a fresh process (as from a fresh shell), with an empty persistent
compilation cache before the first call. The clock starts when the process is
spawned; "first token" is the moment stdout has carried the prompt and at least
one byte more (the CLI prints the prompt, then streams the completion), "exit"
when the process ends (it then times further runs for its speed summary).

Writes ``--json`` (default ``scripts/benchmarks/results/cli_start/bundled.json``) with
the date, the commit, the command and the machine.

    python scripts/benchmarks/bench_cli_start.py                       # bundled pair, 3 rounds
    python scripts/benchmarks/bench_cli_start.py --rounds 1 --json out.json
    python scripts/benchmarks/bench_cli_start.py -- --drafter none     # extra CLI flags after --
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import RESULTS, write_results

PROMPT = "def fibonacci(n):"


def one_call(env: dict, extra: list[str]) -> dict:
    """Spawns ``specjax generate PROMPT``; returns seconds to the first token and to exit."""
    cmd = [sys.executable, "-m", "specjax.cli", "generate", PROMPT, "--no-color", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen, first = b"", None
    while chunk := proc.stdout.read1(4096):
        seen += chunk
        if first is None and len(seen) > len(PROMPT.encode()):
            first = time.perf_counter() - start
    err = proc.stderr.read().decode()
    proc.wait()
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err}")
    return {"first_token_s": first, "exit_s": total, "summary": err.strip().splitlines()[-1]}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="cold+warm pairs, each on a new cache"
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "cli_start" / "bundled.json")
    parser.add_argument("extra", nargs="*", help="flags passed on to specjax generate (after --)")
    args = parser.parse_args(argv)
    rows = []
    for r in range(args.rounds):
        cache = tempfile.mkdtemp(prefix="specjax-bench-cache-")
        # SPECJAX_CACHE holds the compilation cache (and fetched models; the bundled
        # pair needs none). JAX_* settings of the caller would bypass ours.
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION")}
        env.update(SPECJAX_CACHE=cache)
        env.pop("SPECJAX_COMPILATION_CACHE", None)
        try:
            first, second = one_call(env, args.extra), one_call(env, args.extra)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        rows.append({"first": first, "second": second})
        print(
            f"round {r + 1}: first call {first['first_token_s']:.2f} s to the first token "
            f"({first['exit_s']:.2f} s to exit); second call {second['first_token_s']:.2f} s "
            f"({second['exit_s']:.2f} s)",
            flush=True,
        )
    med = {
        f"{call}_{what}": statistics.median(row[call][what] for row in rows)
        for call in ("first", "second")
        for what in ("first_token_s", "exit_s")
    }
    print(
        f"median of {args.rounds}: first call {med['first_first_token_s']:.2f} s to the first "
        f"token, second call {med['second_first_token_s']:.2f} s"
    )
    results = {"prompt": PROMPT, "extra": args.extra, "rounds": rows, "median": med}
    write_results(args.json, results, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
