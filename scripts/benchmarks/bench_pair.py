#!/usr/bin/env python
"""The real pair on this CPU: Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B.

Stages (``--stages``, in this order; each writes its part of ``OUT/NAME.json``, with
the date, the commit, the command and the machine; ``--out`` defaults to
``scripts/benchmarks/results/real_pair`` and ``--name`` to ``pair``):

* ``load``: the 1.5B's load time through the converted-weights cache, first (the
  GGUF is dequantized and the entry written, unless it is already there) and second
  (a fresh process reading the entry).
* ``steps``: for each weight precision (float32, bfloat16, int8 weights, int8 weights
  and activations) the target's T = 1 step and T = γ+1 verify forward at a context of
  ``--context`` tokens, against the weight bytes a step reads over the measured
  memory bandwidth; the same for the draft model.
* ``logits``: each precision's distance from float32 on the chat prompts, teacher
  forced on float32's greedy continuation: top-1 agreement and KL(p32 ‖ p).
* ``e2e``: specjax plain, with the draft model (γ sweep, each γ optionally with a
  ``draft_confidence`` τ, written ``γ:τ``; any draft precision, its head
  optionally cut to the K most frequent ids) and with prompt lookup, T = 0 and T = 1,
  ``--batch`` rows at a time, per workload (chat, code editing), each next to a plain
  run of its own; rates end to end (prefill included). The greedy outputs are checked
  equal to plain decoding's (same target precision); a mismatch stops the run.
* ``fastest``: the fastest configuration with speculation against the fastest without,
  at any weight precision: plain decoding at each of ``--plain-precisions`` and the
  first ``--combos`` entry at the first chain of ``--gammas`` (``--t1-gamma`` at T = 1),
  all timed round robin in one run, T = 0 and T = 1, with each plain precision's greedy
  agreement with float32's.

transformers on the same files is ``bench_real_pair.py --stages peers``, each system in
a process of its own.

    python scripts/benchmarks/bench_pair.py                                        # everything
    python scripts/benchmarks/bench_pair.py --stages steps logits --out /tmp/pair  # a part
    python scripts/benchmarks/bench_pair.py --quick --out /tmp/pair                # minutes

The models are fetched by name on first use (`specjax.fetch`, about 1.6 GB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from harness.machine import RESULTS, run_record
from specjax.core.timing import time_interleaved, time_runs
from specjax.models.quant import quantize
from specjax.verification.tree import Tree

ROOT = Path(__file__).resolve().parents[2]  # the checkout
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
PRECISIONS = ("float32", "bfloat16", "int8-weights", "int8")
PROMPTS_FILE = ROOT / "prompts" / "real_prompts.json"  # chat and code-edit workloads


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--stages",
        nargs="+",
        default=["load", "steps", "logits", "e2e", "fastest"],
        choices=["load", "steps", "logits", "e2e", "fastest"],
    )
    p.add_argument("--out", type=Path, default=RESULTS / "real_pair")
    p.add_argument("--name", default="pair", help="results file name stem (default: pair)")
    p.add_argument(
        "--precisions",
        nargs="+",
        default=list(PRECISIONS),
        choices=PRECISIONS,
        help="weight precisions of the steps stage",
    )
    p.add_argument(
        "--combos",
        nargs="+",
        default=["float32/float32", "float32/int8", "float32/lookup"],
        help="TARGET/DRAFT precisions of the e2e stage; DRAFT:K keeps K ids in the draft's"
        " head (`specjax.sampling.vocab.frequent_ids`), DRAFT 'lookup' is prompt lookup",
    )
    p.add_argument(
        "--plain-precisions", nargs="+", default=["float32", "int8"], choices=PRECISIONS,
        help="target precisions of plain decoding in the fastest stage",
    )  # fmt: skip
    p.add_argument("--context", type=int, default=160, help="tokens in the cache (steps)")
    p.add_argument(
        "--gammas", type=parse_gamma, nargs="+", default=[(3, None), (4, None)],
        help="γ at T = 0, each 'γ', 'γ:τ' (e2e with draft_confidence τ) or a tree's "
        "branching 'b1,b2,...' (`specjax.verification.Tree.from_branching`)",
    )  # fmt: skip
    p.add_argument(
        "--t1-gamma", type=parse_gamma, nargs="+", default=[(4, None)],
        help="γ at T = 1, each 'γ', 'γ:τ' or a tree's branching 'b1,b2,...'",
    )  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--per-workload", type=int, default=1, help="prompts per workload")
    p.add_argument("--repeats", type=int, default=5, help="timed forwards (steps)")
    p.add_argument(
        "--e2e-repeats", type=int, default=2,
        help="e2e: timed rounds of a plain and a speculative pass (the best of each)",
    )  # fmt: skip
    p.add_argument("--batch", type=int, default=1, help="rows per batch (e2e)")
    p.add_argument("--quick", action="store_true", help="one prompt, 8 tokens, 2 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.max_new_tokens, args.per_workload, args.repeats = 8, 1, 2
        args.gammas, args.t1_gamma = [(2, None), (2, 0.5)], [(2, None)]
    return args


def parse_gamma(text: str) -> tuple[int | str, float | None]:
    """``"γ"`` or ``"γ:τ"`` (a draft_confidence) as ``(γ, τ or None)``; a tree's
    branching ``"b1,b2,..."`` as ``(the same text, None)``."""
    if "," in text:
        try:
            Tree.from_branching(tuple(int(b) for b in text.split(",")))
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"bad tree branching {text!r}: {e}") from None
        return text, None
    gamma, _, tau = text.partition(":")
    try:
        return int(gamma), float(tau) if tau else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'γ', 'γ:τ' or 'b1,b2,...', got {text!r}"
        ) from None


def chain_gammas(args) -> list[int]:
    """The chains' γ at T = 0 (trees left out), or [3] if there are none."""
    return [g for g, _ in args.gammas if isinstance(g, int)] or [3]


