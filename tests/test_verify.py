"""Tests for specjax.verification.chain: greedy verification and exact rejection sampling.

Statistical tests draw N samples in one vmapped, jitted call with a fixed key and compare
them against the exact target distribution. Every statistical check uses the same
per-check false-alarm rate ALPHA = 1e-6; the file runs fewer than 200 such checks, so
the family-wise false-alarm rate is below 2e-4 (Bonferroni). Because keys are fixed the
outcome is deterministic: ALPHA is the chance that a correct implementation would have
been unlucky with these seeds. Negative controls show that the same checks, at the same
N and ALPHA, reject verifiers with known bugs.
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

from specjax.decoding.stages import confident_drafts
from specjax.sampling import SamplingConfig, noise, probs_from_logits, sample
from specjax.verification.chain import (
    coupled_verify,
    coupled_verify_single,
    greedy_verify,
    greedy_verify_single,
    rejection_core,
    rejection_sample,
    rejection_sample_onehot,
    rejection_sample_onehot_single,
    rejection_sample_single,
)

ALPHA = 1e-6
NUM_DRAWS = 200_000
GAMMA = 3
# A conditional position is checked only when at least this many draws reach it.
MIN_CONDITIONAL_DRAWS = 2_000


# --------------------------------------------------------------------------------------
# Statistical helpers.


def _draft_cdf(draft_probs_GxV):
    """Float32 CDFs ``[γ, V]``, accumulated in float64: monotone, ending at exactly 1."""
    cdf = np.cumsum(np.asarray(draft_probs_GxV, np.float64), axis=-1)
    return (cdf / cdf[:, -1:]).astype(np.float32)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _simulate(core, key, draft_probs_GxV, draft_cdf_GxV, target_probs_G1xV, num_draws, *extra):
    """``num_draws`` independent verifications; each draws its drafts ``x_i ~ q_i`` first.

    Drafts come from the inverse CDF (one uniform per position: much cheaper than the
    V Gumbel variates of `sample`): ``x = #{j : cdf[j] <= u}``. A token with ``q = 0``
    repeats the previous CDF entry, so no ``u`` selects it.
    """

    def one(k):
        draft_key, verify_key = jax.random.split(k)
        u_G = jax.random.uniform(draft_key, (draft_cdf_GxV.shape[0], 1))
        draft_tokens_G = jnp.sum(draft_cdf_GxV <= u_G, axis=-1, dtype=jnp.int32)
        return core(verify_key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV, *extra)

    return jax.vmap(one)(jax.random.split(key, num_draws))


def _position_pvalues(tokens, num_accepted, target_probs) -> list[float]:
    """p-values of ``tokens[:, i] ~ p_i`` given ``n >= i`` (drafts 0..i-1 were accepted)."""
    pvalues = []
    for i in range(target_probs.shape[0]):
        reached = num_accepted >= i
        if reached.sum() >= MIN_CONDITIONAL_DRAWS:
            pvalues.append(samples_chi2_pvalue(tokens[reached, i], target_probs[i]))
    return pvalues


def _acceptance_pvalue(num_accepted, draft_probs, target_probs) -> float:
    """Exact binomial test of P(draft 0 accepted) = sum_x min(p_0(x), q_0(x))."""
    p0 = np.asarray(target_probs[0], np.float64)
    q0 = np.asarray(draft_probs[0], np.float64)
    rate = float(np.minimum(p0 / p0.sum(), q0 / q0.sum()).sum())
    accepted = int((num_accepted >= 1).sum())
    rate = min(max(rate, 0.0), 1.0)
    if rate in (0.0, 1.0):
        return 1.0 if accepted == round(rate * num_accepted.shape[0]) else 0.0
    return float(stats.binomtest(accepted, num_accepted.shape[0], rate).pvalue)


def _run(core, draft_probs, target_probs, *extra, seed=0, num_draws=NUM_DRAWS):
    tokens, num_accepted = _simulate(
        core,
        jax.random.key(seed),
        jnp.asarray(draft_probs, jnp.float32),
        _draft_cdf(draft_probs),
        jnp.asarray(target_probs, jnp.float32),
        num_draws,
        *extra,
    )
    return np.asarray(tokens), np.asarray(num_accepted)


# --------------------------------------------------------------------------------------
# (p, q) cases: [γ+1, V] target and [γ, V] draft distributions per position.


def _normalise(x):
    x = np.asarray(x, np.float64)
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


def _tile(p, q):
    """The same (p, q) pair at every position; p also serves the bonus position."""
    return np.tile(_normalise(q), (GAMMA, 1)), np.tile(_normalise(p), (GAMMA + 1, 1))


def _make_cases():
    rng = np.random.default_rng(1234)
    cases = {}
    # Different random pairs at every position, V = 50.
    cases["dirichlet_v50"] = (
        _normalise(rng.dirichlet(np.ones(50), GAMMA)),
        _normalise(rng.dirichlet(np.ones(50), GAMMA + 1)),
    )
    cases["p_gt_q_v2"] = _tile([0.8, 0.2], [0.3, 0.7])
    cases["p_lt_q_v2"] = _tile([0.1, 0.9], [0.9, 0.1])
    cases["disjoint_support_v8"] = _tile([1, 2, 3, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 2, 0, 0])
    same = rng.dirichlet(np.ones(8))
    cases["p_equals_q_v8"] = _tile(same, same)  # zero residual everywhere
    cases["one_hot_q_v8"] = _tile([0.1, 0.2, 0.05, 0.3, 0.15, 0.1, 0.05, 0.05], np.eye(8)[3])
    cases["one_hot_q_on_p_zero_v8"] = _tile([0.2, 0.2, 0.2, 0.0, 0.1, 0.1, 0.1, 0.1], np.eye(8)[3])
    sparse_q = np.zeros(50)
    sparse_q[[3, 17, 41]] = [0.5, 0.3, 0.2]
    cases["sparse_q_v50"] = _tile(rng.dirichlet(np.ones(50)), sparse_q)
    sparse_p = np.zeros(50)
    sparse_p[[5, 6]] = [0.7, 0.3]
    cases["sparse_p_v50"] = _tile(sparse_p, rng.dirichlet(np.ones(50)))
    near = rng.dirichlet(np.ones(8))
    cases["near_equal_v8"] = _tile(near, near * (1 + 0.05 * rng.standard_normal(8)).clip(0.5))
    peaked = np.full(50, 1e-4)
    peaked[0] = 1 - 49e-4
    cases["peaked_p_uniform_q_v50"] = _tile(peaked, np.ones(50))
    tiny = rng.dirichlet(np.ones(50)) * np.where(np.arange(50) < 25, 1.0, 1e-6)
    cases["tiny_probs_v50"] = _tile(tiny, rng.dirichlet(np.ones(50) * 0.3))
    return cases


CASES = _make_cases()


# Fast tier: every regime of V = 2 and V = 8 and the random V = 50 pairs; slow tier
# (4 s each): the other V = 50 regimes (sparse supports, a peaked p, tiny probabilities).
_SLOW_CASES = {"peaked_p_uniform_q_v50", "sparse_p_v50", "sparse_q_v50", "tiny_probs_v50"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_CASES else n for n in sorted(CASES)],
)
def test_rejection_sample_is_exact(name):
    """Token i, given drafts 0..i-1 accepted, follows p_i; acceptance rate of draft 0 is
    sum(min(p_0, q_0)). N = 200k draws, chi-square / exact binomial, ALPHA = 1e-6 each."""
    draft_probs, target_probs = CASES[name]
    tokens, num_accepted = _run(rejection_sample_single, draft_probs, target_probs)
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    assert pvalues, "no position had enough draws"
    assert min(pvalues) > ALPHA, pvalues
    assert _acceptance_pvalue(num_accepted, draft_probs, target_probs) > ALPHA


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=0.7, top_k=10, top_p=0.8),
        # Slow tier (3 s): the second combination of filters.
        pytest.param(
            SamplingConfig(temperature=1.3, top_p=0.6, min_p=0.05), marks=pytest.mark.slow
        ),
    ],
    ids=["t0.7_k10_p0.8", "t1.3_p0.6_minp0.05"],
)
def test_rejection_sample_is_exact_with_truncated_distributions(config):
    """Same as above with p and q from probs_from_logits (truncation makes the supports
    differ). N = 200k, ALPHA = 1e-6 per check."""
    keys = jax.random.split(jax.random.key(7))
    # A draft correlated with the target, as real drafters are, so later positions are
    # reached often enough to be tested.
    target_logits = 2.0 * jax.random.normal(keys[0], (GAMMA + 1, 50))
    draft_logits = target_logits[:GAMMA] + jax.random.normal(keys[1], (GAMMA, 50))
    probs = np.asarray(
        jax.jit(probs_from_logits)(jnp.concatenate([draft_logits, target_logits]), config)
    )
    draft_probs, target_probs = probs[:GAMMA], probs[GAMMA:]
    assert ((draft_probs > 0) != (target_probs[:GAMMA] > 0)).any()  # supports differ
    tokens, num_accepted = _run(rejection_sample_single, draft_probs, target_probs)
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    assert len(pvalues) >= 2 and min(pvalues) > ALPHA, pvalues
    assert _acceptance_pvalue(num_accepted, draft_probs, target_probs) > ALPHA


@functools.partial(jax.jit, static_argnums=3)
def _simulate_onehot(key, draft_tokens_G, target_probs_G1xV, num_draws):
    core = lambda k: rejection_sample_onehot_single(k, draft_tokens_G, target_probs_G1xV)
    return jax.vmap(core)(jax.random.split(key, num_draws))


@pytest.mark.parametrize(
    "draft_tokens",
    [[3, 3, 3], [0, 3, 1], [3, -1, 3], [3, 8, 3]],
    ids=["repeated_token", "zero_prob_second", "negative_second", "out_of_vocab_second"],
)
def test_rejection_sample_onehot_is_exact(draft_tokens):
    """Deterministic drafts: token i given n >= i follows p_i whatever the drafts,
    including drafts with p = 0 or outside the vocabulary. N = 200k, ALPHA = 1e-6."""
    rng = np.random.default_rng(5)
    target_probs = _normalise(rng.dirichlet(np.ones(8), GAMMA + 1))
    target_probs[1, 3] = 0.0
    target_probs = _normalise(target_probs)
    tokens, num_accepted = _simulate_onehot(
        jax.random.key(3),
        jnp.asarray(draft_tokens, jnp.int32),
        jnp.asarray(target_probs),
        NUM_DRAWS,
    )
    tokens, num_accepted = np.asarray(tokens), np.asarray(num_accepted)
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    assert pvalues and min(pvalues) > ALPHA, pvalues
    # Draft 0 is accepted with probability p_0(x_0).
    accepted = int((num_accepted >= 1).sum())
    assert (
        stats.binomtest(accepted, NUM_DRAWS, float(target_probs[0, draft_tokens[0]])).pvalue > ALPHA
    )
    # A draft the target gives zero probability, or outside [0, V), is never accepted.
    for i, token in enumerate(draft_tokens):
        if not 0 <= token < 8 or target_probs[i, token] == 0:
            assert (num_accepted <= i).all()


# --------------------------------------------------------------------------------------
# Coupled verification: the target's own sample at each position, drafts accepted iff
# equal. Exact whatever the drafts; with drafts drawn from the same noise, draft 0 is
# accepted with the exponential-race coupling probability
#     P(agree) = sum_i 1 / (1 + sum_{j != i} max(p_j / p_i, q_j / q_i))
# (token i wins both races iff E_j > E_i max(p_j/p_i, q_j/q_i) for every j != i).

COUPLED_CASES = (
    "dirichlet_v50 p_gt_q_v2 disjoint_support_v8 p_equals_q_v8 sparse_q_v50 near_equal_v8"
).split()


def _coupled_independent(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV):
    del draft_probs_GxV  # coupled verification needs no q
    return coupled_verify_single(key, draft_tokens_G, target_probs_G1xV)


def _coupled_same_noise(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV, bug=False):
    """Drafts drawn with the very noise the target samples each position with."""
    del draft_tokens_G
    gamma = draft_probs_GxV.shape[0]
    keys_G1 = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(gamma + 1))
    drafts_G = sample(noise.stream(keys_G1[:gamma], noise.SAMPLE), draft_probs_GxV)
    tokens, n = coupled_verify_single(keys_G1, drafts_G, target_probs_G1xV)
    if bug:  # emit the draft, not the target's sample, at the first mismatch
        padded = jnp.concatenate([drafts_G, jnp.zeros((1,), jnp.int32)])
        tokens = jnp.where((jnp.arange(gamma + 1) == n) & (n < gamma), padded, tokens)
    return tokens, n


def _coupling_probability(p, q) -> float:
    p = np.asarray(p, np.float64) / np.sum(p)
    q = np.asarray(q, np.float64) / np.sum(q)
    total = 0.0
    for i in np.flatnonzero((p > 0) & (q > 0)):
        ratio = np.maximum(p / p[i], q / q[i])
        total += 1.0 / (1.0 + ratio.sum() - 1.0)
    return total


@pytest.mark.parametrize("name", COUPLED_CASES)
@pytest.mark.parametrize("drafts", ["independent", "same_noise"])
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_coupled_verify_is_exact(name, drafts):
    """Token i given n >= i follows p_i, for independent and for same-noise drafts; with
    same-noise drafts, draft 0 is accepted at the coupling probability, at least
    (1 - TV)/(1 + TV). N = 200k draws, chi-square / exact binomial, ALPHA = 1e-6 each."""
    draft_probs, target_probs = CASES[name]
    core = _coupled_independent if drafts == "independent" else _coupled_same_noise
    tokens, num_accepted = _run(core, draft_probs, target_probs)
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    assert pvalues and min(pvalues) > ALPHA, pvalues
    if drafts == "same_noise":
        rate = _coupling_probability(target_probs[0], draft_probs[0])
        overlap = float(np.minimum(target_probs[0], draft_probs[0]).sum())
        assert rate >= overlap / (2 - overlap) - 1e-6  # (1 - TV) / (1 + TV)
        accepted = int((num_accepted >= 1).sum())
        if 0 < rate < 1:
            assert stats.binomtest(accepted, NUM_DRAWS, rate).pvalue > ALPHA
        else:
            assert accepted == round(rate * NUM_DRAWS)


# Slow tier: 19 s: four buggy coupled verifiers, each through the statistical harness.
@pytest.mark.slow
def test_negative_control_coupled_checks_reject_bugs():
    """Emitting the draft at the first mismatch is rejected by the position checks, and
    the acceptance check rejects rejection sampling's rate 1 - TV, which is higher."""
    draft_probs, target_probs = CASES["dirichlet_v50"]
    tokens, num_accepted = _run(
        lambda k, x, q, p: _coupled_same_noise(k, x, q, p, bug=True), draft_probs, target_probs
    )
    assert min(_position_pvalues(tokens, num_accepted, target_probs)) < ALPHA * 1e-3
    tokens, num_accepted = _run(_coupled_same_noise, draft_probs, target_probs)
    overlap = float(np.minimum(target_probs[0], draft_probs[0]).sum())
    accepted = int((num_accepted >= 1).sum())
    assert stats.binomtest(accepted, NUM_DRAWS, overlap).pvalue < ALPHA * 1e-3


