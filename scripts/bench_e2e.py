"""End-to-end decoding benchmark: specjax against Hugging Face transformers on the same weights.

On one target (and optionally a draft model), the same prompts and the same number
of new tokens, at temperature 0 and 1, it measures:

  * specjax: plain ``generate``, ``speculative_generate`` with the draft model
    (``DraftModel``, only with a draft), with prompt lookup (``PromptLookup``) and
    with the block drafter (``BlockDrafter``: one forward on the target's hidden
    states drafts ``--block-gamma`` tokens), at batch 1 and at a large batch
    (``--large-batch``, default 16);
  * transformers (PyTorch, CPU, float32, same weights loaded from the same
    Hugging Face folders or GGUF file, token ids in, no tokenizer): plain
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
(``specjax.default_drafter("block")``) on the bundled pair, else (``--quick``, other
targets, or no bundled drafter yet) one with random weights; the config says which.

EOS never stops a row, so every system generates exactly ``--max-new-tokens``.
Before any timing is reported, the greedy outputs of every system are checked
equal token for token; on any difference the script names the system, prompt
and position with the two tokens' logit gap, and exits with status 1.
``--tie-tol`` tolerates (and reports) transformers mismatches at near-ties; the
specjax systems must always agree exactly.

Times are medians over ``--repeats`` passes over all prompts, after a separate
first pass: for specjax, compile time = first pass - median; for transformers
(no compilation) the first pass is reported next to the median. The predicted
speedup of speculative decoding comes from the measured acceptance probability α
and the measured costs of one draft proposal and one verification, as in
``scripts/bench_decode.py`` (see ``specjax.benchmarking``). The performance targets
are the bundled pair's (``TARGETS``) for the bundled and the ``--quick`` random
pair, and issue #14's real-model targets (``REAL_TARGETS``) for any ``--target``.

    python scripts/bench_e2e.py --out docs/bench_e2e            # bundled pair
    python scripts/bench_e2e.py --target T --draft D --out DIR   # Hugging Face folders
    python scripts/bench_e2e.py --quick --out /tmp/e2e           # tiny random pair, seconds
    python scripts/bench_e2e.py --block-drafter DIR --out DIR    # another block drafter

A real model without a draft (there is no smaller SmolLM2 to draft for the 135M
model, so no assisted generation either), with its trained block drafter:

    python scripts/bench_e2e.py --target /path/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --block-drafter BLOCK_DRAFTER_DIR --large-batch 8 --out docs/bench_e2e_smollm2
    python scripts/bench_e2e.py --quick --target /path/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out /tmp/e2e_smollm2   # minutes: 1 prompt per workload, 8 new tokens, batch 1 and 2

``--target`` takes a Hugging Face folder, a ``.gguf`` file or a folder holding one;
``specjax.io.fetch.smollm2_gguf()`` fetches SmolLM2-135M-Instruct's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.benchmarking import (
    Timing,
    alpha_from_hist,
    draft_cost,
    expected_tokens_per_step,
    forward_costs,
    interleaved_cost,
    peak_matmul_flops,
    predicted_speedup,
    time_call,
)
from specjax.decoding import resolve_cache_len

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
PROMPTS_FILE = PROMPTS_DIR / "bench_prompts.json"  # the bundled pair's (code and prose)
REAL_PROMPTS_FILE = PROMPTS_DIR / "real_prompts.json"  # an instruct model's (chat, code-edit)


class Target(NamedTuple):
    """A performance target: ``value >= threshold`` (``value <= threshold`` if ``at_most``)."""

    key: str
    what: str
    threshold: float
    at_most: bool = False


TARGETS = [
    Target(
        "spec_over_plain", "specjax speculative (draft) / specjax plain tok/s, T=0, batch 1", 2.0
    ),
    Target("realized_over_predicted", "realized / predicted speedup, same run", 0.85),
    Target(
        "spec_over_hf_assisted", "specjax speculative / transformers assisted tok/s, T=0, b=1", 3.0
    ),
    Target("large_over_b1", "specjax speculative total tok/s, batch 16 / batch 1, T=0", 8.0),
    # The block drafter's (issue's targets on the bundled pair, batch 1).
    Target("block_over_plain", "specjax block drafter / specjax plain tok/s, T=0, batch 1", 2.5),
    Target("block_over_plain_t1", "specjax block drafter / specjax plain tok/s, T=1, batch 1", 2.0),
    Target("block_tau", "block drafter tokens per target call (τ), block 8 (γ=7), T=0, b=1", 5.0),
    Target("block_realized_over_predicted", "block drafter realized / predicted, T=0, b=1", 0.9),
]

# Issue #14's targets for a real model (any --target), at batch 1, over all workloads.
# Each is reported for the fastest speculative method at its temperature ("best", the
# one a user would pick) and for each method on its own; "{m}" names the method.
REAL_TARGETS = [
    Target("over_plain", "specjax {m} / specjax plain tok/s, T=0, b=1", 2.0),
    Target("over_hf_plain", "specjax {m} / transformers plain tok/s, T=0, b=1", 4.0),
    Target("over_plain_t1", "specjax {m} / specjax plain tok/s, T=1, b=1", 1.6),
    Target("realized_over_predicted", "specjax {m}: realized / predicted speedup, T=0, b=1", 0.9),
]
# Verifying this many tokens (prompt lookup's γ=4, plus one) should cost little more
# than one decoding step: the premise of every speculative speedup above.
VERIFY_WIDTH = 5
VERIFY_TARGET = Target(
    "verify_over_step",
    f"specjax target forward of {VERIFY_WIDTH} tokens / of 1 token (a verify / a step), b=1",
    1.3,
    at_most=True,
)
SPECULATIVE = ("draft", "lookup", "block")
DEFAULT_BLOCK_GAMMA = 7  # the bundled drafter's block of 8
NO_ASSISTANT = (
    "Assisted generation needs an assistant model; there is none for {name}, so it is not measured."
)


def log(msg: str) -> None:
    print(f"[bench_e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# The greedy-equality check.


@dataclasses.dataclass
class Mismatch:
    """First token where ``system``'s greedy output for prompt ``prompt`` differs."""

    system: str
    row: int
    prompt: int
    position: int
    expected: int  # the reference token (-1: the reference ended here)
    got: int  # -1: the output ended here
    gaps: dict = dataclasses.field(default_factory=dict)  # framework -> logit[exp] - logit[got]

    def describe(self) -> str:
        gaps = ", ".join(f"{k} {v:+.3e}" for k, v in self.gaps.items()) or "n/a"
        return (
            f"{self.system}: row {self.row} (prompt {self.prompt}) differs at new token "
            f"{self.position}: expected {self.expected}, got {self.got}; "
            f"logit gap (expected - got): {gaps}"
        )


class GreedyMismatchError(RuntimeError):
    """Greedy outputs of two systems on the same weights differ."""

    def __init__(self, mismatches: list[Mismatch]):
        self.mismatches = mismatches
        lines = "\n  ".join(m.describe() for m in mismatches)
        super().__init__(
            f"greedy outputs differ from the reference in {len(mismatches)} row(s):\n  {lines}"
        )