def with_precision(model, precision: str):
    """``model`` (float32) at ``precision``."""
    if precision == "float32":
        return model
    if precision == "bfloat16":
        return model.replace(params=jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params))
    return quantize(model, precision)


def step_bytes(model) -> int:
    """Bytes one decode step reads: every parameter, except an untied embedding table
    (only B·T of its rows are read)."""
    total = sum(x.nbytes for x in jax.tree.leaves(model.params))
    if not model.config.tie_word_embeddings:
        table = model.params["embed_tokens"]["embedding"].get_value()
        total -= table.nbytes
    return total


def bandwidth_gbs(gb: float = 2.0) -> float:
    """Streaming read bandwidth: GB/s of a float32 sum over ``gb`` GB (median of 5)."""
    x = jnp.ones((int(gb * 1e9 / 4),), jnp.float32)
    times, _ = time_runs(jax.jit(jnp.sum), x, repeats=5, warmup=1)
    del x
    return gb / float(np.median(times))


def forward_times(model, context: int, widths, repeats: int) -> dict[int, float]:
    """Median seconds of one forward of ``T`` tokens after ``context`` cached ones."""
    cache_len = context + max(widths) + 8
    tokens = jnp.ones((1, context), jnp.int32)
    prefill = jax.jit(lambda m, t, c: m(t, jnp.arange(context)[None], c).cache)
    cache = prefill(model, tokens, model.init_cache(1, cache_len))
    out = {}
    for width in widths:
        positions = context + jnp.arange(width)[None]
        step = jax.jit(lambda m, t, c, p=positions: m(t, p, c).logits)
        times, _ = time_runs(
            step, model, jnp.ones((1, width), jnp.int32), cache, repeats=repeats, warmup=1
        )
        out[width] = float(np.median(times))
    return out


def stage_load(args, results):
    from specjax.io import converted

    path = specjax.fetch(TARGET)
    root = converted.cache_dir()
    entry = None if root is None else converted.entry_for(path, jnp.float32, root)
    cached = entry is not None and (entry / "config.json").is_file()
    code = (
        "import time, specjax; t = time.perf_counter(); "
        f"specjax.load_pretrained({str(path)!r}); print(time.perf_counter() - t)"
    )
    times = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        times.append(float(done.stdout.strip().splitlines()[-1]))
        log(f"load of the 1.5B in a fresh process: {times[-1]:.1f} s")
    results["load"] = dict(
        first_s=None if cached else round(times[0], 1),
        first_was_cached=cached,
        second_s=round(times[1], 1),
        entry=str(entry),
    )


