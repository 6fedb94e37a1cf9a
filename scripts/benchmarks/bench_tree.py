"""Chain against tree: tokens per target call (τ) and tokens/s of each tree drafter.

For each drafter (the bundled draft model, the bundled block drafter, and the bundled
EAGLE-style head when it is shipped) it runs, at temperature 0 on the bundled pair:

  * plain decoding (the baseline);
  * chains of γ drafts, for each γ in ``--gammas`` (the block drafter only up to its
    trained block);
  * trees, for each branching in ``--trees`` (e.g. ``3,2,1``: 3 children at the root,
    2 under each, then 1).

at batch 1 (``--prompts`` prompts through one slot, one jitted call) and batch 16
(16 rows). Prompts are cut from held-out standard-library files; every row generates
``--max-new`` tokens (no EOS, so every system does the same work). Every output is
checked equal to plain greedy before anything is reported. Reported per system:
tokens/s (compilation apart, median of ``--repeats``), τ = tokens per row-step, and the
speedup over plain; per drafter, the best chain, the best tree, and their ratio (the
issue's target: best tree ≥ 1.15 × best chain at batch 1).

    python scripts/benchmarks/bench_tree.py              # bundled pair, ~20 min here
    python scripts/benchmarks/bench_tree.py --quick      # tiny random pair, ~1 min
    python scripts/benchmarks/bench_tree.py --target SmolLM2-135M-Instruct.Q4_1.gguf --batches 1 \\
        --gammas 2 3 --trees 2,1 2,2 3,1,1 --prompts 2 --max-new 32 --name smollm2-135m

Writes ``NAME.json`` (with the date, the commit, the command and the machine) and
``NAME.md`` under ``--out`` (default ``scripts/benchmarks/results/tree``; ``--name``
defaults to ``bundled``, ``quick`` with ``--quick``, or ``target`` with ``--target``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

import specjax
from harness.machine import RESULTS, run_record
from specjax.core.timing import time_fn
from specjax.training import data
from specjax.verification.tree import Tree

DEFAULT_TREES = ["2,1,1,1", "2,2,1,1", "3,1,1,1", "3,2,1", "2,2,2,1", "3,2,2,1", "4,2,1,1"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny random pair, few systems")
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7])
    parser.add_argument("--trees", nargs="+", default=DEFAULT_TREES)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--drafters", nargs="+", default=["model", "block", "eagle"])
    parser.add_argument("--prompts", type=int, default=8, help="prompts through one slot")
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--target", type=Path, default=None,
                        help="SmolLM2-135M(-Instruct) as a .gguf file or folder: measure its "
                             "shipped block drafter (specjax.io.pretrained.smollm2_drafter) "
                             "instead of the bundled pair's drafters")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "tree")
    parser.add_argument("--name", help="file name stem (default: bundled, quick or target)")
    args = parser.parse_args(argv)
    if args.name is None:
        args.name = "quick" if args.quick else "target" if args.target else "bundled"
    if args.quick:
        args.gammas, args.trees, args.batches = [2], ["2,1"], [1, 3]
        args.prompts, args.max_new, args.repeats = 2, 8, 1
    try:
        args.trees = [Tree.parse(t) for t in args.trees]
    except ValueError as e:
        parser.error(str(e))
    return args


def load(args):
    """``(target, {name: chain drafter}, prompts)``."""
    if args.quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=64, init_scale=4.0)
        drafters = {
            "model": specjax.DraftModel(specjax.testing.perturbed(target, seed=1)),
            "block": specjax.BlockDrafter.random(target, key=jax.random.key(2), num_draft=3),
        }
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, 64, n).tolist() for n in (5, 9, 7, 4, 6, 8)]
        return target, drafters, prompts
    if args.target is not None:
        import jax.numpy as jnp

        target = specjax.load_pretrained(args.target, dtype=jnp.float32)
        drafters = {"block": specjax.io.pretrained.smollm2_drafter(target)}
        return target, drafters, _stdlib_prompts(target)
    target, draft, _ = specjax.default_pair()
    drafters = {"model": specjax.DraftModel(draft)}
    if "block" in args.drafters:
        drafters["block"] = specjax.io.pretrained.default_drafter("block")
    if "eagle" in args.drafters:
        try:
            drafters["eagle"] = specjax.io.pretrained.default_drafter("eagle")
        except (ValueError, FileNotFoundError, OSError) as e:
            print(f"  (no eagle drafter: {e})", flush=True)
    drafters = {k: v for k, v in drafters.items() if k in args.drafters}
    return target, drafters, _stdlib_prompts(target)


def _stdlib_prompts(target, count: int = 32):
    """``count`` ragged prompts (16 to 64 tokens) cut from held-out stdlib files."""
    stream = data.tokenize_documents(target.tokenizer, data.stdlib_documents("heldout"))
    starts = np.linspace(0, len(stream) - 65, count).astype(int)
    lengths = np.random.default_rng(0).integers(16, 65, size=count)
    return [stream[s : s + n].tolist() for s, n in zip(starts, lengths, strict=True)]


def max_chain(drafter) -> int:
    """The longest chain a drafter can draft (a block drafter: its trained block)."""
    block = getattr(drafter, "block_size", None)
    return block - 1 if block is not None else 10**9


def run_batch(args, target, drafters, prompts, batch: int):
    greedy = specjax.SamplingConfig.greedy()
    key = jax.random.key(0)
    rows_prompts = prompts[: args.prompts] if batch == 1 else prompts[:batch]
    kw = dict(max_new_tokens=args.max_new, sampling=greedy, num_slots=min(batch, len(rows_prompts)))
    reference = specjax.generate(key, target, rows_prompts, **kw).to_lists()
    results = []

    def record(drafter_name, system, fn):
        timing, out = time_fn(fn, repeats=args.repeats)
        if out.to_lists() != reference:
            sys.exit(f"FAIL: {drafter_name} {system} at batch {batch} differs from plain greedy")
        tokens = int(np.sum(out.lengths))
        row = dict(
            batch=batch, drafter=drafter_name, system=system,
            tokens_per_s=tokens / timing.median_s, seconds=timing.median_s,
            tau=tokens / max(int(np.sum(out.stats.row_target_calls)), 1),
        )  # fmt: skip
        results.append(row)
        # One program per system: dropping each after use keeps compiled code (which
        # otherwise piles up to an out-of-memory LLVM error here) from slowing the rest.
        jax.clear_caches()
        print(f"  batch {batch:>2} {drafter_name:<6} {system:<16} {row['tokens_per_s']:8.1f} "
              f"tok/s  τ {row['tau']:.2f}", flush=True)  # fmt: skip
        return row

    record("plain", "plain", lambda: specjax.generate(key, target, rows_prompts, **kw))
    for name, chain in drafters.items():
        variants = [(f"chain γ={g}", chain.replace(num_draft=g, tree=None))
                    for g in args.gammas if g <= max_chain(chain)]  # fmt: skip
        for tree in args.trees:
            if tree.depth <= max_chain(chain):
                label = "tree " + ",".join(str(int(w)) for w in _branching(tree))
                variants.append((label, chain.with_tree(tree)))
        for label, drafter in variants:
            record(name, label, lambda d=drafter: specjax.speculative_generate(
                key, target, d, rows_prompts, **kw))  # fmt: skip
    return results


def _branching(tree: Tree) -> list[int]:
    """Children per node at each depth of a full tree (what ``--trees`` gave)."""
    counts = [int(np.sum(tree.depths == d)) for d in range(tree.depth + 1)]
    return [counts[d + 1] // counts[d] for d in range(tree.depth)]


def summarise(results):
    lines = ["| batch | drafter | plain tok/s | best chain | tok/s | τ | best tree | tok/s | τ "
             "| tree / chain |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    summary = []
    for batch in sorted({r["batch"] for r in results}):
        plain = next(r for r in results if r["batch"] == batch and r["drafter"] == "plain")
        for name in dict.fromkeys(r["drafter"] for r in results if r["drafter"] != "plain"):
            mine = [r for r in results if r["batch"] == batch and r["drafter"] == name]
            chains = [r for r in mine if r["system"].startswith("chain")]
            trees = [r for r in mine if r["system"].startswith("tree")]
            if not chains or not trees:
                continue
            chain = max(chains, key=lambda r: r["tokens_per_s"])
            tree = max(trees, key=lambda r: r["tokens_per_s"])
            ratio = tree["tokens_per_s"] / chain["tokens_per_s"]
            summary.append(dict(
                batch=batch, drafter=name, plain=plain["tokens_per_s"], best_chain=chain,
                best_tree=tree, tree_over_chain=ratio,
            ))  # fmt: skip
            lines.append(
                f"| {batch} | {name} | {plain['tokens_per_s']:.1f} | {chain['system']} | "
                f"{chain['tokens_per_s']:.1f} | {chain['tau']:.2f} | {tree['system']} | "
                f"{tree['tokens_per_s']:.1f} | {tree['tau']:.2f} | {ratio:.2f}× |"
            )
    return summary, lines


def main(argv=None) -> int:
    args = parse_args(argv)
    target, drafters, prompts = load(args)
    results = []
    record = run_record(argv)
    path = args.out / f"{args.name}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    for batch in args.batches:
        results += run_batch(args, target, drafters, prompts, batch)
        # Written after each batch size, so a long run that dies keeps what it measured.
        path.write_text(json.dumps(dict(**record, results=results), indent=1))
    summary, lines = summarise(results)
    table = ["| batch | drafter | system | tok/s | τ | × plain |", "|---|---|---|---|---|---|"]
    for r in results:
        plain = next(p for p in results if p["batch"] == r["batch"] and p["drafter"] == "plain")
        table.append(f"| {r['batch']} | {r['drafter']} | {r['system']} | "
                     f"{r['tokens_per_s']:.1f} | {r['tau']:.2f} | "
                     f"{r['tokens_per_s'] / plain['tokens_per_s']:.2f} |")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    report = dict(**record, results=results, summary=summary)
    path.write_text(json.dumps(report, indent=1))
    path.with_suffix(".md").write_text("\n".join(lines + [""] + table) + "\n")
    print("\n".join(lines))
    print(f"wrote {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
