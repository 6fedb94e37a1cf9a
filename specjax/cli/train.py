"""``specjax train``, ``distill`` and ``train-drafter``: train on text files into --out."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from specjax.cli.common import UserError, check_flag, load_folder


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


# The ModelConfig fields that --size sets, in the order of SIZES' tuples.
_SIZE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
SIZES = {
    "tiny": (64, 2, 4, 2, 128),
    "draft": (128, 2, 4, 2, 384),
    "target": (384, 8, 6, 2, 1024),
}


# The family the train/distill commands build; the output check compares against it.
_TRAINED_MODEL_TYPE = "llama"


# Where the commands keep training checkpoints, inside --out; the final export
# carries this folder over instead of deleting it, so --resume keeps working.
_CHECKPOINTS = "checkpoints"


def _check_train_args(args, distill: bool) -> None:
    """Option checks that need nothing but the command line."""
    from specjax.core.validation import check_float, check_int

    for flag, lo in (
        ("--steps", 1),
        ("--batch-size", 1),
        ("--seq-len", 1),
        ("--checkpoint-every", 0),
    ):
        check_flag(flag, check_int, getattr(args, flag[2:].replace("-", "_")), lo=lo)
    check_flag("--seed", check_int, args.seed)
    if not distill:
        check_flag("--vocab-size", check_int, args.vocab_size, lo=257)
    check_flag("--lr", check_float, args.lr, lo=0.0, lo_open=True)
    if args.max_minutes is not None:
        check_flag("--max-minutes", check_float, args.max_minutes, lo=0.0)
    if args.resume and args.overwrite:
        raise UserError(
            "--resume continues the run in --out and --overwrite discards it; pass one of them"
        )


def _check_out(args) -> Path:
    """Refuses, before any training, an --out that the final save would refuse or harm."""
    from specjax.io.hf import check_save_target
    from specjax.training import list_checkpoints

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

    from specjax.training import list_checkpoints

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
            "same data, --vocab-size and --model, or pass --overwrite to start over"
        )


def _train_in_out(args, out: Path, train_fn, model, tokens, config, **kwargs):
    """``train_fn(model, tokens, config, **kwargs)`` keeping its checkpoints in --out (and
    resuming them with --resume); errors as UserError."""
    import shutil

    import numpy as np

    checkpoints = out / _CHECKPOINTS
    if args.overwrite and checkpoints.exists():
        # --overwrite discards the old run; its checkpoints must not be resumed
        # into this one. The old model itself stays until the new one replaces it.
        shutil.rmtree(checkpoints)
    try:
        return train_fn(
            model,
            np.asarray(tokens),
            config,
            checkpoint_dir=checkpoints,
            resume=args.resume,
            **kwargs,
        )
    except FloatingPointError as e:
        raise UserError(f"{e} (--lr {args.lr})") from None
    except ValueError as e:  # training refuses before its first step, e.g. a changed config
        raise UserError(str(e)) from None


def _run_options(args) -> dict:
    """The `TrainConfig` fields every training command takes from its options."""
    return dict(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        learning_rate=args.lr,
        warmup_steps=min(100, args.steps // 10),
        seed=args.seed,
        max_minutes=args.max_minutes,
        checkpoint_every=args.checkpoint_every,
    )


def _train_common(args, out, teacher=None):
    from specjax.io.hf import save_pretrained
    from specjax.models import Model, ModelConfig
    from specjax.training import TrainConfig, train
    from specjax.training import tokenizer as tok_lib
    from specjax.training.data import tokenize_documents

    docs = _read_corpus(args.data)
    if teacher is not None:
        tokenizer = teacher.tokenizer
        if tokenizer is None:
            raise UserError(f"--model {args.target} has no tokenizer.json")
        # The draft shares the teacher's logits one for one (padded vocabularies
        # included), which distillation and speculative decoding both need.
        vocab_size = teacher.vocab_size
        if tokenizer.get_vocab_size() > vocab_size:
            raise UserError(
                f"--model {args.target}: its tokenizer has {tokenizer.get_vocab_size()} "
                f"tokens but the model only {vocab_size} logits (another vocabulary)"
            )
        if tokenizer.token_to_id(tok_lib.EOS_TOKEN) is None:
            raise UserError(
                f"--model {args.target}: its tokenizer has no {tok_lib.EOS_TOKEN} token, "
                "which separates the documents of the corpus"
            )
    else:
        tokenizer = tok_lib.train_tokenizer(docs, vocab_size=args.vocab_size)
        vocab_size = tokenizer.get_vocab_size()
    _check_resumed_tokenizer(args, out, tokenizer)
    tokens = tokenize_documents(tokenizer, docs)
    if len(tokens) <= args.seq_len:
        raise UserError(f"corpus has {len(tokens)} tokens, need more than --seq-len {args.seq_len}")
    config = ModelConfig(
        vocab_size=vocab_size,
        **dict(zip(_SIZE_FIELDS, SIZES[args.size], strict=True)),
        tie_word_embeddings=True,
        max_position_embeddings=max(args.seq_len, 512),
        eos_token_id=tok_lib.eos_id(tokenizer),
    )
    model = Model.random(config, seed=args.seed).replace(tokenizer=tokenizer)
    try:
        cfg = TrainConfig(**_run_options(args))
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    result = _train_in_out(args, out, train, model, tokens, cfg, teacher=teacher)
    try:
        save_pretrained(
            result.model.replace(tokenizer=tokenizer),
            out,
            overwrite=args.overwrite,
            keep=(_CHECKPOINTS,),
        )
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
    teacher = load_folder(args.target, "--model")
    if args.seq_len > teacher.config.max_position_embeddings:
        raise UserError(
            f"--seq-len {args.seq_len} is beyond the --model's context "
            f"({teacher.config.max_position_embeddings})"
        )
    return _train_common(args, out, teacher=teacher)


def cmd_train_drafter(args) -> int:
    """Trains a BlockDrafter for --model (default: the bundled target) on text files."""

    import jax

    from specjax.core.validation import check_int
    from specjax.drafters.block import BlockDrafter
    from specjax.io import drafter_weights
    from specjax.io.pretrained import default_pair
    from specjax.training import BlockTrainConfig, list_checkpoints, train_drafter
    from specjax.training.data import tokenize_documents

    _check_train_args(args, distill=True)
    for flag in ("--layers", "--features", "--anchors"):
        check_flag(flag, check_int, getattr(args, flag[2:]), lo=1)
    check_flag("--block-size", check_int, args.block_size, lo=2)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; pass a folder to hold the drafter")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        if not args.resume:
            saved = (out / drafter_weights.config_file(BlockDrafter)).exists()
            what = "a block drafter" if saved else "files"
            raise UserError(
                f"--out {out} already holds {what}; pass --overwrite to replace it, "
                "or --resume to continue its training"
            )
        if not list_checkpoints(out / _CHECKPOINTS):
            raise UserError(f"--resume: --out {out} has no training checkpoints to continue from")
    _check_writable(out)

    if args.target:
        target = load_folder(args.target, "--model")
    else:
        target = default_pair()[0]
    if target.tokenizer is None:
        raise UserError(f"--model {args.target} has no tokenizer.json")
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
            target,
            key=jax.random.key(args.seed),
            num_draft=min(7, args.block_size - 1),
            num_layers=args.layers,
            num_features=args.features,
            block_size=args.block_size,
        )
        config = BlockTrainConfig(
            **_run_options(args),
            num_anchors=args.anchors,
            decay=args.block_size / 2,
        )
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    result = _train_in_out(args, out, train_drafter, drafter, tokens, config)
    drafter_weights.save(result.model, out, overwrite=True, keep=(_CHECKPOINTS,))
    print(
        f"saved {out} after {result.steps} steps; final loss {result.losses[-1]:.3f}; "
        f"{result.tokens_per_second:.0f} tokens/s; use it with specjax generate "
        f"--model TARGET --drafter block --block-drafter {out}",
        file=sys.stderr,
    )
    return 0
