"""Tests for specjax.sampling: SamplingConfig, probs_from_logits and sample.

Truncation (top-k, top-p, min-p) is compared with a straightforward sort-based numpy
reference. Statistical checks of `sample` draw N = 200k tokens in one jitted call with a
fixed key; each uses a per-check false-alarm rate ALPHA = 1e-6 (this file runs fewer
than 10 such checks).
"""

from __future__ import annotations

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from support import samples_chi2_pvalue

from specjax.sampling import (
    SamplingConfig,
    apply_sampling,
    check_sampling_config,
    greedy_tokens,
    probs_from_logits,
    sample,
)

ALPHA = 1e-6
NUM_DRAWS = 200_000
# One compiled program per shape; eager dispatch would compile every op separately.
_jitted_probs = jax.jit(probs_from_logits)


# --------------------------------------------------------------------------------------
# SamplingConfig.


def test_config_fields_are_canonical_array_leaves():
    config = SamplingConfig(temperature=0.7, top_k=5, top_p=1, min_p=np.float64(0.1))
    leaves = jax.tree.leaves(config)
    assert len(leaves) == 4
    assert [np.asarray(x).dtype for x in leaves] == [np.float32, np.int32, np.float32, np.float32]
    assert SamplingConfig.greedy().temperature == 0
    # The default is greedy, as on the command line.
    assert SamplingConfig().temperature == 0 and SamplingConfig() == SamplingConfig.greedy()
    # Arrays (and tracers) are kept as given.
    assert isinstance(SamplingConfig(temperature=jnp.ones(3)).temperature, jax.Array)


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", 1.0),
        ("min_p", -0.1),
        ("top_p", np.array([0.5, 2.0])),
    ],
)
def test_validate_names_the_bad_field(field, value):
    config = SamplingConfig(**{field: value})
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
        config.validate()
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
        check_sampling_config(config)


def test_validate_accepts_good_values_and_skips_tracers():
    config = SamplingConfig(temperature=0.0, top_k=3, top_p=1.0, min_p=0.0)
    assert config.validate() is config
    with pytest.raises(ValueError, match="SamplingConfig.top_k must be an integer"):
        SamplingConfig(top_k=2.5)

    @jax.jit
    def traced(temperature):
        check_sampling_config(SamplingConfig(temperature=temperature))  # must not raise
        return temperature

    traced(-1.0)


def test_changing_config_values_does_not_recompile():
    traces = []

    @jax.jit
    def probs(logits, config):
        traces.append(1)
        return probs_from_logits(logits, config)

    logits = jnp.zeros((2, 5))
    for config in (
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.3, top_k=2),
        SamplingConfig.greedy(),
        SamplingConfig(temperature=jnp.float32(2.0), top_p=0.5, min_p=0.1),
        SamplingConfig(temperature=1, top_k=np.int64(4)),
    ):
        probs(logits, config)
    assert len(traces) == 1


# --------------------------------------------------------------------------------------
# probs_from_logits.


def _softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_logits(temperature):
    logits = np.random.default_rng(0).normal(size=(4, 37)).astype(np.float32) * 3
    got = _jitted_probs(logits, SamplingConfig(temperature=temperature))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, _softmax64(logits / temperature), rtol=1e-5, atol=1e-7)


def _reference_truncation(probs32, top_k, top_p, min_p):
    """Sort-based top-k, then top-p on the renormalised survivors, then min-p (one row)."""
    p = np.asarray(probs32, np.float64)
    keep = np.ones(p.shape, bool)
    if top_k > 0:
        keep &= p >= np.sort(p)[::-1][min(top_k, p.shape[0]) - 1]
    if top_p < 1:
        kept = np.where(keep, p, 0.0)
        kept /= kept.sum()
        desc = np.sort(kept)[::-1]
        cumulative = np.cumsum(desc)
        m = int(np.searchsorted(cumulative, top_p))  # first prefix whose mass >= top_p
        keep &= kept >= desc[m]
        # Float32 sums in the implementation may disagree only if a prefix mass is within
        # rounding of top_p; the caller skips such rows.
        ambiguous = np.abs(cumulative - top_p).min() < 1e-5
    else:
        ambiguous = False
    if min_p > 0:
        keep &= probs32 >= np.float32(min_p) * probs32.max()
    out = np.where(keep, p, 0.0)
    return out / out.sum(), ambiguous


