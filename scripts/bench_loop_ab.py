"""Decode speed of this checkout against an older commit, interleaved in one process.

On a shared machine two processes run minutes apart see different loads, so this
script imports both versions side by side: it extracts ``specjax/`` at ``--old`` with
``git archive`` into a temporary folder, renames the package to ``specjax_old``, and
alternates old and new calls (``--rounds`` of each, after two warm-up calls), so both
see the same machine. It reports the fastest and the median run of each, as tokens/s
of plain ``generate`` and ``speculative_generate`` (DraftModel, γ = 4) on the bundled
pair: batch 1 and 16, temperature 0 and 1, 128 new tokens, EOS off.

    python scripts/bench_loop_ab.py --old 9939a94 --json docs/bench_reproducible/loop_ab.json
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import jax

import specjax
from specjax.benchmarking.timer import time_interleaved

PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "    for i in range(len(items)):",
]


def import_old(rev: str, root: Path):
    """``specjax`` as of ``rev``, imported as ``specjax_old``."""
    repo = Path(specjax.__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "specjax"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(root, filter="data")
    (root / "specjax").rename(root / "specjax_old")
    for path in (root / "specjax_old").rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfrom specjax([. ])", r"from specjax_old\1", text)
        text = re.sub(r"\bimport specjax\b", "import specjax_old as specjax", text)
        path.write_text(text)
    sys.path.insert(0, str(root))
    import specjax_old

    return specjax_old


def _call(lib, pair, prompts, method: str, temperature: float, args):
    """A no-argument call of one version's decoder."""
    target, draft, _ = pair
    kw = dict(
        max_new_tokens=args.max_new_tokens, sampling=lib.SamplingConfig(temperature=temperature)
    )
    if method == "plain":
        return lambda: lib.generate(jax.random.key(0), target, prompts, **kw).tokens
    drafter = lib.DraftModel(draft, num_draft=4)
    return lambda: (
        lib.speculative_generate(jax.random.key(0), target, drafter, prompts, **kw).tokens
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"old": import_old(args.old, Path(tmp)), "new": specjax}
        # Each version loads the bundled pair itself (the old one reads the same assets).
        pairs = {name: lib.default_pair() for name, lib in libs.items()}
        tokenizer = pairs["new"][2]
        results = {}
        for batch in (1, 16):
            prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)]).ids for i in range(batch)]
            for temperature in (0.0, 1.0):
                for method in ("plain", "speculative"):
                    calls = {
                        name: _call(lib, pairs[name], prompts, method, temperature, args)
                        for name, lib in libs.items()
                    }
                    # Two warm-up calls each: compilation, one-time runtime set-up.
                    seconds, _ = time_interleaved(list(calls.values()), args.rounds, warmup=2)
                    times = dict(zip(calls, seconds, strict=True))
                    tokens = batch * args.max_new_tokens
                    row = {
                        name: dict(
                            fastest_tok_s=tokens / min(ts),
                            median_tok_s=tokens / statistics.median(ts),
                        )
                        for name, ts in times.items()
                    }
                    results[f"{method} B={batch} T={temperature}"] = row
                    old, new = row["old"], row["new"]
                    print(
                        f"{method:12s} B={batch:2d} T={temperature}: "
                        f"old {old['fastest_tok_s']:7.1f} ({old['median_tok_s']:7.1f}) | "
                        f"new {new['fastest_tok_s']:7.1f} ({new['median_tok_s']:7.1f}) "
                        "tok/s, fastest (median)",
                        flush=True,
                    )
    if args.json:
        Path(args.json).write_text(json.dumps(dict(old=args.old, rows=results), indent=2))


if __name__ == "__main__":
    main()
