#!/usr/bin/env python
"""End to end on many prompts: plain decoding against each drafter, and the speedup the
measured step costs predict.

On one target, at T = 0 and 1, batch 1 and ``--large-batch``, it decodes every prompt
with plain decoding, the draft model (``DraftModel``, γ = ``--gamma``; with a draft),
prompt lookup (``PromptLookup``) and the block drafter (``BlockDrafter``, γ =
``--block-gamma``), then sweeps γ of the draft model (``--sweep``) and of the block
drafter (``--block-sweep``) at T = 0, batch 1. The bundled pair decodes
``prompts/bench_prompts.json`` (code and prose, cut to ``--prompt-tokens``); a
``--target`` with a chat template ``prompts/real_prompts.json`` in its chat template.
EOS never stops a row. Before timing, every greedy speculative output is checked equal
to plain decoding's (exit 1 naming the system, row and position otherwise).

Speed is the tokens of a pass over every prompt over the median of ``--repeats`` timed
passes after a compiling one. *Predicted* is `specjax.tuning.choose`'s
expected speedup from the step costs `specjax.tuning.measure` takes at
batch 1 and the row's acceptance by position. Writes ``OUT/NAME.json`` (date, commit,
command, machine) and ``OUT/NAME.md`` (default ``scripts/benchmarks/results/e2e``).

    python scripts/benchmarks/bench_e2e.py --repeats 3                # the bundled pair
    python scripts/benchmarks/bench_e2e.py --quick --out /tmp/e2e     # tiny random pair
    python scripts/benchmarks/bench_e2e.py --target SmolLM2-135M-Instruct.Q4_1.gguf \\
        --block-drafter specjax/assets/smollm2 --block-gamma 1 --block-sweep 1 3 \\
        --large-batch 8 --per-workload 4 --max-new-tokens 48 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from harness import RESULTS, ROOT, first_difference, logger, table, write_results
from specjax import tuning
from specjax.core.timing import time_call

log = logger("bench_e2e")
PROMPTS = ROOT / "prompts"


def load_pair(args):
    """``(target, draft or None, tokenizer or None, block drafter, its source)``."""
    if args.target:
        target = specjax.load_pretrained(args.target, dtype=jnp.float32)
        draft = specjax.load_pretrained(args.draft, dtype=jnp.float32) if args.draft else None
        tokenizer = target.tokenizer
    elif args.quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0)
        draft = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0, num_layers=1)
        tokenizer = None
    else:
        target, draft, tokenizer = specjax.default_pair()
    from specjax.drafters.block import BlockDrafter
    from specjax.io import drafter_weights

    if args.block_drafter:
        block = drafter_weights.load(BlockDrafter, args.block_drafter, target)
        source = f"loaded from {args.block_drafter}"
    elif not (args.quick or args.target):
        # Sharing the pair's target: the drafter's embedding and head are its arrays.
        block = specjax.io.pretrained.default_drafter("block").replace(target=target)
        source = "bundled"
    else:
        block = BlockDrafter.random(
            target, key=jax.random.key(args.seed), num_draft=1, num_layers=1, block_size=16
        )
        source = "random weights (BlockDrafter.random, 1 layer, block size 16)"
    if args.block_gamma is None:
        args.block_gamma = min(7, block.block_size - 1)
    too_long = [g for g in [args.block_gamma, *args.block_sweep] if g > block.block_size - 1]
    if too_long:
        raise SystemExit(
            f"--block-gamma/--block-sweep {too_long}: this block drafter takes γ in "
            f"[1, {block.block_size - 1}]"
        )
    return target, draft, tokenizer, block.with_draft(mode=args.block_mode), source


def load_workloads(args, target, tokenizer) -> dict[str, list[list[int]]]:
    """Workload -> its prompts' token ids (UTF-8 bytes for a pair without a tokenizer)."""
    chat = args.target is not None and getattr(target, "chat_template", None) is not None
    path = args.prompts or PROMPTS / ("real_prompts.json" if chat else "bench_prompts.json")
    spec = json.loads(Path(path).read_text())
    workloads = {}
    for kind, items in spec.items():
        if not isinstance(items, list):
            continue
        texts = [p["text"] for p in items[: args.per_workload]]
        if chat:
            message = lambda t: [{"role": "user", "content": t}]  # noqa: E731
            ids = [specjax.apply_chat_template(target, message(t), tokenize=True) for t in texts]
        elif tokenizer is not None:
            ids = [
                tokenizer.encode(t, add_special_tokens=False).ids[-args.prompt_tokens :]
                for t in texts
            ]
        else:
            ids = [list(t.encode("utf-8"))[-args.prompt_tokens :] for t in texts]
        workloads[kind] = ids
    if not chat:  # one length: one compiled program per system
        length = min(len(p) for ids in workloads.values() for p in ids)
        workloads = {w: [p[-length:] for p in ids] for w, ids in workloads.items()}
    return workloads


