"""What ``scripts/benchmarks/bench_e2e.py`` runs on: the models under test and the prompts,
with its log.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import specjax

# The checkout's prompts/ folder (scripts/benchmarks/harness/ is three levels below it): the
# benchmark runs from a checkout, and the prompt files are not package data.
PROMPTS_DIR = Path(__file__).resolve().parents[3] / "prompts"
PROMPTS_FILE = PROMPTS_DIR / "bench_prompts.json"  # the bundled pair's (code and prose)
REAL_PROMPTS_FILE = PROMPTS_DIR / "real_prompts.json"  # an instruct model's (chat, code-edit)
DEFAULT_BLOCK_GAMMA = 7  # the bundled drafter's block of 8


def log(msg: str) -> None:
    """Prints ``msg`` to stderr with the time: progress, apart from the tables on stdout."""
    print(f"[bench_e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Pair:
    """The models under test: a target, an optional draft model and a block drafter."""

    target: object
    draft: object | None  # None: no DraftModel rows and no assisted generation
    tokenizer: object
    target_dir: Path  # what transformers loads: a Hugging Face folder or a GGUF
    draft_dir: Path | None
    name: str
    real: bool = False  # a --target: the real-model targets apply
    block: object = None  # the BlockDrafter (at --block-gamma)
    block_source: str = ""  # where it came from


def gguf_file(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself, or the one in a folder without config.json.

    (``load_pretrained`` has already refused a folder holding several.)
    """
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf")
    return found[0] if len(found) == 1 else None


def model_name(path: Path) -> str:
    """The family and size a checkpoint path names: ``SmolLM2-135M`` for
    ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    An assistant model would have to be a smaller model of that family (sharing
    its tokenizer), whether the target is the instruct variant or not.
    """
    path = Path(path)
    gguf = gguf_file(path)
    stem = gguf.name[: -len(".gguf")] if gguf is not None else path.name
    stem = re.sub(r"[.-](I?Q\d\w*|BF16|F16|F32)$", "", stem, flags=re.IGNORECASE)
    return re.sub(r"-(instruct|chat|it)$", "", stem, flags=re.IGNORECASE)


def load_pair(args, tmp: Path) -> Pair:
    """The pair the arguments name: ``--target`` (and ``--draft``), the ``--quick`` random
    pair (saved under ``tmp`` for transformers to load), or the bundled pair; each with
    its block drafter (`load_block`).
    """
    if args.target:
        pair = load_target(args)
    elif args.quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0)
        draft = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0, num_layers=1)
        specjax.save_pretrained(target, tmp / "target")
        specjax.save_pretrained(draft, tmp / "draft")
        pair = Pair(
            target, draft, None, tmp / "target", tmp / "draft", "tiny random pair (--quick)"
        )
    else:
        from specjax.io.pretrained import default_pair_path

        target, draft, tokenizer = specjax.default_pair()
        root = default_pair_path()
        pair = Pair(
            target, draft, tokenizer, root / "target", root / "draft", "bundled default pair"
        )
    bundled = not (args.quick or args.target)
    pair.block, pair.block_source = load_block(args, pair.target, bundled, pair.real)
    return pair


def load_target(args) -> Pair:
    """``--target`` (a Hugging Face folder or a GGUF) and ``--draft`` if given, in float32."""
    # float32 like transformers' side: the greedy outputs are compared token for token.
    scan = getattr(args, "scan_layers", False)
    target = specjax.load_pretrained(args.target, dtype=jnp.float32, scan_layers=scan)
    draft = (
        specjax.load_pretrained(args.draft, dtype=jnp.float32, scan_layers=scan)
        if args.draft
        else None
    )
    name = f"target {args.target}, " + (f"draft {args.draft}" if args.draft else "no draft model")
    draft_dir = Path(args.draft) if args.draft else None
    return Pair(target, draft, target.tokenizer, Path(args.target), draft_dir, name, real=True)


