#!/usr/bin/env python
"""The real pair end to end on a CPU: specjax's fastest exact speculative decoding
against its fastest plain decoding, and against transformers and llama.cpp at theirs.

Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), GGUF
(``specjax fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b``), batch 1, the first chat and
code-edit requests of ``prompts/real_prompts.json`` in the target's chat template. Every
system stops at the end of its turn; its speed is the tokens it generated over the
seconds of the whole call, prefill included.

Stages (``--stages``; all by default):

* ``sweep``: specjax only. Plain decoding at width 1 in float32 and int8, and speculative
  decoding (int8 target and draft; γ = 1, 2, 3; draft confidence 0.5) at its verify's
  width, T = 0 and 1, 64 new tokens; a warm-up round, then ``--rounds`` rounds in turn.
* ``peers``: every system in a process of its own, one running at a time, in turn round
  by round after a warm-up: specjax with no tuning flags (``default``: the preset's
  precisions and gamma auto, `specjax.tuning.tune`) and its plain int8;
  transformers in float32, bfloat16 and int8 (``harness/hf_worker.py``) as plain
  decoding, assisted by the 0.5B and prompt lookup; llama.cpp (``harness/llamacpp_worker.py``)
  on the GGUF files: plain, drafted by the 0.5B, prompt lookup; each side's threads
  probed. 64 and 128 new tokens; T = 0 (every system) and T = 1 (specjax's systems and
  llama.cpp's plain decoding). All sides stay loaded (about 25 GB): where that does not
  fit, run parts with ``--only PREFIX ...``, which keeps the file's rows of the others.
* ``cli``: ``specjax generate --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b
  --chat TEXT --max-new-tokens 64 --compare --json``, with no tuning flags, on each
  prompt at T = 0 and 1, and the same for the bundled pair on the first code and prose
  prompts of ``prompts/bench_prompts.json`` (128 tokens): speed, gamma auto's choice and
  expected speedup, the speedup over plain decoding, and whether the output equals plain
  decoding at its forward width.
* ``session``: the five requests of ``prompts/session_prompts.json`` through one
  `specjax.Sampler` with no tuning flags, the last timed, against plain decoding at the
  preset's precision (`stage_session`).

Writes ``OUT/NAME.json`` (default ``scripts/benchmarks/results/real_pair/cpu.json``) with
each stage's date, commit, command and machine; a stage replaces its earlier results.

    python scripts/benchmarks/bench_real_pair.py --stages peers --rounds 2 --only default hf-int8
    python scripts/benchmarks/bench_real_pair.py --out /tmp/rp --stages sweep --rounds 1

The peers stage needs the ``bench`` extra (transformers, torch, llama-cpp-python).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax

import specjax
from harness import RESULTS, ROOT, first_difference, logger, run_record
from specjax import tuning
from specjax.core.timing import time_call
from specjax.io import presets
from specjax.io.fetch import fetch
from specjax.models.quant import quantize

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>


log = logger("bench_real_pair")


def prompt_texts() -> dict[str, str]:
    spec = json.loads((ROOT / "prompts" / "real_prompts.json").read_text())
    return {"chat": spec["chat"][0]["text"], "code": spec["code-edit"][0]["text"]}


# ---------------------------------------------------------------------------------
# The servers: one process per side, models loaded once, one job per stdin line.


class SpecjaxSide:
    """specjax's systems: ``plain-<precision>`` at width 1 and ``spec-<config>``."""

    def __init__(self, systems: list[str]):
        precisions = {s.split("-")[1] for s in systems if s.startswith("plain-")}
        float32 = specjax.load_pretrained(fetch(TARGET))
        self.targets = {p: float32 if p == "float32" else quantize(float32, p) for p in precisions}
        if any(s.startswith("spec-") or s == "default" for s in systems):
            self.draft = quantize(specjax.load_pretrained(fetch(DRAFT)), "int8")
            if "int8" not in self.targets:
                self.targets["int8"] = quantize(float32, "int8")
        del float32  # kept only where plain-float32 holds it
        self.preset = presets.find(TARGET, DRAFT)
        self.tokenizer_model = next(iter(self.targets.values()))

    def prompt_ids(self, text: str) -> list[int]:
        message = [{"role": "user", "content": text}]
        return list(specjax.apply_chat_template(self.tokenizer_model, message, tokenize=True))

    def config(self, system: str) -> tuple[object, object, dict]:
        """``(target, drafter or None, keyword arguments)`` of ``system``."""
        if system.startswith("plain-"):
            return self.targets[system.split("-")[1]], None, {}
        if system == "default":
            p = self.preset
            drafter = specjax.DraftModel(self.draft)  # γ up to its default, chosen by run()
            return self.targets[p.quantize], drafter, dict(draft_confidence=p.draft_confidence)
        # spec-g<γ>[-tau<τ>]: int8 target and draft, at the verify's width.
        parts = system.split("-")[1:]
        gamma = int(parts[0][1:])
        tau = float(parts[1][3:]) if len(parts) > 1 else None
        drafter = specjax.DraftModel(self.draft, num_draft=gamma)
        return self.targets["int8"], drafter, dict(forward_width=gamma + 1, draft_confidence=tau)

    def run(self, job: dict) -> dict:
        target, drafter, kw = self.config(job["system"])
        ids = self.prompt_ids(job["text"])
        sampling = specjax.SamplingConfig(temperature=job["temperature"])
        args = dict(max_new_tokens=job["tokens"], sampling=sampling, eos_id=list(EOS_IDS))
        key = jax.random.key(job.get("seed", 0))
        tuned = None
        if job["system"] == "default":
            # gamma="auto", as the CLI and the Sampler: the cached step costs (measured
            # at the first job, the warm-up's), and the acceptance last seen.
            tuned = tuning.tune(target, drafter, [ids], log=log)
            kw = dict(kw, forward_width=tuned.forward_width)
            drafter = None if tuned.gamma == 0 else drafter.with_draft(tuned.gamma)
            if drafter is None:
                kw.pop("draft_confidence", None)
        if drafter is None:
            seconds, out = time_call(lambda: specjax.generate(key, target, [ids], **args, **kw))
        else:
            seconds, out = time_call(
                lambda: specjax.speculative_generate(key, target, drafter, [ids], **args, **kw)
            )
        row = {
            "seconds": seconds,
            "ids": out.to_lists()[0],
            "tokens_per_call": float(out.tokens_per_call),
        }
        if tuned is not None:
            if tuned.gamma:
                tuned.learn(out.stats)
            row["auto"] = {
                "gamma": tuned.gamma,
                "forward_width": tuned.forward_width,
                "expected_speedup": tuned.choice.expected_speedup,
            }
        return row