def load_models():
    target = specjax.load_pretrained(specjax.fetch(TARGET))
    draft = specjax.load_pretrained(specjax.fetch(DRAFT))
    return target, draft


def stage_steps(args, results, target, draft):
    gbs = bandwidth_gbs()
    log(f"streaming read bandwidth: {gbs:.1f} GB/s")
    widths = sorted({1, *(g + 1 for g, _ in args.gammas if isinstance(g, int))})
    rows = []
    for role, model in (("target", target), ("draft", draft)):
        for precision in args.precisions:
            m = with_precision(model, precision)
            times = forward_times(m, args.context, widths, args.repeats)
            nbytes = step_bytes(m)
            limit = nbytes / 1e9 / gbs
            row = dict(
                role=role,
                precision=precision,
                weight_gb=round(nbytes / 1e9, 3),
                limit_ms=round(limit * 1e3, 1),
                ms={w: round(t * 1e3, 1) for w, t in times.items()},
                step_over_limit=round(times[1] / limit, 2),
                verify_over_step={w: round(times[w] / times[1], 2) for w in widths if w > 1},
            )
            log(f"{role} {precision}: {row}")
            rows.append(row)
            del m
    old = {(r["role"], r["precision"]): r for r in results.get("steps", {}).get("rows", [])}
    old.update({(r["role"], r["precision"]): r for r in rows})  # a partial run adds to it
    results["steps"] = dict(
        bandwidth_gbs=round(gbs, 1), context=args.context, rows=list(old.values())
    )


def chat_prompts(tokenizer_model, per_workload: int) -> dict[str, list[list[int]]]:
    spec = json.loads(PROMPTS_FILE.read_text())
    out = {}
    for workload, items in spec.items():
        if not isinstance(items, list):
            continue
        ids = []
        for item in items[:per_workload]:
            message = [{"role": "user", "content": item["text"]}]
            ids.append(list(specjax.apply_chat_template(tokenizer_model, message, tokenize=True)))
        out[workload] = ids
    return out


def stage_logits(args, results, target, workloads):
    greedy = specjax.SamplingConfig.greedy()
    prompts = [p for ps in workloads.values() for p in ps]
    ref = specjax.generate(
        jax.random.key(0), target, prompts, max_new_tokens=args.max_new_tokens, sampling=greedy
    )
    seqs = [p + row for p, row in zip(prompts, ref.to_lists(), strict=True)]

    def log_probs(model, seq):
        tokens = jnp.asarray([seq], jnp.int32)
        positions = jnp.arange(len(seq))[None]
        logits = jax.jit(lambda m, t: m(t, positions, m.init_cache(1, len(seq))).logits)(
            model, tokens
        )
        return jax.nn.log_softmax(logits[0, -args.max_new_tokens - 1 : -1].astype(jnp.float32))

    reference = [log_probs(target, s) for s in seqs]
    rows = []
    for precision in PRECISIONS[1:]:
        m = with_precision(target, precision)
        agree, kls = [], []
        for seq, lp32 in zip(seqs, reference, strict=True):
            lp = log_probs(m, seq)
            agree.append(np.asarray(jnp.argmax(lp, -1) == jnp.argmax(lp32, -1)))
            kls.append(np.asarray(jnp.sum(jnp.exp(lp32) * (lp32 - lp), -1)))
        row = dict(
            precision=precision,
            top1_agreement=round(float(np.mean(np.concatenate(agree))), 4),
            mean_kl=round(float(np.mean(np.concatenate(kls))), 5),
            positions=int(sum(a.size for a in agree)),
        )
        log(f"logits {row}")
        rows.append(row)
    results["logits"] = rows