def load_block(args, target, bundled: bool, real: bool):
    """``(BlockDrafter at --block-gamma, where it came from)``.

    ``--block-drafter`` if given; else the bundled drafter on the bundled pair; else
    (or if none is bundled yet) one with random weights: on a real target shaped like
    the drafter being trained for SmolLM2 (2 layers, blocks of 6), else 1 layer,
    blocks of 16.
    ``--block-gamma`` defaults to the largest γ the drafter takes, at most
    ``DEFAULT_BLOCK_GAMMA`` (``--gamma`` with ``--quick`` on a real target);
    ``--block-sweep`` left unset (``--quick`` on a real target) is that γ alone.
    """
    from specjax.drafters.block import BlockDrafter
    from specjax.io import drafter_weights

    drafter = None
    if args.block_drafter:
        drafter = drafter_weights.load(BlockDrafter, args.block_drafter, target)
        source = f"loaded from {args.block_drafter}"
    elif bundled:
        try:
            # Sharing the pair's target (not the copy default_drafter loads): the
            # drafter's embedding and LM head are then the same arrays as the target's.
            drafter = specjax.io.pretrained.default_drafter("block").replace(target=target)
            source = "bundled (specjax.io.pretrained.default_drafter('block'))"
        except FileNotFoundError as e:
            log(f"WARNING: {e}; the block rows use a drafter with RANDOM weights")
    if drafter is None:
        if target.config.num_layers < 2:
            raise SystemExit("the block drafter needs a target with at least 2 layers")
        layers, block_size = (2, 6) if real else (1, 16)
        drafter = BlockDrafter.random(
            target,
            key=jax.random.key(args.seed),
            num_draft=1,  # any: with_draft below sets --block-gamma
            num_layers=layers,
            block_size=block_size,
        )
        source = (
            f"random weights (BlockDrafter.random, {layers} layer(s), block size {block_size}; "
            "no trained drafter)"
        )
    if args.block_gamma is None:
        # --quick on a real target: prompt lookup's γ, so that both verify forwards
        # have one width (one program fewer to compile).
        cap = args.gamma if args.quick and real else DEFAULT_BLOCK_GAMMA
        args.block_gamma = min(cap, drafter.block_size - 1)
    gamma = args.block_gamma
    if not 1 <= gamma <= drafter.block_size - 1:
        raise SystemExit(
            f"--block-gamma {gamma}: this block drafter takes γ in [1, {drafter.block_size - 1}]"
        )
    if args.block_sweep is None:
        args.block_sweep = [gamma]
    too_long = [g for g in args.block_sweep if g > drafter.block_size - 1]
    if too_long:
        log(f"block sweep: dropping γ {too_long} (> block_size - 1 = {drafter.block_size - 1})")
        args.block_sweep = [g for g in args.block_sweep if g not in too_long]
    # At T=0 the two modes draft the same tokens (a greedy row's processed marginal is
    # one-hot); at T>0 "sample" verifies against the drafter's true marginals.
    drafter = drafter.with_draft(num_draft=gamma, mode=args.block_mode)
    source += (
        f"; block_size {drafter.block_size}, target layers {list(drafter.target_layers)}, "
        f"{drafter.config.num_layers} draft layer(s), mode {drafter.mode}"
    )
    return drafter, source


def prompts_file(args, pair: Pair) -> Path:
    """``--prompts``, else the chat prompt set for a target with a chat template."""
    if args.prompts is not None:
        return args.prompts
    instruct = pair.real and getattr(pair.target, "chat_template", None) is not None
    return REAL_PROMPTS_FILE if instruct else PROMPTS_FILE


def load_prompts(path: Path, limits: dict, per_workload: int | None = None):
    """The prompts of every workload of a prompt file (each of its lists, in order).

    Args:
        path: a JSON object whose list values are the workloads (lists of
            ``{"name", "text"}``); ``"render": "chat_template"`` says each text is a
            user message.
        limits: workload -> keep its first N prompts (a missing or ``None`` entry:
            ``per_workload``; ``None`` there too: all).
        per_workload: the default limit.

    Returns:
        ``(prompts, chat)``: dicts with ``name``, ``text`` and ``kind`` (the
        workload), and whether the texts are user messages.
    """
    spec = json.loads(Path(path).read_text())
    prompts = []
    for kind, items in spec.items():
        if isinstance(items, list):
            limit = limits.get(kind)
            limit = per_workload if limit is None else limit
            prompts += [dict(p, kind=kind) for p in items[:limit]]
    if not prompts:
        raise SystemExit(f"{path}: no prompts (a workload is a list of {{name, text}})")
    return prompts, spec.get("render") == "chat_template"


def encode_prompts(prompts: list[dict], model, tokenizer, prompt_tokens: int, chat: bool):
    """Token ids of every prompt, and how they were made.

    User messages (``chat``) are rendered with the target's chat template (no system
    message of ours, so the template's default one if it has one; generation prompt
    added) and kept whole: cutting the start would cut the template's markup. The
    prompts then differ in length, which specjax pads (one compiled program per
    prompt-width bucket, see `specjax.decoding.pad_prompts`).
    Text prompts are cut to one common length, their last ``L <= prompt_tokens``
    tokens: one length means one compiled program per system. Without a tokenizer (a
    random pair) the UTF-8 bytes are the ids.

    Returns:
        ``(ids, how)``: ``ids[i]`` a list of ints.
    """
    if chat and tokenizer is not None and getattr(model, "chat_template", None) is not None:
        encoded = [
            specjax.apply_chat_template(
                model,
                [{"role": "user", "content": p["text"]}],
                tokenize=True,
                add_generation_prompt=True,
            )
            for p in prompts
        ]
        return encoded, "user messages in the target's chat template, kept whole"
    if tokenizer is not None:
        encoded = [tokenizer.encode(p["text"], add_special_tokens=False).ids for p in prompts]
        how = "the target's tokenizer"
    else:
        if model.vocab_size < 256:
            raise SystemExit("a pair without a tokenizer needs vocab_size >= 256 (byte ids)")
        encoded = [list(p["text"].encode("utf-8")) for p in prompts]
        how = "UTF-8 bytes (the pair has no tokenizer)"
    if chat:  # messages but no template to render them with: the bare text, whole
        return encoded, f"{how}; user messages without a chat template, kept whole"
    length = min(prompt_tokens, *(len(e) for e in encoded))
    return [e[-length:] for e in encoded], f"{how}; the last {length} tokens of each"


def group_by_workload(prompts: list[dict], ids: list[list[int]]) -> dict[str, list[list[int]]]:
    """Workload -> its prompts' ids, in file order."""
    workloads = {}
    for p, row in zip(prompts, ids, strict=True):
        workloads.setdefault(p["kind"], []).append(row)
    return workloads


def describe_lengths(workloads: dict[str, list[list[int]]]) -> dict[str, dict]:
    """Workload -> number of prompts and their lengths (tokens)."""
    return {
        w: {"num_prompts": len(rows), "prompt_tokens": [len(r) for r in rows]}
        for w, rows in workloads.items()
    }
