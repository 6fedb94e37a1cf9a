"""Where a decode step's time goes: a per-op profile and a cost breakdown.

Two views of one decoder (plain ``generate`` or ``speculative_generate`` with the
draft model or prompt lookup) on the bundled pair, or on Hugging Face folders:

1. **Per-op profile.** One ``jax.profiler`` trace of a few decoding runs; the
   XLA ops are summed by kind and output shape (from the compiled HLO) and
   printed per decode step, largest first. This is how the cache layout, the
   tied-head layout and the argmax of specjax were chosen (BENCHMARKS.md,
   "Profiling the decode step").
2. **Cost breakdown** (``speculative`` methods): the measured step time next to
   the isolated costs of its parts: the verification forward, the proposal,
   the two back to back (``harness.interleaved_cost``), and the
   loop's own work, measured by running the same loop with a trivial target
   and drafter (``HashModel``: all of the loop, almost none of a model).

Usage::

    python scripts/benchmarks/profile_decode.py                      # draft model, γ=4, T=0
    python scripts/benchmarks/profile_decode.py --method plain
    python scripts/benchmarks/profile_decode.py --batch 16 --top 30
    python scripts/benchmarks/profile_decode.py --quick              # tiny random pair, seconds
    python scripts/benchmarks/profile_decode.py --method forward \\
        --target SmolLM2-135M-Instruct.Q4_1.gguf

``--method forward`` profiles the target's forward alone, at T = 1 and at
T = γ + 1 (the verification width), against a cache of ``--prompt-tokens``: the
two costs whose ratio decides whether verifying γ drafts is cheap.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import struct

import specjax
from harness import (
    draft_cost,
    forward_costs,
    forward_loop,
    interleaved_cost,
)
from specjax import decoding
from specjax.core.timing import time_runs
from specjax.decoding import resolve_cache_len

# Trace events that are containers or runtime bookkeeping rather than XLA ops.
_NOT_OPS = (
    "Thunk",
    "$",
    "Pjit",
    "end:",
    "Common",
    "Parse",
    "Handle",
    "Slinky",
    "DevicePut",
    "np.",
)
_CONTAINERS = ("while", "cond", "call")


@struct.dataclass
class LengthsOnly:
    """Cache of a model without history: only the per-row lengths."""

    lengths: jax.Array

    def rollback(self, lengths):
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))


@struct.dataclass
class HashModel:
    """A trivial model with the real vocabulary: token t always predicts (31·t + 7) mod V.

    All of the decode loop, almost none of a model: one compare per logit, no weights.
    """

    vocab: int = struct.field(pytree_node=False)

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def init_cache(self, batch_size: int, max_len: int) -> LengthsOnly:
        return LengthsOnly(lengths=jnp.zeros((batch_size,), jnp.int32))

    def __call__(self, tokens_BT, positions_BT, cache):
        ids_V = jnp.arange(self.vocab, dtype=jnp.int32)
        nxt = (tokens_BT * 31 + 7) % self.vocab
        logits = jnp.where(ids_V == nxt[..., None], 5.0, 0.0)
        return specjax.ModelOutput(logits, LengthsOnly(lengths=positions_BT[:, -1] + 1))


def load(args):
    if args.quick:
        from specjax.testing import tiny_model

        target = tiny_model(seed=0, vocab_size=256)
        return target, tiny_model(seed=1, vocab_size=256), None
    if args.target:
        target = specjax.load_pretrained(args.target)
        draft = specjax.load_pretrained(args.draft) if args.draft else None
        if draft is not None and args.draft_head:
            draft = draft.with_head_ids(specjax.sampling.vocab.frequent_ids(draft, args.draft_head))
        from specjax.models.quant import quantize

        if args.target_precision != "float32":
            target = quantize(target, args.target_precision)
        if draft is not None and args.draft_precision != "float32":
            draft = quantize(draft, args.draft_precision)
        return target, draft, target.tokenizer
    from specjax.io.pretrained import default_pair

    return default_pair()


def prompts_of(args, vocab_size: int, tokenizer):
    if tokenizer is None:
        key = jax.random.key(args.seed)
        return jax.random.randint(key, (args.batch, args.prompt_tokens), 0, vocab_size)
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
    ids = tokenizer.encode(text * 40).ids[-args.prompt_tokens :]
    return jnp.asarray([ids] * args.batch, jnp.int32)


def make_drafter(method: str, draft, gamma: int, target=None):
    if method == "block":
        # The bundled block drafter, sharing the target's arrays; argmax drafts.
        drafter = specjax.io.pretrained.default_drafter("block").replace(target=target)
        return drafter.with_draft(num_draft=gamma, mode="argmax")
    if method == "draft":
        if draft is None:
            raise SystemExit("--method draft needs a draft model (--draft)")
        return specjax.DraftModel(draft, num_draft=gamma)
    return specjax.PromptLookup(num_draft=gamma)


def decode_fn(method, target, drafter, prompts, args, sampling):
    key = jax.random.key(args.seed)
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
    if method == "plain":
        return lambda: specjax.generate(key, target, prompts, **kw)
    return lambda: specjax.speculative_generate(key, target, drafter, prompts, **kw)


def step_ms(fn, repeats: int) -> tuple[float, float, int]:
    """(min, median) ms per decode step over ``repeats`` runs, and the step count."""
    times, out = time_runs(fn, repeats=repeats, warmup=1)
    steps = int(out.stats.target_calls)  # the same in every run: same key, same drafts
    return min(times) / steps * 1e3, statistics.median(times) / steps * 1e3, steps


def compiled_shapes(method, target, drafter, prompts, args, sampling) -> dict[str, str]:
    """HLO instruction name -> output shape, from the decoder's compiled program."""
    drafter = specjax.drafters.NoDraft() if method == "plain" else drafter
    key = jax.random.key(args.seed)
    options = decoding.checks.DecodeOptions(max_new_tokens=args.max_new_tokens, sampling=sampling)
    p = decoding.checks.prepare(key, target, drafter, prompts, options)
    lowered = decoding.api._generate_jit.lower(
        p.decoder, p.inputs, cache_len=p.cache_len, num_slots=p.num_slots
    )
    return hlo_shapes(lowered.compile().as_text())


