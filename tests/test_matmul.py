"""`specjax.models.matmul`: the weight-first product for a few rows on a CPU.

Its values are checked against numpy in float64 (an independent product, not
the function's own definition) for every row count up to past the last padded
size, and the compiled program is checked to take the weight-first form where
the module says it does (the form is the reason it exists: BENCHMARKS.md).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models.matmul import matmul, matmul_rows, weight_first_rows

OUT, IN = 24, 40  # no row count below is OUT or IN, so shapes in the HLO are unambiguous

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU path")


def _operands(rows, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, IN)).astype(dtype), rng.standard_normal((OUT, IN)).astype(
        dtype
    )


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33])
def test_values_are_the_product_for_every_row_count(rows):
    x, w = _operands(rows, seed=rows)
    got = np.asarray(jax.jit(matmul_rows)(x, w))
    assert got.shape == (rows, OUT) and got.dtype == np.float32
    want = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_leading_axes_are_flattened_and_restored():
    x, w = _operands(2 * 3)
    got = jax.jit(matmul)(x.reshape(2, 3, IN), w)
    assert got.shape == (2, 3, OUT)
    np.testing.assert_allclose(got.reshape(6, OUT), x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "rows, padded", [(1, None), (2, 2), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16), (17, None)]
)
def test_the_compiled_product_is_weight_first_where_promised(rows, padded):
    assert weight_first_rows(rows) == padded
    x, w = _operands(rows)
    hlo = jax.jit(matmul_rows).lower(x, w).compile().as_text()
    dots = re.findall(r"(f32\[[\d,]+\])\S* (?:dot|fusion)\(", hlo)
    weight_first = f"f32[{OUT},{padded}]" if padded else None
    if padded:
        assert weight_first in dots, hlo
    else:
        assert f"f32[{OUT},{rows}]" not in dots


def test_other_dtypes_keep_the_ordinary_form():
    x, w = _operands(4, dtype=np.float32)
    x, w = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    hlo = jax.jit(matmul_rows).lower(x, w).compile().as_text()
    assert f"[{OUT},4]" not in hlo
    got = jax.jit(matmul_rows)(x, w)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(got, np.float32),
        np.asarray(x, np.float32) @ np.asarray(w, np.float32).T,
        rtol=2e-2,
        atol=5e-2,
    )