# --------------------------------------------------------------------------------------
# Drafts that were not proposed (the decoder's draft_confidence) read as -1.

CUT = 1  # drafts 0..CUT-1 proposed, the rest not


def _cut_drafts(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV):
    """What the decoder does when a row stops proposing after ``CUT`` drafts."""
    tokens = jnp.where(jnp.arange(draft_tokens_G.shape[0]) < CUT, draft_tokens_G, -1)
    return rejection_sample_single(key, tokens, draft_probs_GxV, target_probs_G1xV)


def _cut_drafts_rejected_with_residual(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV):
    """A wrong way to stop: keep the drafts but force their rejection, so the next token
    comes from the residual max(0, p - q) of a draft that was never proposed."""
    cut_G = jnp.arange(draft_tokens_G.shape[0]) >= CUT
    return rejection_core(
        jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
            key, jnp.arange(target_probs_G1xV.shape[0])
        ),
        draft_tokens_G,
        target_probs_G1xV,
        draft_prob_at_G=lambda tokens_G: jnp.where(
            cut_G, jnp.inf, jnp.take_along_axis(draft_probs_GxV, tokens_G[:, None], -1)[:, 0]
        ),
        draft_row=lambda i, _: draft_probs_GxV[i],
    )


def test_drafts_not_proposed_are_never_accepted_and_the_output_stays_exact():
    """Position i given n >= i follows p_i with drafts past CUT = 1 set to -1; n <= CUT.
    N = 200k, chi-square, ALPHA = 1e-6 per position (the positions up to CUT are reached)."""
    draft_probs, target_probs = CASES["dirichlet_v50"]
    tokens, num_accepted = _run(_cut_drafts, draft_probs, target_probs)
    assert num_accepted.max() == CUT
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    assert len(pvalues) == CUT + 1
    assert min(pvalues) > ALPHA, pvalues


