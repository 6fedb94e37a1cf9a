"""Verification microbenchmark: specjax (JAX) against a straightforward PyTorch port.

Measures, for V in {32k, 128k}, B in {1, 8, 64} and γ = 8, the median wall time of one
verification step

* from probabilities: ``rejection_sample(key, draft_tokens, draft_probs, target_probs)``;
* from logits: ``probs_from_logits`` on draft ``[B, γ, V]`` and target ``[B, γ+1, V]``
  logits (temperature 0.8, top-p 0.9), then ``rejection_sample``;

and the same for a PyTorch port of the reference algorithm (batched, sort-based top-p,
``torch.multinomial``). Throughput is reported against the bytes an exact algorithm must
read, next to the machine's measured copy bandwidth. A second table compares the
top-k / top-p threshold search (bisection over float32 bit patterns, as used by
``probs_from_logits``) with sort- and ``lax.top_k``-based thresholds at V = 128k.

Usage::

    python scripts/benchmarks/bench_verify.py            # full run (a few minutes on 2 CPU cores)
    python scripts/benchmarks/bench_verify.py --quick    # tiny sizes, seconds (CI smoke test)

torch is a benchmark-only dependency and is imported here only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from harness.machine import cpu_name
from specjax.core.timing import time_call, time_runs
from specjax.sampling import SamplingConfig, probs_from_logits, sample
from specjax.verification.chain import rejection_sample

TEMPERATURE, TOP_P = 0.8, 0.9


def _median_seconds(fn, repeats: int) -> float:
    warmup_s, _ = time_call(fn)  # warm-up: compilation, allocator, caches
    if warmup_s > 2.0:
        # Multi-second cells (sort-based top-p at B = 64): one timed run keeps the whole
        # benchmark to a few minutes; the spread is small next to the effect measured.
        repeats = 1
    times, _ = time_runs(fn, repeats=repeats)
    return statistics.median(times)


def _jax_timer(fn, *args):
    return lambda: jax.block_until_ready(fn(*args))


def copy_bandwidth_gbs(num_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """numpy copy of a large float32 array: bytes copied per second (each read once)."""
    src = np.ones(num_bytes // 4, np.float32)
    dst = np.empty_like(src)
    seconds = _median_seconds(lambda: np.copyto(dst, src), repeats)
    return num_bytes / seconds / 1e9


def machine_description() -> str:
    return (
        f"{cpu_name()}, {os.cpu_count()} logical CPUs, jax {jax.__version__} "
        f"({jax.default_backend()})"
    )


# --------------------------------------------------------------------------------------
# JAX (specjax).


@jax.jit
def jax_verify_from_probs(key, draft_tokens, draft_probs, target_probs):
    return rejection_sample(key, draft_tokens, draft_probs, target_probs)


@jax.jit
def jax_verify_from_logits(key, draft_tokens, draft_logits, target_logits, config):
    draft_probs = probs_from_logits(draft_logits, config)
    target_probs = probs_from_logits(target_logits, config)
    return rejection_sample(key, draft_tokens, draft_probs, target_probs)


# --------------------------------------------------------------------------------------
# PyTorch port of the reference algorithm (batched over rows).


def torch_probs_from_logits(torch, logits, temperature, top_p):
    """Temperature, then sort-based nucleus filtering, as in common PyTorch samplers."""
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return probs / probs.sum(dim=-1, keepdim=True)


def torch_rejection_sample(torch, generator, draft_tokens, draft_probs, target_probs):
    batch, gamma = draft_tokens.shape
    index = draft_tokens[..., None]
    p = target_probs[:, :gamma].gather(-1, index)[..., 0]
    q = draft_probs.gather(-1, index)[..., 0]
    u = torch.rand(q.shape, generator=generator)
    num_accepted = (u * q < p).to(torch.int32).cumprod(-1).sum(-1)
    rows = torch.arange(batch)
    p_n = target_probs[rows, num_accepted]
    q_n = draft_probs[rows, num_accepted.clamp(max=gamma - 1)]
    q_n = torch.where((num_accepted < gamma)[:, None], q_n, torch.zeros_like(q_n))
    residual = (p_n - q_n).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(
        total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), p_n
    )
    last = torch.multinomial(residual, 1, generator=generator)[:, 0]
    positions = torch.arange(gamma + 1)[None]
    padded = torch.cat([draft_tokens, torch.full((batch, 1), -1)], dim=1)
    tokens = torch.where(positions < num_accepted[:, None], padded, torch.full_like(padded, -1))
    tokens = torch.where(positions == num_accepted[:, None], last[:, None], tokens)
    return tokens, num_accepted


# --------------------------------------------------------------------------------------
# Threshold search: bisection (specjax) against sort / lax.top_k.


def _sort_top_k(probs, k):
    kth = -jnp.sort(-probs, axis=-1)[:, k - 1 : k]
    return jnp.where(probs >= kth, probs, 0.0)


def _lax_top_k(probs, k):
    kth = lax.top_k(probs, k)[0][:, -1:]
    return jnp.where(probs >= kth, probs, 0.0)


def _sort_top_p(probs, top_p):
    desc = -jnp.sort(-probs, axis=-1)
    cumulative = jnp.cumsum(desc, axis=-1)
    first = jnp.sum(cumulative < top_p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(desc, jnp.minimum(first, probs.shape[-1] - 1), axis=-1)
    return jnp.where(probs >= threshold, probs, 0.0)


def threshold_rows(rows: int, vocab: int, repeats: int):
    """Logits -> truncated probabilities, each method doing the same softmax first."""
    logits = 2.0 * jax.random.normal(jax.random.key(0), (rows, vocab))
    top_k, top_p = 50, TOP_P
    softmax = lambda x: jax.nn.softmax(x, axis=-1)
    renorm = lambda x: x / jnp.sum(x, axis=-1, keepdims=True)
    candidates = {
        "top-k=50": {
            "bisection (specjax)": lambda x: probs_from_logits(x, SamplingConfig(top_k=top_k)),
            "jnp.sort": lambda x: renorm(_sort_top_k(softmax(x), top_k)),
            "lax.top_k (static k)": lambda x: renorm(_lax_top_k(softmax(x), top_k)),
        },
        f"top-p={top_p}": {
            "bisection (specjax)": lambda x: probs_from_logits(x, SamplingConfig(top_p=top_p)),
            "jnp.sort + cumsum": lambda x: renorm(_sort_top_p(softmax(x), top_p)),
        },
    }
    results = []
    for task, impls in candidates.items():
        reference = None
        for name, fn in impls.items():
            # Logits are an argument, not a closed-over constant that XLA would fold.
            jitted = jax.jit(fn)
            kept = np.asarray(jitted(logits)) > 0
            if reference is None:
                reference, agree = kept, ""
            else:
                # Bisection is exact; a sort + float32 cumsum can round differently where
                # a prefix mass is within ~1e-7 of top_p.
                same = int((kept == reference).all(-1).sum())
                diff = int((kept != reference).sum(-1).max())
                agree = f"{same}/{rows} rows" + (f" (others: <= {diff} token)" if diff else "")
            seconds = _median_seconds(_jax_timer(jitted, logits), repeats)
            results.append((task, name, seconds, agree))
    return results


# --------------------------------------------------------------------------------------


def verify_rows(vocab: int, batch: int, gamma: int, repeats: int, torch):
    key = jax.random.key(vocab + batch)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    target_logits = 2.0 * jax.random.normal(k1, (batch, gamma + 1, vocab))
    draft_logits = target_logits[:, :gamma] + jax.random.normal(k2, (batch, gamma, vocab))
    config = SamplingConfig(temperature=TEMPERATURE, top_p=TOP_P)
    draft_probs = jax.jit(probs_from_logits)(draft_logits, config)
    target_probs = jax.jit(probs_from_logits)(target_logits, config)
    draft_tokens = jax.jit(sample)(k3, draft_probs)
    jax.block_until_ready((draft_probs, target_probs, draft_tokens))

    # Bytes an exact algorithm must read. From probs: γ scalars from each of p and q plus
    # two full rows (p_n, q_n) per sequence. From logits: every logit once.
    bytes_probs = batch * (2 * vocab + 3 * gamma) * 4
    bytes_logits = batch * (2 * gamma + 1) * vocab * 4

    rows = []
    t = _median_seconds(
        _jax_timer(jax_verify_from_probs, k4, draft_tokens, draft_probs, target_probs), repeats
    )
    rows.append(("specjax", "probs", t, bytes_probs))
    t = _median_seconds(
        _jax_timer(jax_verify_from_logits, k4, draft_tokens, draft_logits, target_logits, config),
        repeats,
    )
    rows.append(("specjax", "logits", t, bytes_logits))

    if torch is not None:
        generator = torch.Generator().manual_seed(0)
        # np.array copies: JAX's host buffers are read-only, torch wants writable ones.
        t_tokens = torch.from_numpy(np.array(draft_tokens, np.int64))
        t_q = torch.from_numpy(np.array(draft_probs))
        t_p = torch.from_numpy(np.array(target_probs))
        t_ql = torch.from_numpy(np.array(draft_logits))
        t_pl = torch.from_numpy(np.array(target_logits))

        def from_probs():
            return torch_rejection_sample(torch, generator, t_tokens, t_q, t_p)

        def from_logits():
            q = torch_probs_from_logits(torch, t_ql, TEMPERATURE, TOP_P)
            p = torch_probs_from_logits(torch, t_pl, TEMPERATURE, TOP_P)
            return torch_rejection_sample(torch, generator, t_tokens, q, p)

        default_threads = torch.get_num_threads()
        # Small steps are a handful of short ops, where OpenMP start-up and spin-waiting
        # can cost more than the work on a busy 2-core machine: report the faster of 1
        # thread and the default. The B = 64 logits steps take seconds and parallelise
        # well, so they run with the default only (keeps the whole run to a few minutes).
        small = batch <= 8
        with torch.inference_mode():
            for source, fn, num_bytes in (
                ("probs", from_probs, bytes_probs),
                ("logits", from_logits, bytes_logits),
            ):
                choices = {1, default_threads} if small or source == "probs" else {default_threads}
                timings = {}
                for threads in sorted(choices):
                    torch.set_num_threads(threads)
                    timings[threads] = _median_seconds(fn, repeats)
                torch.set_num_threads(default_threads)
                threads = min(timings, key=timings.get)
                rows.append((f"torch ({threads} thr)", source, timings[threads], num_bytes))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; finishes in seconds")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch port")
    args = parser.parse_args()

    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: PLC0415  (bench-only dependency)
        except ImportError:
            print("torch not installed: skipping the PyTorch rows")

    if args.quick:
        vocabs, batches, gamma, repeats = (1024,), (1, 2), 4, 2
        threshold_shape, copy_bytes = (4, 4096), 1 << 24
    else:
        vocabs, batches, gamma, repeats = (32_000, 128_000), (1, 8, 64), 8, args.repeats
        threshold_shape, copy_bytes = (72, 128_000), 1 << 29

    start = time.perf_counter()
    print(f"Machine: {machine_description()}")
    if torch is not None:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    copy_gbs = copy_bandwidth_gbs(copy_bytes)
    print(f"numpy copy bandwidth: {copy_gbs:.1f} GB/s (bytes copied per second)\n")

    print(f"Verification step, γ = {gamma}, temperature {TEMPERATURE}, top-p {TOP_P}:\n")
    print("| V | B | impl | from | median ms | MB that must be read | effective GB/s |")
    print("|---:|---:|---|---|---:|---:|---:|")
    for vocab in vocabs:
        for batch in batches:
            # The largest cells take seconds per call; fewer repeats keep the run short.
            cell_repeats = min(repeats, 3) if vocab * batch > 4_000_000 else repeats
            for impl, source, seconds, num_bytes in verify_rows(
                vocab, batch, gamma, cell_repeats, torch
            ):
                print(
                    f"| {vocab} | {batch} | {impl} | {source} | {seconds * 1e3:.2f} "
                    f"| {num_bytes / 1e6:.2f} | {num_bytes / seconds / 1e9:.2f} |",
                    flush=True,
                )

    rows, vocab = threshold_shape
    print(f"\nThreshold search, {rows} rows x V = {vocab} (logits in, truncated probs out):\n")
    print("| filter | method | median ms | same kept set as bisection |")
    print("|---|---|---:|---|")
    for task, name, seconds, agree in threshold_rows(rows, vocab, min(repeats, 3)):
        print(f"| {task} | {name} | {seconds * 1e3:.1f} | {agree} |", flush=True)
    print(f"\nTotal benchmark time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
