"""Trains an EAGLE-3-style head (`specjax.EagleDrafter`) for the bundled target.

    python scripts/training/train_eagle.py                   # the shipped head, about 20 min
    python scripts/training/train_eagle.py --quick --out /tmp/eagle  # CI smoke test, ~1 min

The data are those the bundled block drafter was trained on (`train_block_drafter.py`):
the stdlib corpus in the target's tokenizer mixed half and half with continuations the
target generated from corpus prompts (rows alternating greedy and temperature 1). When
that script's work folder (``--block-work``) holds its cached corpus and continuations
they are reused as they are; otherwise they are rebuilt the same way.

Stages (each logged with its time; the training shows a progress bar):

1. the data, as above;
2. `specjax.training.train_drafter` (EAGLE-3's training-time test, ``--ttt-steps`` steps
   unrolled, weights 0.8^i) with a time budget and resumable checkpoints in ``--work``;
3. the head is saved in bfloat16 to ``--out`` and loaded back, and that loaded head
   is evaluated on held-out prompts: tokens per target call and acceptance, greedy
   and at T=1, next to a random head and the bundled block drafter; all of it, with
   the loss curve, goes to ``<out>/train_report.json`` (``--eval-only`` redoes this
   stage for the head already in ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import training as train
from specjax.drafters.eagle import EagleDrafter
from specjax.io import drafter_weights
from specjax.io.pretrained import default_drafter
from specjax.training import data
from specjax.training.target_data import (
    evaluate_drafter,
    generate_continuations,
    heldout_prompts,
    mix_streams,
    train_logged,
)

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "specjax/assets/default/eagle_drafter"))
    p.add_argument("--work", default=str(ROOT / "runs/_work_eagle"), help="checkpoints, data")
    p.add_argument(
        "--block-work",
        default=str(ROOT / "runs/block_drafter/_work_block_drafter"),
        help="train_block_drafter.py's work folder: its cached data are reused if present",
    )
    p.add_argument("--quick", action="store_true", help="tiny budget; about a minute")
    p.add_argument("--resume", action="store_true")
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="re-evaluate the head in --out and rewrite its report's evaluation",
    )
    p.add_argument("--num-draft", type=int, default=4, help="γ saved with the head")
    p.add_argument("--ttt-steps", type=int, default=4)
    p.add_argument("--steps", type=int, default=360)
    p.add_argument("--minutes", type=float, default=14.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--generated-tokens", type=int, default=200_000)
    p.add_argument("--generated-fraction", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-gammas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def training_stream(args, target, tok, work: Path):
    """``(stream, heldout, description)``: the block drafter's data mix, reused or rebuilt."""
    max_docs = 60 if args.quick else None
    corpus_kw = dict(heldout_fraction=0.02, max_documents=max_docs)
    reuse = Path(args.block_work)
    cached = not args.quick and all(
        (reuse / f).is_file() for f in ("train.npy", "heldout.npy", "generated.npy")
    )
    source = reuse if cached else work
    corpus = data.load_token_stream(tok, "train", cache_path=source / "train.npy", **corpus_kw)
    heldout = data.load_token_stream(tok, "heldout", cache_path=source / "heldout.npy", **corpus_kw)
    if args.quick and len(heldout) <= 256:
        heldout = corpus[-4096:]
    if cached:
        generated = np.load(reuse / "generated.npy", allow_pickle=False)
        log(f"data: reused {reuse} (the bundled block drafter's training data)")
    else:
        t0 = time.time()
        n_gen = 1_000 if args.quick else args.generated_tokens
        generated = generate_continuations(
            target,
            corpus,
            n_gen,
            seed=args.seed,
            batch=8 if args.quick else 32,
            new=32 if args.quick else 96,
            log=log,
        )
        log(f"generated continuations: {len(generated):,} tokens in {time.time() - t0:.0f} s")
    stream, reps = mix_streams(corpus, generated, args.generated_fraction)
    what = dict(
        source=str(reuse) if cached else "rebuilt",
        corpus_tokens=int(len(corpus)),
        generated_tokens=int(len(generated)),
        generated_repeats=reps,
        stream_tokens=int(len(stream)),
    )
    log(f"training stream: {what}")
    return stream, heldout, corpus_kw, what


