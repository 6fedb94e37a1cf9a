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

The two sides get the same inputs, warm-up and repeats, each in a process of its own:
this process times specjax and saves the inputs, then a second one (``--side torch``)
loads them and times the port, with torch's thread count the fastest of 1 .. every
core per cell. Writes ``--json`` (default ``scripts/benchmarks/results/verify/cpu.json``)
with the date, the commit, the command and the machine.

Usage::

    python scripts/benchmarks/bench_verify.py            # full run (a few minutes on 2 CPU cores)
    python scripts/benchmarks/bench_verify.py --quick    # tiny sizes, seconds (CI smoke test)

torch is a benchmark-only dependency and is imported here only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from harness.machine import RESULTS, cpu_name, run_record
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
    at_t1 = SamplingConfig(temperature=1.0)  # softmax at temperature 1, as the others
    candidates = {
        "top-k=50": {
            "bisection (specjax)": lambda x: probs_from_logits(x, at_t1.replace(top_k=top_k)),
            "jnp.sort": lambda x: renorm(_sort_top_k(softmax(x), top_k)),
            "lax.top_k (static k)": lambda x: renorm(_lax_top_k(softmax(x), top_k)),
        },
        f"top-p={top_p}": {
            "bisection (specjax)": lambda x: probs_from_logits(x, at_t1.replace(top_p=top_p)),
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


def verify_inputs(vocab: int, batch: int, gamma: int) -> dict:
    """One cell's inputs, as numpy arrays (the same for both sides)."""
    key = jax.random.key(vocab + batch)
    k1, k2, k3 = jax.random.split(key, 3)
    target_logits = 2.0 * jax.random.normal(k1, (batch, gamma + 1, vocab))
    draft_logits = target_logits[:, :gamma] + jax.random.normal(k2, (batch, gamma, vocab))
    config = SamplingConfig(temperature=TEMPERATURE, top_p=TOP_P)
    draft_probs = jax.jit(probs_from_logits)(draft_logits, config)
    target_probs = jax.jit(probs_from_logits)(target_logits, config)
    draft_tokens = jax.jit(sample)(k3, draft_probs)
    found = dict(
        draft_tokens=draft_tokens,
        draft_probs=draft_probs,
        target_probs=target_probs,
        draft_logits=draft_logits,
        target_logits=target_logits,
    )
    return {name: np.asarray(value) for name, value in found.items()}


def must_read(vocab: int, batch: int, gamma: int) -> dict:
    """Bytes an exact algorithm must read. From probs: γ scalars from each of p and q plus
    two full rows (p_n, q_n) per sequence. From logits: every logit once."""
    return {
        "probs": batch * (2 * vocab + 3 * gamma) * 4,
        "logits": batch * (2 * gamma + 1) * vocab * 4,
    }


def specjax_rows(inputs: dict, repeats: int, key) -> list[tuple]:
    """specjax's ``(impl, source, seconds)`` of one cell."""
    x = {name: jnp.asarray(value) for name, value in inputs.items()}
    config = SamplingConfig(temperature=TEMPERATURE, top_p=TOP_P)
    probs = _jax_timer(
        jax_verify_from_probs, key, x["draft_tokens"], x["draft_probs"], x["target_probs"]
    )
    logits = _jax_timer(
        jax_verify_from_logits,
        key,
        x["draft_tokens"],
        x["draft_logits"],
        x["target_logits"],
        config,
    )
    return [
        ("specjax", "probs", _median_seconds(probs, repeats)),
        ("specjax", "logits", _median_seconds(logits, repeats)),
    ]


def torch_rows(torch, inputs: dict, repeats: int) -> list[tuple]:
    """The PyTorch port's ``(impl, source, seconds)`` of one cell, each at the fastest
    thread count of 1 .. every core."""
    generator = torch.Generator().manual_seed(0)
    t = {name: torch.from_numpy(np.array(value)) for name, value in inputs.items()}
    tokens = t["draft_tokens"].to(torch.int64)

    def from_probs():
        return torch_rejection_sample(torch, generator, tokens, t["draft_probs"], t["target_probs"])

    def from_logits():
        q = torch_probs_from_logits(torch, t["draft_logits"], TEMPERATURE, TOP_P)
        p = torch_probs_from_logits(torch, t["target_logits"], TEMPERATURE, TOP_P)
        return torch_rejection_sample(torch, generator, tokens, q, p)

    rows = []
    with torch.inference_mode():
        for source, fn in (("probs", from_probs), ("logits", from_logits)):
            timings = {}
            for threads in range(1, (os.cpu_count() or 1) + 1):
                torch.set_num_threads(threads)
                timings[threads] = _median_seconds(fn, repeats)
            threads = min(timings, key=timings.get)
            rows.append((f"torch ({threads} thr)", source, timings[threads]))
    return rows


def cells(quick: bool, repeats: int):
    """``(vocab, batch, gamma, repeats)`` of every cell of the verification table."""
    vocabs, batches, gamma = ((1024,), (1, 2), 4) if quick else ((32_000, 128_000), (1, 8, 64), 8)
    for vocab in vocabs:
        for batch in batches:
            # The largest cells take seconds per call; fewer repeats keep the run short.
            yield vocab, batch, gamma, min(repeats, 3) if vocab * batch > 4_000_000 else repeats


def torch_side(args) -> int:
    """``--side torch``: the port on the inputs the specjax side saved, in this process."""
    import torch  # noqa: PLC0415  (bench-only dependency)

    rows = []
    for vocab, batch, _, repeats in cells(args.quick, args.repeats):
        inputs = dict(np.load(Path(args.inputs) / f"{vocab}_{batch}.npz"))
        for impl, source, seconds in torch_rows(torch, inputs, repeats):
            rows.append(dict(vocab=vocab, batch=batch, impl=impl, source=source, seconds=seconds))
    Path(args.inputs, "torch.json").write_text(json.dumps(dict(torch=torch.__version__, rows=rows)))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; finishes in seconds")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch port")
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "verify" / "cpu.json",
        help="write the results here (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--side", choices=["specjax", "torch"], default="specjax",
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "torch":
        return torch_side(args)

    threshold_shape, copy_bytes = ((4, 4096), 1 << 24) if args.quick else ((72, 128_000), 1 << 29)
    start = time.perf_counter()
    print(f"Machine: {machine_description()}")
    copy_gbs = copy_bandwidth_gbs(copy_bytes)
    print(f"numpy copy bandwidth: {copy_gbs:.1f} GB/s (bytes copied per second)\n")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for vocab, batch, gamma, repeats in cells(args.quick, args.repeats):
            inputs = verify_inputs(vocab, batch, gamma)
            np.savez(Path(scratch) / f"{vocab}_{batch}.npz", **inputs)
            key = jax.random.key(vocab + batch + 1)
            for impl, source, seconds in specjax_rows(inputs, repeats, key):
                rows.append(
                    dict(vocab=vocab, batch=batch, impl=impl, source=source, seconds=seconds)
                )
        torch_version = None
        if not args.no_torch:
            cmd = [sys.executable, __file__, "--side", "torch", "--inputs", scratch]
            cmd += ["--repeats", str(args.repeats)] + (["--quick"] if args.quick else [])
            done = subprocess.run(cmd)
            if done.returncode == 0:
                found = json.loads(Path(scratch, "torch.json").read_text())
                rows += found["rows"]
                torch_version = found["torch"]
            else:
                print("the torch side failed (is torch installed?): no PyTorch rows")
    gamma = next(cells(args.quick, args.repeats))[2]
    print(f"Verification step, γ = {gamma}, temperature {TEMPERATURE}, top-p {TOP_P}:\n")
    print("| V | B | impl | from | median ms | MB that must be read | effective GB/s |")
    print("|---:|---:|---|---|---:|---:|---:|")
    rows.sort(key=lambda r: (r["vocab"], r["batch"], r["impl"] != "specjax", r["source"]))
    for r in rows:
        r["must_read_bytes"] = must_read(r["vocab"], r["batch"], gamma)[r["source"]]
        r["effective_gbs"] = r["must_read_bytes"] / r["seconds"] / 1e9
        print(
            f"| {r['vocab']} | {r['batch']} | {r['impl']} | {r['source']} | "
            f"{r['seconds'] * 1e3:.2f} | {r['must_read_bytes'] / 1e6:.2f} | "
            f"{r['effective_gbs']:.2f} |"
        )

    n_rows, vocab = threshold_shape
    print(f"\nThreshold search, {n_rows} rows x V = {vocab} (logits in, truncated probs out):\n")
    print("| filter | method | median ms | same kept set as bisection |")
    print("|---|---|---:|---|")
    thresholds = []
    for task, name, seconds, agree in threshold_rows(n_rows, vocab, min(args.repeats, 3)):
        print(f"| {task} | {name} | {seconds * 1e3:.1f} | {agree} |", flush=True)
        thresholds.append(dict(filter=task, method=name, seconds=seconds, agreement=agree))
    results = dict(
        run_record(),
        torch=torch_version,
        copy_bandwidth_gbs=copy_gbs,
        gamma=gamma,
        verify=rows,
        thresholds=thresholds,
        wall_s=time.perf_counter() - start,
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nTotal benchmark time: {results['wall_s']:.0f} s; wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