@pytest.mark.parametrize("vocab", [50, 3000])
def test_truncation_matches_sort_reference(vocab):
    rng = np.random.default_rng(vocab)
    rows = 48
    # Logits on a coarse grid, so many probabilities tie exactly (also at thresholds).
    logits = (rng.integers(-6, 6, (rows, vocab)) * 0.5).astype(np.float32)
    logits[: rows // 2] += rng.normal(size=(rows // 2, vocab)).astype(np.float32)
    top_k = rng.choice([0, 1, 3, 10, vocab, vocab + 5], rows).astype(np.int32)
    top_p = rng.choice([1.0, 0.05, 0.37, 0.8, 0.95, 0.999], rows).astype(np.float32)
    min_p = rng.choice([0.0, 0.0, 0.05, 0.3], rows).astype(np.float32)
    config = SamplingConfig(temperature=0.9, top_k=top_k, top_p=top_p, min_p=min_p)
    got = np.asarray(_jitted_probs(logits, config))
    # Same leaf shapes as `config`: the same compiled program.
    untruncated = SamplingConfig(
        temperature=np.full(rows, 0.9), top_k=0 * top_k, top_p=np.ones(rows), min_p=0 * min_p
    )
    untruncated = np.asarray(_jitted_probs(logits, untruncated))
    checked = 0
    for r in range(rows):
        expected, ambiguous = _reference_truncation(untruncated[r], top_k[r], top_p[r], min_p[r])
        if ambiguous:
            continue
        checked += 1
        np.testing.assert_array_equal(got[r] > 0, expected > 0, err_msg=f"row {r}")
        np.testing.assert_allclose(got[r], expected, rtol=1e-5, atol=1e-8, err_msg=f"row {r}")
    assert checked >= rows * 3 // 4


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    logits=hnp.arrays(np.float32, (12,), elements=st.sampled_from([-3.0, -1.0, 0.0, 0.5, 2.0])),
    top_k=st.integers(0, 14),
    top_p=st.sampled_from([1.0, 0.1, 0.3, 0.55, 0.7, 0.9]),
    min_p=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_truncation_matches_reference_property(logits, top_k, top_p, min_p):
    """Random tied logits and knobs (one compiled program: knobs are traced)."""
    config = SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    got = np.asarray(_jitted_probs(logits, config))
    expected, ambiguous = _reference_truncation(
        np.asarray(_jitted_probs(logits, SamplingConfig(temperature=1.0))), top_k, top_p, min_p
    )
    if not ambiguous:
        np.testing.assert_array_equal(got > 0, expected > 0)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-8)


def test_top_k_keeps_ties_and_top_p_keeps_boundary_ties():
    logits = jnp.log(jnp.asarray([[0.4, 0.2, 0.2, 0.1, 0.1]]))
    np.testing.assert_allclose(
        _jitted_probs(logits, SamplingConfig(temperature=1.0, top_k=2)),
        [[0.5, 0.25, 0.25, 0, 0]],
        rtol=1e-6,
    )
    # 0.4 < 0.5 = top_p: the next probability (0.2) joins, with its tie.
    np.testing.assert_allclose(
        _jitted_probs(logits, SamplingConfig(temperature=1.0, top_p=0.5)),
        [[0.5, 0.25, 0.25, 0, 0]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        _jitted_probs(logits, SamplingConfig(temperature=1.0, min_p=0.45)),
        [[0.5, 0.25, 0.25, 0, 0]],
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.6, top_k=40, top_p=0.9),
        SamplingConfig.greedy(),
    ],
    ids=["t1", "truncated", "greedy"],
)
def test_bf16_logits_give_normalised_float32(config):
    logits = (4 * jax.random.normal(jax.random.key(0), (3, 5, 1000))).astype(jnp.bfloat16)
    probs = _jitted_probs(logits, config)
    assert probs.dtype == jnp.float32 and probs.shape == logits.shape
    assert not jnp.isnan(probs).any() and (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    expected = _jitted_probs(logits.astype(jnp.float32), config)
    np.testing.assert_array_equal(probs, expected)


_DEGENERATE_CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.5, top_k=2, top_p=0.5, min_p=0.2),
    SamplingConfig.greedy(),
]


