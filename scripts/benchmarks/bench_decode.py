"""Speculative vs plain decoding throughput for one target, with the predicted speedup.

For each batch size it measures, on the same target and prompts:
  * plain ``generate`` and ``speculative_generate`` tokens/s (compile time apart,
    medians over repeats), the acceptance rate and tokens per target call;
  * the cost of one target step (T=1), of one verification (T=γ+1) and of one
    draft proposal (γ draft steps);
  * the speedup predicted from those costs and the measured acceptance
    probability α via Leviathan et al.'s E = (1-α^(γ+1))/(1-α):
        predicted = E · cost(T=1) / (cost(draft) + cost(T=γ+1)),
    and realized / predicted, which is what the loop machinery costs.
Greedy outputs of the two decoders are checked equal before anything is reported.

    python scripts/benchmarks/bench_decode.py                       # bundled pair
    python scripts/benchmarks/bench_decode.py --target T --draft D  # Hugging Face folders
    python scripts/benchmarks/bench_decode.py --quick               # tiny random pair, seconds
    python scripts/benchmarks/bench_decode.py --drafter block --no-predict  # bundled block drafter

``--no-predict`` times the two decoders only (no cost model), with the public API alone:
`bench_decode_ab.py` runs it that way on two checkouts to compare their speed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.core.timing import time_fn
from specjax.decoding import resolve_cache_len


def _run_record(argv) -> dict:
    """`harness.machine.run_record`, loaded from its file: importing the harness package
    would import its cost model, which needs this checkout's specjax, not the one
    bench_decode_ab may have put first on the path."""
    path = Path(__file__).resolve().parent / "harness" / "machine.py"
    spec = importlib.util.spec_from_file_location("_bench_machine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_record(argv)


CODE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "    for i in range(len(items)):",
]


def load_pair(args):
    if args.quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0)
        draft = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0, num_layers=1)
        return target, draft, None
    if args.target:
        target = specjax.load_pretrained(args.target)
        draft = specjax.load_pretrained(args.draft)
        return target, draft, target.tokenizer
    target, draft, tokenizer = specjax.default_pair()
    return target, draft, tokenizer


def make_prompts(tokenizer, batch_size, vocab_size):
    if tokenizer is None:
        rng = np.random.default_rng(0)
        return [list(rng.integers(0, vocab_size, size=8 + i % 5)) for i in range(batch_size)]
    return [tokenizer.encode(CODE_PROMPTS[i % len(CODE_PROMPTS)]).ids for i in range(batch_size)]


def bench_batch(target, draft, tokenizer, batch_size, args):
    prompts = make_prompts(tokenizer, batch_size, target.vocab_size)
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    if args.drafter == "block":
        drafter = specjax.io.pretrained.default_drafter("block", num_draft=args.gamma)
    else:
        drafter = specjax.DraftModel(draft, num_draft=args.gamma)
    key = jax.random.key(args.seed)
    n = args.max_new_tokens
    kw = dict(max_new_tokens=n, sampling=sampling)

    def plain_fn():
        return specjax.generate(key, target, prompts, **kw)

    def spec_fn():
        return specjax.speculative_generate(key, target, drafter, prompts, **kw)

    plain_t, plain = time_fn(plain_fn, repeats=args.repeats)
    spec_t, spec = time_fn(spec_fn, repeats=args.repeats)
    if args.temperature == 0.0 and not np.array_equal(plain.tokens, spec.tokens):
        sys.exit("FAIL: greedy speculative output differs from plain greedy output")

    plain_tps = float(jnp.sum(plain.lengths)) / plain_t.median_s
    spec_tps = float(jnp.sum(spec.lengths)) / spec_t.median_s
    row = {
        "batch": batch_size,
        "drafter": args.drafter,
        "gamma": args.gamma,
        "temperature": args.temperature,
        "plain_tok_s": plain_tps,
        "spec_tok_s": spec_tps,
        "plain_compile_s": plain_t.first_s - plain_t.median_s,
        "spec_compile_s": spec_t.first_s - spec_t.median_s,
        "acceptance_rate": float(spec.stats.acceptance_rate),
        "tokens_per_call": float(spec.tokens_per_call),
        "speedup": spec_tps / plain_tps,
    }
    if args.no_predict:
        return row
    # The cost model lives in the benchmarks' harness (scripts/benchmarks/harness).
    from harness import alpha_from_hist, speculative_prediction

    alpha = alpha_from_hist(np.asarray(spec.stats.accepted_hist))
    prompt_len = max(len(p) for p in prompts)
    context = prompt_len + n // 2
    # Measured against a cache as large as the loop's: attention reads every slot.
    cache_len = resolve_cache_len(None, prompt_len, n, args.gamma + 1)
    prediction = speculative_prediction(
        target,
        drafter,
        batch_size,
        context,
        sampling,
        alpha,
        repeats=args.repeats,
        cache_len=cache_len,
    )
    return {
        **row,
        "alpha": alpha,
        **prediction,
        "realized_over_predicted": row["speedup"] / prediction["predicted_speedup"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", help="target model folder (Hugging Face format)")
    parser.add_argument("--draft", help="draft model folder (Hugging Face format)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", help="also write the rows, with the date, commit and machine, to this file"
    )
    parser.add_argument("--quick", action="store_true", help="tiny random pair (smoke test)")
    parser.add_argument(
        "--drafter",
        choices=("model", "block"),
        default="model",
        help="the draft model of the pair (default), or the bundled pair's block drafter",
    )
    parser.add_argument(
        "--no-predict", action="store_true", help="time the decoders only (no cost model)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.max_new_tokens, args.batch, args.repeats = 16, [1, 2], 1
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together")
    if args.drafter == "block" and (args.target or args.quick):
        parser.error("--drafter block is the bundled pair's block drafter: no --target/--quick")

    target, draft, tokenizer = load_pair(args)
    rows = [bench_batch(target, draft, tokenizer, b, args) for b in args.batch]
    cols = [("batch", "{:d}"), ("drafter", "{}"), ("plain_tok_s", "{:.1f}")]
    cols += [("spec_tok_s", "{:.1f}"), ("speedup", "{:.2f}")]
    if not args.no_predict:
        cols += [("predicted_speedup", "{:.2f}"), ("realized_over_predicted", "{:.2f}")]
        cols += [("alpha", "{:.3f}"), ("cost_step_ms", "{:.2f}"), ("cost_verify_ms", "{:.2f}")]
        cols += [("cost_draft_ms", "{:.2f}")]
    cols += [("acceptance_rate", "{:.3f}"), ("tokens_per_call", "{:.2f}")]
    cols += [("plain_compile_s", "{:.1f}"), ("spec_compile_s", "{:.1f}")]
    print(
        f"# {jax.devices()[0].platform}, γ={args.gamma}, T={args.temperature}, "
        f"max_new_tokens={args.max_new_tokens}"
    )
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(f.format(row[c]) for c, f in cols) + " |")
    if args.json:
        # specjax_path: the checkout decoded (bench_decode_ab runs this script with
        # another checkout first on the import path).
        record = dict(_run_record(argv), specjax_path=str(Path(specjax.__file__).parent))
        with open(args.json, "w") as f:
            json.dump(dict(record, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