def serve(systems: list[str]) -> int:
    """specjax's side: answers one JSON job per stdin line with one JSON line on stdout."""
    server = SpecjaxSide(systems)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(server.run(job)), flush=True)
    return 0


WORKERS = Path(__file__).resolve().parent / "harness"


class Server:
    """A side in a process of its own, driven by the coordinator: `serve` in this file
    (``specjax`` with its systems' names), or ``hf:<precision>`` and ``llamacpp``,
    ``harness/hf_worker.py`` and ``harness/llamacpp_worker.py`` with the two GGUF paths."""

    def __init__(self, side: str, systems: list[str]):
        if side == "llamacpp":
            command = [sys.executable, str(WORKERS / "llamacpp_worker.py"), *systems]
        elif side.startswith("hf:"):
            command = [sys.executable, str(WORKERS / "hf_worker.py"), side[3:], *systems]
        else:
            command = [sys.executable, __file__, "--serve", "--systems", *systems]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"the {side} server did not start")
        self.ready = json.loads(ready)  # {"ready": true} and what the side reports

    def run(self, job: dict) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a server died on {job}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# ---------------------------------------------------------------------------------
# The stages.


def interleaved(
    servers: dict[str, Server],
    systems: list[str],
    workloads,
    rounds: int,
    partial=None,
    greedy_only=None,
):
    """Round 0 warms up; rounds 1.. are timed, each system in turn per workload (rotated
    every round, so no system always runs after another). The systems in
    ``greedy_only`` (default: transformers') skip the workloads at T > 0.

    The warm-up runs every (system, workload) of specjax, whose programs are compiled
    per shape and budget, and transformers' and llama.cpp's systems once each (nothing
    is compiled per shape). The rows so far are written to ``partial`` (a path), if
    given, after every timed run, so that a long run's measurements outlive a later
    failure.
    """
    texts = prompt_texts()
    if greedy_only is None:
        greedy_only = [s for s in systems if s.startswith("hf-")]
    rows = {}
    warmed = set()
    for r in range(rounds + 1):
        for w in workloads:
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            for system in order:
                eager = system.startswith(("hf-", "llamacpp-"))
                if w["temperature"] > 0 and system in greedy_only:
                    continue
                if r == 0 and eager and system in warmed:
                    continue
                warmed.add(system)
                job = dict(w, system=system, text=texts[w["prompt"]])
                out = servers[system].run(job)
                if r == 0:
                    warm_until_chosen(servers[system], job, out)
                    continue
                key = (system, w["prompt"], w["tokens"], w["temperature"])
                row = rows.setdefault(key, {"system": system, **w, "seconds": [], "generated": []})
                if "ids" not in row:
                    row["ids"] = out["ids"]
                    row.update({k: v for k, v in out.items() if k not in ("seconds", "ids")})
                row["seconds"].append(round(out["seconds"], 3))
                if "auto" in out:  # gamma auto's choice in each timed run
                    row.setdefault("chosen", []).append(out["auto"]["gamma"])
                row["generated"].append(len(out["ids"]))
                log(f"round {r} {system} {w}: {len(out['ids']) / out['seconds']:.2f} tok/s")
                if partial is not None:
                    partial.write_text(json.dumps(list(rows.values())) + "\n")
    for row in rows.values():
        rates = [n / s for n, s in zip(row["generated"], row["seconds"], strict=True)]
        row["tok_s"] = round(statistics.median(rates), 3) if rates else None
    return list(rows.values())


