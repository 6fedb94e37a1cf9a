"""End-to-end decoding benchmark: specjax against Hugging Face transformers on the same weights.

On one target/draft pair, the same prompts and the same number of new tokens, at
temperature 0 and 1, it measures:

  * specjax: plain ``generate``, ``speculative_generate`` with the draft model
    (``DraftModel``), with prompt lookup (``PromptLookup``) and with the block
    drafter (``BlockDrafter``: one forward on the target's hidden states drafts
    ``--block-gamma`` tokens), at batch 1 and at a large batch (16);
  * transformers (PyTorch, CPU, float32, same weights loaded from the same
    Hugging Face folders, token ids in, no tokenizer): plain ``generate``,
    assisted generation with the draft as ``assistant_model`` (γ tokens per
    step, constant schedule, no confidence cut-off) and prompt lookup
    (``prompt_lookup_num_tokens=γ``), at batch 1 only: transformers refuses
    assisted generation and prompt lookup for batch > 1 (probed at run time);
    transformers has no block drafter, so the block rows have no counterpart;
  * a sweep over γ of specjax speculative decoding with the draft model
    (temperature 0, batch 1): acceptance rate, realized and predicted speedup;
  * the same sweep over the block drafter's γ (``--block-sweep``; block size γ+1).

The block drafter is ``--block-drafter PATH`` if given, else the bundled one
(``specjax.default_drafter("block")``) on the bundled pair, else (``--quick``, other
pairs, or no bundled drafter yet) one with random weights; the config says which.

EOS never stops a row, so every system generates exactly ``--max-new-tokens``.
Before any timing is reported, the greedy outputs of every system are checked
equal token for token; on any difference the script names the system, prompt
and position with the two tokens' logit gap, and exits with status 1.

Times are medians over ``--repeats`` passes over all prompts, after a separate
first pass: for specjax, compile time = first pass - median; for transformers
(no compilation) the first pass is reported next to the median. The predicted
speedup of speculative decoding comes from the measured acceptance probability α
and the measured costs of one draft proposal and one verification, as in
``scripts/bench_decode.py`` (see ``specjax.benchmarking``).

    python scripts/bench_e2e.py --out docs/bench_e2e            # bundled pair
    python scripts/bench_e2e.py --target T --draft D --out DIR   # Hugging Face folders
    python scripts/bench_e2e.py --quick --out /tmp/e2e           # tiny random pair, seconds
    python scripts/bench_e2e.py --block-drafter DIR --out DIR    # another block drafter
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
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
from specjax.decode import resolve_cache_len

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "prompts" / "bench_prompts.json"

TARGETS = [
    # (key, description, threshold)
    ("spec_over_plain", "specjax speculative (draft) / specjax plain tok/s, T=0, batch 1", 2.0),
    ("realized_over_predicted", "realized / predicted speedup, same run", 0.85),
    ("spec_over_hf_assisted", "specjax speculative / transformers assisted tok/s, T=0, b=1", 3.0),
    ("large_over_b1", "specjax speculative total tok/s, batch 16 / batch 1, T=0", 8.0),
    # The block drafter's (issue's targets on the bundled pair, batch 1).
    ("block_over_plain", "specjax block drafter / specjax plain tok/s, T=0, batch 1", 2.5),
    ("block_over_plain_t1", "specjax block drafter / specjax plain tok/s, T=1, batch 1", 2.0),
    ("block_tau", "block drafter tokens per target call (τ), block 8 (γ=7), T=0, b=1", 5.0),
    ("block_realized_over_predicted", "block drafter realized / predicted, T=0, b=1", 0.9),
]


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
        return bool(m.gaps) and max(abs(g) for g in m.gaps.values()) < tie_tol

    if any(not tolerated(m) for m in mismatches):
        raise GreedyMismatchError(mismatches)
    return mismatches


# ----------------------------------------------------------------------------
# Pair, prompts, machine.


@dataclasses.dataclass
class Pair:
    target: object
    draft: object
    tokenizer: object
    target_dir: Path
    draft_dir: Path
    name: str
    block: object = None  # the BlockDrafter (at --block-gamma)
    block_source: str = ""  # where it came from


def load_pair(args, tmp: Path) -> Pair:
    if args.quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0)
        draft = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0, num_layers=1)
        specjax.save_pretrained(target, tmp / "target")
        specjax.save_pretrained(draft, tmp / "draft")
        pair = Pair(
            target, draft, None, tmp / "target", tmp / "draft", "tiny random pair (--quick)"
        )
    elif args.target:
        target = specjax.load_pretrained(args.target)
        draft = specjax.load_pretrained(args.draft)
        name = f"target {args.target}, draft {args.draft}"
        pair = Pair(target, draft, target.tokenizer, Path(args.target), Path(args.draft), name)
    else:
        from specjax.pretrained import default_pair_path

        target, draft, tokenizer = specjax.default_pair()
        root = default_pair_path()
        pair = Pair(
            target, draft, tokenizer, root / "target", root / "draft", "bundled default pair"
        )
    bundled = not (args.quick or args.target)
    pair.block, pair.block_source = load_block(args, pair.target, bundled)
    return pair


def load_block(args, target, bundled: bool):
    """``(BlockDrafter at --block-gamma, where it came from)``.

    ``--block-drafter`` if given; else the bundled drafter on the bundled pair; else
    (or if none is bundled yet) one with random weights, trained for blocks of 16.
    """
    from specjax.block_drafter import BlockDrafter, load_block_drafter

    gamma = args.block_gamma
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
        drafter = BlockDrafter.random(
            target, key=jax.random.key(args.seed), num_draft=gamma, block_size=16
        )
        source = "random weights (BlockDrafter.random, block size 16; no trained drafter)"
    if not 1 <= gamma <= drafter.block_size - 1:
        raise SystemExit(
            f"--block-gamma {gamma}: this block drafter takes γ in [1, {drafter.block_size - 1}]"
        )
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


def load_prompts(path: Path, num_code: int | None, num_prose: int | None) -> list[dict]:
    spec = json.loads(Path(path).read_text())
    code = [dict(p, kind="code") for p in spec["code"][:num_code]]
    prose = [dict(p, kind="prose") for p in spec["prose"][:num_prose]]
    return code + prose


def encode_prompts(prompts: list[dict], tokenizer, vocab_size: int, prompt_tokens: int):
    """Token ids of every prompt, cut to one common length (the last ``L`` tokens).

    One length means one compiled program per system. Without a tokenizer (a
    random pair) the UTF-8 bytes are the ids.

    Returns:
        ``(ids, L, how)``: ``ids[i]`` a list of ``L`` ints.
    """
    if tokenizer is not None:
        encoded = [tokenizer.encode(p["text"], add_special_tokens=False).ids for p in prompts]
        how = "tokenizer.json"
    else:
        if vocab_size < 256:
            raise SystemExit("a pair without a tokenizer needs vocab_size >= 256 (byte ids)")
        encoded = [list(p["text"].encode("utf-8")) for p in prompts]
        how = "UTF-8 bytes (the pair has no tokenizer)"
    length = min(prompt_tokens, *(len(e) for e in encoded))
    return [e[-length:] for e in encoded], length, how


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


@dataclasses.dataclass(eq=False)
class System:
    framework: str  # "specjax" | "transformers"
    method: str  # "plain" | "draft" | "lookup" | "block"
    batch: int
    temperature: float
    gamma: int | None
    run: Callable[[], object]  # one pass; returns raw outputs
    summarize: Callable[[object], Outcome]
    first_s: float | None = None
    outcome: Outcome | None = None
    timing: Timing | None = None

    @property
    def name(self) -> str:
        g = f" γ={self.gamma}" if self.gamma else ""
        return f"{self.framework} {self.method}{g} b={self.batch} T={self.temperature:g}"

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


def specjax_system(pair, method, prompts, batch, temperature, gamma, args) -> System:
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

    if batch == 1:

        def run():
            return [one(jax.random.fold_in(key, i), [p]) for i, p in enumerate(prompts)]
    else:
        rows = [prompts[i % len(prompts)] for i in range(batch)]

        def run():
            return [one(key, rows)]

    return System("specjax", method, batch, temperature, gamma, run, _summarize_specjax)


class Transformers:
    """The same pair in transformers (PyTorch, CPU, float32), from the same folders.

    It counts target forwards (a forward pre-hook) and drafted candidates, which
    transformers does not expose: ``get_candidates`` of the two candidate
    generators used here is wrapped until :meth:`close`.
    """

    def __init__(self, pair: Pair, args):
        import torch
        import transformers
        from transformers.generation import candidate_generator as cg

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.args = args
        load = transformers.AutoModelForCausalLM.from_pretrained
        self.target = load(pair.target_dir, dtype=torch.float32).eval()
        self.draft = load(pair.draft_dir, dtype=torch.float32).eval()
        for m in (self.target, self.draft):
            # Never stop on EOS (specjax runs with eos_id=None): every system
            # emits exactly max_new_tokens.
            m.generation_config.eos_token_id = None
            m.generation_config.pad_token_id = 0
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

    def system(self, method: str, prompts, temperature: float) -> System:
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
        return System("transformers", method, 1, temperature, gamma, run, summarize)

    def probe_batch(self) -> dict:
        """What transformers does with a batch of 2 rows, for each assisted method."""
        import torch

        ids = torch.zeros((2, 4), dtype=torch.long)
        found = {}
        for method in ("draft", "lookup"):
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
    """Target forward costs for T=1 and T=γ+1, and each drafter's proposal cost (seconds).

    ``context`` is prompt length + max_new_tokens // 2 (the mean context of a run).
    ``gammas`` are the draft model's, ``block_gammas`` the block drafter's. The block
    drafter's proposal cost includes its context update with the verified tokens'
    features (see ``specjax.benchmarking.draft_cost``); its verify forward, which
    also returns those features, is measured at ``--block-gamma`` only (as
    ``verify_features``, a diagnostic): it costs the same as the plain forward
    within noise, so the prediction uses the plain forward's cost at every γ.
    """
    sampling = specjax.SamplingConfig(temperature=0.0)
    widths = sorted(
        {1} | {g + 1 for g in gammas} | {lookup_gamma + 1} | {g + 1 for g in block_gammas}
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
    drafter = specjax.DraftModel(pair.draft, num_draft=args.gamma)
    costs["interleaved"] = {
        ("draft", args.gamma): interleaved_cost(
            pair.target, drafter, batch, context, sampling, **kw
        )
    }
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
        spec = load_prompts(args.prompts, args.num_code, args.num_prose)
        prompts, length, how = encode_prompts(
            spec, pair.tokenizer, pair.target.vocab_size, args.prompt_tokens
        )
        log(f"{pair.name}: {len(prompts)} prompts of {length} tokens ({how})")
        hf = Transformers(pair, args)
        try:
            threads, probe_ms = hf.pick_threads(prompts[0], args.torch_threads)
            log(f"torch threads: {threads} (ms/token by thread count: {probe_ms or 'not probed'})")
            results = measure_all(args, pair, prompts, hf)
            batch_probe = hf.probe_batch()
        finally:
            hf.close()
    results["machine"] = dict(machine_info(), load_average_1m_start=load_start)
    results["config"] = {
        "pair": pair.name,
        "target_dir": str(pair.target_dir),
        "draft_dir": str(pair.draft_dir),
        "num_prompts": len(prompts),
        "prompt_tokens": length,
        "prompt_encoding": how,
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gamma,
        "ngram": args.ngram,
        "large_batch": args.large_batch,
        "repeats": args.repeats,
        "torch_threads": threads,
        "torch_thread_probe_ms_per_token": probe_ms,
        "sweep": list(args.sweep),
        "block_gamma": args.block_gamma,
        "block_sweep": list(args.block_sweep),
        "block_drafter": pair.block_source,
        "command": " ".join(["python", "scripts/bench_e2e.py", *sys.argv[1:]]),
    }
    results["hf_batch_probe"] = batch_probe
    results["targets"] = targets_of(results["rows"], args.large_batch, results["block_sweep"])
    results["wall_s"] = time.perf_counter() - started
    return results


def measure_all(args, pair: Pair, prompts, hf: Transformers) -> dict:
    """Runs every system: greedy correctness first, then timing, then step costs."""
    g, large, n = args.gamma, args.large_batch, args.max_new_tokens
    bg = args.block_gamma
    main = {}  # (framework, method, batch, T) -> System
    for t in (0.0, 1.0):
        for method in ("plain", "draft", "lookup", "block"):
            gamma = {"plain": None, "block": bg}.get(method, g)
            main["specjax", method, 1, t] = specjax_system(pair, method, prompts, 1, t, gamma, args)
            if method != "block":  # transformers has no block drafter
                main["transformers", method, 1, t] = hf.system(method, prompts, t)
            # --quick leaves out the block drafter's large batch: one more decode loop to
            # compile (~10 s) for a path no different here (tests/test_block_drafter.py
            # covers the drafter at batch > 1).
            if large > 1 and not (args.quick and method == "block"):
                main["specjax", method, large, t] = specjax_system(
                    pair, method, prompts, large, t, gamma, args
                )
    sweep = {
        gamma: main["specjax", "draft", 1, 0.0]
        if gamma == g
        else specjax_system(pair, "draft", prompts, 1, 0.0, gamma, args)
        for gamma in args.sweep
    }
    block_sweep = {
        gamma: main["specjax", "block", 1, 0.0]
        if gamma == bg
        else specjax_system(pair, "block", prompts, 1, 0.0, gamma, args)
        for gamma in args.block_sweep
    }
    systems = list(dict.fromkeys([*main.values(), *sweep.values(), *block_sweep.values()]))

    # 1. Correctness first: one pass of every greedy system, compared with
    # specjax's plain greedy decoding before anything is timed.
    greedy = [s for s in systems if s.temperature == 0.0]
    for s in greedy:
        log(f"first pass: {s.name}")
        s.first()
    reference = main["specjax", "plain", 1, 0.0]
    if any(len(r) != n for r in reference.outcome.tokens):
        raise RuntimeError(f"{reference.name} did not generate {n} tokens per prompt")
    ties = check_greedy_outputs(
        reference.outcome.tokens,
        {s.name: s.outcome.tokens for s in greedy if s is not reference},
        logit_gaps=logit_gaps_fn(pair, hf, prompts, reference.outcome.tokens),
        tie_tol=args.tie_tol,
    )
    for m in ties:
        log(f"WARNING near-tie tolerated (|gap| < {args.tie_tol}): {m.describe()}")
    log(f"greedy outputs of {len(greedy)} systems agree token for token")

    # 2. Timing.
    for s in systems:
        log(f"{args.repeats} timed passes: {s.name}")
        s.time(args.repeats)

    # 3. Step costs for the predicted speedup, at context = prompt + n/2.
    log("measuring forward / draft costs")
    context = len(prompts[0]) + n // 2
    block_gammas = sorted({*args.block_sweep, bg})
    costs = {1: measure_costs(pair, 1, context, sorted({*args.sweep, g}), g, args, block_gammas)}
    if large > 1:
        # --quick skips these (compiling them is most of a quick run).
        costs[large] = (
            None if args.quick else measure_costs(pair, large, context, [g], g, args, [bg])
        )

    rows = [
        row_of(s, main[fw, "plain", b, t], costs[b] if fw == "specjax" else None)
        for (fw, _, b, t), s in main.items()
    ]
    plain_b1 = main["specjax", "plain", 1, 0.0]
    return {
        "near_ties": [dataclasses.asdict(m) for m in ties],
        "greedy_checked": [s.name for s in greedy],
        "rows": rows,
        "sweep": [row_of(s, plain_b1, costs[1]) for s in sweep.values()],
        "block_sweep": [row_of(s, plain_b1, costs[1]) for s in block_sweep.values()],
    }


def find_row(rows, framework, method, batch, temperature) -> dict | None:
    want = (framework, method, batch, temperature)
    keys = ("framework", "method", "batch", "temperature")
    return next((r for r in rows if tuple(r[k] for k in keys) == want), None)


def targets_of(rows, large, block_sweep=()) -> list[dict]:
    """The performance targets of the issues, measured at temperature 0 (and 1 for block).

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
    for key, what, threshold in TARGETS:
        value = measured[key]
        if key == "large_over_b1":
            what = what.replace("batch 16", f"batch {large}")
        met = None if value is None else bool(value >= threshold)
        out.append(dict(target=key, what=what, threshold=threshold, value=value, met=met))
    return out


