"""The systems ``scripts/benchmarks/bench_e2e.py`` compares: specjax's and transformers' decoders.

A "pass" is one system decoding every prompt of a workload once; a `System` runs
passes, and its `Outcome` counts what one produced.
"""

from __future__ import annotations

import dataclasses
import statistics
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
            self.first_s, raw = time_call(self.run)
            self.outcome = self.summarize(raw)
        return self.outcome

    def time(self, repeats: int) -> Timing:
        """Times ``repeats`` passes after the first; sets and returns `timing`."""
        self.first()
        times, _ = time_runs(self.run, repeats=repeats)
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


def hf_from_pretrained(path: Path):
    """transformers' float32 model of a Hugging Face folder or a GGUF (file or folder)."""
    import torch
    import transformers

    load = transformers.AutoModelForCausalLM.from_pretrained
    gguf = gguf_file(path)
    if gguf is not None:  # transformers dequantizes it, as specjax did
        return load(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    return load(path, dtype=torch.float32).eval()


class Transformers:
    """The same models in transformers (PyTorch, CPU, float32), from the same files.

    It counts target forwards (a forward pre-hook) and drafted candidates, which
    transformers does not expose: ``get_candidates`` of the two candidate
    generators used here is wrapped until :meth:`close`.
    """

    def __init__(self, pair: Pair, args):
        import transformers
        from transformers.generation import candidate_generator as cg

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.args = args
        self.target = hf_from_pretrained(pair.target_dir)
        self.draft = None if pair.draft_dir is None else hf_from_pretrained(pair.draft_dir)
        for m in (self.target, self.draft):
            if m is None:
                continue
            # Never stop on EOS (specjax runs with eos_id=None): every system
            # emits exactly max_new_tokens.
            m.generation_config.eos_token_id = None
            m.generation_config.pad_token_id = 0
        if self.draft is not None:
            # The assistant's settings are read from its own generation config: γ
            # drafts every step, constant schedule, no confidence cut-off.
            self.draft.generation_config.num_assistant_tokens = args.gamma
            self.draft.generation_config.num_assistant_tokens_schedule = "constant"
            self.draft.generation_config.assistant_confidence_threshold = 0.0
        self.target_calls = self.drafted = 0
        self._hook = self.target.register_forward_pre_hook(self._count_forward)
        self._patched = []
        for cls in (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator):
            original = cls.__dict__["get_candidates"]
            cls.get_candidates = self._counting(original)
            self._patched.append((cls, original))

    def _count_forward(self, module, inputs):
        self.target_calls += 1

    def _counting(self, original):
        def get_candidates(generator, input_ids, *args, **kwargs):
            out = original(generator, input_ids, *args, **kwargs)
            self.drafted += out[0].shape[1] - input_ids.shape[1]
            return out

        return get_candidates

    def close(self):
        """Removes the forward hook and restores the wrapped ``get_candidates``."""
        self._hook.remove()
        for cls, original in self._patched:
            cls.get_candidates = original

    def generation_config(self, method: str, temperature: float, max_new_tokens: int):
        """transformers' settings for ``method`` (EOS off; γ and n-gram from the args)."""
        from transformers import GenerationConfig

        kw = dict(max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        if temperature > 0:
            kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if method == "lookup":
            g, n = self.args.gamma, self.args.ngram
            kw.update(prompt_lookup_num_tokens=g, max_matching_ngram_size=n)
        return GenerationConfig(**kw)

    def generate(self, ids, config, method: str):
        """The target's ``generate``, with the draft as assistant for ``method`` "draft"."""
        import torch

        extra = dict(assistant_model=self.draft) if method == "draft" else {}
        with torch.inference_mode():
            mask = torch.ones_like(ids)
            return self.target.generate(ids, attention_mask=mask, generation_config=config, **extra)

    def system(self, method: str, prompts, temperature: float, workload: str) -> System:
        """transformers decoding ``prompts`` (one workload) with ``method``, at batch 1."""
        import torch

        config = self.generation_config(method, temperature, self.args.max_new_tokens)
        inputs = [torch.tensor([p], dtype=torch.long) for p in prompts]

        def run():
            self.target_calls = self.drafted = 0
            out = []
            for i, ids in enumerate(inputs):
                torch.manual_seed(self.args.seed * 100_003 + i)
                out.append(self.generate(ids, config, method)[0, ids.shape[1] :])
            return out, self.target_calls, self.drafted

        def summarize(raw):
            out, calls, drafted = raw
            tokens = [o.tolist() for o in out]
            # Every target forward emits its accepted candidates plus one token.
            accepted = sum(len(t) for t in tokens) - calls if method != "plain" else 0
            return Outcome(tokens, calls, calls, drafted, accepted, None)

        gamma = None if method == "plain" else self.args.gamma
        return System("transformers", method, 1, temperature, gamma, workload, run, summarize)

    def probe_batch(self) -> dict:
        """What transformers does with a batch of 2 rows, for each assisted method run."""
        import torch

        ids = torch.zeros((2, 4), dtype=torch.long)
        found = {}
        for method in ("draft", "lookup") if self.draft is not None else ("lookup",):
            try:
                self.generate(ids, self.generation_config(method, 0.0, 2), method)
                found[method] = "ran"
            except ValueError as e:
                found[method] = f"ValueError: {e}"
        return found

    def last_logits(self, seq) -> np.ndarray:
        """The target's logits after ``seq`` (one full forward, no cache)."""
        import torch

        with torch.inference_mode():
            return self.target(torch.tensor([seq], dtype=torch.long)).logits[0, -1].numpy()

    def pick_threads(self, prompt, choice: str) -> tuple[int, dict]:
        """Sets torch's thread count: ``choice``, or with "auto" the faster of 1 and 2.

        On a shared 2-core machine two OpenMP threads that spin-wait for a busy
        core can make small decode steps many times slower than one thread, so
        "auto" times 16 greedy tokens with each and keeps the faster.
        """
        import torch

        if choice != "auto":
            torch.set_num_threads(int(choice))
            return int(choice), {}
        ids = torch.tensor([prompt], dtype=torch.long)
        config = self.generation_config("plain", 0.0, 16)
        ms = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            times, _ = time_runs(self.generate, ids, config, "plain", repeats=3)
            ms[n] = statistics.median(times) / 16 * 1e3
        best = min(ms, key=ms.get)
        torch.set_num_threads(best)
        return best, ms
