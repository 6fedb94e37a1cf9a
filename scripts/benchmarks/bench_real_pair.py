#!/usr/bin/env python
"""The real pair end to end on a CPU: specjax's fastest exact speculative decoding
against its fastest plain decoding, and against transformers at its fastest.

Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), GGUF,
fetched once (``specjax fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b``), batch 1. The
prompts are the first chat and the first code-edit request of
``prompts/real_prompts.json``, rendered with the target's chat template. Every system
stops at the end of its turn (the EOS ids of the tokenizer), and its speed is the
tokens it generated over the seconds of the whole call, prefill included.

Stages (``--stages``; all by default):

* ``sweep``: specjax only, one process. Plain decoding at width 1 in float32 and int8
  (the fastest plain decoding at any precision), and the speculative configurations
  worth trying (int8 target and int8 draft; γ = 1, 2, 3; draft confidence 0.5), each at
  its verify's width, at T = 0 and T = 1, 64 new tokens. A warm-up round, then
  ``--rounds`` rounds, the systems in turn within each. Picks the fastest per
  temperature (`specjax.io.presets` holds the pick).
* ``peers``: every system in a process of its own (a JAX runtime in the same process
  slowed transformers about 3x), only one of them running at a time, in turn round by
  round after a warm-up: specjax with no tuning flags (the `specjax.io.presets` entry the
  CLI applies) and plain decoding at its fastest (int8, width 1), and transformers in
  float32 and bfloat16, each as plain decoding, assisted generation with the 0.5B and
  prompt lookup, its torch threads probed (the fastest of 1 .. every core, per dtype;
  the transformers processes import neither jax nor specjax).
  64 and 128 new tokens; T = 0 (transformers: greedy) and T = 1 (specjax).
* ``cli``: ``specjax generate --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b
  --chat TEXT --max-new-tokens 64 --compare --json``, the command a user runs, with no
  tuning flags, on each prompt at T = 0: its speed, its speedup over plain decoding,
  and whether its output equals plain decoding at its forward width.

Writes ``OUT/NAME.json`` (default ``scripts/benchmarks/results/real_pair/cpu.json``),
with each stage's date, commit, command and machine; a stage's results replace that
stage's earlier ones.

    python scripts/benchmarks/bench_real_pair.py
    python scripts/benchmarks/bench_real_pair.py --out /tmp/rp --stages sweep --rounds 1 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
# harness.machine.RESULTS; not imported at the top: harness imports jax, and the
# transformers servers run this file.
RESULTS = ROOT / "scripts" / "benchmarks" / "results"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>


def log(msg: str) -> None:
    print(f"[bench_real_pair {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompt_texts() -> dict[str, str]:
    spec = json.loads((ROOT / "prompts" / "real_prompts.json").read_text())
    return {"chat": spec["chat"][0]["text"], "code": spec["code-edit"][0]["text"]}


# ---------------------------------------------------------------------------------
# The servers: one process per side, models loaded once, one job per stdin line.


class SpecjaxSide:
    """specjax's systems: ``plain-<precision>`` at width 1 and ``spec-<config>``."""

    def __init__(self, systems: list[str]):
        import jax

        import specjax
        from specjax.io.fetch import fetch
        from specjax.models.quant import quantize

        self.jax, self.specjax = jax, specjax
        precisions = {s.split("-")[1] for s in systems if s.startswith("plain-")}
        float32 = specjax.load_pretrained(fetch(TARGET))
        self.targets = {p: float32 if p == "float32" else quantize(float32, p) for p in precisions}
        if any(s.startswith("spec-") or s == "preset" for s in systems):
            self.draft = quantize(specjax.load_pretrained(fetch(DRAFT)), "int8")
            if "int8" not in self.targets:
                self.targets["int8"] = quantize(float32, "int8")
        del float32  # kept only where plain-float32 holds it
        self.preset = specjax.io.presets.find(TARGET, DRAFT)
        self.tokenizer_model = next(iter(self.targets.values()))

    def prompt_ids(self, text: str) -> list[int]:
        message = [{"role": "user", "content": text}]
        return list(self.specjax.apply_chat_template(self.tokenizer_model, message, tokenize=True))

    def config(self, system: str) -> tuple[object, object, dict]:
        """``(target, drafter or None, keyword arguments)`` of ``system``."""
        specjax = self.specjax
        if system.startswith("plain-"):
            return self.targets[system.split("-")[1]], None, {}
        if system == "preset":
            p = self.preset
            drafter = specjax.DraftModel(self.draft, num_draft=p.gamma)
            kw = dict(forward_width=p.forward_width, draft_confidence=p.draft_confidence)
            return self.targets[p.quantize], drafter, kw
        # spec-g<γ>[-tau<τ>]: int8 target and draft, at the verify's width.
        parts = system.split("-")[1:]
        gamma = int(parts[0][1:])
        tau = float(parts[1][3:]) if len(parts) > 1 else None
        drafter = specjax.DraftModel(self.draft, num_draft=gamma)
        return self.targets["int8"], drafter, dict(forward_width=gamma + 1, draft_confidence=tau)

    def run(self, job: dict) -> dict:
        specjax, jax = self.specjax, self.jax
        target, drafter, kw = self.config(job["system"])
        ids = self.prompt_ids(job["text"])
        sampling = specjax.SamplingConfig(temperature=job["temperature"])
        args = dict(max_new_tokens=job["tokens"], sampling=sampling, eos_id=list(EOS_IDS))
        key = jax.random.key(job.get("seed", 0))
        start = time.perf_counter()
        if drafter is None:
            out = specjax.generate(key, target, [ids], **args, **kw)
        else:
            out = specjax.speculative_generate(key, target, drafter, [ids], **args, **kw)
        out = jax.block_until_ready(out)
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "ids": out.to_lists()[0],
            "tokens_per_call": float(out.tokens_per_call),
        }


