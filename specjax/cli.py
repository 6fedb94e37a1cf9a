"""The ``specjax`` command: generate with the bundled pair, train, distil.

User errors (bad options, missing files, mismatched models, an --out that would
be overwritten) print one line to stderr and exit with status 2, and the train
and distill commands check everything they can before training starts. A
failing file system (a full disk, a permission denied) prints one line and exits
with status 1. Only genuine bugs show a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

GREEN, RESET = "\033[32m", "\033[0m"


# What `--drafter auto` picks for the bundled pair: the fastest drafter measured by
# scripts/bench_e2e.py (BENCHMARKS.md, "The block drafter"). The bundled block drafter
# measured slower than the draft model at T=0 and at T=1 on this CPU.
FASTEST_BUNDLED_DRAFTER = "model"


class UserError(Exception):
    """A mistake in the command line or its inputs, reported without a traceback."""


# ----------------------------------------------------------------------------
# generate


def _load_models(args):
    import specjax
    from specjax.pretrained import default_pair

    if args.model:
        target = _load_folder(args.model, "--model")
        draft = _load_folder(args.draft, "--draft") if args.draft else None
    else:
        if args.draft:
            raise UserError(
                "--draft needs --model (the bundled draft only fits the bundled target)"
            )
        try:
            target, draft, _ = default_pair()
        except (FileNotFoundError, ValueError, OSError) as e:
            raise UserError(f"cannot load the bundled pair: {e}") from None
    _resolve_drafter_path(args)
    if args.drafter == "auto":
        # The bundled pair: the fastest drafter measured for it (BENCHMARKS.md). A
        # user's own target: its draft model if given, else a block drafter if given,
        # else prompt lookup (which needs no weights).
        if not args.model:
            args.drafter = FASTEST_BUNDLED_DRAFTER
        else:
            args.drafter = "model" if args.draft else "block" if args.block_drafter else "lookup"
    if args.drafter == "model" and draft is None:
        raise UserError("--drafter model needs --draft PATH when --model is given")
    if args.drafter == "block" and args.model and not args.block_drafter:
        raise UserError(
            "--drafter block needs --block-drafter PATH when --model is given (the bundled "
            "block drafter only fits the bundled target)"
        )
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise UserError(f"{args.model} has no tokenizer.json; specjax generate needs one")
    if args.drafter == "model":
        # A smaller draft of a padded family is fine when the two share their ids.
        try:
            specjax.vocab.check_drafter_vocab(target, specjax.DraftModel(draft))
        except ValueError as e:
            raise UserError(f"--draft {args.draft}: {e}") from None
    if args.drafter == "block":
        draft = _load_block_drafter(args, target)
    if args.drafter == "eagle":
        if args.model:
            raise UserError("--drafter eagle: the bundled EAGLE head only fits the bundled target")
        try:
            # Sampled drafts with their true q measured better than argmax at T=1.
            mode = "sample" if args.temperature > 0 else "argmax"
            draft = specjax.default_drafter("eagle").with_draft(mode=mode)
        except (FileNotFoundError, ValueError, OSError) as e:
            raise UserError(f"bundled EAGLE head: {e}") from None
    del specjax
    return target, draft, tokenizer


DRAFTER_NAMES = ("auto", "block", "eagle", "model", "lookup", "none")


def _parse_tree(args):
    """``--tree 3,2,2,1`` as a `Tree` (None without it), refused for drafters without trees."""
    if args.tree is None:
        return None
    from specjax.tree import Tree

    try:
        tree = Tree.parse(args.tree)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.drafter in ("lookup", "none"):
        raise UserError(f"--tree needs a drafter that proposes trees (block, eagle or model), not "
                        f"--drafter {args.drafter}")  # fmt: skip
    if args.gamma is not None and args.gamma != tree.depth:
        raise UserError(
            f"--gamma {args.gamma} and --tree {args.tree} disagree: a tree drafts its depth "
            f"({tree.depth}) per step; drop --gamma"
        )
    args.gamma = tree.depth
    return tree


def _resolve_drafter_path(args) -> None:
    """``--drafter PATH`` means ``--drafter block --block-drafter PATH``."""
    if args.drafter in DRAFTER_NAMES:
        return
    path = Path(args.drafter)
    if not path.is_dir():
        names = ", ".join(DRAFTER_NAMES)
        raise UserError(
            f"--drafter {args.drafter!r}: neither one of {names} nor a block drafter folder"
        )
    if args.block_drafter and Path(args.block_drafter) != path:
        raise UserError(
            f"--drafter {args.drafter} and --block-drafter {args.block_drafter} name two drafters"
        )
    args.drafter, args.block_drafter = "block", str(path)


def _load_block_drafter(args, target):
    """The bundled block drafter, or the one of --block-drafter, at --gamma (or its own γ)."""
    from specjax.block_drafter import load_block_drafter
    from specjax.pretrained import BLOCK_DRAFTER_DIR, default_pair_path

    path = args.block_drafter or default_pair_path() / BLOCK_DRAFTER_DIR
    flag = "--block-drafter" if args.block_drafter else "bundled block drafter"
    try:
        drafter = load_block_drafter(path, target)
        # Sampling: verify against the drafter's own marginals ("sample"), which measured
        # better than argmax drafts at T=1 (BENCHMARKS.md); at T=0 the two are the same.
        return drafter.with_draft(args.gamma, mode=args.block_mode)
    except (FileNotFoundError, ValueError, OSError, KeyError) as e:
        tree = f" (--tree {args.tree} has depth {args.gamma})" if args.tree else ""
        raise UserError(f"{flag} {path}: {e}{tree}") from None


def _load_folder(path, flag):
    from specjax.io.hf import load_pretrained

    is_gguf = Path(path).suffix.lower() == ".gguf" and Path(path).is_file()
    if not (Path(path).is_dir() or is_gguf):
        raise UserError(f"{flag} {path}: no such directory or .gguf file")
    try:
        return load_pretrained(path)
    except (FileNotFoundError, ValueError, OSError, KeyError) as e:
        raise UserError(f"{flag} {path}: {e}") from None


def _eos_id(tokenizer, model):
    from specjax.tokenizer import EOS_TOKEN

    eos = tokenizer.token_to_id(EOS_TOKEN)
    return eos if eos is not None else model.config.eos_token_id


def _chat_prompt(args, target):
    """``(prompt text, ids, end-of-turn ids)`` of --chat (and --system) in the template."""
    from specjax.chat import apply_chat_template, end_of_turn_ids

    if target.chat_template is None:
        where = f"--model {args.model}" if args.model else "the bundled model"
        raise UserError(
            f"--chat: {where} has no chat template (chat_template.jinja, or chat_template "
            "in tokenizer_config.json); give a PROMPT to complete instead"
        )
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.chat})
    try:
        text = apply_chat_template(target, messages)
    except ValueError as e:
        raise UserError(f"--chat: {e}") from None
    ids = target.tokenizer.encode(text, add_special_tokens=False).ids
    return text, ids, list(end_of_turn_ids(target))


class _TextStream:
    """Turns token ids into text as they arrive, keeping multi-byte characters whole.

    A byte-level BPE can split one character over several tokens; until the last one
    arrives the decoded text ends in U+FFFD, which is held back rather than printed.
    """

    def __init__(self, tokenizer, hide=(), color=False):
        self.tokenizer, self.hide, self.color = tokenizer, set(hide), color
        self.ids, self.printed = [], ""

    def feed(self, ids, from_draft) -> str:
        out = []
        for token, drafted in zip(ids, from_draft, strict=True):
            if token in self.hide:
                continue
            self.ids.append(token)
            text = self.tokenizer.decode(self.ids, skip_special_tokens=False).rstrip("\ufffd")
            if text.startswith(self.printed):
                piece, self.printed = text[len(self.printed) :], text
                out.append(f"{GREEN}{piece}{RESET}" if drafted and self.color and piece else piece)
        return "".join(out)

    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=False)


def _decode_open(key, target, drafter, prompts, max_new_tokens, kw, on_chunk=None):
    """One run through the open loop: init, then one step to the end or chunks streamed.

    Both ways run the same two compiled programs (init and step), so a streamed first
    run also compiles what the timed runs use.
    """
    import jax

    from specjax import decoding

    state = decoding.init(
        key, target, prompts, drafter=drafter, max_new_tokens=max_new_tokens, **kw
    )
    if on_chunk is None:
        # Every iteration emits at least one token per active row.
        state = decoding.step(state, max_new_tokens)
    else:
        for chunk_state, new in decoding.stream(state, steps_per_chunk=4):
            on_chunk(chunk_state, new)
        state = chunk_state
    return jax.block_until_ready(decoding.result(state))


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _median_interleaved(fns, repeats):
    """Times each of ``fns`` ``repeats`` times, round robin (a, b, a, b, ...).

    Interleaving spreads slow drifts of the machine (clock, cache, other load) over
    every system alike. Returns one list of seconds per function and the result of
    each function's last run; the callers report the medians.
    """
    seconds, results = [[] for _ in fns], [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            results[i], s = _timed(fn)
            seconds[i].append(s)
    return seconds, results


def cmd_generate(args) -> int:
    import jax
    import numpy as np

    import specjax
    from specjax.decoding import CACHE_BUCKET

    if args.chat is not None:
        if args.prompt is not None:
            raise UserError("--chat takes the message itself: give --chat or a PROMPT, not both")
        if not args.chat.strip():
            raise UserError("the --chat message is empty")
    elif args.system is not None:
        raise UserError("--system needs --chat (it is the system message of the chat)")
    elif args.prompt is None:
        raise UserError("give a PROMPT to complete, or --chat MESSAGE")
    elif not args.prompt.strip():
        raise UserError("the prompt is empty")
    for name in ("max_new_tokens", "gamma", "batch", "ngram", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from specjax.validation import check_int

    # jax.random.key keeps 32 bits without x64: larger seeds collide or overflow.
    _check_flag("--seed", check_int, args.seed)
    sampling = specjax.SamplingConfig(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p
    )
    try:
        specjax.sampling.check_sampling_config(sampling)
    except ValueError as e:
        raise UserError(str(e)) from None

    tree = _parse_tree(args)
    target, draft, tokenizer = _load_models(args)
    if args.gamma is None:  # the drafter's own default: a block drafter's trained γ, else 4
        args.gamma = draft.num_draft if args.drafter in ("block", "eagle") else 4
    if args.chat is not None:
        # The model sees the rendered template; only the answer is printed, and a
        # row stops at the end of the assistant's turn.
        prompt_text, ids, stop_ids = _chat_prompt(args, target)
        shown_prompt = ""
    else:
        prompt_text = shown_prompt = args.prompt
        ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
        stop_ids = [_eos_id(tokenizer, target)]
    context = target.config.max_position_embeddings
    step_slots = (tree.num_nodes if tree is not None else args.gamma) + 1
    needed = len(ids) + args.max_new_tokens + step_slots
    if needed > context:
        drafts = f"--tree {args.tree}" if tree is not None else f"--gamma {args.gamma}"
        raise UserError(
            f"the prompt is {len(ids)} tokens; with --max-new-tokens {args.max_new_tokens} "
            f"and {drafts} it needs {needed} positions, more than the model's "
            f"context of {context}"
        )
    prompts = [ids] * args.batch
    # An id past the model's logits can never be emitted (nor passed as eos_id).
    stop = (
        set() if args.no_eos else {i for i in stop_ids if i is not None and i < target.vocab_size}
    )
    eos = sorted(stop) or None
    key = jax.random.key(args.seed)
    cache_len = -(-needed // CACHE_BUCKET) * CACHE_BUCKET
    kw = dict(sampling=sampling, eos_id=eos, cache_len=cache_len)
    if args.drafter == "none":
        drafter = None
    elif args.drafter == "model":
        drafter = specjax.DraftModel(draft, num_draft=args.gamma)
    elif args.drafter in ("block", "eagle"):
        drafter = draft if args.drafter == "block" else draft.with_draft(args.gamma)
    else:
        drafter = specjax.PromptLookup(ngram=args.ngram, num_draft=args.gamma)
    if tree is not None:
        try:  # e.g. a tree deeper than a block drafter's block
            drafter = drafter.with_tree(tree)
        except ValueError as e:
            raise UserError(f"--tree {args.tree}: {e}") from None
    try:  # e.g. a draft smaller than the target's tokenizer (a padded family)
        specjax.vocab.resolve_vocab_limit(sampling, target, drafter)
    except ValueError as e:
        raise UserError(str(e)) from None
    run = lambda d, on_chunk=None: _decode_open(  # noqa: E731
        key, target, d, prompts, args.max_new_tokens, kw, on_chunk
    )

    color = sys.stdout.isatty() and not args.no_color and "NO_COLOR" not in os.environ
    hide = stop
    stream = args.batch == 1 and not args.json and not args.no_stream
    if stream:
        # The first run streams row 0 chunk by chunk (no host sync inside a chunk); it
        # also compiles, so the speed below comes from a second, steady run.
        text = _TextStream(tokenizer, hide, color)
        print(shown_prompt, end="", flush=True)

        def show(state, new):
            if new[0]:
                end = len(ids) + int(state.num_generated[0])
                flags = np.asarray(state.from_draft[0, end - len(new[0]) : end]).tolist()
                print(text.feed(new[0], flags), end="", flush=True)

        _, compile_s = _timed(lambda: run(drafter, show))
        print(flush=True)
    else:
        _, compile_s = _timed(lambda: run(drafter))
    # The first execution also pays one-time runtime set-up (measured at about 3x a
    # steady run), so the figures shown are medians of later, steady runs of the same
    # programs; with --compare plain decoding is compiled and warmed once too, then the
    # timed runs alternate speculative, plain, speculative, ...
    fns = [lambda: run(drafter)]
    if args.compare:
        run(None)  # compiles and warms plain decoding
        fns.append(lambda: run(None))
    runs, last = _median_interleaved(fns, args.repeats)
    result, seconds = last[0], statistics.median(runs[0])
    rows = result.to_lists()
    from_draft = np.asarray(result.from_draft)
    total = int(np.sum(np.asarray(result.lengths)))
    summary = {
        "drafter": args.drafter,
        "gamma": args.gamma if args.drafter != "none" else 0,
        "tokens": total,
        "seconds": seconds,
        "tokens_per_second": total / seconds,
        "compile_seconds": compile_s,
        "repeats": args.repeats,
        "speculative_seconds_runs": runs[0],
        "acceptance_rate": float(result.stats.acceptance_rate),
        "tokens_per_target_call": float(result.tokens_per_call),
        "target_calls": int(result.stats.target_calls),
    }
    if args.compare:
        plain, plain_s = last[1], statistics.median(runs[1])
        plain_total = int(np.sum(np.asarray(plain.lengths)))
        summary["plain_seconds"] = plain_s
        summary["plain_seconds_runs"] = runs[1]
        summary["plain_tokens_per_second"] = plain_total / plain_s
        summary["speedup"] = summary["tokens_per_second"] / summary["plain_tokens_per_second"]
        if args.temperature == 0:
            summary["greedy_outputs_equal"] = plain.to_lists() == rows

    texts = []
    for row in rows:
        shown = row[:-1] if (row and row[-1] in stop) else row
        texts.append(tokenizer.decode(shown, skip_special_tokens=False))
    if args.json:
        summary.update(prompt=prompt_text, completions=texts, token_ids=rows)
        print(json.dumps(summary, indent=2))
        return 0

    if not stream:
        for b, row in enumerate(rows):
            shown = row[:-1] if (row and row[-1] in stop) else row
            if args.batch > 1:
                print(f"--- sample {b}")
            rendered = _TextStream(tokenizer, (), color)
            body = rendered.feed(shown, from_draft[b, : len(shown)].tolist())
            print(shown_prompt + body + rendered.text()[len(rendered.printed) :])
    if args.repeats == 1:
        timing = "1 timed run"
    else:
        timing = f"median of {args.repeats}{' interleaved' if args.compare else ''} runs"
    line = (
        f"[{args.drafter}] {total} tokens in {seconds:.2f} s = "
        f"{summary['tokens_per_second']:.1f} tokens/s ({timing}; "
        f"first run incl. compile {compile_s:.1f} s)"
    )
    if args.drafter != "none":
        line += (
            f" | acceptance {summary['acceptance_rate']:.2f}"
            f" | {summary['tokens_per_target_call']:.2f} tokens/target call"
        )
    if args.compare:
        line += (
            f" | plain {summary['plain_tokens_per_second']:.1f} tokens/s"
            f" | speedup {summary['speedup']:.2f}x"
        )
        if "greedy_outputs_equal" in summary:
            line += f" | greedy outputs equal: {summary['greedy_outputs_equal']}"
    if color:
        line += f"  ({GREEN}green{RESET} = accepted draft tokens)"
    print(line, file=sys.stderr)
    return 0


# ----------------------------------------------------------------------------
# train / distill


def _read_corpus(paths) -> list[str]:
    docs = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise UserError(f"{p}: no such file or directory")
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary files in a folder are skipped, not fatal
            if text:
                docs.append(text)
    if not docs:
        raise UserError(f"no UTF-8 text found in {' '.join(map(str, paths))}")
    return docs


SIZES = {
    # name: (hidden, layers, heads, kv heads, intermediate)
    "tiny": (64, 2, 4, 2, 128),
    "draft": (128, 2, 4, 2, 384),
    "target": (384, 8, 6, 2, 1024),
}

# The family the train/distill commands build; the output check compares against it.
_TRAINED_MODEL_TYPE = "llama"
# Where the commands keep training checkpoints, inside --out; the final export
# carries this folder over instead of deleting it, so --resume keeps working.
_CHECKPOINTS = "checkpoints"


def _check_flag(flag, check, value, **bounds):
    """``check`` (a :mod:`specjax.validation` helper) with the error naming ``flag``."""
    try:
        return check(flag, value, **bounds)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None


def _check_train_args(args, distill: bool) -> None:
    """Option checks that need nothing but the command line."""
    from specjax.validation import check_float, check_int

    for flag, lo in (("--steps", 1), ("--batch-size", 1), ("--seq-len", 1),
                     ("--checkpoint-every", 0)):  # fmt: skip
        _check_flag(flag, check_int, getattr(args, flag[2:].replace("-", "_")), lo=lo)
    _check_flag("--seed", check_int, args.seed)
    if not distill:
        _check_flag("--vocab-size", check_int, args.vocab_size, lo=257)
    _check_flag("--lr", check_float, args.lr, lo=0.0, lo_open=True)
    if args.max_minutes is not None:
        _check_flag("--max-minutes", check_float, args.max_minutes, lo=0.0)
    if args.resume and args.overwrite:
        raise UserError(
            "--resume continues the run in --out and --overwrite discards it; pass one of them"
        )


def _check_out(args) -> Path:
    """Refuses, before any training, an --out that the final save would refuse or harm."""
    from specjax.io.hf import check_save_target
    from specjax.train import list_checkpoints

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; pass a folder to hold the model")
    try:
        check_save_target(out, _TRAINED_MODEL_TYPE, overwrite=True)  # root / cwd guard
    except ValueError as e:
        raise UserError(f"--out: {e}") from None
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        if not args.resume:
            what = "a model" if (out / "config.json").exists() else "files"
            raise UserError(
                f"--out {out} already holds {what}; pass --overwrite to replace it, "
                "or --resume to continue its training"
            )
        try:
            check_save_target(out, _TRAINED_MODEL_TYPE, keep=(_CHECKPOINTS,))
        except ValueError as e:
            raise UserError(f"--out {out} is not the output of a training run: {e}") from None
        if not list_checkpoints(out / _CHECKPOINTS):
            raise UserError(
                f"--resume: --out {out} has no training checkpoints to continue from; "
                "pass --overwrite to train a new model in their place"
            )
    _check_writable(out)
    return out


def _check_writable(out: Path) -> None:
    """A read-only folder or a full disk fails here, not after the training."""
    parent = out if out.is_dir() else out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=parent).cleanup()
    except OSError as e:
        raise UserError(f"--out {out}: cannot write in {parent}: {e.strerror or e}") from None


def _check_resumed_tokenizer(args, out, tokenizer) -> None:
    from tokenizers import Tokenizer

    from specjax.train import list_checkpoints

    ckpts = list_checkpoints(out / _CHECKPOINTS) if args.resume else []
    saved = ckpts[-1] / "tokenizer.json" if ckpts else None
    if saved is None or not saved.is_file():
        return
    try:
        previous = Tokenizer.from_file(str(saved)).to_str()
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise UserError(f"--resume: {saved} cannot be read: {e}") from None
    if previous != tokenizer.to_str():
        raise UserError(
            f"--resume: the tokenizer differs from the one of {ckpts[-1]}; resume with the "
            "same data, --vocab-size and --target, or pass --overwrite to start over"
        )


def _train_in_out(args, out: Path, run):
    """``run(checkpoint_dir, resume)`` with --out's checkpoint folder; errors as UserError."""
    import shutil

    checkpoints = out / _CHECKPOINTS
    if args.overwrite and checkpoints.exists():
        # --overwrite discards the old run; its checkpoints must not be resumed
        # into this one. The old model itself stays until the new one replaces it.
        shutil.rmtree(checkpoints)
    try:
        return run(checkpoints, args.resume)
    except FloatingPointError as e:
        raise UserError(f"{e} (--lr {args.lr})") from None
    except ValueError as e:  # training refuses before its first step, e.g. a changed config
        raise UserError(str(e)) from None