def batches_of(prompts: list, batch: int) -> list[list]:
    """The prompts in batches of ``batch`` rows, cycling through them to fill the last."""
    rows = [prompts[i % len(prompts)] for i in range(-(-len(prompts) // batch) * batch)]
    return [rows[i : i + batch] for i in range(0, len(rows), batch)]


class System:
    """One decoder at one batch size and temperature over every workload."""

    def __init__(self, method, drafter, batch, temperature, args, target, workloads):
        self.method, self.batch, self.temperature = method, batch, temperature
        self.gamma = None if drafter is None else drafter.num_draft
        self.name = (
            f"{method}{f' γ={self.gamma}' if self.gamma else ''} b={batch} T={temperature:g}"
        )
        sampling = specjax.SamplingConfig(temperature=temperature)
        key = jax.random.key(args.seed)
        kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)

        def one(i, rows):
            k = jax.random.fold_in(key, i)
            if drafter is None:
                return specjax.generate(k, target, rows, **kw)
            return specjax.speculative_generate(k, target, drafter, rows, **kw)

        self.passes = {
            w: lambda ids=ids: [one(i, rows) for i, rows in enumerate(batches_of(ids, batch))]
            for w, ids in workloads.items()
        }
        self.times = {w: [] for w in workloads}

    def first(self):
        """One pass over every workload (compiling): the first seconds and the outputs."""
        done = {w: time_call(run) for w, run in self.passes.items()}
        self.first_s = sum(s for s, _ in done.values())
        self.outputs = {w: out for w, (_, out) in done.items()}

    def time(self, repeats: int):
        for _ in range(repeats):
            for w, run in self.passes.items():
                self.times[w].append(time_call(run)[0])

    def tokens(self, workload: str) -> list[list[int]]:
        return [row for out in self.outputs[workload] for row in out.to_lists()]

    def row(self, plain: System | None, costs: dict) -> dict:
        outs = [o for w in self.outputs for o in self.outputs[w]]
        stats = [jax.device_get(o.stats) for o in outs]
        tokens = sum(int(np.sum(o.lengths)) for o in outs)
        median_s = statistics.median(map(sum, zip(*self.times.values(), strict=True)))
        row = dict(
            method=self.method,
            batch=self.batch,
            temperature=self.temperature,
            gamma=self.gamma,
            tokens=tokens,
            tok_s=tokens / median_s,
            median_s=median_s,
            first_s=self.first_s,
            compile_s=self.first_s - median_s,
            speedup=None,
            acceptance_rate=None,
            tokens_per_call=tokens / max(sum(int(np.sum(s.row_target_calls)) for s in stats), 1),
            acceptance_by_position=None,
            predicted_speedup=None,
            realized_over_predicted=None,
            workload_tok_s={
                w: sum(int(np.sum(o.lengths)) for o in self.outputs[w]) / statistics.median(t)
                for w, t in self.times.items()
            },
        )
        if plain is not None and plain is not self:
            row["speedup"] = row["tok_s"] / plain.row(None, {})["tok_s"]
        if self.gamma:
            drafted = sum(int(np.sum(s.drafted)) for s in stats)
            row["acceptance_rate"] = sum(int(np.sum(s.accepted)) for s in stats) / max(drafted, 1)
            reached = np.sum([np.asarray(s.position_reached) for s in stats], 0)
            taken = np.sum([np.asarray(s.position_accepted) for s in stats], 0)
            row["acceptance_by_position"] = [
                float(a / r) if r else None for a, r in zip(taken, reached, strict=True)
            ]
            measured = costs.get(self.method)
            if measured is not None and self.batch == 1 and self.gamma <= measured.max_gamma:
                alpha = [a or 0.0 for a in row["acceptance_by_position"]]
                choice = tuning.choose(measured, alpha)
                row["predicted_speedup"] = choice.speedups[self.gamma]
                row["realized_over_predicted"] = row["speedup"] / row["predicted_speedup"]
        return row


def check_greedy(systems: list[System], plain: dict) -> list[str]:
    """Every greedy speculative system's output against plain decoding's at its batch."""
    failures = []
    for s in systems:
        ref = plain.get(s.batch)
        if s.temperature or s.method == "plain" or ref is None:
            continue
        for w in s.outputs:
            for r, (want, got) in enumerate(zip(ref.tokens(w), s.tokens(w), strict=True)):
                at = first_difference(want, got)
                if at is not None:
                    expected = want[at] if at < len(want) else None
                    found = got[at] if at < len(got) else None
                    failures.append(
                        f"{s.name} [{w}]: row {r} differs from plain decoding at new token "
                        f"{at}: expected {expected}, got {found}"
                    )
    return failures


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", help="a Hugging Face folder or a GGUF (default: the bundled pair)")
    p.add_argument("--draft", help="a draft model for --target (default: none)")
    p.add_argument("--prompts", type=Path, help="prompt file (workloads: lists of {name, text})")
    p.add_argument("--per-workload", type=int, help="first N prompts of every workload")
    p.add_argument("--prompt-tokens", type=int, default=80, help="text prompts' last N tokens")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--gamma", type=int, default=4, help="draft model's and lookup's γ")
    p.add_argument("--ngram", type=int, default=3, help="prompt lookup: longest n-gram")
    p.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    p.add_argument("--block-gamma", type=int, help="default: the largest it takes, at most 7")
    p.add_argument("--block-sweep", type=int, nargs="+", default=[1, 2, 3, 4, 5, 7])
    p.add_argument("--block-mode", choices=["argmax", "sample"], default="sample")
    p.add_argument("--block-drafter", help="block drafter folder (default: the bundled one)")
    p.add_argument("--large-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="timed passes after the first")
    p.add_argument("--cost-repeats", type=int, default=3, help="tuning.measure's repeats")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "e2e")
    p.add_argument("--name", help="file name stem (default: bundled, quick or the target's)")
    p.add_argument("--quick", action="store_true", help="a tiny random pair, seconds")
    args = p.parse_args(argv)
    if args.draft and not args.target:
        p.error("--draft needs --target")
    if args.quick:
        args.per_workload, args.prompt_tokens, args.max_new_tokens = 1, 24, 12
        args.gamma, args.sweep, args.large_batch, args.repeats = 2, [1, 2], 4, 1
        args.block_gamma, args.block_sweep, args.cost_repeats = 2, [2], 1
    if args.name is None:
        target = Path(args.target or "").name.split(".")[0].lower()
        args.name = "quick" if args.quick else target or "bundled"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    target, draft, tokenizer, block, source = load_pair(args)
    workloads = load_workloads(args, target, tokenizer)
    log(f"prompts per workload: { {w: len(p) for w, p in workloads.items()} }")
    drafters = {
        "plain": lambda g: None,
        "lookup": lambda g: specjax.PromptLookup(ngram=args.ngram, num_draft=g),
    }
    drafters["block"] = lambda g: block.with_draft(num_draft=g)
    if draft is not None:
        drafters["draft"] = lambda g: specjax.DraftModel(draft, num_draft=g)
    main_gamma = {
        "plain": None,
        "lookup": args.gamma,
        "draft": args.gamma,
        "block": args.block_gamma,
    }

    def system(method, gamma, batch, t):
        return System(method, drafters[method](gamma), batch, t, args, target, workloads)

    systems = {}
    for t in (0.0, 1.0):
        for method in drafters:
            for b in (1, args.large_batch):
                if not (args.quick and method == "block" and b > 1):
                    systems[method, b, t] = system(method, main_gamma[method], b, t)
    sweeps = {"draft": args.sweep if draft is not None else [], "block": args.block_sweep}
    swept = {
        (m, g): systems.get((m, 1, 0.0)) if g == main_gamma[m] else system(m, g, 1, 0.0)
        for m, gammas in sweeps.items()
        for g in gammas
    }
    every = list({id(s): s for s in [*systems.values(), *swept.values()]}.values())
    for s in every:
        log(f"first pass: {s.name}")
        s.first()
    plain = {b: systems["plain", b, 0.0] for b in (1, args.large_batch)}
    failures = check_greedy(every, plain)
    if failures:
        print(
            "FAIL: greedy outputs differ; no timing is reported for wrong outputs", file=sys.stderr
        )
        print("\n".join(failures), file=sys.stderr)
        return 1
    log(f"greedy outputs of {len(every)} systems agree token for token with plain decoding")
    for s in every:
        log(f"{args.repeats} timed passes: {s.name}")
        s.time(args.repeats)
    costs = {}
    probe = [next(iter(workloads.values()))[0]]
    for method in ("draft", "lookup", "block"):
        if method in drafters:
            top = max([main_gamma[method], *sweeps.get(method, [])])
            log(f"step costs: {method}, γ 1..{top}")
            costs[method], _, _ = tuning.measure(
                target,
                drafters[method](top),
                probe,
                max_new_tokens=args.max_new_tokens,
                repeats=args.cost_repeats,
            )

    def row(s):
        return s.row(systems["plain", s.batch, s.temperature], costs)

    results = {
        "config": dict(
            vars(args),
            out=str(args.out),
            prompts=str(args.prompts),
            block_drafter_source=source,
            workloads={w: [len(p) for p in ids] for w, ids in workloads.items()},
        ),
        "greedy_checked": [s.name for s in every if s.temperature == 0.0],
        "rows": [row(s) for s in systems.values()],
        "sweep": [row(swept["draft", g]) for g in sweeps["draft"]],
        "block_sweep": [row(swept["block", g]) for g in sweeps["block"]],
        "step_costs": {m: c.to_json() for m, c in costs.items()},
    }
    columns = [
        "method",
        "gamma",
        "batch",
        "temperature",
        ("tok_s", ".1f"),
        ("speedup", ".2f"),
        ("acceptance_rate", ".2f"),
        ("tokens_per_call", ".2f"),
        ("predicted_speedup", ".2f"),
    ]
    text = "\n\n".join(
        [
            f"# {args.name}: {args.max_new_tokens} new tokens, medians of {args.repeats} passes",
            table(results["rows"], columns),
            "γ sweep (draft model, T = 0, batch 1)",
            table(results["sweep"], columns),
            "Block-size sweep (block drafter, T = 0, batch 1)",
            table(results["block_sweep"], columns),
        ]
    )
    print(text)
    write_results(args.out / f"{args.name}.json", results, argv)
    (args.out / f"{args.name}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
