"""The systems ``scripts/benchmarks/bench_e2e.py`` compares: specjax's and transformers' decoders.

A "pass" is one system decoding every prompt of a workload once; a `System` runs
passes, and its `Outcome` counts what one produced. transformers runs in a process of
its own (`Transformers`, `harness.hf_worker`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.core.timing import Timing, time_call, time_runs

from .pairs import Pair, gguf_file


@dataclasses.dataclass
class Outcome:
    """What one pass produced, summed over its calls."""

    tokens: list[list[int]]  # one row per prompt (batch 1) or per batch row
    target_calls: int  # per-row target forwards that emitted tokens, summed over rows
    steps: int  # decode-loop iterations (= target forwards), summed over calls
    drafted: int
    accepted: int
    hist: list[int] | None  # specjax: how often 0..γ drafts were accepted
    # specjax: per draft position, drafts judged (earlier ones accepted) and accepted.
    position_reached: list[int] | None = None
    position_accepted: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens generated, over every row."""
        return sum(len(r) for r in self.tokens)

    @staticmethod
    def merge(parts: list[Outcome]) -> Outcome:
        """The outcomes of several passes as one (rows in order, counts summed)."""
        hists = [p.hist for p in parts if p.hist is not None]
        return Outcome(
            tokens=[row for p in parts for row in p.tokens],
            target_calls=sum(p.target_calls for p in parts),
            steps=sum(p.steps for p in parts),
            drafted=sum(p.drafted for p in parts),
            accepted=sum(p.accepted for p in parts),
            hist=[int(h) for h in np.sum(hists, axis=0)] if hists else None,
            position_reached=_sum_lists([p.position_reached for p in parts]),
            position_accepted=_sum_lists([p.position_accepted for p in parts]),
        )


@dataclasses.dataclass(eq=False)
class System:
    """One decoder on one workload: ``run`` makes one pass, ``summarize`` reads its output.

    ``first_s``, ``outcome`` and ``timing`` are filled in by `first` and `time`.
    """

    framework: str  # "specjax" | "transformers"
    method: str  # "plain" | "draft" | "lookup" | "block"
    batch: int
    temperature: float
    gamma: int | None
    workload: str  # the prompt set it decodes ("all": several merged, see `merge`)
    run: Callable[[], object] | None  # one pass; returns raw outputs
    summarize: Callable[[object], Outcome] | None
    first_s: float | None = None
    outcome: Outcome | None = None
    timing: Timing | None = None
    # A pass run in another process: the seconds it measured there, from its raw output.
    seconds_of: Callable[[object], float] | None = None

    @property
    def name(self) -> str:
        g = f" γ={self.gamma}" if self.gamma else ""
        return f"{self.framework} {self.method}{g} b={self.batch} T={self.temperature:g}"

    @property
    def label(self) -> str:
        """The name with the workload, for messages about one system's pass."""
        return self.name if self.workload == "all" else f"{self.name} [{self.workload}]"

    def first(self) -> Outcome:
        """The outcome of the first pass, run (and timed, compilation included) once."""
        if self.outcome is None:
            if self.seconds_of is None:
                self.first_s, raw = time_call(self.run)
            else:
                raw = self.run()
                self.first_s = self.seconds_of(raw)
            self.outcome = self.summarize(raw)
        return self.outcome

    def time(self, repeats: int) -> Timing:
        """Times ``repeats`` passes after the first; sets and returns `timing`."""
        self.first()
        if self.seconds_of is None:
            times, _ = time_runs(self.run, repeats=repeats)
        else:
            times = [self.seconds_of(self.run()) for _ in range(repeats)]
        self.timing = Timing(self.first_s, statistics.median(times), times)
        return self.timing

    @classmethod
    def merge(cls, parts: list[System]) -> System:
        """One system's passes over several workloads as one pass over all of them.

        Outcomes are summed, and so are the times of the k-th pass of every part: a
        pass of the merged system is one pass over every prompt, as for one workload.
        """
        first = parts[0]
        same = (first.framework, first.method, first.batch, first.temperature, first.gamma)
        merged = cls(*same, workload="all", run=None, summarize=None)
        merged.outcome = Outcome.merge([p.outcome for p in parts])
        merged.first_s = sum(p.first_s for p in parts)
        times = [sum(ts) for ts in zip(*(p.timing.times_s for p in parts), strict=True)]
        merged.timing = Timing(merged.first_s, statistics.median(times), times)
        return merged


def _sum_lists(lists) -> list[int] | None:
    """Element-wise sum of equal-length int lists (None entries left out; all None: None)."""
    kept = [x for x in lists if x is not None]
    return [int(v) for v in np.sum(kept, axis=0)] if kept else None