def _train_common(args, out, teacher=None):

    import numpy as np

    from specjax import tokenizer as tok_lib
    from specjax.data import tokenize_documents
    from specjax.io.hf import save_pretrained
    from specjax.models import Model, ModelConfig
    from specjax.train import TrainConfig, train

    docs = _read_corpus(args.data)
    if teacher is not None:
        tokenizer = teacher.tokenizer
        if tokenizer is None:
            raise UserError(f"--target {args.target} has no tokenizer.json")
        # The draft shares the teacher's logits one for one (padded vocabularies
        # included), which distillation and speculative decoding both need.
        vocab_size = teacher.vocab_size
        if tokenizer.get_vocab_size() > vocab_size:
            raise UserError(
                f"--target {args.target}: its tokenizer has {tokenizer.get_vocab_size()} "
                f"tokens but the model only {vocab_size} logits (another vocabulary)"
            )
        if tokenizer.token_to_id(tok_lib.EOS_TOKEN) is None:
            raise UserError(
                f"--target {args.target}: its tokenizer has no {tok_lib.EOS_TOKEN} token, "
                "which separates the documents of the corpus"
            )
    else:
        tokenizer = tok_lib.train_tokenizer(docs, vocab_size=args.vocab_size)
        vocab_size = tokenizer.get_vocab_size()
    _check_resumed_tokenizer(args, out, tokenizer)
    tokens = tokenize_documents(tokenizer, docs)
    if len(tokens) <= args.seq_len:
        raise UserError(f"corpus has {len(tokens)} tokens, need more than --seq-len {args.seq_len}")
    hidden, layers, heads, kv, inter = SIZES[args.size]
    config = ModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        tie_word_embeddings=True,
        max_position_embeddings=max(args.seq_len, 512),
        eos_token_id=tok_lib.eos_id(tokenizer),
    )
    model = Model.random(config, seed=args.seed).replace(tokenizer=tokenizer)
    try:
        cfg = TrainConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            learning_rate=args.lr,
            warmup_steps=min(100, args.steps // 10),
            seed=args.seed,
            max_minutes=args.max_minutes,
            checkpoint_every=args.checkpoint_every,
        )
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    result = _train_in_out(
        args, out, lambda checkpoint_dir, resume: train(
            model, np.asarray(tokens), cfg, teacher=teacher,
            checkpoint_dir=checkpoint_dir, resume=resume,
        ),
    )  # fmt: skip
    try:
        save_pretrained(
            result.model.replace(tokenizer=tokenizer), out,
            overwrite=args.overwrite, keep=(_CHECKPOINTS,),
        )  # fmt: skip
    except ValueError as e:  # --out changed while training
        raise UserError(f"--out {out}: {e}") from None
    print(
        f"saved {out} after {result.steps} steps; final loss {result.losses[-1]:.3f}; "
        f"{result.tokens_per_second:.0f} tokens/s",
        file=sys.stderr,
    )
    return 0