# ----------------------------------------------------------------------------
# Reporting.


def _fmt(value, spec="{:.2f}") -> str:
    if value is None:
        return "—"
    return spec.format(value)


def markdown(results: dict) -> str:
    m, c = results["machine"], results["config"]
    lines = [
        f"Pair: {c['pair']}. {c['num_prompts']} prompts of {c['prompt_tokens']} tokens "
        f"({c['prompt_encoding']}), {c['max_new_tokens']} new tokens each, EOS disabled, "
        f"γ={c['gamma']}, prompt lookup n-gram {c['ngram']}, block drafter γ={c['block_gamma']} "
        f"(block size {c['block_gamma'] + 1}), medians of {c['repeats']} passes.",
        f"Block drafter: {c['block_drafter']}.",
        f"Machine: {m['cpu']}, {m['cores']} cores, 1-min load average "
        f"{m['load_average_1m_start']:.1f} at the start, {m['load_average_1m']:.1f} at the end; "
        f"jax {m['jax']} ({m['platform']}), torch {m['torch']} "
        f"({c['torch_threads']} thread(s)), transformers {m['transformers']}.",
        f"Command: `{c['command']}` ({results['wall_s'] / 60:.1f} min).",
        "",
        "Greedy outputs (T=0) of every system below agree token for token "
        f"({len(results['near_ties'])} tolerated near-ties).",
        f"transformers with batch 2: assisted generation -> {results['hf_batch_probe']['draft']}; "
        f"prompt lookup -> {results['hf_batch_probe']['lookup']}. "
        "transformers has no block drafter: the block rows have no transformers counterpart.",
        "",
        "| system | method | batch | T | tok/s | speedup vs own plain | acceptance | "
        "tokens/call | predicted | realized/pred | ms/step | model ms/step | "
        "steady s | first pass s | compile s |",
        "|" + "---|" * 15,
    ]
    for r in results["rows"]:
        method = r["method"] + (f" γ={r['gamma']}" if r["gamma"] else "")
        lines.append(
            f"| {r['framework']} | {method} | {r['batch']} | {r['temperature']:g} | "
            f"{r['tok_s']:.1f} | {_fmt(r['speedup'])} | {_fmt(r['acceptance_rate'], '{:.3f}')} | "
            f"{r['tokens_per_call']:.2f} | {_fmt(r['predicted_speedup'])} | "
            f"{_fmt(r['realized_over_predicted'])} | {r['step_ms']:.2f} | "
            f"{_fmt(r['model_step_ms'])} | {r['median_s']:.2f} | {r['first_s']:.2f} | "
            f"{_fmt(r['compile_s'], '{:.1f}')} |"
        )
    lines += [
        "",
        "γ sweep (specjax, draft model, T=0, batch 1):",
        "",
        "| γ | acceptance | α | tokens/call | tok/s | speedup | predicted | realized/pred | "
        "draft ms | verify ms | ms/step |",
        "|" + "---|" * 11,
    ]
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
    lines += ["", *diagnosis(results["rows"])]
    lines += ["", "Targets:", "", "| target | required | measured | met |", "|---|---|---|---|"]
    for t in results["targets"]:
        met = {True: "yes", False: "**no**", None: "—"}[t["met"]]
        lines.append(f"| {t['what']} | ≥ {t['threshold']:g} | {_fmt(t['value'])} | {met} |")
    return "\n".join(lines)


