"""The forward-width guarantee, checked in a process of its own at jax's default flags.

Started by ``tests/test_numerics.py`` in a process of its own: the rest of the suite
runs with XLA's backend optimisation off (it is compile-bound), and the guarantee must
be shown as users decode, with XLA's optimisation on and jax's default matmul
precision. Runnable by hand::

    python tests/numerics_worker.py float32=model-coupled,control int8=eagle-coupled

Each case decodes the bundled pair's prompts with speculative decoding at forward
width W and compares every row with plain decoding at W (`specjax.decoding.numerics`):

* with coupled verification every row must be equal, token for token: the rows mix
  greedy decoding, temperature 1 and truncated sampling;
* with rejection verification (the default) the greedy rows must be equal.

The batch has B = W = γ + 1 rows, so that no two of batch, width and draft axes can be
confused. The control case runs on a target whose head holds near-duplicate rows
(twin tokens whose logits differ by about 1e-7 of their size), where any change in the
rounding of a forward flips greedy choices: there the decoders must agree at one width,
and a decoder patched to score plain decoding one token wide must be caught.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax
from specjax.decoding import checks
from specjax.io.pretrained import default_drafter
from specjax.models.quant import quantize

specjax.core.compilation_cache.enable_from_environment()  # the suite's shared cache

jax.config.update("jax_numpy_rank_promotion", "raise")

PRECISIONS = ("float32", "bfloat16", "int8", "int8-weights")
GAMMA = 4
WIDTH = GAMMA + 1  # every forward's width, the chain's verify width
BATCH = WIDTH  # B == γ + 1 == W
TREE = (2, 1)  # 2 + 2 = 4 drafted nodes: the tree's verify is W wide too
NEW_TOKENS = 24
CACHE_LEN = 128
PROMPTS = (
    "def fibonacci(n):",
    "import os\n\ndef main():",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    "x = [1, 2, 3]\nprint(",
)
NEIGHBOURS = ("while True:", "def add(a, b):\n    return", "import sys", "# a comment\n")
# Per row: greedy, greedy, temperature 1, then top-p and top-k truncation.
SAMPLING = specjax.SamplingConfig(
    temperature=jnp.array([0.0, 0.0, 1.0, 1.0, 0.7]),
    top_p=jnp.array([1.0, 1.0, 1.0, 0.9, 0.9]),
    top_k=jnp.array([0, 0, 0, 0, 20], jnp.int32),
)
GREEDY_ROWS = (0, 1)
CHAIN_DRAFTERS = ("model", "block", "eagle", "lookup")
FEATURES = ("penalties", "constraint", "stop", "refill", "adaptive")


def models(precision: str):
    """``(target, draft LM, tokenizer)`` of the bundled pair in ``precision``."""
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    target, draft, tokenizer = specjax.default_pair(dtype)
    if precision.startswith("int8"):
        target, draft = quantize(target, precision), quantize(draft, precision)
    return target, draft, tokenizer


def drafter(name: str, precision: str, target, draft):
    """The drafter ``name`` at γ = 4 (a tree: `TREE`), bound to ``target``."""
    if name in ("model", "tree"):
        out = specjax.DraftModel(draft, num_draft=GAMMA)
        return out.with_tree(TREE) if name == "tree" else out
    if name == "lookup":
        return specjax.PromptLookup(ngram=2, num_draft=GAMMA)
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    # The bundled block drafter and EAGLE head read the target's hidden states and use
    # its embedding and head: bound to the target as decoded (quantized included).
    return default_drafter(name, num_draft=GAMMA, dtype=dtype).replace(target=target)


def first_difference(a_rows, b_rows) -> list[int | None]:
    """Per row, the first position where the two token lists differ (None: equal)."""
    out = []
    for a, b in zip(a_rows, b_rows, strict=True):
        diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if diff is None and len(a) != len(b):
            diff = min(len(a), len(b))
        out.append(diff)
    return out


def decode(target, drafter_, prompts, *, verification="coupled", width=WIDTH, **kw):
    """Token lists of plain (``drafter_`` None) or speculative decoding at ``width``."""
    kw = {"sampling": SAMPLING, "cache_len": CACHE_LEN, "forward_width": width, **kw}
    key = jax.random.key(0)
    if drafter_ is None:
        out = specjax.generate(key, target, prompts, max_new_tokens=NEW_TOKENS, **kw)
    else:
        out = specjax.speculative_generate(
            key,
            target,
            drafter_,
            prompts,
            max_new_tokens=NEW_TOKENS,
            verification=verification,
            **kw,
        )
    return out.to_lists(), float(out.tokens_per_call)


def compare(plain_rows, spec_rows, verification: str) -> dict:
    """Which rows must be equal, and whether they are."""
    checked = range(BATCH) if verification == "coupled" else GREEDY_ROWS
    diffs = first_difference(plain_rows, spec_rows)
    return {
        "checked_rows": list(checked),
        "first_difference": diffs,
        "equal": all(diffs[r] is None for r in checked),
    }


def twin_head(target, relative: float = 1e-7, seed: int = 0):
    """``target`` whose (tied) embedding rows come in near-duplicate pairs.

    Row 2k+1 is row 2k times ``1 + relative · N(0, 1)`` per entry, so the two tokens'
    logits differ by about ``relative`` of their size: a greedy choice between them
    follows the last bits of the forward that scored it.
    """
    rng = np.random.default_rng(seed)
    leaves = []
    for path, var in nnx.to_flat_state(target.params):
        if path[-1] == "embedding":
            table = np.asarray(var.get_value(), np.float32).copy()
            noise = rng.standard_normal(table[0::2].shape)
            table[1::2] = table[0::2] * (1 + relative * noise)
            var = var.replace(jnp.asarray(table, var.get_value().dtype))
        leaves.append((path, var))
    return target.replace(params=nnx.from_flat_state(leaves))


def run_case(case: str, precision: str, target, draft, ids, plain_rows) -> list[dict]:
    """One case's comparisons: ``DRAFTER-VERIFICATION`` (e.g. ``model-coupled``, a
    ``tree``), ``neighbours``, ``control``, or a decoder feature of `FEATURES`."""
    name, _, verification = case.partition("-")
    if name in (*CHAIN_DRAFTERS, "tree"):
        d = drafter(name, precision, target, draft)
        rows, per_call = decode(target, d, ids, verification=verification)
        return [dict(compare(plain_rows, rows, verification), tokens_per_call=per_call)]
    if case == "neighbours":
        # Row 0 keeps its prompt; the four others change. At one batch size and shape a
        # row's tokens must not depend on them, plain or speculative.
        other = [ids[0]] + [target.tokenizer.encode(p).ids for p in NEIGHBOURS]
        d = drafter("model", precision, target, draft)
        spec_rows, _ = decode(target, d, ids)
        out = []
        for name, fn in (
            ("plain", lambda p: decode(target, None, p)[0]),
            ("speculative", lambda p: decode(target, d, p)[0]),
        ):
            base = plain_rows if name == "plain" else spec_rows
            diff = first_difference(base[:1], fn(other)[:1])[0]
            out.append({"decoder": name, "first_difference": [diff], "equal": diff is None})
        return out
    if case == "control":
        twin = twin_head(target)
        d = drafter("model", precision, twin, draft)
        spec_rows, _ = decode(twin, d, ids)
        plain_same, _ = decode(twin, None, ids)
        # The bug: plain decoding scored one token wide whatever W says.
        real = checks.check_forward_width
        checks.check_forward_width = lambda w, dr: 1 if dr.null_drafter else real(w, dr)
        try:
            plain_narrow, _ = decode(twin, None, ids)
        finally:
            checks.check_forward_width = real
        return [
            dict(compare(plain_same, spec_rows, "coupled"), decoder="at the same width"),
            dict(compare(plain_narrow, spec_rows, "coupled"), decoder="patched: plain 1 wide"),
        ]
    if case in FEATURES:
        return [run_feature(case, precision, target, draft, ids)]
    raise ValueError(f"unknown case {case!r}")


def run_feature(case: str, precision: str, target, draft, ids) -> dict:
    """A decoder feature on top of the draft model, coupled: every row must be equal."""
    d = drafter("model", precision, target, draft)
    kw, spec_kw = {}, {}
    if case == "penalties":
        kw["sampling"] = SAMPLING.replace(
            repetition_penalty=jnp.array([1.3, 1.0, 1.2, 1.0, 1.1]),
            presence_penalty=jnp.array([0.0, 0.5, 0.0, 0.3, 0.0]),
            frequency_penalty=jnp.array([0.0, 0.0, 0.4, 0.0, 0.2]),
        )
    elif case == "constraint":
        kw["constraint"] = specjax.Constraint.regex(
            r"( [a-z_]+\(\)\n){1,4}", target.tokenizer, target.vocab_size
        )
    elif case == "stop":
        kw["stop"] = ["\n", "):", "()"]
    elif case == "refill":
        kw["num_slots"] = 2
    elif case == "adaptive":
        spec_kw = dict(gamma_by_active_rows={2: GAMMA, 5: 2}, draft_confidence=0.5)
    plain_rows, _ = decode(target, None, ids, **kw)
    rows, per_call = decode(target, d, ids, **kw, **spec_kw)
    return dict(compare(plain_rows, rows, "coupled"), tokens_per_call=per_call)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "groups",
        nargs="+",
        metavar="PRECISION=CASE,CASE",
        help=f"a precision ({', '.join(PRECISIONS)}) and its cases, run in this order",
    )
    parser.add_argument("--out", help="write the JSON report here (default: stdout)")
    args = parser.parse_args(argv)
    report = {"jax": jax.__version__, "backend": jax.default_backend(), "results": {}}
    start = time.perf_counter()
    for group in args.groups:
        precision, _, cases = group.partition("=")
        if precision not in PRECISIONS:
            parser.error(f"unknown precision {precision!r} in {group!r}")
        target, draft, tokenizer = models(precision)
        ids = [tokenizer.encode(p).ids for p in PROMPTS]
        plain_rows, _ = decode(target, None, ids)
        for case in cases.split(","):
            t = time.perf_counter()
            try:
                results = run_case(case, precision, target, draft, ids, plain_rows)
            except Exception:  # one case's failure, reported as that case's, not all
                results = [{"equal": False, "error": traceback.format_exc()}]
            seconds = time.perf_counter() - t
            report["results"].setdefault(precision, {})[case] = {
                "comparisons": results,
                "seconds": seconds,
            }
            print(
                f"numerics_worker {precision} {case}: {seconds:.1f} s", file=sys.stderr, flush=True
            )
    report["seconds"] = time.perf_counter() - start
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