@pytest.mark.parametrize("config", _DEGENERATE_CONFIGS, ids=["plain", "truncated", "greedy"])
def test_degenerate_logits_follow_documented_behaviour(config):
    inf, nan = np.inf, np.nan
    logits = jnp.asarray(
        [
            [-inf, -inf, -inf, -inf],  # no usable logit: uniform (greedy: token 0)
            [nan, nan, nan, nan],  # idem
            [nan, -inf, nan, -inf],  # idem
            [nan, 1.0, nan, 1.0],  # NaN is -inf: uniform over the rest
            [inf, 0.0, inf, nan],  # uniform over +inf tokens
            [3e38, -3e38, 0.0, 3e38],  # finite extremes: no overflow
        ],
        jnp.float32,
    )
    probs = np.asarray(_jitted_probs(logits, config))
    assert not np.isnan(probs).any()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    if config.temperature == 0:
        np.testing.assert_array_equal(probs.argmax(-1), [0, 0, 0, 1, 0, 0])
        assert (probs.max(-1) == 1).all()
    else:
        np.testing.assert_allclose(probs[:3], 0.25)
        np.testing.assert_allclose(
            probs[3:], [[0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0.5, 0, 0, 0.5]]
        )


def test_greedy_is_one_hot_of_lowest_argmax_per_row():
    logits = jnp.asarray([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, -1.0, 5.0, 5.0]])
    probs = _jitted_probs(logits, SamplingConfig.greedy())
    np.testing.assert_array_equal(probs, np.eye(4)[[1, 0, 2]])
    np.testing.assert_array_equal(greedy_tokens(logits), [1, 0, 2])
    # Per-row temperature: greedy and sampled rows in one call.
    mixed = _jitted_probs(logits, SamplingConfig(temperature=jnp.asarray([0.0, 1.0, 0.0])))
    np.testing.assert_array_equal(mixed[0], np.eye(4)[1])
    np.testing.assert_allclose(mixed[1], 0.25)
    np.testing.assert_array_equal(mixed[2], np.eye(4)[2])


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9),
        # Few distinct values, so that ties are common; infinities and NaN included.
        elements=st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0, np.inf, np.nan]),
    )
)
def test_greedy_tokens_equal_numpy_argmax_with_nan_as_minus_inf(logits):
    # greedy_tokens is a max then the lowest index holding it (vectorises on CPU);
    # it must agree with argmax exactly, ties and non-finite values included.
    expected = np.argmax(np.where(np.isnan(logits), -np.inf, logits), axis=-1)
    np.testing.assert_array_equal(jax.jit(greedy_tokens)(logits), expected)


# --------------------------------------------------------------------------------------
# sample.


@functools.partial(jax.jit, static_argnums=2)
def _sample_many(key, weights_V, num_draws):
    # vmap over keys with shared weights: the weights are never copied num_draws times.
    return jax.vmap(lambda k: sample(k, weights_V))(jax.random.split(key, num_draws))


def _flat_weights():
    # Unnormalised; zero, negative and NaN entries must never be drawn.
    return np.asarray([0.0, 1.0, 5.0, 0.0, 2.0, 1e-30, -1.0, np.nan, 3.0, 0.5], np.float32)


def _blocked_weights():
    # V > 2048: the two-stage (block, then token) path. Mass spread over several blocks,
    # several tokens per block, and one block holding only tiny and denormal weights.
    rng = np.random.default_rng(0)
    weights = np.zeros(5000, np.float32)
    support = rng.choice(5000, 60, replace=False)
    weights[support] = rng.dirichlet(np.ones(60)).astype(np.float32)
    weights[4100:4104] = [1e-38, 1e-44, 0.0, 0.2]
    weights[7] = np.nan
    weights[8] = -2.0
    return weights


@pytest.mark.parametrize("weights", [_flat_weights(), _blocked_weights()], ids=["flat", "blocked"])
# Fast tier: the flat race; the blocked one (V > 2048, about 12 s) is slow.
@pytest.mark.first_case_fast
def test_sample_follows_weights_and_never_draws_zeros(weights):
    """N = 200k draws; chi-square with pooled small cells, ALPHA = 1e-6; any draw of a
    zero, negative or NaN weight fails outright."""
    draws = np.asarray(_sample_many(jax.random.key(0), jnp.asarray(weights), NUM_DRAWS))
    assert draws.dtype == np.int32
    valid = np.nan_to_num(weights, nan=0.0) > 0
    assert valid[draws].all(), "drew a token with weight <= 0 or NaN"
    assert samples_chi2_pvalue(draws, np.where(valid, weights, 0.0)) > ALPHA


