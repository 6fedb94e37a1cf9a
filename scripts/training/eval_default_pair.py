"""Held-out loss and acceptance of a target/draft pair, such as the bundled one.

For the target and each draft folder it reports the held-out loss (nats/token
on the stdlib files held out from training), and for each draft, γ and
temperature the acceptance rate and tokens per target call of
``speculative_generate`` continuing prompts cut from held-out files.

    python scripts/training/eval_default_pair.py                          # bundled pair
    python scripts/training/eval_default_pair.py --pair runs/default_pair  # a training output
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import specjax
from specjax import training as train
from specjax.io import load_pretrained
from specjax.io.pretrained import default_pair_path
from specjax.training import data


def heldout_prompts(tokenizer, num_prompts: int, prompt_len: int) -> list[list[int]]:
    """``num_prompts`` windows of ``prompt_len`` tokens, evenly spaced over the held-out stream."""
    stream = data.tokenize_documents(tokenizer, data.stdlib_documents("heldout"))
    starts = np.linspace(0, len(stream) - prompt_len - 1, num_prompts).astype(int)
    return [stream[s : s + prompt_len].tolist() for s in starts]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pair", default=str(default_pair_path()), help="has target/, draft/")
    parser.add_argument("--drafts", nargs="+", default=["draft", "draft_data"])
    parser.add_argument("--gammas", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--eval-windows", type=int, default=64, help="windows for the loss")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)

    target = load_pretrained(f"{args.pair}/target")
    tokenizer = target.tokenizer
    heldout = data.tokenize_documents(tokenizer, data.stdlib_documents("heldout"))
    prompts = heldout_prompts(tokenizer, args.num_prompts, args.prompt_len)
    results = {"loss": {}, "acceptance": []}

    def loss(model):
        return train.evaluate(model, heldout, seq_len=256, max_windows=args.eval_windows)

    results["loss"]["target"] = loss(target)
    print(f"held-out loss: target {results['loss']['target']:.3f} nats/token")
    for name in args.drafts:
        try:
            draft = load_pretrained(f"{args.pair}/{name}")
        except FileNotFoundError:
            print(f"(no {name}/ in {args.pair}; skipped)")
            continue
        results["loss"][name] = loss(draft)
        print(f"held-out loss: {name} {results['loss'][name]:.3f} nats/token")
        for gamma in args.gammas:
            for temperature in args.temperatures:
                out = specjax.speculative_generate(
                    jax.random.key(0),
                    target,
                    specjax.DraftModel(draft, num_draft=gamma),
                    prompts,
                    max_new_tokens=args.max_new_tokens,
                    sampling=specjax.SamplingConfig(temperature=temperature),
                )
                row = {
                    "draft": name,
                    "gamma": gamma,
                    "temperature": temperature,
                    "acceptance_rate": float(out.stats.acceptance_rate),
                    "tokens_per_call": float(out.tokens_per_call),
                }
                results["acceptance"].append(row)
                print(row)

    print("\n| draft | held-out loss | γ | T | acceptance rate | tokens / target call |")
    print("|---|---|---|---|---|---|")
    for row in results["acceptance"]:
        print(
            f"| {row['draft']} | {results['loss'][row['draft']]:.3f} | {row['gamma']} | "
            f"{row['temperature']:g} | {row['acceptance_rate']:.3f} | "
            f"{row['tokens_per_call']:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