def test_negative_control_stopping_with_the_residual_is_rejected():
    """The same check rejects the residual of an unproposed draft at the stop position."""
    draft_probs, target_probs = CASES["dirichlet_v50"]
    tokens, num_accepted = _run(_cut_drafts_rejected_with_residual, draft_probs, target_probs)
    assert num_accepted.max() == CUT
    assert min(_position_pvalues(tokens, num_accepted, target_probs)) < ALPHA * 1e-3


# The decoder's confidence rule (specjax.decoding.stages.confident_drafts), which depends on the
# drafts themselves: TAU is about the median of q_i(x_i) in this case, so rows stop at
# every position.
TAU = 0.03


def _stop_after_unconfident(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV):
    n = confident_drafts(draft_tokens_G[None], draft_probs_GxV[None], TAU)[0]
    tokens = jnp.where(jnp.arange(draft_tokens_G.shape[0]) < n, draft_tokens_G, -1)
    return rejection_sample_single(key, tokens, draft_probs_GxV, target_probs_G1xV)


def _stop_at_unconfident(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV):
    """The tempting bug: drop the unconfident draft itself. Whether position i is
    proposed then depends on x_i, so what is verified at i is q_i restricted to
    confident tokens, while the verifier divides by q_i."""
    q_at = jnp.take_along_axis(draft_probs_GxV, draft_tokens_G[:, None], -1)[:, 0]
    n = jnp.sum(jnp.cumprod((q_at >= TAU).astype(jnp.int32)))
    tokens = jnp.where(jnp.arange(draft_tokens_G.shape[0]) < n, draft_tokens_G, -1)
    return rejection_sample_single(key, tokens, draft_probs_GxV, target_probs_G1xV)