def warm_until_chosen(server: Server, job: dict, out: dict, most: int = 4) -> None:
    """Runs a gamma-auto job again until its choice repeats (at most ``most`` runs).

    Each call chooses γ from the acceptance learnt so far, and the warm-up's own runs
    move it (the first run measures the step costs, with a short measuring run's
    acceptance): a choice that changes after the warm-up would compile its program
    in a timed run. A Sampler keeps its choice per batch size and never recompiles.
    """
    for _ in range(most - 1):
        if "auto" not in out:
            return
        again = server.run(job)
        if again["auto"]["gamma"] == out["auto"]["gamma"]:
            return
        moved = f"{out['auto']['gamma']} -> {again['auto']['gamma']}"
        log(f"warm-up {job['system']}: gamma auto moved {moved}")
        out = again


def summarize(rows, specjax_systems, plain_systems, peers):
    """Per (prompt, tokens, temperature): the fastest speculative, plain and peer, and
    the fastest system of all."""
    out = []
    keys = sorted({(r["prompt"], r["tokens"], r["temperature"]) for r in rows})
    for prompt, tokens, temperature in keys:
        here = {
            r["system"]: r
            for r in rows
            if (r["prompt"], r["tokens"], r["temperature"]) == (prompt, tokens, temperature)
            and r["tok_s"]
        }
        spec, plain, peer = (
            max((here[n] for n in names if n in here), key=lambda r: r["tok_s"], default=None)
            for names in (specjax_systems, plain_systems, peers)
        )
        entry = {"prompt": prompt, "tokens": tokens, "temperature": temperature}
        if spec and plain:
            entry.update(
                fastest_speculative=spec["system"],
                speculative_tok_s=spec["tok_s"],
                fastest_plain=plain["system"],
                plain_tok_s=plain["tok_s"],
                speculative_over_plain=round(spec["tok_s"] / plain["tok_s"], 3),
            )
        if spec and peer:
            entry.update(
                fastest_peer=peer["system"],
                peer_tok_s=peer["tok_s"],
                speculative_over_peer=round(spec["tok_s"] / peer["tok_s"], 3),
            )
        best = max(here.values(), key=lambda r: r["tok_s"], default=None)
        if best:
            entry.update(fastest=best["system"], fastest_tok_s=best["tok_s"])
        out.append(entry)
    return out


