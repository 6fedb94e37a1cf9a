"""Offline throughput: N prompts through 1, 4, 16 and 64 slots, with and without refill.

``--num-prompts`` (64) prompts cut from held-out standard-library files (16 to 64 tokens),
each with a budget drawn from ``[--min-new, --max-new]``, stopping at EOS too. For each
slot count: tokens per second (compilation apart) and the idle row-steps, ``1 - Σ active
row-steps / (loop iterations · slots)``, of plain decoding in static batches of ``slots``
rows, plain decoding with refill (``num_slots``), speculative decoding with refill at each
γ of ``--gammas``, and with adaptive γ (``gamma_by_active_rows``: at each slot count the
fastest fixed γ, 0 included, or ``--table``). All at T = 0, every output checked equal to
plain greedy decoding first; then at T = 1 ``DraftModel`` with its true q against
``greedy_draft=True`` and confidence thresholds τ.

    python scripts/benchmarks/bench_throughput.py --table 1:4,4:4,16:3,64:0   # bundled pair
    python scripts/benchmarks/bench_throughput.py --quick                     # tiny random pair

Writes ``NAME.json`` (date, commit, command, machine) and ``NAME.md`` under ``--out``
(default ``scripts/benchmarks/results/throughput``; ``--name``: ``bundled`` or ``quick``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

import specjax
from harness import RESULTS, first_difference, table, write_results
from specjax.core.timing import time_fn
from specjax.training import data
from specjax.training import tokenizer as tokenizer_lib


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny random pair, few prompts")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--min-new", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--confidences", type=float, nargs="+", default=[0.3, 0.6])
    parser.add_argument("--sampled-slots", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--table",
        default=None,
        help="'rows:γ,...' adaptive table to use as given: skips the static "
        "and fixed-γ runs that otherwise choose it",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput")
    parser.add_argument("--name", help="file name stem (default: bundled, or quick)")
    args = parser.parse_args(argv)
    if args.name is None:
        args.name = "quick" if args.quick else "bundled"
    if args.quick:
        args.num_prompts, args.slots, args.gammas, args.repeats = 6, [1, 3], [1], 1
        args.min_new, args.max_new, args.sampled_slots, args.confidences = 4, 12, [3], [0.3]
    if args.table is not None:
        try:
            pairs = [item.split(":") for item in args.table.split(",")]
            args.table = {int(rows): int(gamma) for rows, gamma in pairs}
        except ValueError:
            parser.error(f"--table must look like '1:4,16:2,64:0', got {args.table!r}")
    if max(args.slots) > args.num_prompts:
        parser.error(f"--slots {max(args.slots)} is more than --num-prompts {args.num_prompts}")
    return args


def load(args):
    """``(target, draft model, slot-sweep drafter factory γ -> Drafter, eos id)``."""
    if args.quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=64, init_scale=4.0)
        draft = specjax.testing.perturbed(target, seed=1)
        block = specjax.BlockDrafter.random(
            target, key=jax.random.key(2), num_draft=max(args.gammas)
        )
        return target, draft, block, None
    target, draft, tok = specjax.default_pair()
    block = specjax.io.pretrained.default_drafter("block", num_draft=max(args.gammas))
    return target, draft, block, tokenizer_lib.eos_id(tok)


def make_workload(args, target):
    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 65, size=args.num_prompts)
    budgets = rng.integers(args.min_new, args.max_new + 1, size=args.num_prompts)
    if args.quick:
        return [list(rng.integers(0, target.vocab_size, size=n)) for n in lengths // 4], budgets
    stream = data.tokenize_documents(target.tokenizer, data.stdlib_documents("heldout"))
    starts = np.linspace(0, len(stream) - 65, args.num_prompts).astype(int)
    return [stream[s : s + n].tolist() for s, n in zip(starts, lengths, strict=True)], budgets


def idle_fraction(stats_list, slots: int) -> float:
    calls = sum(int(s.target_calls) for s in stats_list)
    active = sum(int(np.sum(s.row_target_calls)) for s in stats_list)
    return 1.0 - active / max(calls * slots, 1)


def measure(fn, repeats: int):
    timing, outs = time_fn(fn, repeats=repeats)
    outs = outs if isinstance(outs, list) else [outs]
    tokens = sum(int(np.sum(o.lengths)) for o in outs)
    return dict(
        seconds=timing.median_s,
        first_s=timing.first_s,
        tokens=tokens,
        tokens_per_s=tokens / timing.median_s,
        target_calls=sum(int(o.stats.target_calls) for o in outs),
        tokens_per_call=tokens / max(sum(int(np.sum(o.stats.row_target_calls)) for o in outs), 1),
        acceptance=float(
            sum(int(np.sum(o.stats.accepted)) for o in outs)
            / max(sum(int(np.sum(o.stats.drafted)) for o in outs), 1)
        ),
    ), outs


def check_equal(name, outs, reference):
    got = [row for o in outs for row in o.to_lists()]
    for i, (a, b) in enumerate(zip(got, reference, strict=True)):
        if (at := first_difference(b, a)) is not None:
            sys.exit(f"FAIL: {name}: prompt {i} differs from plain greedy at new token {at}")


def sweep_slots(args, target, block, eos, prompts, budgets):
    greedy = specjax.SamplingConfig.greedy()
    key = jax.random.key(0)
    kw = dict(sampling=greedy, eos_id=eos)
    reference = specjax.generate(key, target, prompts, max_new_tokens=budgets, **kw).to_lists()
    rows, fixed = [], {}

    def record(system, slots, fn, **extra):
        result, outs = measure(fn, args.repeats)
        check_equal(f"{system} at {slots} slots", outs, reference)
        result.update(
            system=system, slots=slots, idle=idle_fraction([o.stats for o in outs], slots)
        )
        result.update(extra)
        rows.append(result)
        print(
            f"  {system:<22} slots {slots:>3}: {result['tokens_per_s']:8.1f} tok/s, idle "
            f"{result['idle']:.1%}, tokens/call {result['tokens_per_call']:.2f}",
            flush=True,
        )
        return result

    for slots in args.slots:
        # γ = 0 in the table is a plain step: the plain run is its measurement.
        fixed[slots, 0] = record(
            "plain refill",
            slots,
            lambda slots=slots: specjax.generate(
                key, target, prompts, max_new_tokens=budgets, num_slots=slots, **kw
            ),
        )
        if args.table is not None:
            continue

        def static(slots=slots):
            return [
                specjax.generate(
                    key,
                    target,
                    prompts[i : i + slots],
                    max_new_tokens=budgets[i : i + slots],
                    **kw,
                )
                for i in range(0, len(prompts), slots)
            ]

        record("plain static batch", slots, static)
        for gamma in args.gammas:
            drafter = block.replace(num_draft=gamma)
            fixed[slots, gamma] = record(
                f"spec γ={gamma} refill",
                slots,
                lambda drafter=drafter, slots=slots: specjax.speculative_generate(
                    key,
                    target,
                    drafter,
                    prompts,
                    max_new_tokens=budgets,
                    num_slots=slots,
                    **kw,
                ),
                gamma=gamma,
            )
    # The table: at each slot count the fastest fixed γ (0: plain), for up to that many
    # active rows.
    table = args.table or {
        slots: max([0, *args.gammas], key=lambda g, s=slots: fixed[s, g]["tokens_per_s"])
        for slots in args.slots
    }
    print(f"  adaptive table (max active rows: γ): {table}", flush=True)
    for slots in args.slots:
        record(
            "spec adaptive refill",
            slots,
            lambda slots=slots: specjax.speculative_generate(
                key,
                target,
                block,
                prompts,
                max_new_tokens=budgets,
                num_slots=slots,
                gamma_by_active_rows=table,
                **kw,
            ),
        )
    return rows, table


def sweep_sampled(args, target, draft, eos, prompts, budgets):
    """T=1: DraftModel with its q, with argmax drafts, and with confidence thresholds."""
    key = jax.random.key(0)
    kw = dict(sampling=specjax.SamplingConfig(temperature=1.0), eos_id=eos, max_new_tokens=budgets)
    gamma = max(args.gammas)
    rows = []
    variants = [
        ("plain", None, {}),
        ("draft q", specjax.DraftModel(draft, num_draft=gamma), {}),
        ("draft argmax", specjax.DraftModel(draft, num_draft=gamma, greedy_draft=True), {}),
    ]
    variants += [
        (
            f"draft q, τ={tau}",
            specjax.DraftModel(draft, num_draft=gamma),
            dict(draft_confidence=tau),
        )
        for tau in args.confidences
    ]
    for slots in args.sampled_slots:
        for name, drafter, extra in variants:
            if drafter is None:
                fn = lambda slots=slots: specjax.generate(
                    key, target, prompts, num_slots=slots, **kw
                )  # noqa: E731
            else:
                fn = lambda drafter=drafter, extra=extra, slots=slots: specjax.speculative_generate(  # noqa: E731
                    key, target, drafter, prompts, num_slots=slots, **kw, **extra
                )
            result, outs = measure(fn, args.repeats)
            result.update(system=name, slots=slots, gamma=gamma)
            rows.append(result)
            print(
                f"  T=1 {name:<18} slots {slots:>3}: {result['tokens_per_s']:8.1f} tok/s, "
                f"acceptance {result['acceptance']:.3f}, "
                f"tokens/call {result['tokens_per_call']:.2f}",
                flush=True,
            )
    return rows


SLOT_COLUMNS = ["system", "slots", ("tokens_per_s", ".1f"), ("idle", ".1%")]
SLOT_COLUMNS += [("tokens_per_call", ".2f"), ("acceptance", ".3f")]


def markdown(results) -> str:
    sampled = ["system", "slots", ("tokens_per_s", ".1f"), ("tokens_per_call", ".2f")]
    return "\n\n".join(
        [
            table(results["slots"], SLOT_COLUMNS),
            f"Adaptive table (max active rows: γ): `{results['table']}`",
            "T = 1",
            table(results["sampled"], [*sampled, ("acceptance", ".3f")]),
        ]
    )


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    target, draft, block, eos = load(args)
    prompts, budgets = make_workload(args, target)
    print(
        f"{len(prompts)} prompts, budgets {budgets.min()}..{budgets.max()}, "
        f"{jax.devices()[0].device_kind}",
        flush=True,
    )
    slot_rows, table = sweep_slots(args, target, block, eos, prompts, budgets)
    sampled_rows = sweep_sampled(args, target, draft, eos, prompts, budgets)
    results = dict(
        config=dict(
            vars(args),
            out=str(args.out),
            device=jax.devices()[0].device_kind,
            budgets=budgets.tolist(),
            prompt_lengths=[len(p) for p in prompts],
        ),
        slots=slot_rows,
        table={str(k): v for k, v in table.items()},
        sampled=sampled_rows,
        wall_s=time.perf_counter() - start,
    )
    write_results(args.out / f"{args.name}.json", results, argv)
    (args.out / f"{args.name}.md").write_text(markdown(results) + "\n")
    print(markdown(results))
    print(f"wrote {args.out}/{args.name}.json and .md ({results['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