def test_the_decoders_confidence_rule_is_exact():
    """Stopping after the first draft with q_i(x_i) < TAU keeps every position exact.
    N = 200k, chi-square, ALPHA = 1e-6 per position; rows stop at every length."""
    draft_probs, target_probs = CASES["dirichlet_v50"]
    tokens, num_accepted = _run(_stop_after_unconfident, draft_probs, target_probs)
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    # Positions 0..γ-1 are reached often enough to test (the bonus position rarely).
    assert len(pvalues) >= GAMMA
    assert min(pvalues) > ALPHA, pvalues


def test_negative_control_stopping_at_the_unconfident_draft_is_rejected():
    draft_probs, target_probs = CASES["dirichlet_v50"]
    tokens, num_accepted = _run(_stop_at_unconfident, draft_probs, target_probs)
    assert min(_position_pvalues(tokens, num_accepted, target_probs)) < ALPHA * 1e-3


# --------------------------------------------------------------------------------------
# Negative controls: known-wrong verifiers must fail the same checks.


_BUGS = ("none", "resample_from_p", "ignore_q", "residual_from_next_position")


def _control_verifier(key, draft_tokens_G, draft_probs_GxV, target_probs_G1xV, bug_id):
    """A plain re-implementation with an optional known bug, chosen by a traced id (one
    compiled program serves every control)."""
    bug = {name: bug_id == i for i, name in enumerate(_BUGS)}
    gamma = draft_tokens_G.shape[0]
    accept_key, resample_key = jax.random.split(key)
    u_G = jax.random.uniform(accept_key, (gamma,))
    rows = jnp.arange(gamma)
    p_at = target_probs_G1xV[rows, draft_tokens_G]
    q_at = draft_probs_GxV[rows, draft_tokens_G]
    # Bug "ignore_q": accept with probability p(x) instead of min(1, p(x)/q(x)).
    accepted = jnp.where(bug["ignore_q"], u_G < p_at, u_G * q_at < p_at)
    n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)))
    p_n = target_probs_G1xV[n]
    # Bug "residual_from_next_position": an off-by-one in the residual's target row.
    p_residual = jnp.where(
        bug["residual_from_next_position"], target_probs_G1xV[jnp.minimum(n + 1, gamma)], p_n
    )
    q_n = jnp.where(n < gamma, draft_probs_GxV[jnp.minimum(n, gamma - 1)], 0.0)
    residual = jnp.maximum(p_residual - q_n, 0.0)
    weights = jnp.where(residual.sum() > 0, residual, p_n)
    # Bug "resample_from_p": resample from the target instead of the residual.
    weights = jnp.where(bug["resample_from_p"], p_n, weights)
    last = sample(resample_key, weights)
    positions = jnp.arange(gamma + 1)
    padded = jnp.concatenate([draft_tokens_G, jnp.full((1,), -1, jnp.int32)])
    tokens = jnp.where(positions < n, padded, jnp.where(positions == n, last, -1))
    return tokens, n