def specjax_pass(target, drafter, prompts, args, temperature, key=0, confidence=None):
    """A function of no arguments: one pass over ``prompts`` in batches of ``--batch``,
    plain (``drafter`` None) or speculative; it returns the batches' results."""
    sampling = specjax.SamplingConfig(temperature=temperature)
    batches = [prompts[i : i + args.batch] for i in range(0, len(prompts), args.batch)]

    def once():
        outs = []
        for i, batch in enumerate(batches):
            k = jax.random.key(key + i)
            kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
            if drafter is None:
                outs.append(specjax.generate(k, target, batch, **kw))
            else:
                outs.append(
                    specjax.speculative_generate(
                        k, target, drafter, batch, draft_confidence=confidence, **kw
                    )
                )
        return jax.block_until_ready(outs)

    return once


def parse_combo(text: str):
    """``TARGET/DRAFT[:K]`` (K ids kept in the draft's head) or ``TARGET/lookup``."""
    tp, rest = text.split("/")
    dp, _, head = rest.partition(":")
    return tp, dp, int(head) if head else 0


def draft_model(kind: str, head: int, draft):
    """The draft model of a combination (None for prompt lookup), built once."""
    if kind == "lookup":
        return None
    if head:
        draft = draft.with_head_ids(specjax.sampling.vocab.frequent_ids(draft, head))
    return with_precision(draft, kind)


def make_drafter(model, gamma: int | str):
    """A chain of γ drafts, or (``gamma`` a branching ``"b1,b2,..."``) a draft tree."""
    if isinstance(gamma, str):
        return None if model is None else specjax.DraftModel(model).with_tree(gamma)
    if model is None:
        return specjax.PromptLookup(num_draft=gamma)
    return specjax.DraftModel(model, num_draft=gamma)


def stage_e2e(args, results, target, draft, workloads):
    """Each combination at T = 0 (γ sweep) and T = 1, per workload.

    Plain decoding is timed again with each speculative configuration, the two passes
    interleaved (``--e2e-repeats`` rounds of plain then speculative, after a warm-up
    pass of each; `time_interleaved`), so that each ratio comes from passes a minute apart:
    this host's speed drifts by 10-20% over minutes. ``speedup`` is the best
    speculative pass's rate over the best plain pass's; ``speedup_median_round`` the
    median of the rounds' ratios. Rates are end to end, prefill included (the draft
    model's own prefill too), as a user waits for them. ``e2e_pooled`` adds the
    workloads up per configuration.
    """
    rows = []
    for combo in args.combos:
        tp, kind, head = parse_combo(combo)
        t_model = with_precision(target, tp)
        d_model = draft_model(kind, head, draft)
        for temperature in (0.0, 1.0):
            for workload, prompts in workloads.items():
                for gamma, tau in args.gammas if temperature == 0 else args.t1_gamma:
                    drafter = make_drafter(d_model, gamma)
                    if drafter is None or (tau is not None and d_model is None):
                        continue  # prompt lookup: no q to stop on, no trees
                    (p_times, s_times), (p_outs, outs) = time_interleaved(
                        [
                            specjax_pass(t_model, None, prompts, args, temperature),
                            specjax_pass(
                                t_model, drafter, prompts, args, temperature, confidence=tau
                            ),
                        ],
                        args.e2e_repeats,
                        warmup=1,
                    )
                    p_seconds, seconds = min(p_times), min(s_times)
                    # Each configuration compiles its own programs: freeing them keeps a
                    # long run inside the process's memory maps (LLVM ran out once).
                    jax.clear_caches()
                    if temperature == 0:
                        for a, b in zip(p_outs, outs, strict=True):
                            if a.to_lists() != b.to_lists():
                                raise SystemExit(f"greedy mismatch: {combo}, γ {gamma}, {workload}")
                    p_tokens = sum(int(o.lengths.sum()) for o in p_outs)
                    tokens = sum(int(o.lengths.sum()) for o in outs)
                    calls = sum(int(o.stats.target_calls) for o in outs)
                    accepted = sum(int(np.sum(o.stats.accepted)) for o in outs)
                    drafted = sum(int(np.sum(o.stats.drafted)) for o in outs)
                    plain_rate, rate = p_tokens / p_seconds, tokens / seconds
                    row = dict(
                        target=tp, draft=kind, draft_head=head or None, gamma=gamma,
                        draft_confidence=tau,
                        temperature=temperature, workload=workload, batch=args.batch,
                        plain_tok_s=round(plain_rate, 2), spec_tok_s=round(rate, 2),
                        speedup=round(rate / plain_rate, 2),
                        speedup_median_round=median_round_ratio(p_tokens, p_times, tokens, s_times),
                        plain_round_s=[round(t, 2) for t in p_times],
                        spec_round_s=[round(t, 2) for t in s_times],
                        plain_tokens=p_tokens, spec_tokens=tokens,
                        plain_s=round(p_seconds, 2), spec_s=round(seconds, 2),
                        acceptance=round(accepted / max(drafted, 1), 3),
                        tokens_per_call=round(tokens / calls, 2),
                    )  # fmt: skip
                    log(f"e2e {row}")
                    rows.append(row)
    key = (
        "target", "draft", "draft_head", "gamma", "draft_confidence", "temperature",
        "workload", "batch",
    )  # fmt: skip
    old = {tuple(r.get(k) for k in key): r for r in results.get("e2e", [])}
    old.update({tuple(r.get(k) for k in key): r for r in rows})
    results["e2e"] = list(old.values())
    results["e2e_pooled"] = pooled(results["e2e"])


