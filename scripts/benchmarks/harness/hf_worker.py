"""transformers' side of ``bench_real_pair.py --stages peers``, in a process of its own.

Run as a script (``python hf_worker.py DTYPE TARGET.gguf DRAFT.gguf``) by
``bench_real_pair.py``, never imported: it imports torch and transformers only (a JAX
runtime in the same process slowed transformers about 3x). ``DTYPE`` is ``float32`` or
``bfloat16`` (the GGUF files dequantized), or ``int8``: float32, then every
``nn.Linear`` of target and assistant in PyTorch's dynamic int8 (`quantize_dynamic`:
a scale per output row, as specjax's ``int8``; each input quantized with one scale per
forward, specjax's one per token, so a prompt scored with drafts can give other greedy
tokens than alone).

It probes torch's thread count (`Worker.probe_threads`), prints ``{"ready": true,
"threads"}`` and answers one JSON job per stdin line (``{"system", "text", "tokens",
"temperature"}``, ``system`` one of ``hf-DTYPE-plain|assistant|lookup``) with one JSON
line (``{"seconds", "ids", "threads"}``); what the libraries print goes to stderr. Each
job renders its text with the target's chat template, tokenizes it before the timer
starts and stops after an EOS id (`EOS_IDS`) or at ``tokens`` new tokens.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import transformers

EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>: bench_real_pair.EOS_IDS


def release_freed_memory() -> None:
    """Returns the C heap's freed pages to the system (glibc's ``malloc_trim``; a no-op
    elsewhere): loading a GGUF file frees its dequantized copies, which the heap keeps."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def quantize_dynamic(model):
    """``model`` with its ``nn.Linear`` layers dynamically quantized to int8, in place:
    per-channel weights (a scale per output row) on PyTorch's x86/fbgemm kernels."""
    from torch.ao.quantization import per_channel_dynamic_qconfig

    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
        )


class Worker:
    """The target and its assistant in one precision, loaded once."""

    def __init__(self, dtype: str, target: str, draft: str):
        transformers.logging.set_verbosity_error()
        float_dtype = torch.float32 if dtype == "int8" else getattr(torch, dtype)

        def load(path: Path):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=float_dtype
            ).eval()
            return quantize_dynamic(model) if dtype == "int8" else model

        target, draft = Path(target), Path(draft)
        self.target, self.assistant = load(target), load(draft)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(target.parent), gguf_file=target.name
        )
        release_freed_memory()  # every side's models stay loaded for the whole stage
        self.threads = self.probe_threads()

    def probe_threads(self) -> int:
        """The fastest torch thread count of 1 .. every core, on 8 greedy tokens (the
        best of 3 per count): threads that spin-wait for a busy core can make small
        decode steps many times slower, so the count is measured, not assumed."""
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
        if job["temperature"] > 0:
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


def main() -> int:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    worker = Worker(*sys.argv[1:4])
    answers.write(json.dumps({"ready": True, "threads": worker.threads}) + "\n")
    answers.flush()
    for line in sys.stdin:
        answers.write(json.dumps(worker.run(json.loads(line))) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