def _control_pvalues(bug, case):
    draft_probs, target_probs = CASES[case]
    bug_id = jnp.int32(_BUGS.index(bug))
    tokens, num_accepted = _run(_control_verifier, draft_probs, target_probs, bug_id)
    pvalues = _position_pvalues(tokens, num_accepted, target_probs)
    return pvalues + [_acceptance_pvalue(num_accepted, draft_probs, target_probs)]


@pytest.mark.parametrize(
    "bug,case",
    [
        ("resample_from_p", "dirichlet_v50"),
        ("ignore_q", "dirichlet_v50"),
        ("residual_from_next_position", "dirichlet_v50"),
    ],
)
def test_negative_control_buggy_verifier_is_rejected(bug, case):
    """The checks of test_rejection_sample_is_exact (N = 200k, ALPHA = 1e-6) have power:
    each buggy verifier fails at least one of them, by a wide margin."""
    assert min(_control_pvalues(bug, case)) < ALPHA * 1e-3


def test_negative_control_harness_accepts_a_correct_reimplementation():
    """The bug-free variant of the control verifier passes: the controls fail for their
    bug, not for an artefact of the test harness. N = 200k, ALPHA = 1e-6."""
    assert min(_control_pvalues("none", "dirichlet_v50")) > ALPHA


# --------------------------------------------------------------------------------------
# Property tests (hypothesis): layout, ranges and cross-consistency on random inputs.

_B, _V = 3, 9
_PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


