"""bench_e2e's measurements: greedy correctness first, then timing, then step costs,
gathered into one row per system (`run_benchmark`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import specjax
from specjax.decoding import resolve_cache_len

from .costs import (
    alpha_from_hist,
    draft_cost,
    expected_tokens_per_step,
    forward_costs,
    interleaved_cost,
    peak_matmul_flops,
    predicted_speedup,
)
from .greedy import GreedyMismatchError, Mismatch, check_greedy_outputs
from .machine import run_record
from .pairs import (
    Pair,
    describe_lengths,
    encode_prompts,
    group_by_workload,
    load_pair,
    load_prompts,
    log,
    model_name,
    prompts_file,
)
from .systems import System, Transformers, specjax_system
from .targets import VERIFY_WIDTH, real_targets_of, targets_of

NO_ASSISTANT = (
    "Assisted generation needs an assistant model; there is none for {name}, so it is not measured."
)


def logit_gaps_fn(pair: Pair, hf: Transformers, prompts, reference):
    """``mismatch -> {framework: logit[expected] - logit[got]}`` from full forwards.

    Both frameworks score the prompt followed by the reference's tokens up to
    the mismatch, without a cache.
    """

    def gaps(m: Mismatch) -> dict:
        seq = prompts[m.prompt] + reference[m.prompt][: m.position]
        tokens = np.asarray([seq], np.int32)
        positions = np.arange(len(seq), dtype=np.int32)[None]
        cache = pair.target.init_cache(1, len(seq))
        ours = np.asarray(pair.target(tokens, positions, cache).logits[0, -1])
        theirs = hf.last_logits(seq)
        return {
            "specjax": float(ours[m.expected] - ours[m.got]),
            "transformers": float(theirs[m.expected] - theirs[m.got]),
        }

    return gaps


def measure_costs(pair, batch, context, gammas, lookup_gamma, args, block_gammas=()) -> dict:
    """Target forward costs for T=1, T=γ+1 and T=VERIFY_WIDTH, and each drafter's
    proposal cost (seconds).

    ``context`` is the mean prompt length + max_new_tokens // 2 (the mean context of
    a run). ``gammas`` are the draft model's (none without one), ``block_gammas`` the
    block drafter's. The block drafter's proposal cost includes its context update
    with the verified tokens' features (see ``harness.costs.draft_cost``);
    its verify forward, which also returns those features, is measured at
    ``--block-gamma`` only (as ``verify_features``, a diagnostic): it costs the same
    as the plain forward within noise, so the prediction uses the plain forward's
    cost at every γ.
    """
    sampling = specjax.SamplingConfig(temperature=0.0)
    widths = sorted(
        {1, VERIFY_WIDTH}
        | {g + 1 for g in gammas}
        | {lookup_gamma + 1}
        | {g + 1 for g in block_gammas}
    )
    # The decode loops allocate this many slots and attention reads all of them,
    # so the costs are measured against a cache of the same size.
    prompt_len = context - args.max_new_tokens // 2
    cache_len = resolve_cache_len(None, prompt_len, args.max_new_tokens, max(widths))
    kw = dict(repeats=args.cost_repeats, inner=args.cost_inner, cache_len=cache_len)
    costs = {"forward": forward_costs(pair.target, batch, context, widths, **kw), "draft": {}}
    for g in gammas:
        drafter = specjax.DraftModel(pair.draft, num_draft=g)
        costs["draft"][("draft", g)] = draft_cost(drafter, batch, context, sampling, **kw)
    drafter = specjax.PromptLookup(ngram=args.ngram, num_draft=lookup_gamma)
    costs["draft"][("lookup", lookup_gamma)] = draft_cost(drafter, batch, context, sampling, **kw)
    for g in block_gammas:
        drafter = pair.block.with_draft(num_draft=g)
        costs["draft"][("block", g)] = draft_cost(
            drafter, batch, context, sampling, target=pair.target, **kw
        )
    # Diagnostics, not part of the prediction: the main γ's proposal and
    # verification back to back in one loop, and the machine's matmul ceiling.
    costs["interleaved"] = {}
    if pair.draft is not None:
        drafter = specjax.DraftModel(pair.draft, num_draft=args.gamma)
        costs["interleaved"]["draft", args.gamma] = interleaved_cost(
            pair.target, drafter, batch, context, sampling, **kw
        )
    costs["verify_features"] = {}
    bg = args.block_gamma
    if bg in block_gammas:
        drafter = pair.block.with_draft(num_draft=bg)
        if not args.quick:  # a diagnostic; compiling it would be a fifth of --quick's extra
            costs["interleaved"]["block", bg] = interleaved_cost(
                pair.target, drafter, batch, context, sampling, **kw
            )
        layers = drafter.target_layers
        forward = forward_costs(pair.target, batch, context, [bg + 1], feature_layers=layers, **kw)
        costs["verify_features"]["block", bg] = forward[bg + 1]
    costs["peak_flops"] = peak_matmul_flops(256 if args.quick else 1024)
    config = getattr(pair.target, "config", None)
    costs["target_params"] = config.num_params() if config is not None else float("nan")
    return costs


def row_of(system: System, plain: System | None, costs: dict | None) -> dict:
    """A timed system's row: speed, acceptance and, with ``costs``, the prediction.

    ``plain`` is the same framework's plain decoding at the same batch and
    temperature (the speedup's reference); ``costs`` is `measure_costs`'s at the
    system's batch (None: no cost columns).
    """
    o, t = system.outcome, system.timing
    tok_s = o.num_tokens / t.median_s
    row = {
        "framework": system.framework,
        "method": system.method,
        "workload": system.workload,
        "batch": system.batch,
        "temperature": system.temperature,
        "gamma": system.gamma,
        "tokens": o.num_tokens,
        "tok_s": tok_s,
        "median_s": t.median_s,
        "first_s": t.first_s,
        "times_s": t.times_s,
        "compile_s": t.first_s - t.median_s if system.framework == "specjax" else None,
        "speedup": None,
        "acceptance_rate": o.accepted / o.drafted if o.drafted else None,
        "alpha": alpha_from_hist(o.hist) if o.hist else None,
        # α_i per draft position: accepted / judged (None where never judged).
        "acceptance_by_position": (
            [
                a / r if r else None
                for a, r in zip(o.position_accepted, o.position_reached, strict=True)
            ]
            if o.position_reached
            else None
        ),
        "tokens_per_call": o.num_tokens / max(o.target_calls, 1),
        "step_ms": t.median_s / max(o.steps, 1) * 1e3,
        "model_step_ms": None,
        "predicted_speedup": None,
        "realized_over_predicted": None,
    }
    if plain is not None and system is not plain:
        row["speedup"] = tok_s / (plain.outcome.num_tokens / plain.timing.median_s)
    if costs is not None:
        c1 = costs["forward"][1]
        if system.method == "plain":
            row["model_step_ms"] = c1 * 1e3
        else:
            g = system.gamma
            c_verify, c_draft = costs["forward"][g + 1], costs["draft"][(system.method, g)]
            row["model_step_ms"] = (c_verify + c_draft) * 1e3
            row["cost_step_ms"], row["cost_verify_ms"] = c1 * 1e3, c_verify * 1e3
            row["cost_draft_ms"] = c_draft * 1e3
            interleaved = costs.get("interleaved", {}).get((system.method, g))
            row["interleaved_ms"] = None if interleaved is None else interleaved * 1e3
            with_features = costs.get("verify_features", {}).get((system.method, g))
            if with_features is not None:
                row["cost_verify_features_ms"] = with_features * 1e3
            # Compute used by the verification forward: ≈ 2 FLOPs per parameter per token.
            flops = 2 * costs["target_params"] * system.batch * (g + 1)
            row["verify_gflops"] = flops / c_verify / 1e9
            row["peak_gflops"] = costs["peak_flops"] / 1e9
            if row["alpha"] is not None:
                pred = predicted_speedup(row["alpha"], g, c1, c_verify, c_draft)
                row["predicted_speedup"] = pred
                row["realized_over_predicted"] = row["speedup"] / pred
                row["expected_tokens_per_call"] = expected_tokens_per_step(row["alpha"], g)
    return row


def run_benchmark(args) -> dict:
    """Everything ``scripts/benchmarks/bench_e2e.py`` reports, for its parsed arguments.

    Returns:
        The results (what ``results.json`` holds): the rows of `measure_all`, the
        machine, the config, transformers' batch probe, the targets' verdicts and the
        wall time.

    Raises:
        GreedyMismatchError: if a system's greedy output differs from the reference.
    """
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        pair = load_pair(args, Path(tmp))
        path = prompts_file(args, pair)
        limits = {"code": args.num_code, "prose": args.num_prose}
        spec, chat = load_prompts(path, limits, args.per_workload)
        ids, how = encode_prompts(spec, pair.target, pair.tokenizer, args.prompt_tokens, chat)
        workloads = group_by_workload(spec, ids)
        lengths = describe_lengths(workloads)
        log(f"{pair.name}: {len(ids)} prompts from {path.name} ({how}): {lengths}")
        assisted = None
        if pair.draft is None:
            assisted = NO_ASSISTANT.format(name=model_name(pair.target_dir))
            log(assisted)
        hf = Transformers(pair, args)
        try:
            threads, probe_ms = hf.pick_threads(ids[0], args.torch_threads)
            log(f"torch threads: {threads} (ms/token by thread count: {probe_ms or 'not probed'})")
            results = measure_all(args, pair, workloads, hf)
            batch_probe = hf.probe_batch()
        finally:
            hf.close()
    record = run_record()
    results["date"], results["commit"] = record["date"], record["commit"]
    results["machine"] = dict(record["machine"], load_average_1m_start=load_start)
    results["config"] = {
        "pair": pair.name,
        "target_dir": str(pair.target_dir),
        "draft_dir": None if pair.draft_dir is None else str(pair.draft_dir),
        "real_model": pair.real,
        "assisted_generation": assisted,  # why it is not measured; None: it is
        "prompts_file": str(path),
        "num_prompts": len(ids),
        "workloads": lengths,
        "prompt_encoding": how,
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gamma,
        "ngram": args.ngram,
        "large_batch": args.large_batch,
        "repeats": args.repeats,
        "torch_threads": threads,
        "torch_thread_probe_ms_per_token": probe_ms,
        "sweep": list(args.sweep) if pair.draft is not None else [],
        "block_gamma": args.block_gamma,
        "block_sweep": list(args.block_sweep),
        "block_drafter": pair.block_source,
        "command": record["command"],
    }
    results["hf_batch_probe"] = batch_probe
    if pair.real:
        results["targets"] = real_targets_of(results["rows"], results["forward_ms"]["1"])
    else:
        results["targets"] = targets_of(results["rows"], args.large_batch, results["block_sweep"])
    results["wall_s"] = time.perf_counter() - started
    return results


def build_systems(args, pair: Pair, workloads: dict, hf: Transformers):
    """Every system to run, one per workload: ``(main, sweep, block_sweep)``.

    ``main[framework, method, batch, T]``, ``sweep[γ]`` (the draft model's; empty
    without one) and ``block_sweep[γ]`` are each ``{workload: System}``; a sweep's
    entry at the main γ is the main system itself.
    """
    g, large, bg = args.gamma, args.large_batch, args.block_gamma
    methods = ["plain", "lookup", "block"]
    if pair.draft is not None:
        methods.insert(1, "draft")
    main = {}
    for t in (0.0, 1.0):
        for method in methods:
            gamma = {"plain": None, "block": bg}.get(method, g)
            main["specjax", method, 1, t] = {
                w: specjax_system(pair, method, prompts, 1, t, gamma, args, w)
                for w, prompts in workloads.items()
            }
            if method != "block":  # transformers has no block drafter
                main["transformers", method, 1, t] = {
                    w: hf.system(method, prompts, t, w) for w, prompts in workloads.items()
                }
            # --quick leaves out the block drafter's large batch: one more decode loop to
            # compile (~10 s) for a path no different here (tests/test_block_drafter.py
            # covers the drafter at batch > 1).
            if large > 1 and not (args.quick and method == "block"):
                main["specjax", method, large, t] = {
                    w: specjax_system(pair, method, prompts, large, t, gamma, args, w)
                    for w, prompts in workloads.items()
                }

    def sweep_of(method, gammas, main_gamma):
        return {
            gamma: main["specjax", method, 1, 0.0]
            if gamma == main_gamma
            else {
                w: specjax_system(pair, method, prompts, 1, 0.0, gamma, args, w)
                for w, prompts in workloads.items()
            }
            for gamma in gammas
        }

    sweep = sweep_of("draft", args.sweep, g) if pair.draft is not None else {}
    return main, sweep, sweep_of("block", args.block_sweep, bg)


def check_all_greedy(groups, reference, pair, hf, workloads, tie_tol) -> list[Mismatch]:
    """Every greedy system against ``reference`` (``{workload: System}``), workload by workload.

    specjax's systems must agree exactly; transformers' may differ at near-ties
    below ``tie_tol`` (reported). All mismatches are raised together.

    Returns:
        The tolerated near-ties.

    Raises:
        GreedyMismatchError: listing every mismatch, if any is not tolerated.
    """
    ties, failed = [], []
    for w, prompts in workloads.items():
        ref = reference[w].outcome.tokens
        others = [
            parts[w] for parts in groups if parts[w].temperature == 0.0 and parts is not reference
        ]
        try:
            ties += check_greedy_outputs(
                ref,
                {s.label: s.outcome.tokens for s in others},
                logit_gaps=logit_gaps_fn(pair, hf, prompts, ref),
                tie_tol=tie_tol,
                strict={s.label for s in others if s.framework == "specjax"},
            )
        except GreedyMismatchError as e:
            failed += e.mismatches
    if failed:
        raise GreedyMismatchError(failed)
    return ties


def measure_all(args, pair: Pair, workloads: dict, hf: Transformers) -> dict:
    """Runs every system: greedy correctness first, then timing, then step costs.

    Rows are per system over all workloads (``rows``, ``sweep``, ``block_sweep``),
    and per system and workload (``workload_rows``).
    """
    g, large, n, bg = args.gamma, args.large_batch, args.max_new_tokens, args.block_gamma
    main, sweep, block_sweep = build_systems(args, pair, workloads, hf)
    # One entry per distinct group: a sweep's main γ is a main system.
    groups = [*main.values(), *sweep.values(), *block_sweep.values()]
    groups = list({id(parts): parts for parts in groups}.values())
    systems = [s for parts in groups for s in parts.values()]

    # 1. Correctness first: one pass of every greedy system, compared with
    # specjax's plain greedy decoding before anything is timed.
    greedy = [s for s in systems if s.temperature == 0.0]
    for s in greedy:
        log(f"first pass: {s.label}")
        s.first()
    reference = main["specjax", "plain", 1, 0.0]
    for s in reference.values():
        if any(len(r) != n for r in s.outcome.tokens):
            raise RuntimeError(f"{s.label} did not generate {n} tokens per prompt")
    ties = check_all_greedy(groups, reference, pair, hf, workloads, args.tie_tol)
    for m in ties:
        log(f"WARNING near-tie tolerated (|gap| < {args.tie_tol}): {m.describe()}")
    log(f"greedy outputs of {len(greedy)} system passes agree token for token")

    # 2. Timing.
    for s in systems:
        log(f"{args.repeats} timed passes: {s.label}")
        s.time(args.repeats)

    # 3. Step costs for the predicted speedup, at context = mean prompt + n/2.
    log("measuring forward / draft costs")
    lengths = [len(p) for prompts in workloads.values() for p in prompts]
    context = round(statistics.mean(lengths)) + n // 2
    block_gammas = sorted({*args.block_sweep, bg})
    draft_gammas = sorted({*args.sweep, g}) if pair.draft is not None else []
    costs = {1: measure_costs(pair, 1, context, draft_gammas, g, args, block_gammas)}
    if large > 1:
        # --quick skips these (compiling them is most of a quick run).
        large_gammas = [g] if pair.draft is not None else []
        costs[large] = (
            None if args.quick else measure_costs(pair, large, context, large_gammas, g, args, [bg])
        )

    # Each system over all workloads: one pass of it is a pass over every prompt.
    merged = {id(parts): System.merge(list(parts.values())) for parts in groups}

    def whole(parts: dict) -> System:
        return merged[id(parts)]

    def row(parts: dict, workload: str | None = None) -> dict:
        """The row of a system over all workloads (or one), against its own plain."""
        s = next(iter(parts.values()))
        plain = main[s.framework, "plain", s.batch, s.temperature]
        cost = costs[s.batch] if s.framework == "specjax" else None
        if workload is None:
            return row_of(whole(parts), whole(plain), cost)
        return row_of(parts[workload], plain[workload], cost)

    return {
        "near_ties": [dataclasses.asdict(m) for m in ties],
        "greedy_checked": [whole(p).name for p in groups if whole(p).temperature == 0.0],
        "rows": [row(parts) for parts in main.values()],
        "workload_rows": [row(parts, w) for parts in main.values() for w in parts],
        "sweep": [row(parts) for parts in sweep.values()],
        "block_sweep": [row(parts) for parts in block_sweep.values()],
        "forward_ms": {
            str(b): {str(t): c * 1e3 for t, c in cost["forward"].items()}
            for b, cost in costs.items()
            if cost is not None
        },
        "context": context,
    }