def test_sample_shapes_determinism_and_degenerate_rows():
    key = jax.random.key(3)
    jitted = jax.jit(sample)
    probs = jax.nn.softmax(jax.random.normal(key, (2, 4, 3000)), -1)
    # A single positive weight is always drawn, wherever it is. A row without positive
    # weight returns token 0; denormal weights count as zero (XLA flushes them).
    degenerate = jnp.zeros((5, 3000)).at[jnp.arange(3), jnp.asarray([0, 2999, 1234])].set(1e-30)
    degenerate = degenerate.at[4, 17].set(1e-40)
    probs = probs.at[0, :4].set(degenerate[:4]).at[1, 0].set(degenerate[4])
    draws = jitted(key, probs)
    assert draws.shape == (2, 4) and draws.dtype == jnp.int32
    np.testing.assert_array_equal(draws, jitted(key, probs))
    np.testing.assert_array_equal(draws[0], [0, 2999, 1234, 0])
    assert draws[1, 0] == 0
    np.testing.assert_array_equal(jitted(key, jnp.zeros((2, 10))), [0, 0])


@jax.jit
def _both_ways(key, logits, config):
    return apply_sampling(key, logits, config), sample(key, probs_from_logits(logits, config))


def test_apply_sampling_is_sample_of_probs():
    key = jax.random.key(4)
    logits = jax.random.normal(key, (6, 300))
    a, b = _both_ways(key, logits, SamplingConfig(temperature=0.8, top_p=0.9))
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------
# The tail: tokens far below the top one are drawn at their rate.
#
# One head token of weight 1 and 2047 tail tokens of weight r = 5e-8 each (V = 2048,
# the flat race). The exact probability of drawing any tail token is
# 2047 r / (1 + 2047 r) = 1.02e-4; N = 400k draws expect 40.9 of them. The draws are
# tested with an exact two-sided binomial test at FALSE_ALARM_TAIL = 1e-4.
#
# Power: the Gumbel-max sampler this replaced (float32 jax.random.gumbel, a 23-bit
# uniform inside) cannot give a token's exponential clock a value below 1.2e-7, so a
# tail token beats the head only when the head's clock exceeds 1.2e-7 / r = 2.4: it
# draws the tail at about a quarter of the right rate. The negative control runs that
# sampler on the same design, and the same test rejects it.
#
# The draws run in one subprocess (tests/tail_worker.py) with XLA's default CPU
# optimisations: the suite turns them off to compile faster (conftest.py), which makes
# this compute-bound test 5x slower. The worker returns the counts; the tests here
# apply the statistics. Cost: 8e8 variates per sampler, about a minute in all.

FALSE_ALARM_TAIL = 1e-4


@pytest.fixture(scope="module")
def tail_counts():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("tail_worker.py")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(worker)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _tail_pvalue(counts, sampler) -> tuple[int, float]:
    hits, n = counts[sampler], counts["draws"]
    tail = counts["tail_tokens"] * counts["tail_weight"]
    return hits, float(stats.binomtest(hits, n, tail / (1 + tail)).pvalue)


@pytest.mark.slow
def test_tiny_probabilities_are_drawn_at_their_rate(tail_counts):
    hits, p = _tail_pvalue(tail_counts, "sample")
    assert p > FALSE_ALARM_TAIL, f"{hits} tail draws, binomial p = {p:.2e}"


@pytest.mark.slow
def test_tail_control_the_gumbel_sampler_is_rejected(tail_counts):
    hits, p = _tail_pvalue(tail_counts, "gumbel")
    assert p < FALSE_ALARM_TAIL, f"{hits} tail draws, binomial p = {p:.2e}"


def test_noise_uniform_range_and_resolution():
    from specjax.sampling import noise

    u = np.asarray(noise.uniform(jax.random.key(0), (2_000_000,)), np.float64)
    assert (u > 0).all() and (u <= 1).all()
    # Values below 2**-23 (impossible for a 23-bit uniform, except 0) occur at their rate:
    # expected 0.24 per 2M draws, so use a coarser cell too: P(u < 2**-16) = 1.5e-5.
    assert stats.binomtest(int((u < 2**-16).sum()), u.size, 2**-16).pvalue > 1e-4
    assert stats.kstest(u[:200_000], "uniform").pvalue > 1e-4
    e = np.asarray(noise.exponential(jax.random.key(1), (200_000,)), np.float64)
    assert np.isfinite(e).all() and (e > 0).all()
    assert stats.kstest(e, "expon").pvalue > 1e-4


def test_sample_with_one_key_per_row_is_each_rows_own_draw():
    keys = jax.random.split(jax.random.key(5), (3, 4))
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(6), (3, 4, 3000)), -1)
    batched = sample(keys, probs)
    for i in range(3):
        for j in range(4):
            assert int(batched[i, j]) == int(sample(keys[i, j], probs[i, j]))
    with pytest.raises(ValueError, match=r"one key per row, of shape \[3, 4\]"):
        sample(keys[:2], probs)