class TransformersSide:
    """transformers' systems in one dtype: ``hf-<dtype>-<plain|assistant|lookup>``."""

    def __init__(self, dtype: str, paths: list[str]):
        import torch
        import transformers

        self.torch = torch
        paths = [Path(p) for p in paths]  # the GGUF files, fetched by the coordinator
        load = lambda p: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
            str(p.parent), gguf_file=p.name, dtype=getattr(torch, dtype)
        ).eval()
        self.target, self.assistant = load(paths[0]), load(paths[1])
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(paths[0].parent), gguf_file=paths[0].name
        )
        self.threads = self.probe_threads()

    def probe_threads(self) -> int:
        """The fastest torch thread count for this dtype, of 1 .. every core."""
        torch = self.torch
        ids = torch.tensor([list(range(100, 140))])
        best = None
        for n in range(1, (os.cpu_count() or 1) + 1):
            torch.set_num_threads(n)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                with torch.no_grad():
                    self.target.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
                    )
                times.append(time.perf_counter() - start)
            if best is None or min(times) < best[1]:
                best = (n, min(times))
        torch.set_num_threads(best[0])
        return best[0]

    def run(self, job: dict) -> dict:
        torch = self.torch
        method = job["system"].split("-")[2]
        message = [{"role": "user", "content": job["text"]}]
        text = self.tokenizer.apply_chat_template(
            message, tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        extra = {
            "plain": {},
            "assistant": {"assistant_model": self.assistant},
            "lookup": {"prompt_lookup_num_tokens": 3},
        }[method]
        sampled = job["temperature"] > 0
        if sampled:
            extra.update(do_sample=True, temperature=job["temperature"], top_k=0, top_p=1.0)
        else:
            extra.update(do_sample=False)
        start = time.perf_counter()
        with torch.no_grad():
            out = self.target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=job["tokens"],
                eos_token_id=list(EOS_IDS),
                **extra,
            )
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "ids": out[0, ids.shape[1] :].tolist(), "threads": self.threads}


def serve(side: str, systems: list[str]) -> int:
    """Answers one JSON job per stdin line with one JSON line on stdout.

    A transformers side (``hf:<dtype>``) takes the two GGUF paths as its ``systems``.
    """
    if side.startswith("hf:"):
        server = TransformersSide(side.split(":")[1], systems)
    else:
        server = SpecjaxSide(systems)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(server.run(job)), flush=True)
    return 0


