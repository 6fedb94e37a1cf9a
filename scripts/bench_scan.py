"""Layer scan vs unrolled layers: compile time and step time.

For each model, both layouts of the same weights (``Model.with_scan_layers``):

* **compile**: wall time of the first ``specjax.generate`` call (trace, compile
  and one run of a short generation), in a fresh JAX cache; then the same for
  ``specjax.speculative_generate`` with prompt lookup (a second program: prefill
  plus a (γ+1)-token verify inside the loop).
* **step**: median over ``--repeats`` runs of the time per generated token of
  greedy plain decoding (``--new`` tokens, batch 1), after the warm-up.

Models: the bundled target (8 layers) and SmolLM2-135M-Instruct (30 layers).
SmolLM2 is loaded from its GGUF (``specjax.io.fetch.smollm2_gguf``) when GGUF
loading is available, else built with random weights of the same shape, which
compiles and runs the same program (the script says which).

    python scripts/bench_scan.py                 # both models
    python scripts/bench_scan.py --quick         # bundled target only, few tokens
"""

from __future__ import annotations

import argparse
import statistics

import jax

import specjax
from specjax.benchmarking.timer import time_call, time_runs
from specjax.models import Model, ModelConfig

SMOLLM2_SHAPE = ModelConfig(
    model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_layers=30, num_heads=9, num_kv_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True, max_position_embeddings=8192,
)  # fmt: skip


def _smollm2():
    try:
        from specjax.io.fetch import smollm2_gguf

        return specjax.load_pretrained(smollm2_gguf()), "GGUF weights"
    except Exception as e:  # no GGUF support or no download: same shapes, random weights
        print(f"  (SmolLM2 GGUF unavailable: {e}; random weights of the same shape)")
        return Model.random(SMOLLM2_SHAPE), "random weights, same shape"


def measure(model, prompt, new_tokens: int, repeats: int) -> dict:
    greedy = specjax.SamplingConfig.greedy()
    key = jax.random.key(0)

    def plain():
        return specjax.generate(key, model, [prompt], max_new_tokens=new_tokens, sampling=greedy)

    def spec():
        return specjax.speculative_generate(
            key, model, specjax.PromptLookup(num_draft=4), [prompt],
            max_new_tokens=new_tokens, sampling=greedy,
        )  # fmt: skip

    jax.clear_caches()
    compile_plain, _ = time_call(lambda: plain().tokens)
    compile_spec, _ = time_call(lambda: spec().tokens)
    runs, _ = time_runs(lambda: plain().tokens, repeats=repeats)
    tokens = plain().to_lists()[0]
    return dict(
        compile_plain_s=compile_plain,
        compile_spec_s=compile_spec,
        ms_per_token=1e3 * statistics.median(runs) / new_tokens,
        tokens=tokens,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="bundled target only, few tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per timed run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.new, args.repeats = 8, 1

    target, _, tokenizer = specjax.default_pair()
    models = [("bundled target (8 layers)", target, "bundled weights")]
    if not args.quick:
        smol, source = _smollm2()
        models.append(("SmolLM2-135M (30 layers)", smol, source))
    rows = []
    for name, model, source in models:
        prompt = list(range(1, 17)) * 2  # 32 ids present in every vocabulary
        if model.tokenizer is not None:
            prompt = model.tokenizer.encode("def fibonacci(n):\n    ").ids
        results = {}
        for scan in (False, True):
            m = model.with_scan_layers(scan)
            results[scan] = measure(m, prompt, args.new, args.repeats)
        if results[False]["tokens"] != results[True]["tokens"]:
            raise SystemExit(f"{name}: scanned and unrolled greedy outputs differ")
        for scan in (False, True):
            r = results[scan]
            rows.append((name, source, "scan" if scan else "unrolled", r))
            print(
                f"{name:28s} {'scan' if scan else 'unrolled':9s} "
                f"compile plain {r['compile_plain_s']:6.1f} s  spec {r['compile_spec_s']:6.1f} s  "
                f"step {r['ms_per_token']:6.2f} ms/token",
                flush=True,
            )
    print("\n| model | weights | layers run as | first call, plain (s) | first call, "
          "speculative (s) | plain step (ms/token) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, source, how, r in rows:
        print(
            f"| {name} | {source} | {how} | {r['compile_plain_s']:.1f} | "
            f"{r['compile_spec_s']:.1f} | {r['ms_per_token']:.2f} |"
        )


if __name__ == "__main__":
    main()