def _invariants(tokens, num_accepted, draft_tokens, target_probs):
    tokens, n = np.asarray(tokens), np.asarray(num_accepted)
    draft_tokens, target_probs = np.asarray(draft_tokens), np.asarray(target_probs)
    gamma = draft_tokens.shape[1]
    assert tokens.shape == (draft_tokens.shape[0], gamma + 1) and tokens.dtype == np.int32
    assert n.dtype == np.int32 and ((n >= 0) & (n <= gamma)).all()
    for b in range(tokens.shape[0]):
        np.testing.assert_array_equal(tokens[b, : n[b]], draft_tokens[b, : n[b]])
        assert (tokens[b, n[b] + 1 :] == -1).all()
        emitted = tokens[b, : n[b] + 1]
        assert ((emitted >= 0) & (emitted < target_probs.shape[-1])).all()
        # No emitted token, accepted or sampled, has zero target probability.
        assert (target_probs[b, np.arange(n[b] + 1), emitted] > 0).all()


@st.composite
def _verify_inputs(draw, gamma):
    logits = hnp.arrays(np.float32, (_B, 2 * gamma + 1, _V), elements=st.floats(-4, 4, width=32))
    logits = draw(logits)
    top_k = draw(st.integers(0, _V))
    draft_tokens = draw(hnp.arrays(np.int32, (_B, gamma), elements=st.integers(-2, _V + 1)))
    seed = draw(st.integers(0, 2**31 - 1))
    return logits, top_k, draft_tokens, seed


@jax.jit
def _all_verifiers(key, logits_BxTxV, top_k, draft_tokens_BxG):
    gamma = draft_tokens_BxG.shape[1]
    config = SamplingConfig(temperature=1.0, top_k=top_k)
    probs = probs_from_logits(logits_BxTxV, config)
    draft_probs, target_probs = probs[:, :gamma], probs[:, gamma:]
    one_hot = jax.nn.one_hot(draft_tokens_BxG, _V, dtype=jnp.float32)
    greedy_target = jax.nn.one_hot(jnp.argmax(logits_BxTxV[:, gamma:], -1), _V)
    return dict(
        target_probs=target_probs,
        sampled=rejection_sample(key, draft_tokens_BxG, draft_probs, target_probs),
        explicit_one_hot=rejection_sample(key, draft_tokens_BxG, one_hot, target_probs),
        one_hot=rejection_sample_onehot(key, draft_tokens_BxG, target_probs),
        greedy=greedy_verify(draft_tokens_BxG, logits_BxTxV[:, gamma:]),
        one_hot_on_greedy_target=rejection_sample_onehot(key, draft_tokens_BxG, greedy_target),
    )


@pytest.mark.parametrize("gamma", [0, 4])
@_PROPERTY_SETTINGS
@given(data=st.data())
def test_properties_on_random_inputs(gamma, data):
    """Layout and ranges hold; one-hot drafts match explicit one-hot q bit for bit; with a
    one-hot target, one-hot rejection sampling reduces to greedy verification."""
    logits, top_k, draft_tokens, seed = data.draw(_verify_inputs(gamma))
    out = _all_verifiers(jax.random.key(seed), logits, top_k, draft_tokens)
    for name in ("sampled", "explicit_one_hot", "one_hot"):
        _invariants(*out[name], draft_tokens, out["target_probs"])
    for a, b in zip(out["one_hot"], out["explicit_one_hot"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(out["one_hot_on_greedy_target"], out["greedy"], strict=True):
        np.testing.assert_array_equal(a, b)


@_PROPERTY_SETTINGS
@given(
    p=hnp.arrays(np.float64, (2, 6), elements=st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0, 3.0])),
    q=hnp.arrays(np.float64, (6,), elements=st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0, 3.0])),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow  # sampled (empirical), about 5 s; the enumerated tests above are exact
def test_empirical_exactness_on_random_distributions(p, q, seed):
    """γ = 1, V = 6, (p, q) from hypothesis (sparse, tied, disjoint): token 0 follows p_0
    and the bonus token follows p_1. N = 50k per example, ALPHA = 1e-6 per check (25
    examples x 3 checks)."""
    p[:, 0] += p.sum(-1) == 0  # keep every row a distribution
    q[0] += q.sum() == 0
    p, q = _normalise(p), _normalise(q)
    tokens, n = _run(rejection_sample_single, q[None], p, seed=seed, num_draws=50_000)
    assert samples_chi2_pvalue(tokens[:, 0], p[0]) > ALPHA
    assert _acceptance_pvalue(n, q[None], p) > ALPHA
    if (n == 1).sum() >= MIN_CONDITIONAL_DRAWS:
        assert samples_chi2_pvalue(tokens[n == 1, 1], p[1]) > ALPHA


# --------------------------------------------------------------------------------------
# Greedy verification.


# Jitted once per shape; eager dispatch would compile every primitive separately.
_greedy_verify = jax.jit(greedy_verify)
_rejection_sample = jax.jit(rejection_sample)
_rejection_sample_onehot = jax.jit(rejection_sample_onehot)