SWEEP_SPEC = ["spec-g1", "spec-g2", "spec-g3", "spec-g2-tau0.5", "spec-g3-tau0.5"]
SWEEP_PLAIN = ["plain-float32", "plain-int8"]


def stage_sweep(args, results):
    systems = SWEEP_PLAIN + SWEEP_SPEC
    server = Server("specjax", systems)
    workloads = [
        dict(prompt=p, tokens=64, temperature=t) for p in ("chat", "code") for t in (0.0, 1.0)
    ]
    partial = args.out / "sweep.partial.json"
    rows = interleaved({s: server for s in systems}, systems, workloads, args.rounds, partial)
    server.close()
    for row in rows:  # at T = 0, speculative == plain at its width is checked by the tests
        row.pop("ids", None)
    results["sweep"] = {"rows": rows, "summary": summarize(rows, SWEEP_SPEC, SWEEP_PLAIN, [])}
    partial.unlink()


PEERS_SPECJAX = ["default", "plain-int8"]
PEERS_HF = [
    f"hf-{d}-{m}" for d in ("float32", "bfloat16", "int8") for m in ("plain", "assistant", "lookup")
]
PEERS_LLAMACPP = ["llamacpp-plain", "llamacpp-draft", "llamacpp-lookup"]


def stage_peers(args, results):
    """Every system in turn (``--only``: those named, the others' rows kept), the
    greedy outputs' first differences, and the summary over every row."""
    systems = [
        s
        for s in PEERS_SPECJAX + PEERS_HF + PEERS_LLAMACPP
        if not args.only or s.startswith(tuple(args.only))
    ]
    servers = {}
    specjax_systems = [s for s in PEERS_SPECJAX if s in systems]
    if specjax_systems:
        side = Server("specjax", specjax_systems)
        servers.update({s: side for s in specjax_systems})
    paths = [str(fetch(TARGET)), str(fetch(DRAFT))]
    # int8 first: its load (float32, then quantized) needs about twice what it keeps.
    for dtype in ("int8", "float32", "bfloat16"):
        mine = [s for s in systems if s.startswith(f"hf-{dtype}-")]
        if mine:
            server = Server(f"hf:{dtype}", paths)
            servers.update({s: server for s in mine})
    mine = [s for s in systems if s.startswith("llamacpp-")]
    llamacpp = None
    if mine:
        server = Server("llamacpp", paths)
        servers.update({s: server for s in mine})
        llamacpp = {k: v for k, v in server.ready.items() if k != "ready"}
    tokens = (64, 128) if not args.quick else (16,)
    workloads = [
        dict(prompt=p, tokens=n, temperature=t)
        for p in ("chat", "code")
        for n in tokens
        for t in (0.0, 1.0)
    ]
    # Sampled: specjax's systems and llama.cpp's plain decoding; the others greedy only.
    greedy_only = [
        s for s in systems if s.startswith(("hf-", "llamacpp-")) and s != "llamacpp-plain"
    ]
    partial = args.out / "peers.partial.json"
    rows = interleaved(servers, systems, workloads, args.rounds, partial, greedy_only)
    for server in {id(s): s for s in servers.values()}.values():
        server.close()
    # How far each greedy output agrees with transformers' float32 greedy output, and a
    # peer's drafted output with its own plain decoding's.
    greedy = {(r["system"], r["prompt"], r["tokens"]): r for r in rows if r["temperature"] == 0}
    for (system, prompt, tokens), row in greedy.items():
        ref = greedy.get(("hf-float32-plain", prompt, tokens))
        if ref is not None:
            row["first_difference_from_hf_float32"] = first_difference(row["ids"], ref["ids"])
        own = greedy.get((system.rsplit("-", 1)[0] + "-plain", prompt, tokens))
        if system.endswith(("-assistant", "-draft", "-lookup")) and own is not None:
            row["first_difference_from_own_plain"] = first_difference(row["ids"], own["ids"])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for row in rows:
        row.pop("ids", None)
        row["date"] = date
    earlier = results.get("peers", {}) if args.only else {}
    # A part (--only): the other systems' rows stay from the earlier parts.
    rows += [r for r in earlier.get("rows", []) if r["system"] not in systems]
    if llamacpp is None:
        llamacpp = earlier.get("llamacpp")
    peers = sorted({r["system"] for r in rows} & set(PEERS_HF + PEERS_LLAMACPP))
    summary = summarize(rows, ["default"], ["plain-int8"], peers)
    results["peers"] = {"rows": rows, "summary": summary}
    if llamacpp is not None:  # its version, build and thread probe
        results["peers"]["llamacpp"] = llamacpp
    for entry in summary:
        rates = ", ".join(
            f"{r['system']} {r['tok_s']}"
            for r in sorted(rows, key=lambda r: -(r["tok_s"] or 0))
            if (r["prompt"], r["tokens"], r["temperature"])
            == (entry["prompt"], entry["tokens"], entry["temperature"])
        )
        log(
            f"{entry['prompt']}, {entry['tokens']} tokens, T = {entry['temperature']}: "
            f"fastest {entry.get('fastest')}; tok/s: {rates}"
        )
    partial.unlink()


