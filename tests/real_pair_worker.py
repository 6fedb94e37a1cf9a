"""The real pair in int8 at one forward width, decoded at jax's default flags.

Started by ``tests/test_real_pair.py`` in a process of its own: the rest of the suite
compiles with XLA's backend optimisation off (it is compile-bound), which would both
change the numerics under test and make a 1.5B model's 128 tokens take many minutes.
Here the pair decodes as users run it. Runnable by hand::

    python tests/real_pair_worker.py TARGET.gguf DRAFT.gguf OUT.json

The prompts are the first chat and the first code-edit request of
``prompts/real_prompts.json``, rendered with the target's chat template (as the
benchmarks render them). Writes the token lists of greedy decoding with the int8
target (weights and activations): speculative decoding with the int8 draft at γ = 3
and forward width W = 4, plain decoding at W = 4, and plain decoding one token wide,
plus the number of accepted drafts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax

import specjax
from specjax.models.quant import quantize

specjax.core.compilation_cache.enable_from_environment()  # the suite's shared cache

GAMMA = 3
WIDTH = GAMMA + 1
NEW_TOKENS = 128


def chat_and_code_prompts(model) -> list[list[int]]:
    """The first chat and the first code-edit prompt, as ``model``'s chat template
    renders them."""
    spec = json.loads((Path(__file__).parents[1] / "prompts" / "real_prompts.json").read_text())
    return [
        list(
            specjax.apply_chat_template(
                model, [{"role": "user", "content": spec[kind][0]["text"]}], tokenize=True
            )
        )
        for kind in ("chat", "code-edit")
    ]


def main(target_path: str, draft_path: str, out_path: str) -> int:
    start = time.perf_counter()
    # Quantized as loaded: the float32 1.5B (6 GB) is freed before the draft loads.
    target = quantize(specjax.load_pretrained(target_path, scan_layers=True), "int8")
    draft = quantize(specjax.load_pretrained(draft_path, scan_layers=True), "int8")
    prompts = chat_and_code_prompts(target)
    kw = dict(max_new_tokens=NEW_TOKENS, sampling=specjax.SamplingConfig.greedy())
    key = jax.random.key(0)
    spec = specjax.speculative_generate(
        key, target, specjax.DraftModel(draft, num_draft=GAMMA), prompts, forward_width=WIDTH, **kw
    )
    plain_w = specjax.generate(key, target, prompts, forward_width=WIDTH, **kw)
    plain_1 = specjax.generate(key, target, prompts, **kw)
    report = {
        "jax": jax.__version__,
        "forward_width": WIDTH,
        "speculative": spec.to_lists(),
        "plain_at_width": plain_w.to_lists(),
        "plain_one_wide": plain_1.to_lists(),
        "accepted": int(spec.stats.accepted.sum()),
        "seconds": time.perf_counter() - start,
    }
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