def _summarize_specjax(results) -> Outcome:
    tokens = [row for r in results for row in r.to_lists()]
    stats = [jax.device_get(r.stats) for r in results]
    hist = np.sum([np.asarray(s.accepted_hist) for s in stats], axis=0)
    return Outcome(
        tokens=tokens,
        target_calls=int(sum(np.sum(s.row_target_calls) for s in stats)),
        steps=int(sum(s.target_calls for s in stats)),
        drafted=int(sum(np.sum(s.drafted) for s in stats)),
        accepted=int(sum(np.sum(s.accepted) for s in stats)),
        hist=[int(h) for h in hist] if hist.size else None,
        position_reached=_sum_lists([np.asarray(s.position_reached) for s in stats]) or None,
        position_accepted=_sum_lists([np.asarray(s.position_accepted) for s in stats]) or None,
    )


def batches_of(prompts: list, batch: int) -> list[list]:
    """The prompts in batches of ``batch`` rows, cycling through them to fill the last.

    Row ``r`` of the concatenated batches is prompt ``r % len(prompts)``.
    """
    rows = [prompts[i % len(prompts)] for i in range(-(-len(prompts) // batch) * batch)]
    return [rows[i : i + batch] for i in range(0, len(rows), batch)]


def specjax_system(pair, method, prompts, batch, temperature, gamma, args, workload) -> System:
    """specjax decoding ``prompts`` (one workload) with ``method``, one call per batch."""
    sampling = specjax.SamplingConfig(temperature=temperature)
    key = jax.random.key(args.seed)
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
    drafter = None
    if method == "draft":
        drafter = specjax.DraftModel(pair.draft, num_draft=gamma)
    elif method == "lookup":
        drafter = specjax.PromptLookup(ngram=args.ngram, num_draft=gamma)
    elif method == "block":
        drafter = pair.block.with_draft(num_draft=gamma)

    def one(k, rows):
        if method == "plain":
            return specjax.generate(k, pair.target, rows, **kw)
        return specjax.speculative_generate(k, pair.target, drafter, rows, **kw)

    batches = batches_of(prompts, batch)

    def run():
        return [one(jax.random.fold_in(key, i), rows) for i, rows in enumerate(batches)]

    return System("specjax", method, batch, temperature, gamma, workload, run, _summarize_specjax)


def _where(path: Path) -> dict:
    """How the worker loads ``path``: a Hugging Face folder or a GGUF (file or folder)."""
    gguf = gguf_file(path)
    if gguf is not None:
        return {"folder": str(gguf.parent), "gguf": gguf.name}
    return {"folder": str(path), "gguf": None}


class Transformers:
    """The same models in transformers (PyTorch, CPU, float32), from the same files,
    in a process of their own (`harness.hf_worker`): no JAX runtime shares it.

    Each call here is one job for that process, which runs while this one waits, so
    only one framework decodes at a time. A pass is timed inside the worker, as
    specjax's are here, without the pipe's round trip.
    """

    def __init__(self, pair: Pair, args):
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("hf_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._ask(
            op="load",
            target=_where(pair.target_dir),
            draft=None if pair.draft_dir is None else _where(pair.draft_dir),
            gamma=args.gamma,
            ngram=args.ngram,
            seed=args.seed,
        )

    def _ask(self, **job):
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the transformers worker stopped on the job {job['op']!r}")
        return json.loads(line)

    def close(self):
        """Ends the worker process."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()

    def system(self, method: str, prompts, temperature: float, workload: str) -> System:
        """transformers decoding ``prompts`` (one workload) with ``method``, at batch 1."""
        job = dict(
            op="one_pass",
            method=method,
            prompts=[list(map(int, p)) for p in prompts],
            temperature=temperature,
            max_new_tokens=self.args.max_new_tokens,
        )

        def run():
            return self._ask(**job)

        def summarize(raw):
            tokens, calls = raw["tokens"], raw["calls"]
            # Every target forward emits its accepted candidates plus one token.
            accepted = sum(len(t) for t in tokens) - calls if method != "plain" else 0
            return Outcome(tokens, calls, calls, raw["drafted"], accepted, None)

        gamma = None if method == "plain" else self.args.gamma
        return System(
            "transformers", method, 1, temperature, gamma, workload, run, summarize,
            seconds_of=lambda raw: raw["seconds"],
        )  # fmt: skip

    def probe_batch(self) -> dict:
        """What transformers does with a batch of 2 rows, for each assisted method run."""
        return self._ask(op="probe_batch")

    def last_logits(self, seq) -> np.ndarray:
        """The target's logits after ``seq`` (one full forward, no cache)."""
        return np.asarray(self._ask(op="last_logits", seq=[int(t) for t in seq]), np.float32)

    def pick_threads(self, prompt, choice: str) -> tuple[int, dict]:
        """Sets torch's thread count: ``choice``, or with "auto" the fastest of 1 .. every
        core on a short greedy probe (`harness.hf_worker.Worker.threads`).

        Returns:
            ``(threads, {count: ms per token})`` (the dict empty when not probed).
        """
        found = self._ask(op="threads", prompt=[int(t) for t in prompt], choice=choice)
        return found["threads"], {int(n): ms for n, ms in found["ms"].items()}
