"""llama.cpp's side of ``bench_real_pair.py --stages peers``, in a process of its own.

Run as a script (``python llamacpp_worker.py TARGET.gguf DRAFT.gguf``) by
``bench_real_pair.py``, never imported: it imports llama-cpp-python and numpy only.
llama.cpp computes in the GGUF files' own formats (the 1.5B's Q4_K/Q6_K, the 0.5B's
Q5_0/Q8_0 mix). It loads the models, sets the thread count to the fastest of 1 .. every
core (`Worker.probe_threads`), prints ``{"ready": true, ...}`` (its version, build and
probe) and answers one JSON job per stdin line (``{"system", "text", "tokens",
"temperature"[, "seed"]}``) with one JSON line (``{"seconds", "ids", "threads",
"target_calls", "drafted"}``); what the library prints goes to stderr.

Systems: ``llamacpp-plain`` (the target alone; greedy at T = 0, temperature-only
sampling at T > 0), ``llamacpp-draft`` (the 0.5B proposing `DRAFT_TOKENS` greedy tokens
a step, `GreedyDraft`, verified greedily by ``Llama.generate``) and ``llamacpp-lookup``
(``LlamaPromptLookupDecoding``, `LOOKUP_TOKENS` candidates from an n-gram of up to 2).
Each job renders its text with the target's chat template, tokenizes it before the
timer starts, clears every KV cache and times the whole generation; it stops after an
EOS id (`EOS_IDS`, counted) or at ``tokens`` new tokens.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import Llama, llama_set_n_threads
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>: bench_real_pair.EOS_IDS
N_CTX = 2048  # the context of every model: the prompts and 128 new tokens fit
DRAFT_TOKENS = 3  # γ, the 0.5B's greedy tokens per speculative step
LOOKUP_TOKENS = 3  # prompt lookup's candidates per step, as transformers' lookup drafts


class GreedyDraft(LlamaDraftModel):
    """``num_draft`` greedy tokens from a second `Llama` (the draft GGUF) per call.

    ``Llama.generate`` keeps the longest prefix its KV cache shares with the tokens it
    is given and evaluates only the rest, so the draft's cache follows the target's
    accepted tokens: a call evaluates the tokens accepted since the last call and
    drops the rejected drafts. Drafting stops early at an EOS id.
    """

    def __init__(self, model: Llama, num_draft: int):
        self.model, self.num_draft = model, num_draft
        self.drafted = 0

    def reset(self) -> None:
        """Forgets the draft's cached tokens (their KV is dropped on the next call)."""
        self.model.reset()
        self.drafted = 0

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        out: list[int] = []
        for token in self.model.generate(input_ids.tolist(), temp=0.0, repeat_penalty=1.0):
            out.append(token)
            if len(out) == self.num_draft or token in EOS_IDS:
                break
        self.drafted += len(out)
        return np.array(out, dtype=np.intc)


class Worker:
    """The target and the draft model, each loaded once (llama.cpp keeps a copy of its
    own of a model's repacked weights), the target set up per method by `use`."""

    def __init__(self, target: str, draft: str):
        load = lambda path, **kw: Llama(  # noqa: E731
            model_path=path, n_ctx=N_CTX, verbose=False, **kw
        )
        self.draft = GreedyDraft(load(draft), DRAFT_TOKENS)
        self.lookup = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=LOOKUP_TOKENS)
        self.target = load(target, logits_all=True)  # room for every position's logits
        self.target_calls = 0
        self.target.eval = self._counting(self.target.eval)
        self.formatter = Jinja2ChatFormatter(
            template=self.target.metadata["tokenizer.chat_template"],
            eos_token=self._token_text(self.target, self.target.token_eos()),
            bos_token=self._token_text(self.target, self.target.token_bos()),
        )
        self.threads, self.probe_ms = self.probe_threads()

    def use(self, method: str) -> Llama:
        """The target with ``method``'s drafter, as ``Llama(draft_model=...)`` sets it
        up: with a drafter it keeps the logits of every position it evaluates (the
        verification samples at each drafted position), without one only the last
        position's, as a plain `Llama` does."""
        llm = self.target
        llm.draft_model = {"plain": None, "draft": self.draft, "lookup": self.lookup}[method]
        llm._logits_all = llm.draft_model is not None
        return llm

    @staticmethod
    def _token_text(llm: Llama, token: int) -> str:
        return "" if token < 0 else llm.detokenize([token], special=True).decode()

    def _counting(self, original):
        def eval(tokens):  # one target forward over ``tokens``
            self.target_calls += 1
            return original(tokens)

        return eval

    def set_threads(self, n: int) -> None:
        for llm in (self.target, self.draft.model):
            llama_set_n_threads(llm.ctx, n, n)  # decoding, and prompts in batches
            llm.n_threads = llm.n_threads_batch = n

    def probe_threads(self) -> tuple[int, dict[int, float]]:
        """The fastest thread count of 1 .. every core: plain greedy decoding of 16
        tokens after 40 prompt tokens, median of 3 after a warm-up, per count.

        Threads that spin-wait for a busy core can make small decode steps many times
        slower than fewer threads, so the count is measured, not assumed.
        """
        prompt = list(range(100, 140))
        ms = {}
        for n in range(1, (os.cpu_count() or 1) + 1):
            self.set_threads(n)
            times = []
            for _ in range(4):
                start = time.perf_counter()
                self.decode("plain", prompt, 16, 0.0, 0, stop=False)
                times.append(time.perf_counter() - start)
            ms[n] = round(statistics.median(times[1:]) / 16 * 1e3, 2)
        best = min(ms, key=ms.get)
        self.set_threads(best)
        return best, ms

    def prompt_ids(self, text: str) -> list[int]:
        rendered = self.formatter(messages=[{"role": "user", "content": text}]).prompt
        return self.target.tokenize(rendered.encode(), add_bos=False, special=True)

    def decode(
        self, method: str, ids: list[int], tokens: int, temperature: float, seed: int, stop=True
    ) -> list[int]:
        """Up to ``tokens`` new tokens after ``ids``, from empty KV caches."""
        llm = self.use(method)
        llm.reset()
        self.draft.reset()
        llm.set_seed(seed)
        sampling = dict(temp=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0)
        out = []
        for token in llm.generate(ids, repeat_penalty=1.0, **sampling):
            out.append(int(token))
            if len(out) == tokens or (stop and token in EOS_IDS):
                break
        return out

    def run(self, job: dict) -> dict:
        method = job["system"].split("-")[1]
        ids = self.prompt_ids(job["text"])
        self.target_calls = 0
        start = time.perf_counter()
        out = self.decode(method, ids, job["tokens"], job["temperature"], job.get("seed", 0))
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "ids": out,
            "threads": self.threads,
            "target_calls": self.target_calls,
            "drafted": self.draft.drafted if method == "draft" else None,
        }


def main() -> int:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the library prints goes to stderr
    worker = Worker(*sys.argv[1:3])
    ready = {
        "ready": True,
        "llama_cpp_python": llama_cpp.__version__,
        "cpu_features": llama_cpp.llama_print_system_info().decode().strip(),
        "threads": worker.threads,
        "probe_ms_per_token": worker.probe_ms,
    }
    answers.write(json.dumps(ready) + "\n")
    answers.flush()
    for line in sys.stdin:
        answers.write(json.dumps(worker.run(json.loads(line))) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
