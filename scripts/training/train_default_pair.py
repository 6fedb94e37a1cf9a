#!/usr/bin/env python
"""Reproduces specjax's bundled default target/draft pair from fixed seeds.

Pipeline (every stage deterministic for a fixed Python version and step count):

1. A 4096-token byte-level BPE on the standard library's ``.py`` files.
2. ``target/``: a ~14M-parameter Llama trained on the stream (cross-entropy).
3. ``draft_data/``: a ~0.9M-parameter Llama trained on the data (cross-entropy).
4. ``draft/``: the distilled draft, initialised from ``draft_data`` (``--distill-init
   scratch``: random weights), trained with forward KL(p_target || q_draft) at
   temperature 1 against the exported target: the distillation steps, each of which
   runs the target, go to matching it rather than to learning the language.

Outputs, each a Hugging Face folder in bfloat16 with ``tokenizer.json``::

    OUT/target/  OUT/draft/  OUT/draft_data/  OUT/tokenizer.json  OUT/report.json

Float32 checkpoints with optimizer state live in ``OUT/_work/``; ``--resume`` continues
every unfinished stage from them bit-identically and skips finished ones (delete
``OUT/_work/draft*`` to redo a later stage). A stage that runs out of its time budget
stops with a final checkpoint and continues with ``--resume`` and a new budget.

Examples::

    python scripts/training/train_default_pair.py --quick --out /tmp/pair      # seconds
    python scripts/training/train_default_pair.py --out runs/default_pair \\
        --target-minutes 42 --draft-data-minutes 9 --draft-minutes 17
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax import training as train
from specjax.io import load_pretrained, save_pretrained
from specjax.models import Model, ModelConfig
from specjax.training import data
from specjax.training import tokenizer as tokenizer_lib

EXPORT_DTYPE = jnp.bfloat16


def model_configs(args, vocab_size: int, eos: int) -> tuple[ModelConfig, ModelConfig]:
    common = dict(
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        max_position_embeddings=args.max_positions or args.seq_len,
        eos_token_id=eos,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )
    target = ModelConfig(
        hidden_size=args.target_hidden,
        num_layers=args.target_layers,
        num_heads=args.target_heads,
        num_kv_heads=args.target_kv_heads,
        intermediate_size=args.target_intermediate,
        **common,
    )
    draft = ModelConfig(
        hidden_size=args.draft_hidden,
        num_layers=args.draft_layers,
        num_heads=args.draft_heads,
        num_kv_heads=args.draft_kv_heads,
        intermediate_size=args.draft_intermediate,
        **common,
    )
    return target, draft


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/default_pair", help="output folder")
    p.add_argument("--quick", action="store_true", help="tiny models and corpus; seconds")
    p.add_argument("--resume", action="store_true", help="continue from OUT/_work checkpoints")
    p.add_argument("--no-progress", action="store_true", help="hide the tqdm bars")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=512, help="training context = max positions")
    p.add_argument("--max-positions", type=int, default=None, help="default: --seq-len")
    p.add_argument("--heldout-fraction", type=float, default=0.02)
    p.add_argument(
        "--corpus",
        choices=("stdlib", "code"),
        default="stdlib",
        help="stdlib: the standard library; code: it plus installed packages' .py files "
        "(training only; the held-out split is the standard library's either way)",
    )
    p.add_argument(
        "--site-fraction", type=float, default=0.25, help="share of site-packages files (code)"
    )
    p.add_argument(
        "--tokenizer", help="reuse this tokenizer.json instead of training one (keeps ids)"
    )
    p.add_argument("--target-init", help="warm-start the target from this HF folder")
    p.add_argument("--draft-data-init", help="warm-start the data-only draft from this folder")
    p.add_argument("--draft-init", help="warm-start the distilled draft from this folder")
    # Sizes.
    p.add_argument("--target-hidden", type=int, default=384)
    p.add_argument("--target-layers", type=int, default=8)
    p.add_argument("--target-heads", type=int, default=6)
    p.add_argument("--target-kv-heads", type=int, default=2)
    p.add_argument("--target-intermediate", type=int, default=1024)
    p.add_argument("--draft-hidden", type=int, default=128)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-heads", type=int, default=4)
    p.add_argument("--draft-kv-heads", type=int, default=2)
    p.add_argument("--draft-intermediate", type=int, default=384)
    # Schedules. Step counts fix the cosine schedules (and so the result); the
    # minutes are a safety budget (a stopped stage continues with --resume and
    # a new budget). Defaults fit the budgets on an otherwise idle 2-core CPU.
    p.add_argument("--target-steps", type=int, default=1200)
    p.add_argument("--target-batch", type=int, default=4)
    p.add_argument("--target-lr", type=float, default=1.5e-3)
    p.add_argument("--target-minutes", type=float, default=42.0)
    p.add_argument("--draft-data-steps", type=int, default=600)
    p.add_argument("--draft-data-batch", type=int, default=16)
    p.add_argument("--draft-data-lr", type=float, default=3e-3)
    p.add_argument("--draft-data-minutes", type=float, default=9.0)
    p.add_argument("--draft-steps", type=int, default=1700)
    p.add_argument("--draft-batch", type=int, default=4)
    p.add_argument(
        "--draft-lr", type=float, default=None, help="default 1e-3 (data), 3e-3 (scratch)"
    )
    p.add_argument("--draft-minutes", type=float, default=17.0)
    p.add_argument("--distill-init", choices=("data", "scratch"), default="data")
    p.add_argument("--kl-weight", type=float, default=1.0)
    p.add_argument("--tvd-weight", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows to score")
    p.add_argument("--skip-draft-data-export", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        for name, value in dict(
            vocab_size=512,
            seq_len=64,
            target_hidden=64,
            target_layers=2,
            target_heads=4,
            target_kv_heads=2,
            target_intermediate=128,
            draft_hidden=32,
            draft_layers=1,
            draft_heads=2,
            draft_kv_heads=1,
            draft_intermediate=64,
            target_steps=30,
            draft_data_steps=30,
            draft_steps=30,
            target_batch=4,
            draft_data_batch=4,
            draft_batch=4,
            warmup_steps=5,
            checkpoint_every=10,
            eval_windows=8,
        ).items():
            setattr(args, name, value)
    if args.draft_lr is None:
        args.draft_lr = 1e-3 if args.distill_init == "data" else 3e-3
    return args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def export(model: Model, path: Path) -> int:
    """Saves ``model`` in bf16 as an HF folder; returns its size in bytes."""
    save_pretrained(train.cast_params(model, EXPORT_DTYPE), path)
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def installed_packages() -> list[str]:
    """``name==version`` of every installed distribution (what the site corpus held)."""
    from importlib import metadata

    return sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()})


def warm_start(path, config: ModelConfig, tok) -> Model | None:
    """The float32 model saved at ``path`` to continue training from, or ``None``.

    Its architecture must be ``config``'s (only the positions limit may differ)
    and its tokenizer ``tok``'s: a warm start with other ids would train on noise.
    """
    if not path:
        return None
    model = load_pretrained(path, dtype=jnp.float32)
    mine = dataclasses.replace(model.config, max_position_embeddings=1, eos_token_id=None)
    wanted = dataclasses.replace(config, max_position_embeddings=1, eos_token_id=None)
    if mine != wanted:
        raise ValueError(f"--*-init {path}: its config {model.config} is not {config}")
    if model.tokenizer is None or model.tokenizer.get_vocab() != tok.get_vocab():
        raise ValueError(f"--*-init {path}: its tokenizer differs from the pair's")
    log(f"warm start from {path}")
    return model.replace(config=config, tokenizer=tok)


def run_stage(name, model, tokens, config, work, *, resume, teacher=None):
    t0 = time.time()
    log(f"{name}: {model.config.num_params() / 1e6:.2f}M params, {config.steps} steps")
    result = train.train(
        model, tokens, config, teacher=teacher, checkpoint_dir=work / name, resume=resume
    )
    minutes = (time.time() - t0) / 60
    log(
        f"{name}: {result.steps} steps in {minutes:.1f} min, {result.tokens_per_second:,.0f} "
        f"tok/s, final loss {result.losses[-1]:.4f}"
        + (" (time budget reached)" if result.stopped_early else "")
    )
    stats = dict(
        params=model.config.num_params(),
        steps=result.steps,
        planned_steps=config.steps,
        resumed_from=result.start_step,
        stopped_early=result.stopped_early,
        minutes=round(minutes, 2),
        tokens_per_second=round(result.tokens_per_second, 1),
        tokens_seen=result.steps * config.batch_size * config.seq_len,
        final_train_loss=result.losses[-1],
        train_config=dataclasses.asdict(config),
    )
    stats_path = work / f"{name}.json"
    if result.start_step == result.steps and stats_path.exists():
        # Nothing ran in this call (finished stage, --resume): keep the timings
        # of the call that did the training.
        previous = json.loads(stats_path.read_text())
        stats.update({k: previous[k] for k in ("minutes", "tokens_per_second") if k in previous})
    stats_path.write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return result.model, stats


@jax.jit
def _divergence(student, teacher, windows_BT):
    return train.distill_losses(
        train.forward(student, windows_BT), train.forward(teacher, windows_BT)
    )


def divergence(student, teacher, heldout, seq_len, max_windows, batch=8):
    windows = data.eval_windows(heldout, seq_len, max_windows)[:, :-1]
    sums = {"kl": 0.0, "tvd": 0.0}
    for i in range(0, len(windows), batch):
        chunk = windows[i : i + batch]
        d = _divergence(student, teacher, jnp.asarray(chunk))
        for k in sums:
            sums[k] += float(d[k]) * len(chunk)
    return {k: v / len(windows) for k, v in sums.items()}


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    work = out / "_work"
    if not args.resume:  # a fresh run: checkpoints of an earlier one must not be resumed
        for stage in ("target", "draft_data", "draft"):
            shutil.rmtree(work / stage, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    progress = not args.no_progress
    max_docs = 60 if args.quick else None
    log(f"jax {jax.__version__} on {jax.default_backend()}, Python {platform.python_version()}")

    # 1. Tokenizer and token streams. Reused on --resume: the checkpoints
    # depend on them.
    tok_path = out / "tokenizer.json"
    corpus_kw = dict(heldout_fraction=args.heldout_fraction, max_documents=max_docs)
    if args.resume and tok_path.exists():
        tok = tokenizer_lib.load_tokenizer(tok_path)
        log(f"tokenizer: reused {tok_path}")
    else:
        for stale in work.glob("*.npy"):
            stale.unlink()
        if args.tokenizer:
            tok = tokenizer_lib.load_tokenizer(args.tokenizer)
            log(f"tokenizer: {args.tokenizer} (V={tok.get_vocab_size()})")
        else:
            docs = data.stdlib_documents("train", **corpus_kw)
            log(f"tokenizer: training V={args.vocab_size} on {len(docs)} stdlib files")
            tok = tokenizer_lib.train_tokenizer(docs, args.vocab_size)
        tokenizer_lib.save_tokenizer(tok, tok_path)
    train_tokens = data.load_token_stream(tok, "train", cache_path=work / "train.npy", **corpus_kw)
    heldout = data.load_token_stream(tok, "heldout", cache_path=work / "heldout.npy", **corpus_kw)
    corpus_source = "Python standard library .py files (sysconfig stdlib, no site-packages)"
    if args.corpus == "code":
        site_path = work / "site.npy"
        if site_path.exists():
            site_tokens = np.load(site_path, allow_pickle=False)
        else:
            site_docs = data.site_packages_documents(
                fraction=args.site_fraction,
                exclude=data.stdlib_documents("heldout", **corpus_kw),
            )
            if args.quick:
                site_docs = site_docs[:max_docs]
            site_tokens = data.tokenize_documents(tok, site_docs)
            np.save(site_path, site_tokens, allow_pickle=False)
        log(f"corpus: {len(site_tokens):,} site-packages tokens")
        train_tokens = np.concatenate([train_tokens, site_tokens])
        corpus_source = (
            "Python standard library .py files (training split) plus "
            f"{args.site_fraction:.0%} of the installed site-packages' .py files by path hash "
            "(files equal to a held-out stdlib file excluded); held out: the stdlib split"
        )
    if args.quick:  # tiny corpora have tiny held-out splits
        heldout = train_tokens[-4096:] if len(heldout) <= args.seq_len else heldout
    log(f"corpus: {len(train_tokens):,} train tokens, {len(heldout):,} held-out tokens")

    vocab = tok.get_vocab_size()
    target_cfg, draft_cfg = model_configs(args, vocab, tokenizer_lib.eos_id(tok))
    common = dict(
        seq_len=args.seq_len,
        warmup_steps=args.warmup_steps,
        checkpoint_every=args.checkpoint_every,
        progress=progress,
    )
    report = dict(
        python=platform.python_version(),
        jax=jax.__version__,
        backend=jax.default_backend(),
        corpus=dict(
            source=corpus_source,
            packages=installed_packages() if args.corpus == "code" else None,
            train_tokens=len(train_tokens),
            heldout_tokens=len(heldout),
            vocab_size=vocab,
        ),
        args=vars(args),
        models={},
    )

    def evaluate(model):
        return train.evaluate(
            model, heldout, seq_len=args.seq_len, max_windows=args.eval_windows, batch_size=8
        )

    # 2. Target.
    target_config = train.TrainConfig(
        steps=args.target_steps,
        batch_size=args.target_batch,
        learning_rate=args.target_lr,
        max_minutes=args.target_minutes,
        seed=0,
        **common,
    )
    target0 = warm_start(args.target_init, target_cfg, tok) or Model.random(
        target_cfg, seed=0
    ).replace(tokenizer=tok)
    target, stats = run_stage(
        "target", target0, train_tokens, target_config, work, resume=args.resume
    )
    stats["bytes"] = export(target, out / "target")
    # The teacher is the model as shipped: bf16 weights, computed in float32.
    target = load_pretrained(out / "target", dtype=jnp.float32)
    stats["heldout_loss"] = evaluate(target)
    report["models"]["target"] = stats
    log(f"target: held-out loss {stats['heldout_loss']:.4f}")

    # 3. Data-only draft.
    draft_data_config = train.TrainConfig(
        steps=args.draft_data_steps,
        batch_size=args.draft_data_batch,
        learning_rate=args.draft_data_lr,
        max_minutes=args.draft_data_minutes,
        seed=1,
        **common,
    )
    draft0 = warm_start(args.draft_data_init, draft_cfg, tok) or Model.random(
        draft_cfg, seed=1
    ).replace(tokenizer=tok)
    draft_data, stats = run_stage(
        "draft_data", draft0, train_tokens, draft_data_config, work, resume=args.resume
    )
    if not args.skip_draft_data_export:
        stats["bytes"] = export(draft_data, out / "draft_data")
    stats["heldout_loss"] = evaluate(draft_data)
    stats["vs_target"] = divergence(draft_data, target, heldout, args.seq_len, args.eval_windows)
    report["models"]["draft_data"] = stats

    # 4. Distilled draft.
    draft_config = train.TrainConfig(
        steps=args.draft_steps,
        batch_size=args.draft_batch,
        learning_rate=args.draft_lr,
        max_minutes=args.draft_minutes,
        seed=2,
        kl_weight=args.kl_weight,
        tvd_weight=args.tvd_weight,
        ce_weight=0.0,
        **common,
    )
    init = draft_data if args.distill_init == "data" else draft0
    init = warm_start(args.draft_init, draft_cfg, tok) or init
    draft, stats = run_stage(
        "draft", init, train_tokens, draft_config, work, resume=args.resume, teacher=target
    )
    stats["init"] = args.distill_init
    stats["bytes"] = export(draft, out / "draft")
    stats["heldout_loss"] = evaluate(draft)
    stats["vs_target"] = divergence(draft, target, heldout, args.seq_len, args.eval_windows)
    report["models"]["draft"] = stats

    for name in ("draft_data", "draft"):
        v = report["models"][name]["vs_target"]
        # 1 - TV(p, q) is the probability that speculative sampling at
        # temperature 1 accepts one drafted token.
        log(
            f"{name}: held-out loss {report['models'][name]['heldout_loss']:.4f}, "
            f"KL(target||draft) {v['kl']:.4f}, token acceptance 1-TV {1 - v['tvd']:.3f}"
        )
    bundled = sum(report["models"][n].get("bytes", 0) for n in ("target", "draft", "draft_data"))
    report["bundled_megabytes"] = round(bundled / 1e6, 2)
    report["total_minutes"] = round((time.time() - t_start) / 60, 2)
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    log(f"done in {report['total_minutes']} min; exported {bundled / 1e6:.1f} MB to {out}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
