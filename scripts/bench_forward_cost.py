"""How much does scoring T tokens against the KV cache cost, relative to one token?

Speculative decoding pays off when verifying T drafted tokens in one forward
costs about as much as a single decoding step. This measures it: for a few
random Llama-shaped configs (float32, batch 1, a 512-slot cache holding 128
tokens, T = 1, 2, 4, 8, 16) or for a real checkpoint (``--model``: a 256-slot
cache holding 100 tokens, T = 1..6 and 8, the γ + 1 a verify forward scores),
the median (and minimum) wall time of one jitted
``model(tokens[1, T], positions, cache)`` and its ratio to T = 1.

The cache is donated and the returned one fed back in, as a decoder would do,
so the time includes writing T cache entries but no copy of the whole cache.

    python scripts/bench_forward_cost.py            # 15M, 50M and 100M configs
    python scripts/bench_forward_cost.py --quick    # 50M only, fewer repeats
    python scripts/bench_forward_cost.py --model SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from specjax.benchmarking.machine import cpu_name
from specjax.benchmarking.timer import time_interleaved
from specjax.io import load_pretrained
from specjax.models import Model, ModelConfig

CONFIGS = {
    "15M": ModelConfig(
        vocab_size=8192, hidden_size=384, intermediate_size=768, num_layers=6,
        num_heads=6, num_kv_heads=6,
    ),
    "50M": ModelConfig(
        vocab_size=8192, hidden_size=512, intermediate_size=1408, num_layers=12,
        num_heads=8, num_kv_heads=8,
    ),
    "100M": ModelConfig(
        vocab_size=16384, hidden_size=768, intermediate_size=2048, num_layers=12,
        num_heads=12, num_kv_heads=4,
    ),
}  # fmt: skip


def bench(model: Model, ts, *, cache_len: int, prefix: int, repeats: int, warmup: int):
    config = model.config
    # Donating the cache lets XLA write the T new entries in place.
    forward = jax.jit(lambda m, t, p, c: m(t, p, c), donate_argnums=3)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, config.vocab_size, (1, prefix)), jnp.int32)
    _, cache = forward(
        model, prompt, jnp.arange(prefix, dtype=jnp.int32)[None], model.init_cache(1, cache_len)
    )

    carry = {"cache": cache}  # the cache is donated: each forward is fed the last one's

    def call(t):
        tokens = jnp.asarray(rng.integers(0, config.vocab_size, (1, t)), jnp.int32)
        positions = jnp.arange(prefix, prefix + t, dtype=jnp.int32)[None]

        def forward_t():
            logits, carry["cache"] = forward(model, tokens, positions, carry["cache"])
            return logits, carry["cache"]

        return forward_t

    # Round-robin over T, so that load from other processes hits every T alike; the
    # warm-up calls compile each T.
    times, _ = time_interleaved([call(t) for t in ts], repeats, warmup=warmup)
    rows = [(t, statistics.median(s), min(s)) for t, s in zip(ts, times, strict=True)]
    return rows


def describe(name: str, c: ModelConfig) -> str:
    return (
        f"## {name}: {c.num_params() / 1e6:.1f}M params (hidden {c.hidden_size}, "
        f"{c.num_layers} layers, {c.num_heads} heads / {c.num_kv_heads} kv, "
        f"intermediate {c.intermediate_size}, vocab {c.vocab_size})"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        help="a checkpoint (Hugging Face folder or .gguf) loaded in float32, instead of the "
        "random configs",
    )
    parser.add_argument("--quick", action="store_true", help="50M config only, 8 repeats")
    parser.add_argument("--sizes", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    # Defaults depend on --model (see the docstring), hence None here.
    parser.add_argument("--tokens", nargs="+", type=int, help="the Ts to time")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cache-len", type=int)
    parser.add_argument("--prefix", type=int, help="tokens already in the cache")
    args = parser.parse_args()
    real = args.model is not None
    tokens = args.tokens or ([1, 2, 3, 4, 5, 6, 8] if real else [1, 2, 4, 8, 16])
    cache_len = args.cache_len or (256 if real else 512)
    prefix = args.prefix if args.prefix is not None else (100 if real else 128)
    sizes, repeats = (["50M"], 8) if args.quick and not real else (args.sizes, args.repeats)
    if real:
        models = {args.model: lambda: load_pretrained(args.model, dtype=jnp.float32)}
    else:
        models = {name: lambda c=CONFIGS[name]: Model.random(c, seed=0) for name in sizes}

    device = jax.devices()[0]
    where = cpu_name() if device.platform == "cpu" else device.device_kind
    print(f"# {where}; jax {jax.__version__} on {device.platform}; float32, batch 1")
    print(f"# cache {cache_len} slots, {prefix} filled; median of {repeats} runs")
    for name, build in models.items():
        model = build()
        print(f"\n{describe(name, model.config)}")
        rows = bench(
            model, tokens, cache_len=cache_len, prefix=prefix, repeats=repeats,
            warmup=args.warmup,
        )  # fmt: skip
        base, base_min = rows[0][1], rows[0][2]
        print("| T | median ms | ratio to T=1 | min ms | ratio (min) |")
        print("|---:|---:|---:|---:|---:|")
        for t, median, fastest in rows:
            print(
                f"| {t} | {median * 1e3:.2f} | {median / base:.2f} "
                f"| {fastest * 1e3:.2f} | {fastest / base_min:.2f} |"
            )


if __name__ == "__main__":
    main()