def cmd_train(args) -> int:
    _check_train_args(args, distill=False)
    out = _check_out(args)
    return _train_common(args, out)


def cmd_distill(args) -> int:
    _check_train_args(args, distill=True)
    out = _check_out(args)
    teacher = _load_folder(args.target, "--target")
    if args.seq_len > teacher.config.max_position_embeddings:
        raise UserError(
            f"--seq-len {args.seq_len} is beyond the --target model's context "
            f"({teacher.config.max_position_embeddings})"
        )
    return _train_common(args, out, teacher=teacher)


def cmd_train_drafter(args) -> int:
    """Trains a BlockDrafter for --target (default: the bundled target) on text files."""

    import jax
    import numpy as np

    from specjax.block_drafter import CONFIG_FILE, BlockDrafter, save_block_drafter
    from specjax.data import tokenize_documents
    from specjax.pretrained import default_pair
    from specjax.train import BlockTrainConfig, list_checkpoints, train_block_drafter
    from specjax.validation import check_int

    _check_train_args(args, distill=True)
    for flag in ("--layers", "--features", "--anchors"):
        _check_flag(flag, check_int, getattr(args, flag[2:]), lo=1)
    _check_flag("--block-size", check_int, args.block_size, lo=2)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; pass a folder to hold the drafter")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        if not args.resume:
            what = "a block drafter" if (out / CONFIG_FILE).exists() else "files"
            raise UserError(
                f"--out {out} already holds {what}; pass --overwrite to replace it, "
                "or --resume to continue its training"
            )
        if not list_checkpoints(out / _CHECKPOINTS):
            raise UserError(f"--resume: --out {out} has no training checkpoints to continue from")
    _check_writable(out)

    if args.target:
        target = _load_folder(args.target, "--target")
    else:
        target = default_pair()[0]
    if target.tokenizer is None:
        raise UserError(f"--target {args.target} has no tokenizer.json")
    if args.seq_len > target.config.max_position_embeddings:
        raise UserError(
            f"--seq-len {args.seq_len} is beyond the target's context "
            f"({target.config.max_position_embeddings})"
        )
    tokens = tokenize_documents(target.tokenizer, _read_corpus(args.data))
    if len(tokens) <= args.seq_len:
        raise UserError(f"corpus has {len(tokens)} tokens, need more than --seq-len {args.seq_len}")
    try:
        drafter = BlockDrafter.random(
            target, key=jax.random.key(args.seed), num_draft=min(7, args.block_size - 1),
            num_layers=args.layers, num_features=args.features, block_size=args.block_size,
        )  # fmt: skip
        config = BlockTrainConfig(
            steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
            learning_rate=args.lr, warmup_steps=min(100, args.steps // 10), seed=args.seed,
            max_minutes=args.max_minutes, checkpoint_every=args.checkpoint_every,
            num_anchors=args.anchors, decay=args.block_size / 2,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    result = _train_in_out(
        args, out, lambda checkpoint_dir, resume: train_block_drafter(
            drafter, np.asarray(tokens), config, checkpoint_dir=checkpoint_dir, resume=resume
        ),
    )  # fmt: skip
    save_block_drafter(result.model, out, overwrite=True, keep=(_CHECKPOINTS,))
    print(
        f"saved {out} after {result.steps} steps; final loss {result.losses[-1]:.3f}; "
        f"{result.tokens_per_second:.0f} tokens/s; use it with specjax generate "
        f"--model TARGET --drafter block --block-drafter {out}",
        file=sys.stderr,
    )
    return 0


# ----------------------------------------------------------------------------


class _OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other user error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="specjax",
        description="Exact speculative decoding in JAX. Runs offline on a bundled code model pair.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser(
        "generate",
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
        help="target model: a Hugging Face folder or a GGUF file (specjax[gguf]); default: bundled",
    )
    g.add_argument("--draft", help="draft model folder for --drafter model (with --model)")
    g.add_argument(
        "--drafter", default="auto", metavar="{auto,block,eagle,model,lookup,none,PATH}",
        help="who drafts: the block drafter (reads the target's hidden states), the bundled "
        "EAGLE-style head (eagle: reads them too, drafts step by step), the draft "
        "model, prompt lookup (n-gram copy), none (plain decoding), or the path of a block "
        "drafter folder (the same as --drafter block --block-drafter PATH); auto (default): "
        f"the fastest measured for the bundled pair ({FASTEST_BUNDLED_DRAFTER})",
    )  # fmt: skip
    g.add_argument(
        "--block-mode", choices=["argmax", "sample"], default="sample",
        help="block drafter: argmax drafts with a one-hot q, or sampled drafts with their "
        "true q (default; the same drafts at temperature 0)",
    )  # fmt: skip
    g.add_argument(
        "--block-drafter", metavar="PATH",
        help="block drafter folder for --drafter block with --model (specjax train-drafter)",
    )  # fmt: skip
    g.add_argument(
        "--gamma", type=int, default=None,
        help="tokens drafted per target call (γ); default: 4, or the block drafter's own (2)",
    )  # fmt: skip
    g.add_argument(
        "--tree", default=None, metavar="K1,K2,...",
        help="draft a tree instead of a chain: K1 children at the root, K2 under each of "
        "those, ... (e.g. 3,2,2,1; --drafter block or model); its depth is γ",
    )  # fmt: skip
    g.add_argument(
        "--ngram", type=int, default=3, help="longest n-gram matched by --drafter lookup"
    )
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (1 = off)")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p × max prob")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate")
    g.add_argument("--seed", type=int, default=0, help="PRNG seed (same seed, same output)")
    g.add_argument("--batch", type=int, default=1, help="generate this many samples at once")
    g.add_argument(
        "--no-eos", action="store_true",
        help="do not stop at <|endoftext|> (with --chat: at the end of the turn)",
    )  # fmt: skip
    g.add_argument(
        "--compare", action="store_true",
        help="also time plain decoding, interleaved with the speculative runs; print the speedup "
        "(ratio of the median speeds)",
    )  # fmt: skip
    g.add_argument(
        "--repeats", type=int, default=5, metavar="N",
        help="timed runs after a warm-up run; the speed shown is their median, with or "
        "without --compare (with it, N runs of each, alternating speculative, plain, ...) "
        "(default 5)",
    )  # fmt: skip
    g.add_argument("--json", action="store_true", help="print machine-readable JSON")
    g.add_argument("--no-color", action="store_true", help="do not colour accepted draft tokens")
    g.add_argument(
        "--no-stream", action="store_true", help="print the completion at the end, not as it grows"
    )
    _add_cache_flag(g)
    g.set_defaults(func=cmd_generate)

    for name, helptext in [
        ("train", "train a model (and a byte-level BPE tokenizer) on text files"),
        ("distill", "distil a draft model from a --target model on text files"),
    ]:
        t = sub.add_parser(name, help=helptext, description=helptext)
        t.add_argument("data", nargs="+", help="text files or folders (read recursively)")
        t.add_argument("--out", required=True, help="output folder (Hugging Face format)")
        if name == "distill":
            t.add_argument("--target", required=True, help="teacher model folder")
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
    d.add_argument("--target", help="target model folder (default: the bundled target)")
    d.add_argument("--layers", type=int, default=2, help="draft layers (1-5)")
    d.add_argument("--features", type=int, default=3, help="target layers fused")
    d.add_argument("--block-size", type=int, default=8, help="largest block (γ+1) trained")
    d.add_argument("--anchors", type=int, default=32, help="blocks per training sequence")
    _add_run_flags(d, steps=2000, batch_size=8, lr=2e-3)
    d.set_defaults(func=cmd_train_drafter)
    return parser


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
    from specjax import compilation_cache

    if args.no_compilation_cache:
        compilation_cache.disable()
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


if __name__ == "__main__":
    sys.exit(main())
