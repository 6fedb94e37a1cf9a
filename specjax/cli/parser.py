"""The command line: its parser, and `main`, which runs the command it names."""

from __future__ import annotations

import argparse
import sys

from specjax.cli.common import UserError
from specjax.cli.compile import cmd_compile
from specjax.cli.fetch import cmd_fetch
from specjax.cli.generate import COMPARE_REPEATS, cmd_generate
from specjax.cli.train import SIZES, cmd_distill, cmd_train, cmd_train_drafter
from specjax.text.defaults import DEFAULTS


class _OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other user error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the help already says it or
    there is none to show (``None``, a flag's ``False``)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False:
            return text
        if action.default == argparse.SUPPRESS:
            return text
        if not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def _gamma(value: str) -> int | str:
    """``--gamma``: a whole number, or ``auto``."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number or 'auto', got {value!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="specjax",
        description="Exact speculative decoding in JAX. Runs offline on a bundled code model pair.",
    )
    from specjax import __version__

    parser.add_argument("--version", action="version", version=f"specjax {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser(
        "generate",
        formatter_class=_DefaultsFormatter,
        help="complete a prompt with speculative decoding",
        description="Complete PROMPT with speculative decoding (bundled pair by default). "
        "The text goes to stdout, a one-line summary to stderr.",
    )
    g.add_argument(
        "prompt", nargs="?", help="the text to complete, e.g. 'def fibonacci(n):' (or --chat)"
    )
    g.add_argument(
        "--chat", metavar="MESSAGE",
        help="chat with an instruct --model instead: MESSAGE is the user's turn, written in "
        "the model's chat template; only the answer is printed, and generation stops at the "
        "end of the assistant's turn",
    )  # fmt: skip
    g.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    g.add_argument(
        "--model",
        help="target model: a Hugging Face folder, a GGUF file, a model name that specjax "
        "fetches once (specjax fetch --list, e.g. qwen2.5-coder-1.5b) or a Hugging Face Hub "
        "id (owner/name, downloaded once into the Hub's cache; HF_ENDPOINT, HF_HUB_OFFLINE); "
        "default: the bundled target. Without --draft (or --block-drafter), --drafter auto "
        "drafts by prompt lookup",
    )
    g.add_argument(
        "--gguf-file", metavar="NAME",
        help="with a Hub id as --model: the GGUF file of its repository to load",
    )  # fmt: skip
    g.add_argument(
        "--draft",
        help="draft model for --drafter model (with --model): a folder, a GGUF file or a "
        "model name (e.g. qwen2.5-coder-0.5b); --drafter auto then drafts with it "
        "(default: none, or the bundled draft for the bundled target)",
    )
    g.add_argument(
        "--quantize", choices=["int8", "int8-weights"], default=None,
        help="run the target (and the draft model) with int8 weights (default: none, the "
        "checkpoint's precision, or a named pair's preset): int8 also quantizes "
        "each token's activations (int8 x int8 dots, the fastest on a CPU at batch 1), "
        "int8-weights keeps float32 products (specjax.models.quant); either way the "
        "speculative output equals the quantized model's plain output at the same "
        "--forward-width",
    )  # fmt: skip
    g.add_argument(
        "--draft-quantize", choices=["int8", "int8-weights", "none"], default=None,
        help="the draft model's own --quantize (default: the same as --quantize); "
        "--draft-quantize int8 is the fastest exact setting measured on a CPU",
    )  # fmt: skip
    g.add_argument(
        "--draft-head", type=int, default=None, metavar="N",
        help="the draft model's LM head scores only N ids, its tokenizer's added tokens "
        "and then the lowest ids (specjax.sampling.vocab.frequent_ids); exact whatever N, cheaper "
        "drafts, lower acceptance when the next token is outside them (default: none, every id)",
    )  # fmt: skip
    g.add_argument(
        "--drafter", default=DEFAULTS.drafter,
        metavar="{auto,block,eagle,model,lookup,suffix,none,PATH}",
        help="who drafts: the block drafter (reads the target's hidden states), the bundled "
        "EAGLE-style head (eagle: reads them too, drafts step by step), the draft "
        "model, prompt lookup (n-gram copy), suffix (the longest suffix match in the "
        "prompt, the output and --corpus), none (plain decoding), or the path of a block "
        "drafter folder (the same as --drafter block --block-drafter PATH); default "
        f"{DEFAULTS.drafter}: for the bundled pair the draft model "
        f"({DEFAULTS.bundled_drafter}); with --model, the draft model of --draft, else the "
        "block drafter of --block-drafter, else prompt lookup",
    )  # fmt: skip
    g.add_argument(
        "--block-mode", choices=["argmax", "sample"], default=DEFAULTS.draft_mode,
        help="block drafter: argmax drafts with a one-hot q, or sampled drafts with their "
        "true q (the same drafts at temperature 0)",
    )  # fmt: skip
    g.add_argument(
        "--block-drafter", metavar="PATH",
        help="block drafter folder for --drafter block with --model (specjax train-drafter)",
    )  # fmt: skip
    g.add_argument(
        "--gamma", type=_gamma, default="auto", metavar="{N,auto}",
        help="tokens drafted per target call (γ; 0 decodes plainly). auto: the γ from 0 "
        f"(plain decoding) up to the drafter's own ({DEFAULTS.gamma}, or a block drafter's "
        "trained γ) with the "
        "most expected tokens per second, from step costs measured on this machine once "
        "(cached; the first run shows the measuring) and recent runs' acceptance; "
        "--verbose says why. A tree (--tree) and --drafter none have no γ to choose",
    )  # fmt: skip
    g.add_argument(
        "--draft-confidence", type=float, default=None, metavar="X",
        help="a row stops drafting after its first draft the drafter gives a probability "
        "below X (0..1; its softmax when it drafts the argmax; default: none, every row "
        "drafts gamma); the draft model then "
        "skips the forwards no row needs. Exact; pays where draft forwards are costly "
        "and often wrong (0.5 on the Qwen2.5-Coder pair's chat; BENCHMARKS.md)",
    )  # fmt: skip
    g.add_argument(
        "--forward-width", type=int, default=None, metavar="N",
        help="every target forward scores exactly N tokens (speculative decoding's verify "
        "is padded to N, plain decoding's step too), so that speculative output equals "
        "plain output at width N token for token in any precision; default: the verify's "
        "width (gamma + 1, or a tree's nodes + 1), 1 with --drafter none",
    )  # fmt: skip
    g.add_argument(
        "--verification", choices=["block", "rejection", "coupled"], default=DEFAULTS.verification,
        help="block: the chain judged as a whole, the most accepted drafts on average; "
        "rejection: speculative rejection sampling, draft by draft; coupled: the drafts "
        "share the target's noise, and the output equals plain decoding's for the same "
        "--seed at any temperature (default: block for a chain, rejection for --tree)",
    )  # fmt: skip
    g.add_argument(
        "--tree", default=None, metavar="K1,K2,...",
        help="draft a tree instead of a chain: K1 children at the root, K2 under each of "
        "those, ... (e.g. 3,2,2,1; --drafter block or model); its depth is γ",
    )  # fmt: skip
    g.add_argument(
        "--corpus", metavar="PATH",
        help="with --drafter suffix: a file or folder of text or code to draft from too, "
        "besides the prompt and the output so far (tokenised once and cached)",
    )  # fmt: skip
    g.add_argument(
        "--ngram", type=int, default=DEFAULTS.ngram, metavar="N",
        help="longest n-gram matched by --drafter lookup",
    )  # fmt: skip
    g.add_argument(
        "--temperature", type=float, default=DEFAULTS.temperature, metavar="X", help="0 = greedy"
    )
    g.add_argument(
        "--top-k", type=int, default=0, metavar="N", help="keep the N most likely tokens (0 = off)"
    )
    g.add_argument(
        "--top-p", type=float, default=1.0, metavar="X", help="nucleus mass to keep (1 = off)"
    )
    g.add_argument(
        "--min-p", type=float, default=0.0, metavar="X", help="drop tokens below X × max prob"
    )
    g.add_argument(
        "--stop", action="append", metavar="TEXT",
        help="end a sample when its text contains TEXT (repeatable; kept in the output)",
    )  # fmt: skip
    constraint = g.add_mutually_exclusive_group()
    constraint.add_argument(
        "--regex", metavar="PATTERN",
        help="constrain the output to the regular expression PATTERN (matched whole)",
    )  # fmt: skip
    constraint.add_argument(
        "--json-schema", metavar="FILE",
        help="constrain the output to JSON documents valid under the schema in FILE",
    )  # fmt: skip
    g.add_argument(
        "--repetition-penalty", type=float, metavar="X", default=1.0,
        help="transformers' repetition penalty over prompt and output (1 = off)",
    )  # fmt: skip
    g.add_argument(
        "--presence-penalty", type=float, metavar="X", default=0.0,
        help="OpenAI's presence penalty over the output, in [-2, 2] (0 = off)",
    )  # fmt: skip
    g.add_argument(
        "--frequency-penalty", type=float, metavar="X", default=0.0,
        help="OpenAI's frequency penalty over the output, in [-2, 2] (0 = off)",
    )  # fmt: skip
    g.add_argument(
        "--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens, metavar="N",
        help="tokens to generate (EOS included)",
    )  # fmt: skip
    g.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS.seed,
        metavar="N",
        help="PRNG seed (same seed, same output)",
    )
    g.add_argument(
        "--batch-size", dest="batch", type=int, default=1, metavar="N",
        help="generate this many samples at once",
    )  # fmt: skip
    g.add_argument(
        "--no-eos", action="store_true",
        help="do not stop at the end of sequence (the config's EOS ids and the "
        "tokenizer's <|endoftext|>; with --chat, also the end of the turn)",
    )  # fmt: skip
    g.add_argument(
        "--compare", action="store_true",
        help="also decode plainly: check that the output equals plain decoding at the same "
        "--forward-width (greedy, or --verification coupled), and time plain decoding at "
        "width 1, its fastest, interleaved with the speculative runs; print the speedup "
        "(ratio of the median speeds)",
    )  # fmt: skip
    g.add_argument(
        "--repeats", type=int, default=None, metavar="N",
        help="time N steady runs after the first (which compiles) and show their median "
        "speed (with --compare, N runs of each, alternating speculative, plain, ...); "
        f"default: none, the generation runs once and its time includes compiling; "
        f"{COMPARE_REPEATS} with --compare",
    )  # fmt: skip
    g.add_argument("--json", action="store_true", help="print machine-readable JSON")
    g.add_argument(
        "--verbose", action="store_true",
        help="say why gamma auto chose its γ (also in --json's auto section)",
    )  # fmt: skip
    g.add_argument("--no-color", action="store_true", help="do not colour accepted draft tokens")
    g.add_argument(
        "--no-stream", action="store_true", help="print the completion at the end, not as it grows"
    )
    _add_cache_flag(g)
    g.set_defaults(func=cmd_generate)

    _add_compile(sub)

    for name, helptext in [
        ("train", "train a model (and a byte-level BPE tokenizer) on text files"),
        ("distill", "distil a draft model from a --model (the target) on text files"),
    ]:
        t = sub.add_parser(name, help=helptext, description=helptext)
        t.add_argument("data", nargs="+", help="text files or folders (read recursively)")
        t.add_argument("--out", required=True, help="output folder (Hugging Face format)")
        if name == "distill":
            t.add_argument(
                "--model", dest="target", required=True,
                help="the target (teacher) model folder",
            )  # fmt: skip
        t.add_argument(
            "--size", choices=sorted(SIZES), default="tiny" if name == "train" else "draft",
            help="architecture preset",
        )  # fmt: skip
        t.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (train only)")
        _add_run_flags(t, steps=1000, batch_size=16, lr=1e-3)
        t.set_defaults(func=cmd_train if name == "train" else cmd_distill)

    helptext = "train a block drafter (DFlash-style) for a target on text files"
    d = sub.add_parser(
        "train-drafter",
        help=helptext,
        description=helptext + ". The target "
        "is frozen; its hidden states are computed inside each training step.",
    )
    d.add_argument("data", nargs="+", help="text files or folders (read recursively)")
    d.add_argument("--out", required=True, help="output folder of the drafter")
    d.add_argument(
        "--model", dest="target",
        help="the target model folder (default: the bundled target)",
    )  # fmt: skip
    d.add_argument("--layers", type=int, default=2, help="draft layers (1-5)")
    d.add_argument("--features", type=int, default=3, help="target layers fused")
    d.add_argument("--block-size", type=int, default=8, help="largest block (γ+1) trained")
    d.add_argument("--anchors", type=int, default=32, help="blocks per training sequence")
    _add_run_flags(d, steps=2000, batch_size=8, lr=2e-3)
    d.set_defaults(func=cmd_train_drafter)

    helptext = "fetch models by name into $SPECJAX_CACHE (once; --model NAME does it too)"
    f = sub.add_parser("fetch", help=helptext, description=helptext)
    f.add_argument("names", nargs="*", metavar="NAME", help="the models to fetch")
    f.add_argument("--list", action="store_true", help="list the names, whether each is cached")
    f.set_defaults(func=cmd_fetch)
    return parser


def _add_compile(sub) -> None:
    from specjax.chips.table import CHIPS

    c = sub.add_parser(
        "compile",
        formatter_class=_DefaultsFormatter,
        help="compile the decoder for a TPU or GPU from this host, and predict what it does there",
        description="Compile the decoder ahead of time for --chip (no chip needed: libtpu or "
        "jax's CUDA plugin describes it) and report whether it fits the chip's memory, what "
        "one decode step reads and costs for every gamma, and the speedup predicted at the "
        "acceptance this pair reaches. Predictions come from the compiled programs' bytes "
        "and flops and the chip's published figures; nothing is measured. Exit status 3: "
        "it does not fit (the report says what to change).",
    )
    c.add_argument("--chip", default="v5e-1", help=f"one of {', '.join(CHIPS)}")
    c.add_argument(
        "--model",
        help="target: a Hugging Face folder, a GGUF file or a model name (only its "
        "configuration is read; no weights are loaded); default: the bundled target",
    )
    c.add_argument("--draft", help="draft model for --drafter model, as --model")
    c.add_argument(
        "--drafter",
        default="auto",
        choices=["auto", "model", "lookup", "block", "eagle", "none"],
        help="who drafts; auto: the draft model of --draft (the bundled draft without "
        "--model), else prompt lookup",
    )
    c.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default="bfloat16",
        help="the weights' (and activations') dtype on the chip",
    )  # fmt: skip
    c.add_argument(
        "--quantize", choices=["int8", "int8-weights"], default=None,
        help="int8 weights (specjax.models.quant) for the target and the draft model "
        "(default: none, --dtype weights)",
    )  # fmt: skip
    c.add_argument(
        "--draft-quantize", choices=["int8", "int8-weights", "none"], default=None,
        help="the draft model's own --quantize (default: the same as --quantize)",
    )  # fmt: skip
    c.add_argument(
        "--gamma", type=_gamma, default="auto", metavar="{N,auto}",
        help="the gamma a run uses; step costs are predicted for 0..gamma. auto: for "
        "0..4, and the gamma with the most predicted tokens per second is chosen",
    )  # fmt: skip
    c.add_argument("--batch-size", dest="batch", type=int, default=1, help="rows at once")
    c.add_argument("--prompt-length", type=int, default=128, help="tokens per prompt")
    c.add_argument(
        "--max-new-tokens", type=int, default=256,
        help="tokens generated per row (with --prompt-length, the context to hold)",
    )  # fmt: skip
    c.add_argument(
        "--acceptance", metavar="A1,A2,...",
        help="acceptance by draft position to predict the speedups at (default: what this "
        "machine's runs of the pair learnt, in the tuning cache)",
    )  # fmt: skip
    c.add_argument(
        "--mesh", metavar="DATAxMODEL",
        help="mesh axes over a slice's chips (default 1xN: tensor parallel over every chip, "
        "the draft model replicated)",
    )  # fmt: skip
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.set_defaults(func=cmd_compile)


def _add_cache_flag(parser) -> None:
    parser.add_argument(
        "--no-compilation-cache", action="store_true",
        help="compile everything anew and keep nothing: no persistent compilation cache "
        "(by default compiled programs are kept in $SPECJAX_CACHE/jax, so a second run "
        "starts in seconds; SPECJAX_COMPILATION_CACHE=off does the same as this flag)",
    )  # fmt: skip


def _add_run_flags(parser, *, steps: int, batch_size: int, lr: float) -> None:
    """The flags every training command shares: schedule, budget, checkpoints."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=None, help="time budget")
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    _add_cache_flag(parser)
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace whatever --out holds (by default an existing model is never replaced)",
    )  # fmt: skip


def main(argv=None) -> int:
    """Runs the command; returns the exit status (0, 2 for a user error, 1, 130).

    User errors print one line, ``specjax: error: ...``, with status 2; so do
    argparse's (returned, not raised, so that ``main([...])`` can be called
    in-process). A failure of the file system (a full disk, a permission
    denied) prints one line with status 1. Only genuine bugs show a traceback.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad option (2), already printed
        return e.code if isinstance(e.code, int) else 2
    from specjax.core import compilation_cache

    if getattr(args, "no_compilation_cache", False):  # fetch compiles nothing
        compilation_cache.disable()
    else:
        # The command keeps its compiled programs between runs; the library leaves
        # jax's settings to its user (`specjax.core.compilation_cache.enable`).
        compilation_cache.enable_from_environment()
    try:
        # An unreadable cache entry costs a compile and a warning, never the run; the
        # entry is removed afterwards, so the next run caches the program again.
        with compilation_cache.repairing():
            return args.func(args)
    except UserError as e:
        print(f"specjax: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"specjax: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("specjax: interrupted", file=sys.stderr)
        return 130