def bundled_texts() -> dict[str, str]:
    """The first code and the first prose prompt of ``prompts/bench_prompts.json``."""
    spec = json.loads((ROOT / "prompts" / "bench_prompts.json").read_text())
    return {"bundled-code": spec["code"][0]["text"], "bundled-prose": spec["prose"][0]["text"]}


def cli_commands(rounds: int):
    """``(prompt name, temperature, argv, argv as printed)`` of the ``cli`` stage: the
    real pair on its two chat prompts (64 tokens), then the bundled pair on a code and
    a prose completion (128 tokens), each at T = 0 and T = 1, with no tuning flags."""
    repeats = ["--compare", "--json", "--repeats", str(max(rounds, 1))]
    jobs = []
    for prompt, text in prompt_texts().items():
        head = ["specjax", "generate", "--model", TARGET, "--draft", DRAFT]
        shown = [*head, "--chat", f"<{prompt} prompt>", "--max-new-tokens", "64", *repeats]
        jobs.append((prompt, head + ["--chat", text, "--max-new-tokens", "64", *repeats], shown))
    for prompt, text in bundled_texts().items():
        shown = ["specjax", "generate", f"<{prompt} prompt>", "--max-new-tokens", "128", *repeats]
        jobs.append((prompt, ["specjax", "generate", text, *shown[3:]], shown))
    for (prompt, cmd, shown), temperature in itertools.product(jobs, (0, 1)):
        extra = ["--temperature", str(temperature)] if temperature else []
        yield prompt, temperature, cmd + extra, shown + extra


def stage_cli(args, results):
    """The command a user runs, with no tuning flags, on each prompt at T = 0 and T = 1."""
    keep = (
        "preset",
        "drafter",
        "auto",
        "gamma",
        "forward_width",
        "tokens",
        "tokens_per_second",
        "plain_tokens_per_second",
        "speedup",
        "equals_plain_at_width",
        "acceptance_rate",
        "tokens_per_target_call",
        "repeats",
    )
    runs = []
    for prompt, temperature, cmd, shown in cli_commands(args.rounds):
        log(" ".join(shown))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        out = json.loads(done.stdout)
        runs.append(
            {
                "prompt": prompt,
                "temperature": temperature,
                "command": " ".join(shown),
                **{k: out.get(k) for k in keep},
                # The cost model's account of the run (`Tuned.review`): every γ's expected
                # speedup at the acceptance this run achieved.
                "expected_at_this_runs_acceptance": (out.get("auto") or {}).get(
                    "expected_at_this_run"
                ),
                "stderr": done.stderr.strip().splitlines()[:2],
            }
        )
        speedup = out.get("speedup") or 0
        log(f"{prompt}, T = {temperature}: {speedup:.2f}x plain, γ {out.get('gamma')}")
    results["cli"] = {"runs": runs}