def median_round_ratio(plain_tokens, plain_round_s, spec_tokens, spec_round_s) -> float:
    """The median over rounds of speculative over plain tokens per second (rates, not
    seconds: a sampled answer may end sooner than its plain counterpart)."""
    ratios = (spec_tokens / np.asarray(spec_round_s)) / (plain_tokens / np.asarray(plain_round_s))
    return round(float(np.median(ratios)), 2)


def pooled(rows: list[dict]) -> list[dict]:
    """The workloads of each configuration added up: tokens over seconds of the best
    passes, and the median over rounds of the summed rounds' rate ratio."""
    config = ("target", "draft", "draft_head", "gamma", "draft_confidence", "temperature", "batch")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in config), []).append(r)
    out = []
    for key, group in groups.items():
        plain_tokens = sum(r["plain_tokens"] for r in group)
        spec_tokens = sum(r["spec_tokens"] for r in group)
        plain_rate = plain_tokens / sum(r["plain_s"] for r in group)
        rate = spec_tokens / sum(r["spec_s"] for r in group)
        entry = dict(zip(config, key, strict=True), workloads=[r["workload"] for r in group])
        entry.update(
            plain_tok_s=round(plain_rate, 2), spec_tok_s=round(rate, 2),
            speedup=round(rate / plain_rate, 2),
        )  # fmt: skip
        rounds = [r.get("plain_round_s") for r in group] + [r.get("spec_round_s") for r in group]
        if all(rounds) and len({len(x) for x in rounds}) == 1:
            entry["speedup_median_round"] = median_round_ratio(
                plain_tokens, np.sum([r["plain_round_s"] for r in group], axis=0),
                spec_tokens, np.sum([r["spec_round_s"] for r in group], axis=0),
            )  # fmt: skip
        out.append(entry)
    return out


