"""``x · wᵀ`` for a handful of rows, in the form XLA:CPU runs fastest.

A verify forward multiplies γ+1 rows (tokens) by every weight matrix, and at
batch 1 that product is bound by reading the weights. XLA:CPU runs one row
through a matrix–vector kernel at the memory's speed, but ``x [M, I] · w [O, I]ᵀ``
for M ≥ 2 through a kernel that reads the weights more slowly: in that form a verify
of a few tokens costs well over a one-token step, a ratio that caps what speculation
can gain on a CPU whatever the drafter.

The same product written weight-first, ``w [O, I] · x [M, I]ᵀ → [O, M]``, with the
``[O, M]`` result kept in that layout, runs 2 to 4 rows near the one-row cost and 8
or 16 rows faster than the row-first form; 5–7 and 9–15 rows are about as slow
as the row-first form, so they are padded up to 8 or 16 zero rows (a zero row changes
no other row's sum). The transpose back to ``[M, O]`` must not be folded into the
product: XLA would then pick the row-first kernel again, so an
``optimization_barrier`` keeps the two apart (the transpose itself moves M · O
floats, nothing next to the O · I weights). BENCHMARKS.md ("What bounds the speedup
on a CPU: the step costs") has both forms' costs on Qwen2.5-Coder-1.5B.

Only the float32 product in a program compiled for a CPU takes this path: other
platforms and dtypes have their own kernels, and one row (a plain decoding step) and
more than 16 rows (a prompt's prefill, where the product is bound by arithmetic) keep
the ordinary form. The platform is the one the program is compiled for
(`specjax.core.platform`), so a program compiled on a CPU host for a TPU or GPU
takes the chip's form. The values are the float32 product either way; only the
summation order may differ, as between any two kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.core.platform import by_platform

# Row counts the weight-first kernel runs well; others are padded up to the next.
_FAST_ROWS = (2, 3, 4, 8, 16)


def weight_first_rows(rows: int) -> int | None:
    """The padded row count the weight-first form uses for ``rows`` on a CPU, or None
    for the ordinary form (one row, or more than 16)."""
    if rows < 2 or rows > _FAST_ROWS[-1]:
        return None
    return next(m for m in _FAST_ROWS if m >= rows)


def matmul_rows(x_MI: jax.Array, weight_OI: jax.Array) -> jax.Array:
    """``x · weightᵀ``: ``[M, I] × [O, I] → [M, O]`` in the weight's dtype.

    Args:
        x_MI: the rows (tokens), cast to the weight's dtype.
        weight_OI: the matrix, stored ``[out, in]`` like ``torch.nn.Linear``.

    Returns:
        ``[M, O]``, the same values as ``x @ weight.T`` up to summation order.
    """
    x_MI = x_MI.astype(weight_OI.dtype)
    rows = x_MI.shape[0]
    padded = weight_first_rows(rows) if weight_OI.dtype == jnp.float32 else None
    if padded is None:
        return _row_first(x_MI, weight_OI)

    def weight_first(x_MI, weight_OI):
        if padded > rows:
            x_MI = jnp.pad(x_MI, ((0, padded - rows), (0, 0)))
        y_OM = jax.lax.dot_general(weight_OI, x_MI, (((1,), (1,)), ((), ())))
        # Keeps XLA from folding the transpose into the product (see the module docstring).
        y_OM = jax.lax.optimization_barrier(y_OM)
        return y_OM.T[:rows]

    return by_platform(x_MI, weight_OI, cpu=weight_first, other=_row_first)


def _row_first(x_MI: jax.Array, weight_OI: jax.Array) -> jax.Array:
    """The ordinary ``x · weightᵀ``."""
    return jax.lax.dot_general(x_MI, weight_OI, (((1,), (1,)), ((), ())))


def matmul(x: jax.Array, weight_OI: jax.Array) -> jax.Array:
    """``x · weightᵀ`` for ``x [..., I]``: :func:`matmul_rows` over the flattened rows."""
    lead = x.shape[:-1]
    y = matmul_rows(x.reshape(-1, x.shape[-1]), weight_OI)
    return y.reshape(*lead, weight_OI.shape[0])


def einsum_f32(subscripts: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``jnp.einsum(subscripts, a, b)`` accumulated and returned in float32, any input dtype.

    Attention scores are summed in float32 whatever the cache's dtype. XLA:CPU has no
    kernel for a bfloat16 × bfloat16 → float32 product (for some shapes it fails at run
    time: "Unsupported element type for DotThunk"), so in a program compiled for a CPU
    the operands are widened first; other platforms multiply them as they are. That is
    exact: every bfloat16 (and float16) value is a float32, and their products are
    exact in float32, so the sums are the same float32 sums.
    """

    def product(a, b):
        return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)

    def widened(a, b):
        return product(a.astype(jnp.float32), b.astype(jnp.float32))

    return by_platform(a, b, cpu=widened, other=product)