class Server:
    """A side in a process of its own (`serve`), driven by the coordinator."""

    def __init__(self, side: str, systems: list[str]):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", side, "--systems", *systems],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"the {side} server did not start")

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
    servers: dict[str, Server], systems: list[str], workloads, rounds: int, partial=None
):
    """Round 0 warms up; rounds 1.. are timed, each system in turn per workload (rotated
    every round, so no system always runs after another).

    The warm-up runs every (system, workload) of specjax, whose programs are compiled
    per shape and budget, and transformers' systems once each (eager: nothing is
    compiled per shape). The rows so far are written to ``partial`` (a path), if given,
    after every timed run, so that a long run's measurements outlive a later failure.
    """
    texts = prompt_texts()
    rows = {}
    warmed = set()
    for r in range(rounds + 1):
        for w in workloads:
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            for system in order:
                hf = system.startswith("hf-")
                if w["temperature"] > 0 and hf and not w.get("hf"):
                    continue
                if r == 0 and hf and system in warmed:
                    continue
                warmed.add(system)
                job = dict(w, system=system, text=texts[w["prompt"]])
                out = servers[system].run(job)
                if r == 0:
                    continue
                key = (system, w["prompt"], w["tokens"], w["temperature"])
                row = rows.setdefault(key, {"system": system, **w, "seconds": [], "generated": []})
                if "ids" not in row:
                    row["ids"] = out["ids"]
                    row.update({k: v for k, v in out.items() if k not in ("seconds", "ids")})
                row["seconds"].append(round(out["seconds"], 3))
                row["generated"].append(len(out["ids"]))
                log(f"round {r} {system} {w}: {len(out['ids']) / out['seconds']:.2f} tok/s")
                if partial is not None:
                    partial.write_text(json.dumps(list(rows.values())) + "\n")
    for row in rows.values():
        rates = [n / s for n, s in zip(row["generated"], row["seconds"], strict=True)]
        row["tok_s"] = round(statistics.median(rates), 3) if rates else None
    return list(rows.values())


def first_difference(a, b):
    diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return min(len(a), len(b)) if diff is None and len(a) != len(b) else diff


def summarize(rows, specjax_systems, plain_systems, peers):
    """Per (prompt, tokens, temperature): the fastest speculative, plain and peer."""
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


def stage_peers(args, results):
    specjax_systems = ["preset", "plain-int8"]
    hf = [f"hf-{d}-{m}" for d in ("float32", "bfloat16") for m in ("plain", "assistant", "lookup")]
    servers = {s: None for s in specjax_systems + hf}
    side = Server("specjax", specjax_systems)
    servers.update({s: side for s in specjax_systems})
    import specjax  # here, so that the transformers processes never import jax

    paths = [str(specjax.fetch(TARGET)), str(specjax.fetch(DRAFT))]
    for dtype in ("float32", "bfloat16"):
        server = Server(f"hf:{dtype}", paths)
        servers.update({s: server for s in hf if s.startswith(f"hf-{dtype}")})
    tokens = (64, 128) if not args.quick else (16,)
    workloads = [
        dict(prompt=p, tokens=n, temperature=t, hf=t == 0)
        for p in ("chat", "code")
        for n in tokens
        for t in (0.0, 1.0)
    ]
    partial = args.out / "peers.partial.json"
    rows = interleaved(servers, specjax_systems + hf, workloads, args.rounds, partial)
    for server in {id(s): s for s in servers.values()}.values():
        server.close()
    # How far each greedy output agrees with transformers' float32 greedy output.
    for row in rows:
        if row["temperature"] == 0:
            ref = next(
                r
                for r in rows
                if r["system"] == "hf-float32-plain"
                and (r["prompt"], r["tokens"], r["temperature"])
                == (row["prompt"], row["tokens"], 0)
            )
            row["first_difference_from_hf_float32"] = first_difference(row["ids"], ref["ids"])
    for row in rows:
        row.pop("ids", None)
    results["peers"] = {"rows": rows, "summary": summarize(rows, ["preset"], ["plain-int8"], hf)}
    partial.unlink()


def stage_cli(args, results):
    """The command a user runs, with no tuning flags, on each prompt at T = 0."""
    keep = (
        "preset",
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
    for prompt, text in prompt_texts().items():
        cmd = [
            "specjax", "generate", "--model", TARGET, "--draft", DRAFT, "--chat", text,
            "--max-new-tokens", "64", "--compare", "--json", "--repeats", str(max(args.rounds, 1)),
        ]  # fmt: skip
        log(" ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        out = json.loads(done.stdout)
        runs.append({
            "prompt": prompt,
            "command": " ".join(cmd[:6] + ["--chat", f"<{prompt} prompt>"] + cmd[8:]),
            **{k: out.get(k) for k in keep},
            "stderr": done.stderr.strip().splitlines()[:2],
        })  # fmt: skip
    results["cli"] = {"runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS / "real_pair")
    p.add_argument("--name", default="cpu", help="results file name stem (default: cpu)")
    p.add_argument(
        "--stages", nargs="+", default=["sweep", "peers", "cli"], choices=["sweep", "peers", "cli"]
    )
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
    p.add_argument("--quick", action="store_true", help="peers: 16 tokens only (a smoke run)")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--systems", nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.systems)
    from harness.machine import run_record

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for stage in args.stages:
        log(f"stage {stage}")
        record = run_record(argv)  # the date it started, the commit, the machine
        {"sweep": stage_sweep, "peers": stage_peers, "cli": stage_cli}[stage](args, results)
        results.setdefault("runs", {})[stage] = record
        path.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
