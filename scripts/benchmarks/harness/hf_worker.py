"""transformers' side of bench_e2e, in a process of its own.

Run as a script (``python hf_worker.py``) by `harness.systems.Transformers`, never
imported by it: this file imports torch and transformers only, so no JAX runtime
shares the process with PyTorch (one in the same process slowed transformers' decoding
about 3x). It reads one JSON job per line on stdin and answers each with one JSON
line on the stdout it was started with; anything the libraries print goes to stderr.

Jobs (``op``):

* ``load``: the target (and draft) as float32 models from a Hugging Face folder or a
  GGUF file (``{"folder", "gguf"}``), EOS off, the assistant's γ settings;
* ``threads``: sets torch's thread count, given or (``"auto"``) the fastest of
  1 .. every core on a short greedy probe;
* ``pass``: one pass of a method (plain, draft, lookup) over prompts, at batch 1:
  the tokens, the target forwards and the drafted candidates it counted;
* ``probe_batch``: what transformers does with a batch of 2 rows per assisted method;
* ``last_logits``: the target's logits after a sequence (one full forward, no cache).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import transformers
from transformers.generation import candidate_generator as cg


class Worker:
    """The models and the counters of one transformers process."""

    def __init__(self, job: dict):
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.gamma, self.ngram, self.seed = job["gamma"], job["ngram"], job["seed"]
        self.target = self.load(job["target"])
        self.draft = None if job["draft"] is None else self.load(job["draft"])
        if self.draft is not None:
            # The assistant's settings are read from its own generation config: γ
            # drafts every step, constant schedule, no confidence cut-off.
            self.draft.generation_config.num_assistant_tokens = self.gamma
            self.draft.generation_config.num_assistant_tokens_schedule = "constant"
            self.draft.generation_config.assistant_confidence_threshold = 0.0
        self.target_calls = self.drafted = 0
        self.target.register_forward_pre_hook(self._count_forward)
        # transformers does not expose its drafted candidates: count them.
        for cls in (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator):
            cls.get_candidates = self._counting(cls.__dict__["get_candidates"])

    @staticmethod
    def load(where: dict):
        """A float32 model from ``{"folder", "gguf"}`` (``gguf`` None: a HF folder)."""
        kw = dict(dtype=torch.float32)
        if where["gguf"] is not None:  # transformers dequantizes it, as specjax did
            kw["gguf_file"] = where["gguf"]
        model = transformers.AutoModelForCausalLM.from_pretrained(where["folder"], **kw).eval()
        # Never stop on EOS (specjax runs with eos_id=None): every system emits
        # exactly max_new_tokens.
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        return model

    def _count_forward(self, module, inputs):
        self.target_calls += 1

    def _counting(self, original):
        def get_candidates(generator, input_ids, *args, **kwargs):
            out = original(generator, input_ids, *args, **kwargs)
            self.drafted += out[0].shape[1] - input_ids.shape[1]
            return out

        return get_candidates

    def config(self, method: str, temperature: float, max_new_tokens: int):
        """transformers' settings for ``method`` (EOS off; γ and n-gram as specjax's)."""
        kw = dict(max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        if temperature > 0:
            kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if method == "lookup":
            kw.update(prompt_lookup_num_tokens=self.gamma, max_matching_ngram_size=self.ngram)
        return transformers.GenerationConfig(**kw)

    def generate(self, ids, config, method: str):
        """The target's ``generate``, with the draft as assistant for ``method`` "draft"."""
        extra = dict(assistant_model=self.draft) if method == "draft" else {}
        with torch.inference_mode():
            mask = torch.ones_like(ids)
            return self.target.generate(ids, attention_mask=mask, generation_config=config, **extra)

    def threads(self, job: dict) -> dict:
        """Sets torch's thread count: ``choice``, or with "auto" the fastest of 1 .. every
        core, each timed on 16 greedy tokens (median of 3).

        Threads that spin-wait for a busy core can make small decode steps many times
        slower than fewer threads, so the count is measured, not assumed.
        """
        if job["choice"] != "auto":
            torch.set_num_threads(int(job["choice"]))
            return {"threads": int(job["choice"]), "ms": {}}
        ids = torch.tensor([job["prompt"]], dtype=torch.long)
        config = self.config("plain", 0.0, 16)
        ms = {}
        for n in range(1, (os.cpu_count() or 1) + 1):
            torch.set_num_threads(n)
            self.generate(ids, config, "plain")  # warm-up at this count
            times = []
            for _ in range(3):
                start = time.perf_counter()
                self.generate(ids, config, "plain")
                times.append(time.perf_counter() - start)
            ms[n] = statistics.median(times) / 16 * 1e3
        best = min(ms, key=ms.get)
        torch.set_num_threads(best)
        return {"threads": best, "ms": ms}

    def one_pass(self, job: dict) -> dict:
        """One pass of ``method`` over ``prompts`` at batch 1, timed here."""
        method = job["method"]
        config = self.config(method, job["temperature"], job["max_new_tokens"])
        inputs = [torch.tensor([p], dtype=torch.long) for p in job["prompts"]]
        self.target_calls = self.drafted = 0
        tokens = []
        start = time.perf_counter()
        for i, ids in enumerate(inputs):
            torch.manual_seed(self.seed * 100_003 + i)
            tokens.append(self.generate(ids, config, method)[0, ids.shape[1] :].tolist())
        seconds = time.perf_counter() - start
        return dict(tokens=tokens, calls=self.target_calls, drafted=self.drafted, seconds=seconds)

    def probe_batch(self, job: dict) -> dict:
        ids = torch.zeros((2, 4), dtype=torch.long)
        found = {}
        for method in ("draft", "lookup") if self.draft is not None else ("lookup",):
            try:
                self.generate(ids, self.config(method, 0.0, 2), method)
                found[method] = "ran"
            except ValueError as e:
                found[method] = f"ValueError: {e}"
        return found

    def last_logits(self, job: dict) -> list[float]:
        with torch.inference_mode():
            seq = torch.tensor([job["seq"]], dtype=torch.long)
            return self.target(seq).logits[0, -1].tolist()


def main() -> int:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    worker = None
    for line in sys.stdin:
        job = json.loads(line)
        if job["op"] == "load":
            worker, answer = Worker(job), {"ready": True}
        else:
            answer = getattr(worker, job["op"])(job)
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