def _logits_with_argmax(argmax_BxT, vocab=6):
    logits = np.zeros((*np.shape(argmax_BxT), vocab), np.float32)
    np.put_along_axis(logits, np.asarray(argmax_BxT)[..., None], 1.0, axis=-1)
    return jnp.asarray(logits)


def test_greedy_verify_accept_all_none_partial():
    target = _logits_with_argmax([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = jnp.asarray([[1, 2, 3], [5, 2, 3], [1, 2, 0]], jnp.int32)
    tokens, n = _greedy_verify(drafts, target)
    np.testing.assert_array_equal(n, [3, 0, 2])
    np.testing.assert_array_equal(tokens, [[1, 2, 3, 4], [1, -1, -1, -1], [1, 2, 3, -1]])
    assert tokens.dtype == jnp.int32 and n.dtype == jnp.int32


def test_greedy_verify_ties_nan_and_out_of_vocab():
    # Ties resolve to the lowest index; NaN counts as -inf; out-of-range drafts never match.
    target = jnp.tile(
        jnp.asarray([[[0.5, 0.5, 0.1], [np.nan, 0.2, 0.3], [1.0, 1.0, 1.0]]], jnp.float32),
        (5, 1, 1),
    )
    drafts = jnp.asarray([[0, 2], [1, 2], [0, -1], [0, 3], [0, 1 << 30]], jnp.int32)
    tokens, n = _greedy_verify(drafts, target)
    np.testing.assert_array_equal(n, [2, 0, 1, 1, 1])
    np.testing.assert_array_equal(
        tokens, [[0, 2, 0], [0, -1, -1], [0, 2, -1], [0, 2, -1], [0, 2, -1]]
    )


def test_greedy_verify_vmap_of_core_and_eager():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.integers(0, 3, (5, 4, 6)).astype(np.float32))  # many ties
    drafts = jnp.asarray(rng.integers(0, 2, (5, 3)), jnp.int32)
    expected = _greedy_verify(drafts, logits)
    _assert_same(jax.jit(jax.vmap(greedy_verify_single))(drafts, logits), expected)
    _assert_same(greedy_verify(drafts, logits), expected)


# --------------------------------------------------------------------------------------
# Batching, keys and jit.


def _random_batch(seed, batch=6, gamma=GAMMA, vocab=7):
    rng = np.random.default_rng(seed)
    draft_probs = _normalise(rng.dirichlet(np.ones(vocab), (batch, gamma)))
    target_probs = _normalise(rng.dirichlet(np.ones(vocab), (batch, gamma + 1)))
    draft_tokens = rng.integers(0, vocab, (batch, gamma)).astype(np.int32)
    return jnp.asarray(draft_tokens), jnp.asarray(draft_probs), jnp.asarray(target_probs)


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_rows_are_independent_of_the_rest_of_the_batch():
    key = jax.random.key(11)
    x, q, p = _random_batch(0)
    x2, q2, p2 = _random_batch(1)
    # Row 2 keeps its contents; every other row changes.
    keep = jnp.arange(6)[:, None] == 2
    mixed_x, mixed_q = jnp.where(keep, x, x2), jnp.where(keep[..., None], q, q2)
    mixed_p = jnp.where(keep[..., None], p, p2)
    pairs = [
        (_rejection_sample(key, x, q, p), _rejection_sample(key, mixed_x, mixed_q, mixed_p)),
        (_rejection_sample_onehot(key, x, p), _rejection_sample_onehot(key, mixed_x, mixed_p)),
    ]
    for base, mixed in pairs:
        np.testing.assert_array_equal(base[0][2], mixed[0][2])
        np.testing.assert_array_equal(base[1][2], mixed[1][2])


def test_one_key_draws_as_the_documented_position_keys():
    """One key means row b, position i draws with ``fold_in(fold_in(key, b), i)``: the
    same tokens as those position keys passed explicitly, as the decoders pass them."""
    key = jax.random.key(5)
    x, q, p = _random_batch(2)
    batch, positions = p.shape[:2]
    keys_BG1 = jnp.stack(
        [
            jnp.stack([jax.random.fold_in(jax.random.fold_in(key, b), i) for i in range(positions)])
            for b in range(batch)
        ]
    )
    _assert_same(_rejection_sample(key, x, q, p), _rejection_sample(keys_BG1, x, q, p))
    _assert_same(_rejection_sample_onehot(key, x, p), _rejection_sample_onehot(keys_BG1, x, p))
    _assert_same(coupled_verify(key, x, p), coupled_verify(keys_BG1, x, p))


# Slow tier: 7 s: every verifier eager and jitted.
@pytest.mark.slow
def test_jit_matches_eager_and_same_key_is_reproducible():
    x, q, p = _random_batch(3)
    key = jax.random.key(9)
    jitted = _rejection_sample(key, x, q, p)
    _assert_same(rejection_sample(key, x, q, p), jitted)
    _assert_same(_rejection_sample(key, x, q, p), jitted)
    # Legacy uint32 keys work too, as the typed key holding the same key data: a
    # threefry PRNGKey(9) draws exactly what key(9) drew above.
    legacy = jax.random.PRNGKey(9)
    np.testing.assert_array_equal(legacy, jax.random.key_data(key))
    _assert_same(_rejection_sample(legacy, x, q, p), jitted)
    # Different keys give different draws somewhere in a batch of 6 x 4 positions.
    other = _rejection_sample(jax.random.key(10), x, q, p)
    assert not all(np.array_equal(a, b) for a, b in zip(other, jitted, strict=True))


def test_bf16_inputs_are_verified_in_float32():
    x, q, p = _random_batch(4)
    key = jax.random.key(1)
    q16, p16 = q.astype(jnp.bfloat16), p.astype(jnp.bfloat16)
    _assert_same(
        _rejection_sample(key, x, q16, p16),
        _rejection_sample(key, x, q16.astype(jnp.float32), p16.astype(jnp.float32)),
    )


def test_gamma_zero_returns_only_the_bonus_token():
    p = jnp.asarray([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
    empty = jnp.zeros((2, 0), jnp.int32)
    for tokens, n in (
        _rejection_sample(jax.random.key(0), empty, jnp.zeros((2, 0, 3)), p),
        _rejection_sample_onehot(jax.random.key(0), empty, p),
        _greedy_verify(empty, p),
    ):
        np.testing.assert_array_equal(tokens, [[1], [2]])
        np.testing.assert_array_equal(n, [0, 0])


def test_out_of_vocab_drafts_are_rejected_and_never_emitted():
    # Rows 0-3 draft ids outside [0, V) first; rows 4-5 are ordinary.
    x, q, p = _random_batch(5)
    bad = jnp.asarray([-1, 7, -(2**31), 2**31 - 1], jnp.int32)
    x = x.at[:4, 0].set(bad)
    key = jax.random.key(0)
    for tokens, n in (_rejection_sample(key, x, q, p), _rejection_sample_onehot(key, x, p)):
        np.testing.assert_array_equal(n[:4], 0)
        assert ((tokens[:4, 0] >= 0) & (tokens[:4, 0] < 7)).all()
        assert (tokens[:4, 1:] == -1).all()


# --------------------------------------------------------------------------------------
# Argument validation (shapes are static: plain Python checks work under jit).

_x, _q, _p = _random_batch(0, batch=2, vocab=5)


@pytest.mark.parametrize(
    "args,error,match",
    [
        ((_x[0], _q, _p), ValueError, r"draft_tokens must have rank 2.*draft_tokens\[3\]"),
        ((_x, _q[0], _p), ValueError, r"draft_probs must have rank 3.*draft_probs\[3, 5\]"),
        ((_x, _q, _p[..., 0]), ValueError, r"target_probs must have rank 3.*target_probs\[2, 4\]"),
        ((_x[:1], _q, _p), ValueError, r"batch sizes B differ.*draft_tokens\[1, 3\]"),
        ((_x, _q, _p[:, :3]), ValueError, r"target_probs must have γ\+1 positions.*\[2, 3, 5\]"),
        ((_x, _q[:, :2], _p), ValueError, r"draft_probs must have γ positions.*\[2, 2, 5\]"),
        ((_x, _q[..., :4], _p), ValueError, r"vocabulary sizes V differ.*draft_probs\[2, 3, 4\]"),
        ((_x.astype(jnp.float32), _q, _p), TypeError, r"draft_tokens must be an integer array"),
        ((_x, _q, (_p > 0.1).astype(jnp.int32)), TypeError, r"target_probs must be a float array"),
    ],
)
def test_rejection_sample_validates_arguments(args, error, match):
    key = jax.random.key(0)
    with pytest.raises(error, match=match):
        rejection_sample(key, *args)
    with pytest.raises(error, match=match):
        jax.jit(rejection_sample)(key, *args)


def test_other_entry_points_validate_arguments():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"rejection_sample_onehot: .*target_probs\[2, 3, 5\]"):
        rejection_sample_onehot(key, _x, _p[:, :3])
    with pytest.raises(ValueError, match=r"greedy_verify: target_logits must have rank 3"):
        greedy_verify(_x, _p[0])
    with pytest.raises(TypeError, match=r"greedy_verify_single: draft_tokens"):
        greedy_verify_single(_x[0].astype(jnp.float32), _p[0])
    with pytest.raises(ValueError, match=r"rejection_sample_single: .*draft_probs\[3, 4\]"):
        rejection_sample_single(key, _x[0], _q[0, :, :4], _p[0])
    with pytest.raises(ValueError, match=r"rejection_sample_onehot_single: .*rank 1"):
        rejection_sample_onehot_single(key, _x, _p[0])