def stage_fastest(args, results, target, draft, workloads):
    """The fastest configuration with speculation against the fastest without, any
    weight precision, in one interleaved run (see the module docstring).

    Plain decoding is timed at each of ``--plain-precisions`` (an int8-activation
    target decodes on XLA:CPU's fast two-row int8 kernel), so the comparison is not
    limited to the speculative target's precision. `scripts/benchmarks/bench_real_pair.py`
    sweeps int8 targets with speculation, each at its verify's width.
    """
    tp, kind, head = parse_combo(args.combos[0])
    t_model, d_model = with_precision(target, tp), draft_model(kind, head, draft)
    plain = {p: with_precision(target, p) for p in args.plain_precisions}
    systems: list[dict] = []
    for temperature in (0.0, 1.0):
        chains = [
            g for g in (args.gammas if temperature == 0 else args.t1_gamma) if isinstance(g[0], int)
        ]
        gamma, tau = chains[0] if chains else (3, None)
        tau = tau if d_model is not None else None  # prompt lookup has no q to stop on
        drafter = make_drafter(d_model, gamma)
        spec_name = f"{tp} target, {kind} draft, γ {gamma}" + (f", τ {tau}" if tau else "")
        names = [f"plain {p}" for p in plain] + [spec_name]
        rows = {
            n: dict(temperature=temperature, system=n, speculative=n == spec_name, tokens=0,
                    seconds=0.0, round_s=[0.0] * args.e2e_repeats)
            for n in names
        }  # fmt: skip
        answers: dict[str, list] = {n: [] for n in names}
        for workload, prompts in workloads.items():
            fns = [specjax_pass(m, None, prompts, args, temperature) for m in plain.values()]
            fns.append(specjax_pass(t_model, drafter, prompts, args, temperature, confidence=tau))
            times, outs = time_interleaved(fns, args.e2e_repeats, warmup=1)
            jax.clear_caches()
            for n, t, out in zip(names, times, outs, strict=True):
                r = rows[n]
                r["tokens"] += sum(int(o.lengths.sum()) for o in out)
                r["seconds"] += min(t)
                r["round_s"] = list(np.add(r["round_s"], t))  # the workloads' rounds summed
                answers[n] += [a for o in out for a in o.to_lists()]
            log(f"fastest T={temperature} {workload}: {[round(min(t), 2) for t in times]} s")
        if temperature == 0 and tp in plain and answers[f"plain {tp}"] != answers[spec_name]:
            raise SystemExit(f"greedy mismatch: {spec_name} against plain {tp}")
        for r in rows.values():
            r["tok_s"] = round(r["tokens"] / r["seconds"], 2)
            r["round_s"] = [round(float(x), 2) for x in r["round_s"]]
            if temperature == 0 and "float32" in plain and not r["speculative"]:
                r["agreement_with_float32"] = agreement(
                    answers["plain float32"], answers[r["system"]]
                )
        systems += rows.values()
        log(f"fastest T={temperature}: {list(rows.values())}")
    results["fastest"] = dict(systems=systems, ratio=fastest_ratios(systems))


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """How far greedy answers ``other`` are from ``reference`` (lists of token lists):
    the share of positions with the same token, and the first position where each
    answer departs from its reference (its length where it never does)."""
    same = total = 0
    first = []
    for a, b in zip(reference, other, strict=True):
        shared = list(zip(a, b, strict=False))  # a sampled-out answer may be shorter
        same += sum(x == y for x, y in shared)
        total += max(len(a), len(b))
        first.append(next((i for i, (x, y) in enumerate(shared) if x != y), len(shared)))
    return dict(positions_equal=round(same / max(total, 1), 3), first_difference=first)


def fastest_ratios(systems: list[dict]) -> dict[str, dict]:
    """Per temperature, the fastest speculative system's rate over the fastest plain
    one's, with both names."""
    out = {}
    for temperature in sorted({s["temperature"] for s in systems}):
        at_t = [s for s in systems if s["temperature"] == temperature]
        best_plain = max((s for s in at_t if not s["speculative"]), key=lambda s: s["tok_s"])
        best_spec = max((s for s in at_t if s["speculative"]), key=lambda s: s["tok_s"])
        out[f"T={temperature:g}"] = dict(
            speculative=best_spec["system"], plain=best_plain["system"],
            ratio=round(best_spec["tok_s"] / best_plain["tok_s"], 2),
        )  # fmt: skip
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.update(run_record(argv))
    results["config"] = {k: str(v) for k, v in vars(args).items()}

    def save():
        path.write_text(json.dumps(results, indent=2) + "\n")

    if "load" in args.stages:
        stage_load(args, results)
        save()
    rest = [s for s in args.stages if s != "load"]
    if not rest:
        return 0
    target, draft = load_models()
    workloads = chat_prompts(target, args.per_workload)
    if "steps" in rest:
        stage_steps(args, results, target, draft)
        save()
    if "logits" in rest:
        stage_logits(args, results, target, workloads)
        save()
    if "e2e" in rest:
        stage_e2e(args, results, target, draft, workloads)
        save()
    if "fastest" in rest:
        stage_fastest(args, results, target, draft, workloads)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