def hlo_shapes(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> output shape, from a compiled program's text."""
    return dict(re.findall(r"%([\w.\-]+) = (\S+\[[\d,]*\])", hlo_text))


def op_profile(fn, shapes: dict[str, str], steps: int, runs: int = 3):
    """Per-step microseconds and counts of each (op kind, output shape)."""
    jax.block_until_ready(fn())  # compiled, warm, and finished before the trace starts
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(runs):
                jax.block_until_ready(fn())
        trace = next(Path(tmp).rglob("*.trace.json.gz"))
        events = json.load(gzip.open(trace))["traceEvents"]
    total = collections.Counter()
    count = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(_NOT_OPS):
            continue
        kind = re.sub(r"[.\d]+$", "", name)
        if kind.startswith(_CONTAINERS):
            continue  # their time is the ops inside them
        op = (kind, shapes.get(name, "?"))
        total[op] += e["dur"] / (runs * steps)
        count[op] += 1 / (runs * steps)
    return total, count


def profile_forward(target, args, inner: int = 10) -> int:
    """Per-op profiles of the target's T = 1 and T = γ+1 forwards, and their ratio."""
    medians = {}
    for width in (1, args.gamma + 1):
        fn, fn_args = forward_loop(
            target, args.batch, args.prompt_tokens, width, inner=inner,
            cache_len=args.prompt_tokens + args.max_new_tokens + args.gamma + 1,
        )  # fmt: skip
        shapes = hlo_shapes(fn.lower(*fn_args).compile().as_text())
        call = lambda fn=fn, fn_args=fn_args: fn(*fn_args)  # noqa: E731
        times, _ = time_runs(call, repeats=args.repeats, warmup=1)
        times = [seconds / inner * 1e3 for seconds in times]
        medians[width] = statistics.median(times)
        total, count = op_profile(call, shapes, inner)
        print(
            f"\nforward of T={width} (batch {args.batch}, context {args.prompt_tokens}): "
            f"{medians[width]:.2f} ms median, {min(times):.2f} min; per-op profile "
            f"(µs per forward, profiler on; sum {sum(total.values()):.0f} µs):"
        )
        for op, us in total.most_common(args.top):
            print(f"{us:9.1f} µs  {count[op]:6.1f}×  {op[0]:<32} {op[1]}")
    ratio = medians[args.gamma + 1] / medians[1]
    print(f"\nT={args.gamma + 1} / T=1: {ratio:.2f}×")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="Hugging Face folder of the target (default: bundled)")
    parser.add_argument("--draft", help="Hugging Face folder of the draft")
    parser.add_argument(
        "--method", choices=["draft", "lookup", "block", "plain", "forward"], default="draft"
    )
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument(
        "--target-precision",
        choices=["float32", "int8", "int8-weights"],
        default="float32",
        help="int8 (activations too) only for plain decoding and --method forward",
    )
    parser.add_argument(
        "--draft-precision", choices=["float32", "int8", "int8-weights"], default="float32"
    )
    parser.add_argument(
        "--draft-head", type=int, default=0, help="keep K ids in the draft's head (0: all)"
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompt-tokens", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per measurement")
    parser.add_argument("--top", type=int, default=20, help="ops to list")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny random pair, few tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompt_tokens, args.max_new_tokens, args.repeats = 8, 12, 2

    target, draft, tokenizer = load(args)
    if args.method == "forward":
        return profile_forward(target, args)
    prompts = prompts_of(args, target.vocab_size, tokenizer)
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    drafter = (
        None if args.method == "plain" else make_drafter(args.method, draft, args.gamma, target)
    )
    fn = decode_fn(args.method, target, drafter, prompts, args, sampling)

    best, median, steps = step_ms(fn, args.repeats)
    print(
        f"{args.method} decoding, batch {args.batch}, T={args.temperature:g}"
        + ("" if drafter is None else f", γ={args.gamma}")
        + f": {median:.3f} ms/step median, {best:.3f} min, {steps} steps"
    )

    shapes = compiled_shapes(args.method, target, drafter, prompts, args, sampling)
    total, count = op_profile(fn, shapes, steps)
    print(f"\nper-op profile (µs per step, profiler on; sum {sum(total.values()):.0f} µs):")
    for op, us in total.most_common(args.top):
        print(f"{us:9.1f} µs  {count[op]:6.1f}×  {op[0]:<32} {op[1]}")

    if drafter is None:
        return 0
    context = args.prompt_tokens + args.max_new_tokens // 2
    cache_len = resolve_cache_len(None, args.prompt_tokens, args.max_new_tokens, args.gamma + 1)
    kw = dict(cache_len=cache_len, repeats=args.repeats)
    b = args.batch
    verify = forward_costs(target, b, context, [args.gamma + 1], **kw)[args.gamma + 1] * 1e3
    propose = draft_cost(drafter, b, context, sampling, target=target, **kw) * 1e3
    both = interleaved_cost(target, drafter, b, context, sampling, **kw) * 1e3
    trivial = HashModel(vocab=target.vocab_size)
    trivial_drafter = (
        specjax.DraftModel(trivial, num_draft=args.gamma) if args.method == "draft" else drafter
    )
    if args.method == "block":
        # A trivial target returns no hidden states for the block drafter to read:
        # measure the loop's machinery with prompt lookup at the same γ instead.
        trivial_drafter = specjax.PromptLookup(num_draft=args.gamma)
    loop_only = decode_fn(args.method, trivial, trivial_drafter, prompts, args, sampling)
    machinery, _, _ = step_ms(loop_only, args.repeats)
    print(f"\ncost breakdown at context {context}, cache {cache_len} (ms):")
    rows = [
        (f"verification forward (T={args.gamma + 1})", f"{verify:8.3f}"),
        ("proposal", f"{propose:8.3f}"),
        ("both, back to back in one loop", f"{both:8.3f}  ({both - verify - propose:+.3f})"),
        ("loop machinery (trivial models, min)", f"{machinery:8.3f}"),
        ("measured step (median / min)", f"{median:8.3f} / {best:.3f}"),
    ]
    for label, value in rows:
        print(f"  {label:<40}{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
