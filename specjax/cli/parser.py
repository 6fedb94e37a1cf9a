"""The command line: its parser, and `main`, which runs the command it names."""

from __future__ import annotations

import argparse
import sys

from specjax.cli.common import UserError
from specjax.cli.compile import cmd_compile
from specjax.cli.fetch import cmd_fetch
from specjax.cli.generate import COMPARE_REPEATS, cmd_generate
from specjax.cli.train import SIZES, cmd_distill, cmd_train, cmd_train_drafter
from specjax.text.options import parse_gamma


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


def _add_option_flags(g) -> None:
    """One flag per field of `specjax.GenerationOptions`, its help, default and spelling
    taken from the field (``sampling``: one flag per `SAMPLING_FLAGS` entry)."""
    import dataclasses

    from specjax.text.flags import SAMPLING_FLAGS, flag_of, sampling_default
    from specjax.text.options import GenerationOptions

    groups = {}
    for field in dataclasses.fields(GenerationOptions):
        if field.name == "sampling":
            for name, spec in SAMPLING_FLAGS.items():
                g.add_argument(
                    "--" + name.replace("_", "-"), default=sampling_default(name), **spec
                )
            continue
        spec = {k: v for k, v in field.metadata.items() if k not in ("flag", "group")}
        group = field.metadata.get("group")
        if group is not None and group not in groups:
            groups[group] = g.add_mutually_exclusive_group()
        target = g if group is None else groups[group]
        target.add_argument(flag_of(field.name), dest=field.name, default=field.default, **spec)


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
        "--chat",
        metavar="MESSAGE",
        help="chat with an instruct --model instead: MESSAGE is the user's turn, written in "
        "the model's chat template; only the answer is printed, and generation stops at the "
        "end of the assistant's turn",
    )
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
        "--gguf-file",
        metavar="NAME",
        help="with a Hub id as --model: the GGUF file of its repository to load",
    )
    g.add_argument(
        "--draft",
        help="draft model for --drafter model (with --model): a folder, a GGUF file or a "
        "model name (e.g. qwen2.5-coder-0.5b); --drafter auto then drafts with it "
        "(default: none, or the bundled draft for the bundled target)",
    )
    g.add_argument(
        "--block-drafter",
        metavar="PATH",
        help="block drafter folder for --drafter block with --model (specjax train-drafter)",
    )
    _add_option_flags(g)
    g.add_argument(
        "--batch-size",
        dest="batch",
        type=int,
        default=1,
        metavar="N",
        help="generate this many samples at once",
    )
    g.add_argument(
        "--compare",
        action="store_true",
        help="also decode plainly: check that the output equals plain decoding at the same "
        "--forward-width (greedy, or --verification coupled), and time plain decoding at "
        "width 1, its fastest, interleaved with the speculative runs; print the speedup "
        "(ratio of the median speeds)",
    )
    g.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="N",
        help="time N steady runs after the first (which compiles) and show their median "
        "speed (with --compare, N runs of each, alternating speculative, plain, ...); "
        f"default: none, the generation runs once and its time includes compiling; "
        f"{COMPARE_REPEATS} with --compare",
    )
    g.add_argument("--json", action="store_true", help="print machine-readable JSON")
    g.add_argument(
        "--verbose",
        action="store_true",
        help="say why gamma auto chose its γ (also in --json's auto section)",
    )
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
                "--model",
                dest="target",
                required=True,
                help="the target (teacher) model folder",
            )
        t.add_argument(
            "--size",
            choices=sorted(SIZES),
            default="tiny" if name == "train" else "draft",
            help="architecture preset",
        )
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
        "--model",
        dest="target",
        help="the target model folder (default: the bundled target)",
    )
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
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the weights' (and activations') dtype on the chip",
    )
    c.add_argument(
        "--quantize",
        choices=["int8", "int8-weights"],
        default=None,
        help="int8 weights (specjax.models.quant) for the target and the draft model "
        "(default: none, --dtype weights)",
    )
    c.add_argument(
        "--draft-quantize",
        choices=["int8", "int8-weights", "none"],
        default=None,
        help="the draft model's own --quantize (default: the same as --quantize)",
    )
    c.add_argument(
        "--gamma",
        type=parse_gamma,
        default="auto",
        metavar="{N,auto}",
        help="the gamma a run uses; step costs are predicted for 0..gamma. auto: for "
        "0..4, and the gamma with the most predicted tokens per second is chosen",
    )
    c.add_argument("--batch-size", dest="batch", type=int, default=1, help="rows at once")
    c.add_argument("--prompt-length", type=int, default=128, help="tokens per prompt")
    c.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="tokens generated per row (with --prompt-length, the context to hold)",
    )
    c.add_argument(
        "--acceptance",
        metavar="A1,A2,...",
        help="acceptance by draft position to predict the speedups at (default: what this "
        "machine's runs of the pair learnt, in the tuning cache)",
    )
    c.add_argument(
        "--mesh",
        metavar="DATAxMODEL",
        help="mesh axes over a slice's chips (default 1xN: tensor parallel over every chip, "
        "the draft model replicated)",
    )
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.set_defaults(func=cmd_compile)


def _add_cache_flag(parser) -> None:
    parser.add_argument(
        "--no-compilation-cache",
        action="store_true",
        help="compile everything anew and keep nothing: no persistent compilation cache "
        "(by default compiled programs are kept in $SPECJAX_CACHE/jax, so a second run "
        "starts in seconds; SPECJAX_COMPILATION_CACHE=off does the same as this flag)",
    )


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
        "--overwrite",
        action="store_true",
        help="replace whatever --out holds (by default an existing model is never replaced)",
    )


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