def stage_session(args, results):
    """A repeated session: one `specjax.Sampler` of the named pair with no tuning flags,
    the five requests of ``prompts/session_prompts.json`` in turn (each in the chat
    template), the last timed, against a Sampler that decodes plainly at the pair's
    preset precision (int8) on the same five. A session of both untimed first (it
    compiles every program); then ``--rounds`` sessions, each with fresh Samplers (a
    suffix drafter forgets what it saw), the order of the two alternating."""
    from specjax.io.presets import load_pair
    from specjax.text.loading import build_drafter

    requests = json.loads((ROOT / "prompts" / "session_prompts.json").read_text())["requests"]
    tokens = 128
    # Loaded once, as Sampler.from_pretrained(TARGET, DRAFT) loads them (the preset's
    # precisions), then a fresh Sampler each session: what it learnt goes with it.
    target, model_drafter, preset = load_pair(TARGET, DRAFT)
    name = args.session_drafter or preset.drafter
    drafter = build_drafter(name, target, bundled=False, draft=model_drafter.model)
    log(f"session: drafter {name} ({type(drafter).__name__})")

    def samplers():
        return {
            "speculative": specjax.Sampler(target, drafter=drafter),
            "plain": specjax.Sampler(target, drafter=None),
        }

    def session(pair: dict, order: list[str]) -> dict:
        texts = [
            specjax.apply_chat_template(pair["plain"].target, [{"role": "user", "content": r}])
            for r in requests
        ]
        for name in order:
            for text in texts[:-1]:
                pair[name].sample(text, max_new_tokens=tokens)
        timed = {}
        for name in order:
            sample = functools.partial(pair[name].sample, max_new_tokens=tokens, return_result=True)
            seconds, (_, result) = time_call(sample, texts[-1])
            timed[name] = {
                "seconds": seconds,
                "tokens": int(result.lengths[0]),
                "tokens_per_second": int(result.lengths[0]) / seconds,
                "tokens_per_target_call": float(result.tokens_per_call),
                "token_ids": result.to_lists()[0],
            }
        fast = pair["speculative"]
        timed["speculative"]["drafter"] = type(fast.drafter).__name__
        timed["speculative"]["gamma"] = {b: t.gamma for b, t in fast.tuned.items()}
        return timed

    log("session: warm-up (compiles)")
    session(samplers(), ["speculative", "plain"])
    rounds = []
    for r in range(args.rounds):
        order = ["speculative", "plain"] if r % 2 == 0 else ["plain", "speculative"]
        timed = session(samplers(), order)
        timed["speedup"] = (
            timed["speculative"]["tokens_per_second"] / timed["plain"]["tokens_per_second"]
        )
        timed["equal"] = timed["speculative"]["token_ids"] == timed["plain"]["token_ids"]
        rounds.append(timed)
        log(f"session round {r}: {timed['speedup']:.2f}x, equal {timed['equal']}")
    speedups = sorted(r["speedup"] for r in rounds)
    results["session" if args.session_drafter is None else f"session-{name}"] = {
        "drafter": name,
        "requests": len(requests),
        "max_new_tokens": tokens,
        "rounds": rounds,
        "median_speedup": speedups[len(speedups) // 2],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS / "real_pair")
    p.add_argument("--name", default="cpu", help="results file name stem (default: cpu)")
    p.add_argument(
        "--stages",
        nargs="+",
        default=["sweep", "peers", "cli", "session"],
        choices=["sweep", "peers", "cli", "session"],
    )
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
    p.add_argument("--quick", action="store_true", help="peers: 16 tokens only (a smoke run)")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="PREFIX",
        help="peers: only the systems whose names start with one of these, e.g. llamacpp "
        "hf-int8 plain-int8, keeping the file's rows of the others (default: every system)",
    )
    p.add_argument(
        "--session-drafter",
        help="session: the drafter to measure instead of the pair's preset's (e.g. "
        "suffix,model); its results are kept apart, under session-DRAFTER",
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--systems", nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args.systems)

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for stage in args.stages:
        log(f"stage {stage}")
        record = run_record(argv)  # the date it started, the commit, the machine
        stages = {"sweep": stage_sweep, "peers": stage_peers, "cli": stage_cli}
        (stages | {"session": stage_session})[stage](args, results)
        results.setdefault("runs", {})[stage] = record
        path.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