def find_mismatches(reference: list[list[int]], outputs: dict[str, list[list[int]]]):
    """First differing position of every row of every system against ``reference``.

    Row ``r`` of a system is compared with ``reference[r % len(reference)]`` (a
    large batch cycles through the prompts).
    """
    found = []
    for system, rows in outputs.items():
        for r, row in enumerate(rows):
            i = r % len(reference)
            ref = list(reference[i])
            row = [int(t) for t in row]
            if row == ref:
                continue
            n = min(len(row), len(ref))
            pos = next((j for j in range(n) if row[j] != ref[j]), n)
            expected = ref[pos] if pos < len(ref) else -1
            got = row[pos] if pos < len(row) else -1
            found.append(Mismatch(system, r, i, pos, expected, got))
    return found


def check_greedy_outputs(
    reference: list[list[int]],
    outputs: dict[str, list[list[int]]],
    *,
    logit_gaps: Callable[[Mismatch], dict] | None = None,
    tie_tol: float = 0.0,
    strict=(),
) -> list[Mismatch]:
    """Checks every system's greedy output equals ``reference`` token for token.

    Args:
        reference: ``[num_prompts][N]`` the reference system's tokens.
        outputs: system name -> rows of tokens (row ``r`` is prompt ``r % num_prompts``).
        logit_gaps: optional ``mismatch -> {framework: logit[expected] - logit[got]}``
            at the first differing position, to tell a near-tie from a bug.
        tie_tol: a mismatch whose every logit gap is below this in absolute value
            is a near-tie flip of the argmax: it is returned (to be reported)
            instead of raised. 0 (the default) tolerates nothing.
        strict: names of systems whose mismatches are never tolerated, whatever
            their gaps (specjax's own systems: one framework's greedy decoders of
            the same weights must agree exactly, near-ties included).

    Returns:
        The tolerated near-tie mismatches (empty when all outputs are equal).

    Raises:
        GreedyMismatchError: listing every mismatch, if any is not a tolerated tie.
    """
    mismatches = find_mismatches(reference, outputs)
    for m in mismatches:
        if logit_gaps is not None and m.expected >= 0 and m.got >= 0:
            m.gaps = logit_gaps(m)

    def tolerated(m):
        if m.system in strict or not m.gaps:
            return False
        return max(abs(g) for g in m.gaps.values()) < tie_tol

    if any(not tolerated(m) for m in mismatches):
        raise GreedyMismatchError(mismatches)
    return mismatches


# ----------------------------------------------------------------------------
# Pair, prompts, machine.


@dataclasses.dataclass
class Pair:
    """The models under test: a target, an optional draft model and a block drafter."""

    target: object
    draft: object | None  # None: no DraftModel rows and no assisted generation
    tokenizer: object
    target_dir: Path  # what transformers loads: a Hugging Face folder or a GGUF
    draft_dir: Path | None
    name: str
    real: bool = False  # a --target: issue #14's real-model targets apply
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
        from specjax.pretrained import default_pair_path

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
    target = specjax.load_pretrained(args.target, dtype=jnp.float32)
    draft = specjax.load_pretrained(args.draft, dtype=jnp.float32) if args.draft else None
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
    from specjax.block_drafter import BlockDrafter, load_block_drafter

    drafter = None
    if args.block_drafter:
        drafter = load_block_drafter(args.block_drafter, target)
        source = f"loaded from {args.block_drafter}"
    elif bundled:
        try:
            # Sharing the pair's target (not the copy default_drafter loads): the
            # drafter's embedding and LM head are then the same arrays as the target's.
            drafter = specjax.default_drafter("block").replace(target=target)
            source = "bundled (specjax.default_drafter('block'))"
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


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    import torch
    import transformers

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": jax.devices()[0].platform,
        "jax": jax.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


# ----------------------------------------------------------------------------
# Systems. A "pass" is one system decoding every prompt once.


@dataclasses.dataclass
class Outcome:
    """What one pass produced, summed over its calls."""

    tokens: list[list[int]]  # one row per prompt (batch 1) or per batch row
    target_calls: int  # per-row target forwards that emitted tokens, summed over rows
    steps: int  # decode-loop iterations (= target forwards), summed over calls
    drafted: int
    accepted: int
    hist: list[int] | None  # specjax: how often 0..γ drafts were accepted

    @property
    def num_tokens(self) -> int:
        return sum(len(r) for r in self.tokens)

    @staticmethod
    def merge(parts: list[Outcome]) -> Outcome:
        """The outcomes of several passes as one (rows in order, counts summed)."""
        hists = [p.hist for p in parts if p.hist is not None]
        return Outcome(
            tokens=[row for p in parts for row in p.tokens],
            target_calls=sum(p.target_calls for p in parts),
            steps=sum(p.steps for p in parts),
            drafted=sum(p.drafted for p in parts),
            accepted=sum(p.accepted for p in parts),
            hist=[int(h) for h in np.sum(hists, axis=0)] if hists else None,
        )


@dataclasses.dataclass(eq=False)
class System:
    framework: str  # "specjax" | "transformers"
    method: str  # "plain" | "draft" | "lookup" | "block"
    batch: int
    temperature: float
    gamma: int | None
    workload: str  # the prompt set it decodes ("all": several merged, see `merge`)
    run: Callable[[], object] | None  # one pass; returns raw outputs
    summarize: Callable[[object], Outcome] | None
    first_s: float | None = None
    outcome: Outcome | None = None
    timing: Timing | None = None

    @property
    def name(self) -> str:
        g = f" γ={self.gamma}" if self.gamma else ""
        return f"{self.framework} {self.method}{g} b={self.batch} T={self.temperature:g}"

    @property
    def label(self) -> str:
        """The name with the workload, for messages about one system's pass."""
        return self.name if self.workload == "all" else f"{self.name} [{self.workload}]"

    def first(self) -> Outcome:
        if self.outcome is None:
            self.first_s, raw = time_call(self.run)
            self.outcome = self.summarize(raw)
        return self.outcome

    def time(self, repeats: int) -> Timing:
        self.first()
        times = [time_call(self.run)[0] for _ in range(repeats)]
        self.timing = Timing(self.first_s, statistics.median(times), times)
        return self.timing

    @classmethod
    def merge(cls, parts: list[System]) -> System:
        """One system's passes over several workloads as one pass over all of them.

        Outcomes are summed, and so are the times of the k-th pass of every part: a
        pass of the merged system is one pass over every prompt, as for one workload.
        """
        first = parts[0]
        same = (first.framework, first.method, first.batch, first.temperature, first.gamma)
        merged = cls(*same, workload="all", run=None, summarize=None)
        merged.outcome = Outcome.merge([p.outcome for p in parts])
        merged.first_s = sum(p.first_s for p in parts)
        times = [sum(ts) for ts in zip(*(p.timing.times_s for p in parts), strict=True)]
        merged.timing = Timing(merged.first_s, statistics.median(times), times)
        return merged


def _summarize_specjax(results) -> Outcome:
    tokens = [row for r in results for row in r.to_lists()]
    stats = [jax.device_get(r.stats) for r in results]
    hist = np.sum([np.asarray(s.accepted_hist) for s in stats], axis=0)
    return Outcome(
        tokens=tokens,
        target_calls=int(sum(np.sum(s.row_target_calls) for s in stats)),
        steps=int(sum(s.target_calls for s in stats)),
        drafted=int(sum(np.sum(s.drafted) for s in stats)),
        accepted=int(sum(np.sum(s.accepted) for s in stats)),
        hist=[int(h) for h in hist] if hist.size else None,
    )


