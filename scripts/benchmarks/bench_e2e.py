"""End-to-end decoding benchmark: specjax against Hugging Face transformers on the same weights.

On one target (and optionally a draft model), the same prompts and the same number
of new tokens, at temperature 0 and 1, it measures:

  * specjax: plain ``generate``, ``speculative_generate`` with the draft model
    (``DraftModel``, only with a draft), with prompt lookup (``PromptLookup``) and
    with the block drafter (``BlockDrafter``: one forward on the target's hidden
    states drafts ``--block-gamma`` tokens), at batch 1 and at a large batch
    (``--large-batch``, default 16);
  * transformers (PyTorch, CPU, float32, same weights loaded from the same
    Hugging Face folders or GGUF file, token ids in, no tokenizer), in a process of
    its own (`harness.hf_worker`: a JAX runtime in the same process slowed it about
    3x), its torch threads set to the fastest of 1 .. every core: plain
    ``generate``, assisted generation with the draft as ``assistant_model`` (γ tokens
    per step, constant schedule, no confidence cut-off; only with a draft) and prompt
    lookup (``prompt_lookup_num_tokens=γ``), at batch 1 only: transformers refuses
    assisted generation and prompt lookup for batch > 1 (probed at run time);
    transformers has no block drafter, so the block rows have no counterpart;
  * a sweep over γ of specjax speculative decoding with the draft model
    (temperature 0, batch 1; only with a draft): acceptance rate, realized and
    predicted speedup;
  * the same sweep over the block drafter's γ (``--block-sweep``; block size γ+1).

Prompts come in workloads (the lists of the ``--prompts`` file), reported one by
one and together. The bundled pair decodes ``prompts/bench_prompts.json`` (code and
prose, each cut to its last ``--prompt-tokens`` tokens). A ``--target`` with a chat
template (an instruct model such as SmolLM2-135M-Instruct) decodes
``prompts/real_prompts.json``: chat instructions and code-editing requests, each a
user message rendered with the model's chat template and kept whole (prompts of
different lengths; specjax pads them, see ``specjax.decoding.pad_prompts``). The large
batch decodes each workload's prompts in batches of that many rows, cycling through
them to fill the last batch.

The block drafter is ``--block-drafter PATH`` if given, else the bundled one
(``specjax.io.pretrained.default_drafter("block")``) on the bundled pair, else (``--quick``, other
targets, or no bundled drafter yet) one with random weights; the config says which.

EOS never stops a row, so every system generates exactly ``--max-new-tokens``.
Before any timing is reported, the greedy outputs of every system are checked
equal token for token; on any difference the script names the system, prompt
and position with the two tokens' logit gap, and exits with status 1.
``--tie-tol`` tolerates (and reports) transformers mismatches at near-ties; the
specjax systems must always agree exactly.

Both frameworks get the same prompts, the same first (warm-up) pass and the same
``--repeats`` timed passes; times are the medians of those passes over all prompts:
for specjax, compile time = first pass - median; for transformers (no compilation)
the first pass is reported next to the median. A ratio against transformers is
against its fastest system at that temperature, plain decoding included. The predicted
speedup of speculative decoding comes from the measured acceptance probability α
and the measured costs of one draft proposal and one verification, as in
``bench_decode.py`` (see ``harness.costs``). The performance targets are the bundled
pair's (``TARGETS``) for the bundled and the ``--quick`` random pair, and the
real-model targets (``REAL_TARGETS``) for any ``--target``.

Writes ``OUT/NAME.json`` (with the date, the commit, the command and the machine),
``OUT/NAME.md`` and ``OUT/NAME_<figure>.png``; ``--out`` defaults to
``scripts/benchmarks/results/e2e`` and ``--name`` to the model (``bundled`` for the
bundled pair, ``quick`` for ``--quick``).

    python scripts/benchmarks/bench_e2e.py                                 # bundled pair
    python scripts/benchmarks/bench_e2e.py --target T --draft D --out DIR  # HF folders
    python scripts/benchmarks/bench_e2e.py --quick --out /tmp/e2e          # tiny pair, seconds
    python scripts/benchmarks/bench_e2e.py --block-drafter DIR --out DIR   # another drafter

A real model without a draft (there is no smaller SmolLM2 to draft for the 135M
model, so no assisted generation either), with its trained block drafter:

    python scripts/benchmarks/bench_e2e.py --target /path/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --block-drafter BLOCK_DRAFTER_DIR --large-batch 8          # results/e2e/smollm2-135m.*
    python scripts/benchmarks/bench_e2e.py --quick --target /path/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out /tmp/e2e_smollm2   # minutes: 1 prompt per workload, 8 new tokens, batch 1 and 2

``--target`` takes a Hugging Face folder, a ``.gguf`` file or a folder holding one;
``specjax.io.fetch.smollm2_gguf()`` fetches SmolLM2-135M-Instruct's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The systems, measurements, report and figures live in harness/ (one
# module each, see its docstring); this script is their command line. The names in
# __all__ are re-exported: tests and users load this script as a module and call them.
from harness.e2e import run_benchmark
from harness.greedy import GreedyMismatchError, check_greedy_outputs
from harness.machine import RESULTS
from harness.pairs import (
    DEFAULT_BLOCK_GAMMA,
    PROMPTS_FILE,
    REAL_PROMPTS_FILE,
    log,
    model_name,
)
from harness.plots import plot
from harness.report import markdown
from harness.systems import batches_of
from harness.targets import real_targets_of

__all__ = [
    "GreedyMismatchError",
    "batches_of",
    "check_greedy_outputs",
    "main",
    "model_name",
    "parse_args",
    "real_targets_of",
    "run_benchmark",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--target",
        help="target model: a Hugging Face folder, a .gguf file or a folder holding one "
        "(default: the bundled pair)",
    )
    parser.add_argument(
        "--draft",
        help="draft model folder (Hugging Face format), with --target; without it there "
        "are no draft-model or assisted-generation rows",
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        help=f"prompt file (default: {REAL_PROMPTS_FILE.name} for a --target with a chat "
        f"template, else {PROMPTS_FILE.name})",
    )
    parser.add_argument("--num-code", type=int, default=None, help="first N code prompts")
    parser.add_argument("--num-prose", type=int, default=None, help="first N prose prompts")
    parser.add_argument(
        "--per-workload", type=int, default=None, help="first N prompts of every workload"
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=80,
        help="prompt length (tokens) of text prompts; chat prompts are kept whole",
    )
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--ngram", type=int, default=3, help="prompt lookup: longest n-gram")
    parser.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument(
        "--block-gamma",
        type=int,
        default=None,
        help=f"block drafter: draft tokens per step (γ; default the largest it takes, at "
        f"most {DEFAULT_BLOCK_GAMMA})",
    )
    parser.add_argument(
        "--block-sweep",
        type=int,
        nargs="+",
        default=[1, 2, 3, 4, 5, 7],
        help="block drafter γ sweep (block size γ+1; T=0, batch 1)",
    )
    parser.add_argument(
        "--block-mode", choices=["argmax", "sample"], default="sample",
        help="block drafter mode (default sample: on the bundled drafter it measured "
        "τ 2.1 against argmax's 1.19 at T=1, γ=3, and is the same drafts at T=0)",
    )  # fmt: skip
    parser.add_argument(
        "--block-drafter",
        help="block drafter folder (specjax.io.drafter_weights.save); default: the bundled one "
        "on the bundled pair, else random weights",
    )
    parser.add_argument("--large-batch", type=int, default=16, help="specjax's large batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes after the first")
    parser.add_argument("--cost-repeats", type=int, default=5)
    parser.add_argument("--cost-inner", type=int, default=10)
    parser.add_argument(
        "--torch-threads",
        default="auto",
        help="torch threads; auto: the fastest of 1 .. every core on a short probe (default)",
    )
    parser.add_argument(
        "--tie-tol",
        type=float,
        default=0.0,
        help="tolerate (and report) greedy mismatches whose |logit gap| is below this",
    )
    parser.add_argument(
        "--scan-layers", action="store_true",
        help="run --target's layers as one lax.scan (compiles once for any depth; docs/models.md, "
        "'Layer scan', for its cost per step); on with --quick --target",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "e2e",
        help="folder for NAME.json, NAME.md and the figures (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--name", help="file name stem (default: bundled, quick, or the --target's model)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: a tiny random pair (seconds), or with --target a tiny setting "
        "of that model (minutes)",
    )
    args = parser.parse_args(argv)
    if args.draft and not args.target:
        parser.error("--draft needs --target")
    if args.name is None:
        args.name = (
            "quick" if args.quick else model_name(args.target).lower() if args.target else "bundled"
        )
    if args.quick and args.target:
        quick_real(args)
    elif args.quick:
        args.num_code, args.num_prose, args.prompt_tokens = 1, 1, 24
        args.max_new_tokens, args.gamma, args.sweep, args.large_batch = 12, 2, [1, 2], 4
        # One block γ: every other one is another decode loop to compile (~7 s).
        args.block_gamma, args.block_sweep = 2, [2]
        args.repeats, args.cost_repeats, args.cost_inner = 1, 1, 2
    return args


def quick_real(args) -> None:
    """``--quick --target``: every system on the real model, as little of it as runs end
    to end (CI runs it on SmolLM2-135M on 2 CPU cores).

    One prompt per workload, 8 new tokens, batch 1 and 2, one timed pass and no sweep
    beyond the main γ, and the layers scanned: compiling is most of the run.
    Prompt lookup keeps γ = 4, so that its verification is the
    `harness.targets.VERIFY_WIDTH` forward, and the block drafter takes
    the same γ (see `harness.pairs.load_block`). Compilation is most of
    the run.
    """
    args.per_workload, args.max_new_tokens, args.large_batch = 1, 8, 2
    # Each decode loop of the unrolled 30-layer model is a 30-layer program to compile;
    # scanned, XLA compiles one layer per program.
    args.scan_layers = True
    args.sweep, args.block_sweep = [args.gamma], None  # None: the block γ alone
    args.repeats, args.cost_repeats, args.cost_inner = 1, 1, 2
    if args.torch_threads == "auto":
        # The probe decodes 96 tokens, half of them with 2 threads: on a busy 2-core
        # machine that took half a minute, and 1 thread won it.
        args.torch_threads = "1"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        results = run_benchmark(args)
    except GreedyMismatchError as e:
        bar = "!" * 78
        print(
            f"\n{bar}\nFAIL: {e}\nNo timing is reported for wrong outputs.\n{bar}", file=sys.stderr
        )
        return 1
    text = markdown(results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=2))
    (args.out / f"{args.name}.md").write_text(text + "\n")
    for path in plot(results, args.out, args.name):
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