def diagnosis(rows) -> list[str]:
    """Splits realized / predicted of each batch-1 greedy speculative row into its factors.

    At batch 1, realized / predicted = (tokens per call / E(α, γ))
    × (draft + verify cost / measured step) × (plain measured step / forward cost).
    """
    plain = find_row(rows, "specjax", "plain", 1, 0.0)
    out = ["Where realized / predicted goes (specjax, batch 1, T=0):", ""]
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


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    sweep = results["sweep"]
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
    fig.tight_layout()
    paths.append(out / "gamma_sweep.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if results.get("block_sweep"):
        paths.append(plot_block_sweep(results, out / "block_sweep.png", plt))

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
    fig.tight_layout()
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", help="target model folder (Hugging Face format)")
    parser.add_argument("--draft", help="draft model folder (Hugging Face format)")
    parser.add_argument("--prompts", type=Path, default=PROMPTS_FILE)
    parser.add_argument("--num-code", type=int, default=None, help="first N code prompts")
    parser.add_argument("--num-prose", type=int, default=None, help="first N prose prompts")
    parser.add_argument("--prompt-tokens", type=int, default=80, help="prompt length (tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--ngram", type=int, default=3, help="prompt lookup: longest n-gram")
    parser.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument(
        "--block-gamma", type=int, default=7, help="block drafter: draft tokens per step (γ)"
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
    parser.add_argument("--quick", action="store_true", help="tiny random pair (smoke test)")
    args = parser.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together")
    if args.quick:
        args.num_code, args.num_prose, args.prompt_tokens = 1, 1, 24
        args.max_new_tokens, args.gamma, args.sweep, args.large_batch = 12, 2, [1, 2], 4
        # One block γ: every other one is another decode loop to compile (~7 s).
        args.block_gamma, args.block_sweep = 2, [2]
        args.repeats, args.cost_repeats, args.cost_inner = 1, 1, 2
    return args


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