def batches_of(prompts: list, batch: int) -> list[list]:
    """The prompts in batches of ``batch`` rows, cycling through them to fill the last.

    Row ``r`` of the concatenated batches is prompt ``r % len(prompts)``.
    """
    rows = [prompts[i % len(prompts)] for i in range(-(-len(prompts) // batch) * batch)]
    return [rows[i : i + batch] for i in range(0, len(rows), batch)]


def specjax_system(pair, method, prompts, batch, temperature, gamma, args, workload) -> System:
    """specjax decoding ``prompts`` (one workload) with ``method``, one call per batch."""
    sampling = specjax.SamplingConfig(temperature=temperature)
    key = jax.random.key(args.seed)
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
    drafter = None
    if method == "draft":
        drafter = specjax.DraftModel(pair.draft, num_draft=gamma)
    elif method == "lookup":
        drafter = specjax.PromptLookup(ngram=args.ngram, num_draft=gamma)
    elif method == "block":
        drafter = pair.block.with_draft(num_draft=gamma)

    def one(k, rows):
        if method == "plain":
            return specjax.generate(k, pair.target, rows, **kw)
        return specjax.speculative_generate(k, pair.target, drafter, rows, **kw)

    batches = batches_of(prompts, batch)

    def run():
        return [one(jax.random.fold_in(key, i), rows) for i, rows in enumerate(batches)]

    return System("specjax", method, batch, temperature, gamma, workload, run, _summarize_specjax)


def hf_from_pretrained(path: Path):
    """transformers' float32 model of a Hugging Face folder or a GGUF (file or folder)."""
    import torch
    import transformers

    load = transformers.AutoModelForCausalLM.from_pretrained
    gguf = gguf_file(path)
    if gguf is not None:  # transformers dequantizes it, as specjax did
        return load(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    return load(path, dtype=torch.float32).eval()


class Transformers:
    """The same models in transformers (PyTorch, CPU, float32), from the same files.

    It counts target forwards (a forward pre-hook) and drafted candidates, which
    transformers does not expose: ``get_candidates`` of the two candidate
    generators used here is wrapped until :meth:`close`.
    """

    def __init__(self, pair: Pair, args):
        import transformers
        from transformers.generation import candidate_generator as cg

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.args = args
        self.target = hf_from_pretrained(pair.target_dir)
        self.draft = None if pair.draft_dir is None else hf_from_pretrained(pair.draft_dir)
        for m in (self.target, self.draft):
            if m is None:
                continue
            # Never stop on EOS (specjax runs with eos_id=None): every system
            # emits exactly max_new_tokens.
            m.generation_config.eos_token_id = None
            m.generation_config.pad_token_id = 0
        if self.draft is not None:
            # The assistant's settings are read from its own generation config: γ
            # drafts every step, constant schedule, no confidence cut-off.
            self.draft.generation_config.num_assistant_tokens = args.gamma
            self.draft.generation_config.num_assistant_tokens_schedule = "constant"
            self.draft.generation_config.assistant_confidence_threshold = 0.0
        self.target_calls = self.drafted = 0
        self._hook = self.target.register_forward_pre_hook(self._count_forward)
        self._patched = []
        for cls in (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator):
            original = cls.__dict__["get_candidates"]
            cls.get_candidates = self._counting(original)
            self._patched.append((cls, original))

    def _count_forward(self, module, inputs):
        self.target_calls += 1

    def _counting(self, original):
        def get_candidates(generator, input_ids, *args, **kwargs):
            out = original(generator, input_ids, *args, **kwargs)
            self.drafted += out[0].shape[1] - input_ids.shape[1]
            return out

        return get_candidates

    def close(self):
        self._hook.remove()
        for cls, original in self._patched:
            cls.get_candidates = original

    def generation_config(self, method: str, temperature: float, max_new_tokens: int):
        from transformers import GenerationConfig

        kw = dict(max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        if temperature > 0:
            kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if method == "lookup":
            g, n = self.args.gamma, self.args.ngram
            kw.update(prompt_lookup_num_tokens=g, max_matching_ngram_size=n)
        return GenerationConfig(**kw)

    def generate(self, ids, config, method: str):
        import torch

        extra = dict(assistant_model=self.draft) if method == "draft" else {}
        with torch.inference_mode():
            mask = torch.ones_like(ids)
            return self.target.generate(ids, attention_mask=mask, generation_config=config, **extra)

    def system(self, method: str, prompts, temperature: float, workload: str) -> System:
        """transformers decoding ``prompts`` (one workload) with ``method``, at batch 1."""
        import torch

        config = self.generation_config(method, temperature, self.args.max_new_tokens)
        inputs = [torch.tensor([p], dtype=torch.long) for p in prompts]

        def run():
            self.target_calls = self.drafted = 0
            out = []
            for i, ids in enumerate(inputs):
                torch.manual_seed(self.args.seed * 100_003 + i)
                out.append(self.generate(ids, config, method)[0, ids.shape[1] :])
            return out, self.target_calls, self.drafted

        def summarize(raw):
            out, calls, drafted = raw
            tokens = [o.tolist() for o in out]
            # Every target forward emits its accepted candidates plus one token.
            accepted = sum(len(t) for t in tokens) - calls if method != "plain" else 0
            return Outcome(tokens, calls, calls, drafted, accepted, None)

        gamma = None if method == "plain" else self.args.gamma
        return System("transformers", method, 1, temperature, gamma, workload, run, summarize)

    def probe_batch(self) -> dict:
        """What transformers does with a batch of 2 rows, for each assisted method run."""
        import torch

        ids = torch.zeros((2, 4), dtype=torch.long)
        found = {}
        for method in ("draft", "lookup") if self.draft is not None else ("lookup",):
            try:
                self.generate(ids, self.generation_config(method, 0.0, 2), method)
                found[method] = "ran"
            except ValueError as e:
                found[method] = f"ValueError: {e}"
        return found

    def last_logits(self, seq) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.target(torch.tensor([seq], dtype=torch.long)).logits[0, -1].numpy()

    def pick_threads(self, prompt, choice: str) -> tuple[int, dict]:
        """Sets torch's thread count: ``choice``, or with "auto" the faster of 1 and 2.

        On a shared 2-core machine two OpenMP threads that spin-wait for a busy
        core can make small decode steps many times slower than one thread, so
        "auto" times 16 greedy tokens with each and keeps the faster.
        """
        import torch

        if choice != "auto":
            torch.set_num_threads(int(choice))
            return int(choice), {}
        ids = torch.tensor([prompt], dtype=torch.long)
        config = self.generation_config("plain", 0.0, 16)
        ms = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            times = [time_call(self.generate, ids, config, "plain")[0] for _ in range(3)]
            ms[n] = statistics.median(times) / 16 * 1e3
        best = min(ms, key=ms.get)
        torch.set_num_threads(best)
        return best, ms


# ----------------------------------------------------------------------------
# Measurements.


def logit_gaps_fn(pair: Pair, hf: Transformers, prompts, reference):
    """``mismatch -> {framework: logit[expected] - logit[got]}`` from full forwards.

    Both frameworks score the prompt followed by the reference's tokens up to
    the mismatch, without a cache.
    """

    def gaps(m: Mismatch) -> dict:
        seq = prompts[m.prompt] + reference[m.prompt][: m.position]
        tokens = np.asarray([seq], np.int32)
        positions = np.arange(len(seq), dtype=np.int32)[None]
        cache = pair.target.init_cache(1, len(seq))
        ours = np.asarray(pair.target(tokens, positions, cache)[0][0, -1])
        theirs = hf.last_logits(seq)
        return {
            "specjax": float(ours[m.expected] - ours[m.got]),
            "transformers": float(theirs[m.expected] - theirs[m.got]),
        }

    return gaps


def measure_costs(pair, batch, context, gammas, lookup_gamma, args, block_gammas=()) -> dict:
    """Target forward costs for T=1, T=γ+1 and T=VERIFY_WIDTH, and each drafter's
    proposal cost (seconds).

    ``context`` is the mean prompt length + max_new_tokens // 2 (the mean context of
    a run). ``gammas`` are the draft model's (none without one), ``block_gammas`` the
    block drafter's. The block drafter's proposal cost includes its context update
    with the verified tokens' features (see ``specjax.benchmarking.draft_cost``);
    its verify forward, which also returns those features, is measured at
    ``--block-gamma`` only (as ``verify_features``, a diagnostic): it costs the same
    as the plain forward within noise, so the prediction uses the plain forward's
    cost at every γ.
    """
    sampling = specjax.SamplingConfig(temperature=0.0)
    widths = sorted(
        {1, VERIFY_WIDTH}
        | {g + 1 for g in gammas}
        | {lookup_gamma + 1}
        | {g + 1 for g in block_gammas}
    )
    # The decode loops allocate this many slots and attention reads all of them,
    # so the costs are measured against a cache of the same size.
    prompt_len = context - args.max_new_tokens // 2
    cache_len = resolve_cache_len(None, prompt_len, args.max_new_tokens, max(widths))
    kw = dict(repeats=args.cost_repeats, inner=args.cost_inner, cache_len=cache_len)
    costs = {"forward": forward_costs(pair.target, batch, context, widths, **kw), "draft": {}}
    for g in gammas:
        drafter = specjax.DraftModel(pair.draft, num_draft=g)
        costs["draft"][("draft", g)] = draft_cost(drafter, batch, context, sampling, **kw)
    drafter = specjax.PromptLookup(ngram=args.ngram, num_draft=lookup_gamma)
    costs["draft"][("lookup", lookup_gamma)] = draft_cost(drafter, batch, context, sampling, **kw)
    for g in block_gammas:
        drafter = pair.block.with_draft(num_draft=g)
        costs["draft"][("block", g)] = draft_cost(
            drafter, batch, context, sampling, target=pair.target, **kw
        )
    # Diagnostics, not part of the prediction: the main γ's proposal and
    # verification back to back in one loop, and the machine's matmul ceiling.
    costs["interleaved"] = {}
    if pair.draft is not None:
        drafter = specjax.DraftModel(pair.draft, num_draft=args.gamma)
        costs["interleaved"]["draft", args.gamma] = interleaved_cost(
            pair.target, drafter, batch, context, sampling, **kw
        )
    costs["verify_features"] = {}
    bg = args.block_gamma
    if bg in block_gammas:
        drafter = pair.block.with_draft(num_draft=bg)
        if not args.quick:  # a diagnostic; compiling it would be a fifth of --quick's extra
            costs["interleaved"]["block", bg] = interleaved_cost(
                pair.target, drafter, batch, context, sampling, **kw
            )
        layers = drafter.target_layers
        forward = forward_costs(pair.target, batch, context, [bg + 1], feature_layers=layers, **kw)
        costs["verify_features"]["block", bg] = forward[bg + 1]
    costs["peak_flops"] = peak_matmul_flops(256 if args.quick else 1024)
    config = getattr(pair.target, "config", None)
    costs["target_params"] = config.num_params() if config is not None else float("nan")
    return costs


def row_of(system: System, plain: System | None, costs: dict | None) -> dict:
    o, t = system.outcome, system.timing
    tok_s = o.num_tokens / t.median_s
    row = {
        "framework": system.framework,
        "method": system.method,
        "workload": system.workload,
        "batch": system.batch,
        "temperature": system.temperature,
        "gamma": system.gamma,
        "tokens": o.num_tokens,
        "tok_s": tok_s,
        "median_s": t.median_s,
        "first_s": t.first_s,
        "times_s": t.times_s,
        "compile_s": t.first_s - t.median_s if system.framework == "specjax" else None,
        "speedup": None,
        "acceptance_rate": o.accepted / o.drafted if o.drafted else None,
        "alpha": alpha_from_hist(o.hist) if o.hist else None,
        "tokens_per_call": o.num_tokens / max(o.target_calls, 1),
        "step_ms": t.median_s / max(o.steps, 1) * 1e3,
        "model_step_ms": None,
        "predicted_speedup": None,
        "realized_over_predicted": None,
    }
    if plain is not None and system is not plain:
        row["speedup"] = tok_s / (plain.outcome.num_tokens / plain.timing.median_s)
    if costs is not None:
        c1 = costs["forward"][1]
        if system.method == "plain":
            row["model_step_ms"] = c1 * 1e3
        else:
            g = system.gamma
            c_verify, c_draft = costs["forward"][g + 1], costs["draft"][(system.method, g)]
            row["model_step_ms"] = (c_verify + c_draft) * 1e3
            row["cost_step_ms"], row["cost_verify_ms"] = c1 * 1e3, c_verify * 1e3
            row["cost_draft_ms"] = c_draft * 1e3
            interleaved = costs.get("interleaved", {}).get((system.method, g))
            row["interleaved_ms"] = None if interleaved is None else interleaved * 1e3
            with_features = costs.get("verify_features", {}).get((system.method, g))
            if with_features is not None:
                row["cost_verify_features_ms"] = with_features * 1e3
            # Compute used by the verification forward: ≈ 2 FLOPs per parameter per token.
            flops = 2 * costs["target_params"] * system.batch * (g + 1)
            row["verify_gflops"] = flops / c_verify / 1e9
            row["peak_gflops"] = costs["peak_flops"] / 1e9
            if row["alpha"] is not None:
                pred = predicted_speedup(row["alpha"], g, c1, c_verify, c_draft)
                row["predicted_speedup"] = pred
                row["realized_over_predicted"] = row["speedup"] / pred
                row["expected_tokens_per_call"] = expected_tokens_per_step(row["alpha"], g)
    return row


def run_benchmark(args) -> dict:
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        pair = load_pair(args, Path(tmp))
        path = prompts_file(args, pair)
        limits = {"code": args.num_code, "prose": args.num_prose}
        spec, chat = load_prompts(path, limits, args.per_workload)
        ids, how = encode_prompts(spec, pair.target, pair.tokenizer, args.prompt_tokens, chat)
        workloads = group_by_workload(spec, ids)
        lengths = describe_lengths(workloads)
        log(f"{pair.name}: {len(ids)} prompts from {path.name} ({how}): {lengths}")
        assisted = None
        if pair.draft is None:
            assisted = NO_ASSISTANT.format(name=model_name(pair.target_dir))
            log(assisted)
        hf = Transformers(pair, args)
        try:
            threads, probe_ms = hf.pick_threads(ids[0], args.torch_threads)
            log(f"torch threads: {threads} (ms/token by thread count: {probe_ms or 'not probed'})")
            results = measure_all(args, pair, workloads, hf)
            batch_probe = hf.probe_batch()
        finally:
            hf.close()
    results["machine"] = dict(machine_info(), load_average_1m_start=load_start)
    results["config"] = {
        "pair": pair.name,
        "target_dir": str(pair.target_dir),
        "draft_dir": None if pair.draft_dir is None else str(pair.draft_dir),
        "real_model": pair.real,
        "assisted_generation": assisted,  # why it is not measured; None: it is
        "prompts_file": str(path),
        "num_prompts": len(ids),
        "workloads": lengths,
        "prompt_encoding": how,
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gamma,
        "ngram": args.ngram,
        "large_batch": args.large_batch,
        "repeats": args.repeats,
        "torch_threads": threads,
        "torch_thread_probe_ms_per_token": probe_ms,
        "sweep": list(args.sweep) if pair.draft is not None else [],
        "block_gamma": args.block_gamma,
        "block_sweep": list(args.block_sweep),
        "block_drafter": pair.block_source,
        "command": " ".join(["python", "scripts/bench_e2e.py", *sys.argv[1:]]),
    }
    results["hf_batch_probe"] = batch_probe
    if pair.real:
        results["targets"] = real_targets_of(results["rows"], results["forward_ms"]["1"])
    else:
        results["targets"] = targets_of(results["rows"], args.large_batch, results["block_sweep"])
    results["wall_s"] = time.perf_counter() - started
    return results


def build_systems(args, pair: Pair, workloads: dict, hf: Transformers):
    """Every system to run, one per workload: ``(main, sweep, block_sweep)``.

    ``main[framework, method, batch, T]``, ``sweep[γ]`` (the draft model's; empty
    without one) and ``block_sweep[γ]`` are each ``{workload: System}``; a sweep's
    entry at the main γ is the main system itself.
    """
    g, large, bg = args.gamma, args.large_batch, args.block_gamma
    methods = ["plain", "lookup", "block"]
    if pair.draft is not None:
        methods.insert(1, "draft")
    main = {}
    for t in (0.0, 1.0):
        for method in methods:
            gamma = {"plain": None, "block": bg}.get(method, g)
            main["specjax", method, 1, t] = {
                w: specjax_system(pair, method, prompts, 1, t, gamma, args, w)
                for w, prompts in workloads.items()
            }
            if method != "block":  # transformers has no block drafter
                main["transformers", method, 1, t] = {
                    w: hf.system(method, prompts, t, w) for w, prompts in workloads.items()
                }
            # --quick leaves out the block drafter's large batch: one more decode loop to
            # compile (~10 s) for a path no different here (tests/test_block_drafter.py
            # covers the drafter at batch > 1).
            if large > 1 and not (args.quick and method == "block"):
                main["specjax", method, large, t] = {
                    w: specjax_system(pair, method, prompts, large, t, gamma, args, w)
                    for w, prompts in workloads.items()
                }

    def sweep_of(method, gammas, main_gamma):
        return {
            gamma: main["specjax", method, 1, 0.0]
            if gamma == main_gamma
            else {
                w: specjax_system(pair, method, prompts, 1, 0.0, gamma, args, w)
                for w, prompts in workloads.items()
            }
            for gamma in gammas
        }

    sweep = sweep_of("draft", args.sweep, g) if pair.draft is not None else {}
    return main, sweep, sweep_of("block", args.block_sweep, bg)


def check_all_greedy(groups, reference, pair, hf, workloads, tie_tol) -> list[Mismatch]:
    """Every greedy system against ``reference`` (``{workload: System}``), workload by workload.

    specjax's systems must agree exactly; transformers' may differ at near-ties
    below ``tie_tol`` (reported). All mismatches are raised together.

    Returns:
        The tolerated near-ties.

    Raises:
        GreedyMismatchError: listing every mismatch, if any is not tolerated.
    """
    ties, failed = [], []
    for w, prompts in workloads.items():
        ref = reference[w].outcome.tokens
        others = [
            parts[w] for parts in groups if parts[w].temperature == 0.0 and parts is not reference
        ]
        try:
            ties += check_greedy_outputs(
                ref,
                {s.label: s.outcome.tokens for s in others},
                logit_gaps=logit_gaps_fn(pair, hf, prompts, ref),
                tie_tol=tie_tol,
                strict={s.label for s in others if s.framework == "specjax"},
            )
        except GreedyMismatchError as e:
            failed += e.mismatches
    if failed:
        raise GreedyMismatchError(failed)
    return ties


def measure_all(args, pair: Pair, workloads: dict, hf: Transformers) -> dict:
    """Runs every system: greedy correctness first, then timing, then step costs.

    Rows are per system over all workloads (``rows``, ``sweep``, ``block_sweep``),
    and per system and workload (``workload_rows``).
    """
    g, large, n, bg = args.gamma, args.large_batch, args.max_new_tokens, args.block_gamma
    main, sweep, block_sweep = build_systems(args, pair, workloads, hf)
    # One entry per distinct group: a sweep's main γ is a main system.
    groups = [*main.values(), *sweep.values(), *block_sweep.values()]
    groups = list({id(parts): parts for parts in groups}.values())
    systems = [s for parts in groups for s in parts.values()]

    # 1. Correctness first: one pass of every greedy system, compared with
    # specjax's plain greedy decoding before anything is timed.
    greedy = [s for s in systems if s.temperature == 0.0]
    for s in greedy:
        log(f"first pass: {s.label}")
        s.first()
    reference = main["specjax", "plain", 1, 0.0]
    for s in reference.values():
        if any(len(r) != n for r in s.outcome.tokens):
            raise RuntimeError(f"{s.label} did not generate {n} tokens per prompt")
    ties = check_all_greedy(groups, reference, pair, hf, workloads, args.tie_tol)
    for m in ties:
        log(f"WARNING near-tie tolerated (|gap| < {args.tie_tol}): {m.describe()}")
    log(f"greedy outputs of {len(greedy)} system passes agree token for token")

    # 2. Timing.
    for s in systems:
        log(f"{args.repeats} timed passes: {s.label}")
        s.time(args.repeats)

    # 3. Step costs for the predicted speedup, at context = mean prompt + n/2.
    log("measuring forward / draft costs")
    lengths = [len(p) for prompts in workloads.values() for p in prompts]
    context = round(statistics.mean(lengths)) + n // 2
    block_gammas = sorted({*args.block_sweep, bg})
    draft_gammas = sorted({*args.sweep, g}) if pair.draft is not None else []
    costs = {1: measure_costs(pair, 1, context, draft_gammas, g, args, block_gammas)}
    if large > 1:
        # --quick skips these (compiling them is most of a quick run).
        large_gammas = [g] if pair.draft is not None else []
        costs[large] = (
            None if args.quick else measure_costs(pair, large, context, large_gammas, g, args, [bg])
        )

    # Each system over all workloads: one pass of it is a pass over every prompt.
    merged = {id(parts): System.merge(list(parts.values())) for parts in groups}

    def whole(parts: dict) -> System:
        return merged[id(parts)]

    def row(parts: dict, workload: str | None = None) -> dict:
        """The row of a system over all workloads (or one), against its own plain."""
        s = next(iter(parts.values()))
        plain = main[s.framework, "plain", s.batch, s.temperature]
        cost = costs[s.batch] if s.framework == "specjax" else None
        if workload is None:
            return row_of(whole(parts), whole(plain), cost)
        return row_of(parts[workload], plain[workload], cost)

    return {
        "near_ties": [dataclasses.asdict(m) for m in ties],
        "greedy_checked": [whole(p).name for p in groups if whole(p).temperature == 0.0],
        "rows": [row(parts) for parts in main.values()],
        "workload_rows": [row(parts, w) for parts in main.values() for w in parts],
        "sweep": [row(parts) for parts in sweep.values()],
        "block_sweep": [row(parts) for parts in block_sweep.values()],
        "forward_ms": {
            str(b): {str(t): c * 1e3 for t, c in cost["forward"].items()}
            for b, cost in costs.items()
            if cost is not None
        },
        "context": context,
    }


def find_row(rows, framework, method, batch, temperature) -> dict | None:
    want = (framework, method, batch, temperature)
    keys = ("framework", "method", "batch", "temperature")
    return next((r for r in rows if tuple(r[k] for k in keys) == want), None)


def judge(target: Target, value, **extra) -> dict:
    """A target's result: ``met`` is None when nothing was measured."""
    met = None
    if value is not None:
        met = bool(value <= target.threshold if target.at_most else value >= target.threshold)
    return dict(
        target=target.key,
        what=target.what,
        threshold=target.threshold,
        at_most=target.at_most,
        value=value,
        met=met,
        **extra,
    )


def targets_of(rows, large, block_sweep=()) -> list[dict]:
    """The bundled pair's targets (`TARGETS`), at temperature 0 (and 1 for block).

    τ at block 8 comes from the block row or block-sweep row with γ = 7 (None if
    neither ran at γ = 7).
    """
    spec = find_row(rows, "specjax", "draft", 1, 0.0)
    hf = find_row(rows, "transformers", "draft", 1, 0.0)
    spec_large = find_row(rows, "specjax", "draft", large, 0.0) if large > 1 else None
    block = find_row(rows, "specjax", "block", 1, 0.0) or {}
    block_t1 = find_row(rows, "specjax", "block", 1, 1.0) or {}
    block8 = next((r for r in [block, *block_sweep] if r.get("gamma") == 7), {})
    measured = {
        "spec_over_plain": spec["speedup"],
        "realized_over_predicted": spec["realized_over_predicted"],
        "spec_over_hf_assisted": spec["tok_s"] / hf["tok_s"],
        "large_over_b1": spec_large["tok_s"] / spec["tok_s"] if spec_large else None,
        "block_over_plain": block.get("speedup"),
        "block_over_plain_t1": block_t1.get("speedup"),
        "block_tau": block8.get("tokens_per_call"),
        "block_realized_over_predicted": block.get("realized_over_predicted"),
    }
    out = []
    for target in TARGETS:
        if target.key == "large_over_b1":
            target = target._replace(what=target.what.replace("batch 16", f"batch {large}"))
        out.append(judge(target, measured[target.key]))
    return out


def real_targets_of(rows, forward_ms: dict) -> list[dict]:
    """Issue #14's real-model targets (`REAL_TARGETS`, `VERIFY_TARGET`), at batch 1.

    Each target of `REAL_TARGETS` is judged for the fastest speculative method at its
    temperature ("best") and for each method that ran; ``forward_ms`` is the batch-1
    target forward's cost by width (``{"1": ms, ...}``).
    """
    hf_plain = find_row(rows, "transformers", "plain", 1, 0.0)
    speculative = {}  # T -> [(label, row)], the best first
    for t in (0.0, 1.0):
        found = [r for m in SPECULATIVE if (r := find_row(rows, "specjax", m, 1, t))]
        labels = [f"{r['method']} γ={r['gamma']}" for r in found]
        pairs = list(zip(labels, found, strict=True))
        best = max(pairs, key=lambda p: p[1]["tok_s"], default=None)
        speculative[t] = ([(f"best ({best[0]})", best[1])] if best else []) + pairs
    measure = {
        "over_plain": lambda r: r["speedup"],
        "over_hf_plain": lambda r: r["tok_s"] / hf_plain["tok_s"] if hf_plain else None,
        "over_plain_t1": lambda r: r["speedup"],
        "realized_over_predicted": lambda r: r["realized_over_predicted"],
    }
    out = []
    for target in REAL_TARGETS:
        t = 1.0 if target.key.endswith("_t1") else 0.0
        for label, r in speculative[t]:
            method = "best" if label.startswith("best") else r["method"]
            one = target._replace(key=f"{target.key}:{method}", what=target.what.format(m=label))
            out.append(judge(one, measure[target.key](r), system=label))
    verify = forward_ms.get(str(VERIFY_WIDTH)), forward_ms.get("1")
    ratio = verify[0] / verify[1] if None not in verify else None
    out.append(judge(VERIFY_TARGET, ratio))
    return out


# ----------------------------------------------------------------------------
# Reporting.


def _fmt(value, spec="{:.2f}") -> str:
    if value is None:
        return "—"
    return spec.format(value)


def describe_workloads(workloads: dict) -> str:
    """``chat: 12 of 39–52 tokens; code-edit: ...`` from the config's ``workloads``."""
    parts = []
    for w, d in workloads.items():
        lo, hi = min(d["prompt_tokens"]), max(d["prompt_tokens"])
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        parts.append(f"{w}: {d['num_prompts']} of {span} tokens")
    return "; ".join(parts)


def header(results: dict) -> list[str]:
    """What ran, where, and the greedy check's verdict."""
    m, c = results["machine"], results["config"]
    drafts = "draft model and prompt lookup" if c["draft_dir"] else "prompt lookup"
    names = {"draft": "assisted generation", "lookup": "prompt lookup"}
    probe = "; ".join(f"{names[k]} -> {v}" for k, v in results["hf_batch_probe"].items())
    lines = [
        f"Models: {c['pair']}. {c['num_prompts']} prompts from {Path(c['prompts_file']).name} "
        f"({describe_workloads(c['workloads'])}; {c['prompt_encoding']}), "
        f"{c['max_new_tokens']} new tokens each, EOS disabled, γ={c['gamma']} ({drafts}), "
        f"prompt lookup n-gram {c['ngram']}, block drafter γ={c['block_gamma']} "
        f"(block size {c['block_gamma'] + 1}), medians of {c['repeats']} passes.",
        f"Block drafter: {c['block_drafter']}.",
        f"Machine: {m['cpu']}, {m['cores']} cores, 1-min load average "
        f"{m['load_average_1m_start']:.1f} at the start, {m['load_average_1m']:.1f} at the end; "
        f"jax {m['jax']} ({m['platform']}), torch {m['torch']} "
        f"({c['torch_threads']} thread(s)), transformers {m['transformers']}.",
        f"Command: `{c['command']}` ({results['wall_s'] / 60:.1f} min).",
        "",
        "Greedy outputs (T=0) of every system below agree token for token, workload by "
        f"workload ({len(results['near_ties'])} tolerated near-ties).",
        f"transformers with batch 2: {probe}. "
        "transformers has no block drafter: the block rows have no transformers counterpart.",
    ]
    if c.get("assisted_generation"):
        lines.append(c["assisted_generation"])
    return lines


def rows_table(rows) -> list[str]:
    """The main table: every system over all workloads."""
    lines = [
        "| system | method | batch | T | tok/s | speedup vs own plain | acceptance | "
        "tokens/call | predicted | realized/pred | ms/step | model ms/step | "
        "steady s | first pass s | compile s |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        method = r["method"] + (f" γ={r['gamma']}" if r["gamma"] else "")
        lines.append(
            f"| {r['framework']} | {method} | {r['batch']} | {r['temperature']:g} | "
            f"{r['tok_s']:.1f} | {_fmt(r['speedup'])} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{r['tokens_per_call']:.2f} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {r['step_ms']:.2f} | "
            f"{_fmt(r['model_step_ms'])} | {r['median_s']:.2f} | {r['first_s']:.2f} | "
            f"{_fmt(r['compile_s'], '{:.1f}')} |"
        )
    return lines


def workload_table(rows) -> list[str]:
    """Every system on each workload, against its own plain decoding of that workload."""
    lines = [
        "Per workload (speedup: against the same framework's plain decoding of the same "
        "workload, batch and T):",
        "",
        "| system | method | batch | T | workload | tok/s | speedup vs own plain | acceptance | "
        "tokens/call | predicted | realized/pred |",
        "|" + "---|" * 11,
    ]
    for r in sorted(rows, key=lambda r: r["workload"]):  # stable: system order kept
        method = r["method"] + (f" γ={r['gamma']}" if r["gamma"] else "")
        lines.append(
            f"| {r['framework']} | {method} | {r['batch']} | {r['temperature']:g} | "
            f"{r['workload']} | {r['tok_s']:.1f} | {_fmt(r['speedup'])} | "
            f"{_fmt(r['acceptance_rate'], '{:.3f}')} | {r['tokens_per_call']:.2f} | "
            f"{_fmt(r['predicted_speedup'])} | {_fmt(r['realized_over_predicted'])} |"
        )
    return lines


def sweep_tables(results: dict) -> list[str]:
    """The draft model's γ sweep (or why there is none) and the block-size sweep."""
    if results["sweep"]:
        lines = [
            "γ sweep (specjax, draft model, T=0, batch 1):",
            "",
            "| γ | acceptance | α | tokens/call | tok/s | speedup | predicted | realized/pred | "
            "draft ms | verify ms | ms/step |",
            "|" + "---|" * 11,
        ]
    else:
        lines = ["No γ sweep of a draft model: none was given (--draft)."]
    for r in results["sweep"]:
        lines.append(
            f"| {r['gamma']} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{_fmt(r['alpha'], '{:.3f}')} | {r['tokens_per_call']:.2f} | {r['tok_s']:.1f} | "
            f"{_fmt(r['speedup'])} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {r['cost_draft_ms']:.2f} | "
            f"{r['cost_verify_ms']:.2f} | {r['step_ms']:.2f} |"
        )
    lines += [
        "",
        "Block-size sweep (specjax, block drafter, T=0, batch 1; τ = tokens per target call):",
        "",
        "| γ | block | acceptance | α | τ | tok/s | speedup | predicted | realized/pred | "
        "proposal ms | verify ms | ms/step |",
        "|" + "---|" * 12,
    ]
    for r in results.get("block_sweep", []):
        lines.append(
            f"| {r['gamma']} | {r['gamma'] + 1} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{_fmt(r['alpha'], '{:.3f}')} | {r['tokens_per_call']:.2f} | {r['tok_s']:.1f} | "
            f"{_fmt(r['speedup'])} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {_fmt(r.get('cost_draft_ms'))} | "
            f"{_fmt(r.get('cost_verify_ms'))} | {r['step_ms']:.2f} |"
        )
    return lines


def targets_table(targets) -> list[str]:
    lines = ["Targets:", "", "| target | required | measured | met |", "|---|---|---|---|"]
    for t in targets:
        met = {True: "yes", False: "**no**", None: "—"}[t["met"]]
        required = f"{'≤' if t.get('at_most') else '≥'} {t['threshold']:g}"
        lines.append(f"| {t['what']} | {required} | {_fmt(t['value'])} | {met} |")
    return lines


def markdown(results: dict) -> str:
    lines = [*header(results), "", *rows_table(results["rows"])]
    if len(results["config"]["workloads"]) > 1:
        lines += ["", *workload_table(results.get("workload_rows", []))]
    lines += ["", *sweep_tables(results)]
    lines += ["", *diagnosis(results["rows"], results.get("forward_ms", {}).get("1", {}))]
    lines += ["", *targets_table(results["targets"])]
    return "\n".join(lines)


def diagnosis(rows, forward_ms: dict | None = None) -> list[str]:
    """Splits realized / predicted of each batch-1 greedy speculative row into its factors.

    At batch 1, realized / predicted = (tokens per call / E(α, γ))
    × (draft + verify cost / measured step) × (plain measured step / forward cost).
    ``forward_ms`` (the batch-1 target forward's ms by width) adds what verifying
    `VERIFY_WIDTH` tokens costs against one.
    """
    plain = find_row(rows, "specjax", "plain", 1, 0.0)
    out = ["Where realized / predicted goes (specjax, batch 1, T=0):", ""]
    one, wide = (forward_ms or {}).get("1"), (forward_ms or {}).get(str(VERIFY_WIDTH))
    if one and wide:
        out.append(
            f"* A target forward of {VERIFY_WIDTH} tokens (a verification at γ="
            f"{VERIFY_WIDTH - 1}) costs {wide:.2f} ms, {wide / one:.2f}× one of 1 token "
            f"({one:.2f} ms, a decoding step)."
        )
    proposal = {
        "draft": "a draft proposal",
        "lookup": "a lookup proposal",
        "block": "a block proposal (one drafter forward + its context update)",
    }
    for method in ("draft", "lookup", "block"):
        r = find_row(rows, "specjax", method, 1, 0.0)
        if r is None or r.get("expected_tokens_per_call") is None:
            continue
        e, tpc = r["expected_tokens_per_call"], r["tokens_per_call"]
        step, model = r["step_ms"], r["model_step_ms"]
        p_step, p_model = plain["step_ms"], plain["model_step_ms"]
        verify, draft = (
            r["cost_verify_ms"] / r["cost_step_ms"],
            r["cost_draft_ms"] / r["cost_step_ms"],
        )
        out.append(
            f"* {method} γ={r['gamma']}: {r['realized_over_predicted']:.2f} = "
            f"tokens/call {tpc:.2f} / E(α={r['alpha']:.3f}) {e:.2f} (×{tpc / e:.2f}) "
            f"· draft+verify {model:.2f} ms / measured step {step:.2f} ms (×{model / step:.2f}) "
            f"· plain: measured step {p_step:.2f} ms / forward {p_model:.2f} ms "
            f"(×{p_step / p_model:.2f}). A verify forward (T={r['gamma'] + 1}) costs "
            f"{verify:.2f}× a T=1 forward, {proposal[method]} {draft:.2f}×."
        )
        if r.get("cost_verify_features_ms") is not None:
            out[-1] += (
                f" The verify forward returning the drafter's features costs "
                f"{r['cost_verify_features_ms']:.2f} ms against {r['cost_verify_ms']:.2f} ms "
                f"without (the prediction uses the latter)."
            )
        out[-1] += (
            f" The {step:.2f} ms step: proposal {r['cost_draft_ms']:.2f} ms "
            f"({r['cost_draft_ms'] / step:.0%}), verify {r['cost_verify_ms']:.2f} ms "
            f"({r['cost_verify_ms'] / step:.0%}), the rest {step - model:+.2f} ms (the loop's "
            f"work, less what the two calls lose or gain from running back to back)."
        )
        if r.get("interleaved_ms") is not None:
            both = r["interleaved_ms"]
            out[-1] += (
                f" Run back to back in one loop (no acceptance or bookkeeping), the proposal "
                f"and the verification cost {both:.2f} ms, against {model:.2f} ms apart: "
                f"{both - model:+.2f} ms is what the two calls cost each other (on a CPU, "
                f"mostly weights they evict from the caches); the loop's own work (acceptance, "
                f"sampling, buffers) is the remaining {step - both:+.2f} ms of the "
                f"{step:.2f} ms step."
            )
    large = [r for r in rows if r["framework"] == "specjax" and r["batch"] > 1]
    for r in large:
        if r["method"] in ("draft", "block") and r["temperature"] == 0 and r.get("verify_gflops"):
            out.append(
                f"* batch {r['batch']}, {r['method']} γ={r['gamma']}: the verification forward "
                f"({r['batch']}×{r['gamma'] + 1} "
                f"tokens) runs at {r['verify_gflops']:.0f} GFLOP/s, "
                f"{r['verify_gflops'] / r['peak_gflops']:.0%} of this machine's measured "
                f"float32 matmul peak ({r['peak_gflops']:.0f} GFLOP/s): at this batch the step "
                f"is compute-bound, so tokens that are drafted and rejected cost real time."
            )
    return out


def _save(fig, path: Path, plt) -> Path:
    """Writes ``fig`` to ``path`` and closes it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if results["sweep"]:
        paths.append(plot_gamma_sweep(results["sweep"], out / "gamma_sweep.png", plt))
    if results.get("block_sweep"):
        paths.append(plot_block_sweep(results, out / "block_sweep.png", plt))
    paths.append(plot_throughput(results, out / "throughput.png", plt))
    if len(results["config"]["workloads"]) > 1:
        paths.append(plot_workloads(results, out / "workloads.png", plt))
    return paths


def plot_gamma_sweep(sweep, path: Path, plt) -> Path:
    """Acceptance and speedup against the draft model's γ."""
    gammas = [r["gamma"] for r in sweep]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(gammas, [r["acceptance_rate"] for r in sweep], "o-", label="acceptance rate")
    ax1.plot(gammas, [r["alpha"] for r in sweep], "s--", label="α (per-token MLE)")
    ax1.set(xlabel="γ (draft tokens per step)", ylabel="rate", ylim=(0, 1.05), xticks=gammas)
    ax1.legend()
    ax2.plot(gammas, [r["speedup"] for r in sweep], "o-", label="realized")
    ax2.plot(gammas, [r["predicted_speedup"] for r in sweep], "s--", label="predicted")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(xlabel="γ (draft tokens per step)", ylabel="speedup over plain", xticks=gammas)
    ax2.legend()
    fig.suptitle("specjax speculative decoding, draft model, T=0, batch 1")
    return _save(fig, path, plt)


def plot_throughput(results: dict, path: Path, plt) -> Path:
    """tok/s of every system at batch 1 and at the large batch, T=0 and 1."""
    rows = results["rows"]
    groups = [(1, "batch 1"), (results["config"]["large_batch"], "total, large batch")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for ax, (batch, title) in zip(axes, groups, strict=True):
        systems = [(r["framework"], r["method"]) for r in rows if r["batch"] == batch]
        systems = list(dict.fromkeys(systems))
        x = np.arange(len(systems))
        for k, t in enumerate((0.0, 1.0)):
            values = [find_row(rows, *s, batch, t)["tok_s"] for s in systems]
            ax.bar(x + (k - 0.5) * 0.4, values, 0.4, label=f"T={t:g}")
        ax.set_xticks(x, [f"{fw}\n{m}" for fw, m in systems], fontsize=8)
        ax.set(ylabel="tokens/s", title=f"{title} (b={batch})")
        ax.legend()
    return _save(fig, path, plt)


def plot_workloads(results: dict, path: Path, plt) -> Path:
    """tok/s of every batch-1 system on each workload, T=0 and 1."""
    rows = [r for r in results["workload_rows"] if r["batch"] == 1]
    workloads = list(results["config"]["workloads"])
    systems = list(dict.fromkeys((r["framework"], r["method"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    x = np.arange(len(systems))
    width = 0.8 / len(workloads)
    for ax, t in zip(axes, (0.0, 1.0), strict=True):
        for k, w in enumerate(workloads):
            here = [r for r in rows if r["workload"] == w and r["temperature"] == t]
            by_system = {(r["framework"], r["method"]): r["tok_s"] for r in here}
            values = [by_system.get(s, np.nan) for s in systems]
            ax.bar(x + (k - (len(workloads) - 1) / 2) * width, values, width, label=w)
        ax.set_xticks(x, [f"{fw}\n{m}" for fw, m in systems], fontsize=8)
        ax.set(ylabel="tokens/s", title=f"batch 1, T={t:g}")
        ax.legend()
    fig.suptitle("throughput by workload")
    return _save(fig, path, plt)


def plot_block_sweep(results: dict, path: Path, plt) -> Path:
    """τ and speedup against block size γ+1, the draft model's γ sweep on the same axes."""
    block, draft = results["block_sweep"], results["sweep"]
    bx = [r["gamma"] + 1 for r in block]
    dx = [r["gamma"] + 1 for r in draft]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(bx, [r["tokens_per_call"] for r in block], "o-", color="C0", label="block drafter")
    ax1.plot(dx, [r["tokens_per_call"] for r in draft], "s--", color="C1", label="draft model")
    ax1.plot(bx, bx, ":", color="gray", lw=0.8, label="ceiling (γ+1)")
    ax1.set(xlabel="γ + 1 (block size)", ylabel="τ (tokens per target call)")
    ax1.legend()
    predicted = [r["predicted_speedup"] or np.nan for r in block]
    ax2.plot(bx, [r["speedup"] for r in block], "o-", color="C0", label="block, realized")
    ax2.plot(bx, predicted, "o:", color="C0", alpha=0.6, label="block, predicted")
    ax2.plot(dx, [r["speedup"] for r in draft], "s--", color="C1", label="draft model, realized")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(xlabel="γ + 1 (block size)", ylabel="speedup over plain")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({*bx, *dx}))
    fig.suptitle("specjax speculative decoding, block drafter vs draft model, T=0, batch 1")
    return _save(fig, path, plt)


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
        help="block drafter folder (save_block_drafter); default: the bundled one on the "
        "bundled pair, else random weights",
    )
    parser.add_argument("--large-batch", type=int, default=16, help="specjax's large batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes after the first")
    parser.add_argument("--cost-repeats", type=int, default=5)
    parser.add_argument("--cost-inner", type=int, default=10)
    parser.add_argument(
        "--torch-threads",
        default="auto",
        help="torch threads; auto: the faster of 1 and 2 on a short probe (default)",
    )
    parser.add_argument(
        "--tie-tol",
        type=float,
        default=0.0,
        help="tolerate (and report) greedy mismatches whose |logit gap| is below this",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write results.json, results.md and plots here")
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
    beyond the main γ: each further decode loop is a 30-layer program to compile.
    Prompt lookup keeps γ = 4, so that its verification is the `VERIFY_WIDTH` forward,
    and the block drafter takes the same γ (see `load_block`). Compilation is most of
    the run.
    """
    args.per_workload, args.max_new_tokens, args.large_batch = 1, 8, 2
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
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
        (args.out / "results.md").write_text(text + "\n")
        for path in plot(results, args.out):
            log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
