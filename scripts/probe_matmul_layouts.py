"""Which weight layout makes a T-token matmul cheap on XLA:CPU? (SmolLM2-135M shapes)

Speculative decoding needs a (γ+1)-token forward to cost about as much as a
one-token step: both must read every weight once, and the weights dominate. This
probe times, in float32 at batch 1, for T = 1, 4, 5 and 8:

* **MLP stack**: 30 SwiGLU MLPs of SmolLM2's shape (E = 576, F = 1536; 318 MB of
  weights, so nothing stays in cache), with kernels stored ``[in, out]``
  (``x @ W``, the layout of ``nnx.Linear``, which specjax used before) or
  ``[out, in]`` (``einsum("bte,fe->btf")``, the layout of ``torch.nn.Linear``,
  Hugging Face checkpoints and specjax's ``Dense`` now), and with gate and up
  fused into one ``[E, 2F]`` kernel, and ``[out, in]`` run weight-first for 2-16
  rows (`specjax.models.matmul`, what ``Dense`` does now);
* **LM head**: ``[T, 576] @ [576, 49152]`` (the tied embedding stored as the head
  kernel ``[E, V]``, as specjax did before) against ``einsum`` over the table
  ``[V, E]`` (specjax now).

It only measures; it changes nothing in the library (specjax has since
switched to ``[out, in]``, see BENCHMARKS.md).

    python scripts/probe_matmul_layouts.py
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from specjax.benchmarking.timer import time_runs
from specjax.models.matmul import matmul

E, F, V, L = 576, 1536, 49152, 30


def _ms(fn, args, repeats):
    times, _ = time_runs(fn, *args, repeats=repeats, warmup=1)
    return 1e3 * float(np.median(times))


@jax.jit
def mlp_in_out(x, gates, ups, downs):
    for g, u, d in zip(gates, ups, downs, strict=True):
        x = x + (jax.nn.silu(x @ g) * (x @ u)) @ d
    return x


@jax.jit
def mlp_out_in(x, gates, ups, downs):
    for g, u, d in zip(gates, ups, downs, strict=True):
        h = jax.nn.silu(jnp.einsum("bte,fe->btf", x, g)) * jnp.einsum("bte,fe->btf", x, u)
        x = x + jnp.einsum("btf,ef->bte", h, d)
    return x


@jax.jit
def mlp_weight_first(x, gates, ups, downs):
    # specjax.models.matmul: weight-first products for 2-16 rows, as Dense runs them
    for g, u, d in zip(gates, ups, downs, strict=True):
        x = x + matmul(jax.nn.silu(matmul(x, g)) * matmul(x, u), d)
    return x


@jax.jit
def mlp_fused_gate_up(x, gate_ups, downs):
    for gu, d in zip(gate_ups, downs, strict=True):
        g, u = jnp.split(x @ gu, 2, axis=-1)
        x = x + (jax.nn.silu(g) * u) @ d
    return x


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    key = jax.random.key(0)

    def normal(i, shape):
        return 0.02 * jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32)

    gates = [normal(i, (E, F)) for i in range(L)]
    ups = [normal(100 + i, (E, F)) for i in range(L)]
    downs = [normal(200 + i, (F, E)) for i in range(L)]
    transposed = [[jnp.asarray(w.T) for w in ws] for ws in (gates, ups, downs)]
    gate_ups = [jnp.concatenate([g, u], axis=1) for g, u in zip(gates, ups, strict=True)]
    head_EV = normal(300, (E, V))
    head_VE = jnp.asarray(head_EV.T)
    head_in_out = jax.jit(lambda h, k: h @ k)
    head_out_in = jax.jit(lambda h, k: jnp.einsum("bte,ve->btv", h, k))

    rows = []
    for t in (1, 4, 5, 8):
        x = jax.random.normal(key, (1, t, E), jnp.float32)
        rows.append(
            (
                t,
                _ms(mlp_in_out, (x, gates, ups, downs), args.repeats),
                _ms(mlp_out_in, (x, *transposed), args.repeats),
                _ms(mlp_weight_first, (x, *transposed), args.repeats),
                _ms(mlp_fused_gate_up, (x, gate_ups, downs), args.repeats),
                _ms(head_in_out, (x, head_EV), args.repeats),
                _ms(head_out_in, (x, head_VE), args.repeats),
            )
        )
        print(rows[-1], flush=True)
    print("\n| T | MLP stack [in, out] | MLP stack [out, in] | [out, in] weight-first "
          "| fused gate/up [in, 2F] | head [E, V] | head [V, E] |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for t, *ms in rows:
        print(f"| {t} | " + " | ".join(f"{m:.1f} ms" for m in ms) + " |")
    base = rows[0]
    for r in rows[1:]:
        print(
            f"ratio to T=1 (same form), T={r[0]}: MLP {r[1] / base[1]:.2f}x / "
            f"{r[2] / base[2]:.2f}x / weight-first {r[3] / base[3]:.2f}x, "
            f"head {r[5] / base[5]:.2f}x / {r[6] / base[6]:.2f}x"
        )


if __name__ == "__main__":
    main()
