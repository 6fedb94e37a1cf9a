"""Per-token cost of the sampling features, speculative against plain.

For each model pair and each feature set (none; the three penalties; a logit bias with
forbidden ids; stop strings that never match; ``top_logprobs=5``; all of them; a JSON
schema constraint), one
batch-1 run of plain decoding and one of speculative decoding with the pair's drafter,
on the same prompt, at T = 0 and T = 1: milliseconds per generated token (median of
``--repeats`` steady runs after a compiling one), the speedup and the acceptance.

Writes ``--json`` (default ``scripts/benchmarks/results/sampling_features/<pair>.json``,
the SmolLM2 pair's ``smollm2-135m.json``) with the date, the commit, the command and the
machine.

    python scripts/benchmarks/bench_sampling_features.py
    python scripts/benchmarks/bench_sampling_features.py --pair smollm2  # + its block drafter
    python scripts/benchmarks/bench_sampling_features.py --features "none,json schema" \\
        --json scripts/benchmarks/results/sampling_features/json_schema_bundled.json

The stop strings never match so that every run generates the same number of tokens.
So does the JSON schema: its document needs more characters than the budget holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import jax
import numpy as np

import specjax
from harness.machine import RESULTS, run_record
from specjax.core.timing import time_runs

PROMPT = "def parse_config(path):\n    "


def _pair(name: str):
    if name == "bundled":
        target, draft, tokenizer = specjax.default_pair()
        return target, specjax.DraftModel(draft, num_draft=4), tokenizer
    from specjax.io.fetch import smollm2_gguf

    target = specjax.load_pretrained(smollm2_gguf(), scan_layers=True)
    return target, specjax.io.pretrained.smollm2_drafter(target), target.tokenizer


# A document that cannot be complete within the budget (a string of at least 160
# characters), so that every run generates the same number of tokens.
SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 160}, "done": {"type": "boolean"}},
    "required": ["text", "done"],
}


def _features(vocab: int, tokenizer):
    bias = np.zeros(vocab, np.float32)
    bias[:: max(vocab // 64, 1)] = -0.5
    penalties = dict(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.3)
    bias_forbid = dict(logit_bias=bias, forbidden_ids=list(range(3, 3 + 32)))
    never = ["§never§", "¤nor this¤"]
    return {
        "none": ({}, {}),
        "penalties": (penalties, {}),
        "bias+forbidden": (bias_forbid, {}),
        "stop strings": ({}, dict(stop=never)),
        "top_logprobs=5": ({}, dict(top_logprobs=5)),
        "all": ({**penalties, **bias_forbid}, dict(stop=never, top_logprobs=5)),
        "json schema": (
            {},
            dict(constraint=specjax.Constraint.json_schema(SCHEMA, tokenizer, vocab)),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=["bundled", "smollm2"], default="bundled")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="default: <pair>.json in " + str(RESULTS / "sampling_features"),
    )
    parser.add_argument("--features", default=None, help="comma-separated subset to run")
    args = parser.parse_args()
    if args.json is None:
        name = {"bundled": "bundled", "smollm2": "smollm2-135m"}[args.pair]
        args.json = RESULTS / "sampling_features" / f"{name}.json"

    target, drafter, tokenizer = _pair(args.pair)
    prompt = [tokenizer.encode(PROMPT).ids]
    rows = []
    for temperature in (0.0, 1.0):
        features = _features(target.vocab_size, tokenizer)
        chosen = features if args.features is None else args.features.split(",")
        for name in chosen:
            fields, kwargs = features[name]
            sampling = specjax.SamplingConfig(temperature=temperature, **fields)
            if "stop" in kwargs:
                kwargs = dict(kwargs, stop=specjax.StopStrings.build(
                    kwargs["stop"], tokenizer, target.vocab_size, 1))  # fmt: skip
            key = jax.random.key(0)

            def plain(key=key, sampling=sampling, kwargs=kwargs):
                return specjax.generate(
                    key, target, prompt, max_new_tokens=args.tokens, sampling=sampling, **kwargs
                )

            def spec(key=key, sampling=sampling, kwargs=kwargs):
                return specjax.speculative_generate(
                    key, target, drafter, prompt, max_new_tokens=args.tokens,
                    sampling=sampling, **kwargs,
                )  # fmt: skip

            plain_s, plain_out = time_runs(plain, repeats=args.repeats, warmup=2)
            spec_s, spec_out = time_runs(spec, repeats=args.repeats, warmup=2)
            if temperature == 0:  # exactness before speed
                assert spec_out.to_lists() == plain_out.to_lists(), name
            n = int(plain_out.lengths[0])
            row = dict(
                pair=args.pair, temperature=temperature, features=name, tokens=n,
                plain_ms_per_token=1e3 * statistics.median(plain_s) / n,
                spec_ms_per_token=1e3 * statistics.median(spec_s) / int(spec_out.lengths[0]),
                acceptance=float(spec_out.stats.acceptance_rate),
            )  # fmt: skip
            row["speedup"] = row["plain_ms_per_token"] / row["spec_ms_per_token"]
            rows.append(row)
            print(
                f"T={temperature:g} {name:16s} plain {row['plain_ms_per_token']:7.2f} ms/tok  "
                f"spec {row['spec_ms_per_token']:7.2f} ms/tok  x{row['speedup']:.2f}  "
                f"acceptance {row['acceptance']:.2f}",
                flush=True,
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(run_record(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
