"""What position-keyed, exact-tail, coupled decoding costs and gives (BENCHMARKS.md).

Three sections, each printed as a table and written to ``--json``:

* ``loop``: tokens/s of plain ``generate`` and of ``speculative_generate`` (DraftModel,
  γ = 4) on the bundled pair, batch 1 and 16, temperature 0 and 1, 128 new tokens, no
  EOS, from the fastest of ``--repeats`` steady runs (median too). It uses only the
  public API that existed before the loops were merged, so it runs unchanged against
  an older checkout
  (``PYTHONPATH=old/checkout python scripts/bench_reproducible.py --sections loop``):
  that is how "before and after" was measured.
* ``noise``: the cost of one decode step's randomness, in isolation: drawing one token
  per row from ``[B, V]`` probabilities with the old single-key Gumbel-max sampler and
  with `specjax.sample` (per-row position keys, 64-bit exponential races), plus the
  position-key derivation of one speculative step (``B x (γ+1)`` keys, three streams),
  and a flat race over all V tokens (what the two-stage draw for ``V > 2048`` avoids).
* ``coupled``: acceptance rate and tokens per target call of rejection against coupled
  verification on the bundled pair (16 held-out prompts of 64 tokens, 64 new tokens,
  γ = 4), at T = 1 and at T = 0.8 with top-p 0.95, with the bound
  ``(1 - TV) / (1 + TV)`` computed from the rejection run's acceptance (``1 - TV``),
  and a check that coupled output equals plain output token for token.

    python scripts/bench_reproducible.py                    # all sections
    python scripts/bench_reproducible.py --sections noise   # one section
    python scripts/bench_reproducible.py --quick            # smoke test, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.benchmarking.timer import time_runs

CODE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "    for i in range(len(items)):",
]


def _seconds(fn, repeats: int) -> tuple[float, float]:
    """(min, median) seconds of ``fn()`` over ``repeats`` steady runs.

    The minimum is the better estimate on a shared machine: other work only ever
    adds time.
    """
    # Two untimed calls: the first compiles, the second pays one-time runtime set-up.
    times, _ = time_runs(fn, repeats=repeats, warmup=2)
    return min(times), statistics.median(times)


def _pair(quick: bool):
    if quick:
        target = specjax.testing.tiny_model(seed=0, vocab_size=256, init_scale=4.0)
        draft = specjax.testing.tiny_model(seed=1, vocab_size=256, num_layers=1)
        return target, draft, None
    return specjax.default_pair()


def _prompts(tokenizer, batch: int, vocab: int):
    if tokenizer is None:
        rng = np.random.default_rng(0)
        return [list(rng.integers(0, vocab, size=8)) for _ in range(batch)]
    return [tokenizer.encode(CODE_PROMPTS[i % len(CODE_PROMPTS)]).ids for i in range(batch)]


def _loop_row(target, draft, prompts, temperature, args) -> list[dict]:
    sampling = specjax.SamplingConfig(temperature=temperature)
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
    key = jax.random.key(0)
    drafter = specjax.DraftModel(draft, num_draft=4)
    runs = {
        "plain": lambda: specjax.generate(key, target, prompts, **kw).tokens,
        "speculative": lambda: (
            specjax.speculative_generate(key, target, drafter, prompts, **kw).tokens
        ),
    }
    rows = []
    for name, fn in runs.items():
        if name not in args.decoders:
            continue
        fastest, median = _seconds(fn, args.repeats)
        tokens = len(prompts) * args.max_new_tokens
        rows.append(
            dict(decoder=name, batch=len(prompts), temperature=temperature,
                 tokens_per_s=tokens / fastest, median_tokens_per_s=tokens / median)
        )  # fmt: skip
        print(
            f"loop  {name:12s} B={len(prompts):3d} T={temperature}: {tokens / fastest:8.1f} "
            f"tok/s (fastest run; median {tokens / median:.1f})"
        )
    return rows


def bench_loop(args) -> list[dict]:
    target, draft, tokenizer = _pair(args.quick)
    rows = []
    for batch in args.batches:
        prompts = _prompts(tokenizer, batch, target.vocab_size)
        for temperature in (0.0, 1.0):
            rows += _loop_row(target, draft, prompts, temperature, args)
    return rows


def _old_gumbel_sample(key, weights_RxV):
    """The sampler before this change: one key, float32 Gumbel noise, two-stage for V > 2048."""
    r, v = weights_RxV.shape
    if v <= 2048:
        g = jax.random.gumbel(key, (r, v), jnp.float32)
        return jnp.argmax(jnp.where(weights_RxV > 0, jnp.log(weights_RxV) + g, -jnp.inf), -1)
    blocks = -(-v // 256)
    w = jnp.pad(weights_RxV, [(0, 0), (0, blocks * 256 - v)]).reshape(r, blocks, 256)
    k1, k2 = jax.random.split(key)
    mass = jnp.sum(w, -1)
    g1 = jax.random.gumbel(k1, mass.shape, jnp.float32)
    block = jnp.argmax(jnp.where(mass > 0, jnp.log(mass) + g1, -jnp.inf), -1)
    chosen = jnp.take_along_axis(w, block[:, None, None], 1)[:, 0]
    g2 = jax.random.gumbel(k2, chosen.shape, jnp.float32)
    return block * 256 + jnp.argmax(jnp.where(chosen > 0, jnp.log(chosen) + g2, -jnp.inf), -1)


INNER = 50  # draws per timed call, in one jitted loop, so dispatch is not what is timed


def _in_a_loop(draw, batch: int, probs):
    """``draw(i, probs)`` INNER times; probs is an argument, so XLA cannot fold it."""
    body = lambda p: lambda i, acc: acc + draw(i, p)
    loop = jax.jit(lambda p: jax.lax.fori_loop(0, INNER, body(p), jnp.zeros((batch,), jnp.int32)))
    return lambda: loop(probs)


def _noise_row(batch: int, vocab: int, repeats: int, gamma: int = 4) -> dict:
    from specjax import noise

    probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (batch, vocab)), -1)
    row_keys = noise.row_keys(jax.random.key(0), jnp.arange(batch))

    def old(i, probs):
        return _old_gumbel_sample(jax.random.fold_in(jax.random.key(1), i), probs)

    def new(i, probs):
        keys = noise.position_keys(row_keys, jnp.full((batch, 1), i))[:, 0]
        return specjax.sample(noise.stream(keys, noise.SAMPLE), probs)

    def keys_only(i, probs):
        keys = noise.position_keys(row_keys, i + jnp.zeros((batch, gamma + 1), jnp.int32))
        streams = [noise.stream(keys, s) for s in (noise.SAMPLE, noise.DRAFT, noise.ACCEPT)]
        data = sum(jnp.sum(jax.random.key_data(k), axis=(1, 2)) for k in streams)
        return data.astype(jnp.int32)

    def flat(i, probs):
        # The exponential race over all V tokens at once: what the two-stage draw avoids.
        keys = noise.position_keys(row_keys, jnp.full((batch, 1), i))[:, 0]
        exp_BxV = jax.vmap(lambda k: noise.exponential(k, (vocab,)))(keys)
        return specjax.sampling._race_argmax(exp_BxV, probs)

    t_old, t_new, t_keys, t_flat = (
        _seconds(_in_a_loop(f, batch, probs), repeats)[0] / INNER
        for f in (old, new, keys_only, flat)
    )
    print(
        f"noise V={vocab:6d} B={batch:3d}: old gumbel {1e6 * t_old:8.1f} us | new "
        f"{1e6 * t_new:8.1f} us | flat race {1e6 * t_flat:8.1f} us | keys for one γ=4 step "
        f"{1e6 * t_keys:6.1f} us"
    )
    return dict(vocab=vocab, batch=batch, old_gumbel_us=1e6 * t_old, new_sample_us=1e6 * t_new,
                flat_race_us=1e6 * t_flat, position_keys_us=1e6 * t_keys)  # fmt: skip


def bench_noise(args) -> list[dict]:
    return [_noise_row(b, v, args.repeats) for v in args.vocabs for b in args.batches]


def bench_coupled(args) -> list[dict]:
    target, draft, tokenizer = _pair(args.quick)
    if tokenizer is None:
        prompts = _prompts(None, 4, target.vocab_size)
    else:
        from specjax import data

        stream = data.tokenize_documents(tokenizer, data.stdlib_documents("heldout"))
        starts = np.linspace(0, len(stream) - 65, 16).astype(int)
        prompts = [stream[s : s + 64].tolist() for s in starts]
    rows = []
    settings = {
        "T=1": specjax.SamplingConfig(temperature=1.0),
        "T=0.8 top-p 0.95": specjax.SamplingConfig(temperature=0.8, top_p=0.95),
    }
    drafters = {
        "draft_model": specjax.DraftModel(draft, num_draft=4),
        "prompt_lookup": specjax.PromptLookup(num_draft=4),
    }
    key = jax.random.key(0)
    for setting, sampling in settings.items():
        kw = dict(max_new_tokens=args.coupled_tokens, sampling=sampling)
        plain = specjax.generate(key, target, prompts, **kw).to_lists()
        for dname, drafter in drafters.items():
            out = {}
            for mode in ("rejection", "coupled"):
                res = specjax.speculative_generate(
                    key, target, drafter, prompts, verification=mode, **kw
                )
                out[mode] = dict(
                    acceptance=float(res.stats.acceptance_rate),
                    tokens_per_call=float(res.tokens_per_call),
                    equals_plain=res.to_lists() == plain,
                )
            alpha = out["rejection"]["acceptance"]
            row = dict(setting=setting, drafter=dname, bound=alpha / (2 - alpha),
                       **{f"{m}_{k}": v for m, d in out.items() for k, v in d.items()})  # fmt: skip
            rows.append(row)
            print(
                f"coupled {setting:17s} {dname:13s}: rejection {alpha:.3f} "
                f"({out['rejection']['tokens_per_call']:.2f}/call) | coupled "
                f"{out['coupled']['acceptance']:.3f} ({out['coupled']['tokens_per_call']:.2f}/call)"
                f" | bound {row['bound']:.3f} | coupled == plain: {out['coupled']['equals_plain']}"
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sections", nargs="+", default=["loop", "noise", "coupled"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--decoders", nargs="+", default=["plain", "speculative"])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[4096, 49152, 131072])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--coupled-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny models and sizes (smoke)")
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.vocabs, args.max_new_tokens = [2], [512], 8
        args.coupled_tokens, args.repeats = 8, 1
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=Path(specjax.__file__).parent,
        ).stdout.strip()  # fmt: skip
    except OSError:
        commit = ""
    report = dict(specjax=str(Path(specjax.__file__).parent), commit=commit, jax=jax.__version__)
    sections = {"loop": bench_loop, "noise": bench_noise, "coupled": bench_coupled}
    for name in args.sections:
        report[name] = sections[name](args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