def evaluate(target, drafters, prompts, *, gammas, new):
    """Tokens per target call and acceptance of each drafter, T=0 and T=1."""
    report = {}
    for name, (drafter, temps, gs) in drafters.items():
        report |= evaluate_drafter(
            target,
            drafter,
            prompts,
            gammas=gs if gs else gammas,
            temperatures=temps,
            new=new,
            name=name,
            log=log,
        )
    return report


def evaluate_head(args, target, shipped, random_head, prompts):
    """The report's evaluation: the shipped head (argmax drafts; at T=1 also sampled
    drafts), a random head and the bundled block drafter."""
    gammas = (2,) if args.quick else tuple(args.eval_gammas)
    both = (0.0,) if args.quick else (0.0, 1.0)
    compare = (2,) if args.quick else (4,)
    drafters = {"eagle": (shipped, both, gammas), "random_head": (random_head, (0.0,), compare)}
    if not args.quick:
        drafters["eagle_sample"] = (shipped.with_draft(mode="sample"), (1.0,), gammas)
        drafters["block_drafter"] = (default_drafter("block"), (0.0, 1.0), compare)
    return evaluate(target, drafters, prompts, gammas=gammas, new=16 if args.quick else 64)


def main(argv=None):
    args = parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    if not (args.resume or args.eval_only):
        shutil.rmtree(work / "train", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    target, _, tok = specjax.default_pair()
    log(f"jax {jax.__version__} on {jax.default_backend()}; bundled target")
    stream, heldout, corpus_kw, data_report = training_stream(args, target, tok, work)
    prompts = heldout_prompts(target, heldout, chat=False, corpus_kw=corpus_kw)

    drafter = EagleDrafter.random(target, key=jax.random.key(args.seed), num_draft=args.num_draft)
    if args.eval_only:
        t0 = time.time()
        report = json.loads((out / "train_report.json").read_text())
        report["evaluation"] = evaluate_head(
            args, target, drafter_weights.load(EagleDrafter, out, target), drafter, prompts
        )
        report["eval_minutes"] = round((time.time() - t0) / 60, 2)
        (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
        log(f"re-evaluated {out}")
        return
    n_params = sum(x.size for x in jax.tree.leaves(drafter.params))
    config = train.EagleTrainConfig(
        steps=12 if args.quick else args.steps,
        batch_size=2 if args.quick else args.batch,
        seq_len=64 if args.quick else args.seq_len,
        learning_rate=args.lr,
        warmup_steps=3 if args.quick else max(1, min(30, args.steps // 10)),
        weight_decay=0.01,
        ttt_steps=args.ttt_steps,
        checkpoint_every=100,
        max_minutes=args.minutes,
        log_every=5,
        progress=not args.no_progress,
        seed=args.seed,
    )
    log(
        f"head: {n_params / 1e6:.2f}M params, target layers {drafter.target_layers}, "
        f"{config.steps} steps of {config.batch_size}×{config.seq_len}, TTT {config.ttt_steps} "
        f"steps, budget {args.minutes} min"
    )
    result, minutes = train_logged(drafter, stream, config, work=work, resume=args.resume, log=log)

    # The shipped head is the bf16 file: evaluate what a user loads.
    drafter_weights.save(
        result.model.with_draft(args.num_draft), out, overwrite=True, dtype=jnp.bfloat16
    )
    shipped = drafter_weights.load(EagleDrafter, out, target)
    t0 = time.time()
    evaluation = evaluate_head(args, target, shipped, drafter, prompts)
    losses = np.asarray(result.losses)
    chunk = max(1, len(losses) // 20)
    report = dict(
        params=int(n_params),
        target_layers=list(drafter.target_layers),
        steps=result.steps,
        stopped_early=result.stopped_early,
        train_minutes=round(minutes, 2),
        tokens_per_second=round(result.tokens_per_second, 1),
        final_train_loss=float(losses[-1]),
        loss_curve=dict(
            every=chunk,
            mean_loss=[
                round(float(losses[i : i + chunk].mean()), 4) for i in range(0, len(losses), chunk)
            ],
        ),
        data=data_report,
        train_config=dataclasses.asdict(config),
        evaluation_prompts=f"{len(prompts)} held-out corpus windows of {len(prompts[0])} tokens",
        evaluation=evaluation,
        eval_minutes=round((time.time() - t0) / 60, 2),
        total_minutes=round((time.time() - t_start) / 60, 2),
    )
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"saved {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
