"""Exactness with per-row sampling settings, end to end.

One batch mixes rows at temperature 0, 0.6, 1.0 and 1.3, a top-p, a top-k and a min-p
row, interleaved (row i belongs to group i % 7), in plain decoding and in speculative decoding with
`DraftModel` and `PromptLookup`, under rejection and coupled verification. The exact
distribution of each group's first K tokens is enumerated over V = 8 with that
group's own settings, and each sampled group is tested against it with a chi-square
goodness-of-fit test.

A second set runs batches with B == γ+1 (3 rows, γ = 2), where settings read along the
γ+1 positions instead of the rows would raise no shape error: the decoder is
`jax.vmap`-ed over N keys, so each of the N instances is one such batch.

A third set sends the mixed batch through 1,000 slots with ragged budgets
(continuous batching): plain decoding, `DraftModel` with adaptive γ (a table by active
rows plus a confidence threshold), and `DraftModel(greedy_draft=True)` without and
with a confidence threshold (the draft model then stops drafting by itself).

Sample sizes and false alarms: N_PER_GROUP = 2,000 rows per group and decoder (K = 2
tokens; 3 for DraftModel, whose drafts reach the third position), each test rejecting
at p < FALSE_ALARM = 1e-4. This file runs 30 + 9 + 24 = 63 such tests, so the
family-wise false-alarm rate is below 0.7% (Bonferroni). Keys are fixed, so the outcome is
deterministic. The negative controls show that the same test, at the same N, rejects a
group's samples against another group's distribution (what reading the settings of
the wrong row gives) and the draft's distribution against the target's.

N is sized by a power calculation (non-central chi-square, `specjax.testing.chi_square_power`,
checked by `test_sample_size_has_power_against_every_control`): the smallest N at which
the test rejects each control with power 0.999 at p < 1e-4 is 892 (t1.0 rows tested
against t1.3's law, K = 2), 749 (the same, K = 3), 297, 223, 207, 115 (the other pairs)
and 58 (the target's rows against the draft's law). N = 2,000 is more than twice the
largest: the power is above 1 - 1e-11 against every control (N was 10,000 before, for
the same controls).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import make_drafter, peaked_pair

import specjax
from specjax.testing import (
    chi_square_power,
    chi_square_pvalue,
    exact_sequence_probs,
    sequence_counts,
)

pytestmark = pytest.mark.slow
pair = pytest.fixture(peaked_pair, scope="module", name="pair")

V = 8
PROMPT = [1, 2, 3, 1, 2]
N_PER_GROUP = 2_000
FALSE_ALARM = 1e-4
GROUPS = {
    "t0": dict(temperature=0.0),
    "t0.6": dict(temperature=0.6),
    "t1.0": dict(temperature=1.0),
    "t1.3": dict(temperature=1.3),
    "t1.3_topp0.8": dict(temperature=1.3, top_p=0.8),
    "t0.6_topk3": dict(temperature=0.6, top_k=3),
    "t1.0_minp0.1": dict(temperature=1.0, min_p=0.1),
}
SAMPLED = [g for g in GROUPS if g != "t0"]
DECODERS = [
    ("plain", "rejection"),
    ("draft_model", "rejection"),
    ("lookup", "rejection"),
    ("draft_model", "coupled"),
    ("lookup", "coupled"),
]


def _num_tokens(drafter_name):
    return 3 if drafter_name == "draft_model" else 2


def _mixed_config(num_rows):
    """Row i gets group i % 7's settings: one [num_rows] array per field."""
    names = list(GROUPS)
    fields = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    per_field = {
        f: np.asarray([GROUPS[names[i % len(names)]].get(f, d) for i in range(num_rows)])
        for f, d in fields.items()
    }
    return specjax.SamplingConfig(**per_field)


def _exact(target, group, num_tokens):
    return exact_sequence_probs(target, PROMPT, num_tokens, specjax.SamplingConfig(**GROUPS[group]))


def _mixed_batch():
    """``(num_rows, prompts [N, P], sampling)``: N_PER_GROUP rows of each group, interleaved."""
    num_rows = N_PER_GROUP * len(GROUPS)
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))
    return num_rows, prompts, _mixed_config(num_rows)


@pytest.fixture(scope="module")
def mixed_samples(pair):
    """Tokens [N, K] of every decoder on one mixed batch, same key and seeds throughout."""
    target, draft = pair
    num_rows, prompts, sampling = _mixed_batch()
    key = jax.random.key(2026)
    out = {}
    for name, verification in DECODERS:
        k = _num_tokens(name)
        if name == "plain":
            res = specjax.generate(key, target, prompts, max_new_tokens=k, sampling=sampling)
        else:
            res = specjax.speculative_generate(
                key,
                target,
                make_drafter(name, target, draft, 2),
                prompts,
                max_new_tokens=k,
                sampling=sampling,
                verification=verification,
            )
        assert int(jnp.min(res.lengths)) == k
        out[name, verification] = np.asarray(res.tokens)
    return out


@pytest.mark.parametrize("group", SAMPLED)
@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: "-".join(d))
def test_each_row_group_follows_its_own_distribution(pair, mixed_samples, decoder, group):
    target, _ = pair
    tokens = mixed_samples[decoder]
    rows = tokens[list(GROUPS).index(group) :: len(GROUPS)]
    assert rows.shape[0] == N_PER_GROUP
    exact = _exact(target, group, rows.shape[1])
    p = chi_square_pvalue(sequence_counts(rows, V), exact)
    assert p > FALSE_ALARM, f"{decoder}/{group}: chi-square p = {p:.2e}"


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: "-".join(d))
def test_greedy_rows_equal_plain_greedy(pair, mixed_samples, decoder):
    target, _ = pair
    _assert_greedy_rows_equal_plain_greedy(target, mixed_samples[decoder])


def test_coupled_output_equals_plain_output_token_for_token(mixed_samples):
    """Coupled verification reproduces generate()'s sample for the same key and seeds."""
    plain = mixed_samples["plain", "rejection"]
    for name in ("draft_model", "lookup"):
        np.testing.assert_array_equal(mixed_samples[name, "coupled"][:, :2], plain)


CONTROL_PAIRS = (("t0.6", "t1.0"), ("t1.0", "t1.3"), ("t1.3_topp0.8", "t1.3"))


def test_sample_size_has_power_against_every_control(pair):
    """The power calculation behind N_PER_GROUP: each control is rejected with power
    above 0.999 at FALSE_ALARM (at N = 2,000 it is above 1 - 1e-11)."""
    target, draft = pair
    for k in (2, 3):
        for group, other in CONTROL_PAIRS:
            power = chi_square_power(
                _exact(target, other, k), _exact(target, group, k), N_PER_GROUP, FALSE_ALARM
            )
            assert power > 0.999, (k, group, other, power)
    draft_law = exact_sequence_probs(draft, PROMPT, 2, specjax.SamplingConfig(temperature=1.3))
    power = chi_square_power(draft_law, _exact(target, "t1.3", 2), N_PER_GROUP, FALSE_ALARM)
    assert power > 0.999, power


def test_control_other_groups_distribution_is_rejected(pair, mixed_samples):
    """Negative control: a group's samples fail against a neighbouring group's distribution,
    which is what a decoder that read another row's settings would produce."""
    target, _ = pair
    tokens = mixed_samples["draft_model", "rejection"]
    for group, other in CONTROL_PAIRS:
        rows = tokens[list(GROUPS).index(group) :: len(GROUPS)]
        p = chi_square_pvalue(sequence_counts(rows, V), _exact(target, other, rows.shape[1]))
        assert p < FALSE_ALARM, f"{group} vs {other}: p = {p:.2e}"


# --------------------------------------------------------------------------------------
# B == γ+1: three rows with three settings, γ = 2, vmapped over N keys.

ROW_GROUPS = ("t0.6", "t1.3", "t1.3_topp0.8")
GAMMA = 2


@pytest.fixture(scope="module")
def square_samples(pair):
    target, draft = pair
    fields = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    sampling = specjax.SamplingConfig(
        **{f: np.asarray([GROUPS[g].get(f, d) for g in ROW_GROUPS]) for f, d in fields.items()}
    )
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (GAMMA + 1, len(PROMPT)))
    keys = jax.random.split(jax.random.key(77), N_PER_GROUP)
    out = {}
    for name, verification in (
        ("draft_model", "rejection"),
        ("lookup", "rejection"),
        ("draft_model", "coupled"),
    ):
        drafter = make_drafter(name, target, draft, GAMMA)
        k = _num_tokens(name)

        def one(key, drafter=drafter, k=k, verification=verification):
            return specjax.speculative_generate(
                key,
                target,
                drafter,
                prompts,
                max_new_tokens=k,
                sampling=sampling,
                verification=verification,
            ).tokens

        out[name, verification] = np.asarray(jax.jit(jax.vmap(one))(keys))  # [N, B, K]
    return out


@pytest.mark.parametrize("row", range(GAMMA + 1))
@pytest.mark.parametrize(
    "decoder",
    [("draft_model", "rejection"), ("lookup", "rejection"), ("draft_model", "coupled")],
    ids=lambda d: "-".join(d),
)
def test_batch_of_gamma_plus_one_rows_uses_each_rows_settings(pair, square_samples, decoder, row):
    target, _ = pair
    tokens = square_samples[decoder][:, row]
    assert tokens.shape == (N_PER_GROUP, _num_tokens(decoder[0])) and (tokens >= 0).all()
    exact = _exact(target, ROW_GROUPS[row], tokens.shape[1])
    p = chi_square_pvalue(sequence_counts(tokens, V), exact)
    assert p > FALSE_ALARM, f"{decoder} row {row} ({ROW_GROUPS[row]}): p = {p:.2e}"


def test_control_draft_distribution_is_rejected(pair, square_samples):
    """Negative control: the same test at the same N rejects the draft model's own
    distribution in place of the target's."""
    _, draft = pair
    tokens = square_samples["lookup", "rejection"][:, 1]
    exact = exact_sequence_probs(draft, PROMPT, 2, specjax.SamplingConfig(temperature=1.3))
    assert chi_square_pvalue(sequence_counts(tokens, V), exact) < FALSE_ALARM


# --------------------------------------------------------------------------------------
# Continuous batching: the mixed batch through REFILL_SLOTS slots, with ragged budgets
# (K or K+1 by row pair) so that slots are refilled at different steps. Adaptive γ
# (a table by active rows and a confidence threshold) and argmax drafting run here.

REFILL_SLOTS = 1_000
REFILL_DECODERS = {
    "plain": None,
    "draft_model_adaptive": dict(gamma_by_active_rows={500: 2, 10**6: 1}, draft_confidence=0.3),
    "draft_model_argmax": None,
    # Argmax drafts carry no q: the draft model stops on its own softmax (`DraftModel`).
    "draft_model_argmax_confident": dict(draft_confidence=0.5),
}


@pytest.fixture(scope="module")
def refill_samples(pair):
    """Tokens [N, K] of each decoder on the mixed batch through REFILL_SLOTS slots."""
    target, draft = pair
    num_rows, prompts, sampling = _mixed_batch()
    key = jax.random.key(2026)  # as mixed_samples: plain tokens must then agree
    extra = (np.arange(num_rows) // len(GROUPS)) % 2
    out = {}
    for name, adaptive in REFILL_DECODERS.items():
        k = 2 if name == "plain" else 3
        kw = dict(max_new_tokens=k + extra, sampling=sampling, num_slots=REFILL_SLOTS)
        if name == "plain":
            res = specjax.generate(key, target, prompts, **kw)
        else:
            argmax = "argmax" in name
            drafter = specjax.DraftModel(draft, num_draft=2, greedy_draft=argmax)
            res = specjax.speculative_generate(
                key, target, drafter, prompts, **kw, **(adaptive or {})
            )
            stats = res.stats
            if adaptive:
                # The threshold left drafts unproposed, and some steps still accepted both.
                assert int(np.sum(stats.drafted)) < 2 * int(np.sum(stats.row_target_calls))
                assert int(np.asarray(stats.accepted_hist)[2]) > 0
            assert int(np.sum(stats.accepted)) > 0
        np.testing.assert_array_equal(res.lengths, k + extra)
        out[name] = np.asarray(res.tokens)[:, :k]
    return out


@pytest.mark.parametrize("group", SAMPLED)
@pytest.mark.parametrize("decoder", list(REFILL_DECODERS))
def test_refilled_rows_follow_their_own_distribution(pair, refill_samples, decoder, group):
    target, _ = pair
    rows = refill_samples[decoder][list(GROUPS).index(group) :: len(GROUPS)]
    assert rows.shape[0] == N_PER_GROUP
    p = chi_square_pvalue(sequence_counts(rows, V), _exact(target, group, rows.shape[1]))
    assert p > FALSE_ALARM, f"{decoder}/{group} with refill: chi-square p = {p:.2e}"


def test_refilled_plain_rows_equal_one_slot_per_row(mixed_samples, refill_samples):
    """Plain sampling keys by prompt seed and position, so refill changes no token."""
    np.testing.assert_array_equal(refill_samples["plain"], mixed_samples["plain", "rejection"])


@pytest.mark.parametrize("decoder", list(REFILL_DECODERS))
def test_refilled_greedy_rows_equal_plain_greedy(pair, refill_samples, decoder):
    target, _ = pair
    _assert_greedy_rows_equal_plain_greedy(target, refill_samples[decoder])


def _assert_greedy_rows_equal_plain_greedy(target, tokens_NK):
    """The temperature-0 group (rows 0, 7, 14, ...) equals plain greedy decoding."""
    tokens = tokens_NK[0 :: len(GROUPS)]
    greedy = specjax.generate(
        jax.random.key(0),
        target,
        [PROMPT],
        max_new_tokens=tokens.shape[1],
        sampling=specjax.SamplingConfig.greedy(),
    ).to_lists()[0]
    assert (tokens == np.asarray(greedy)).all()


def test_control_refilled_rows_against_another_group_are_rejected(pair, refill_samples):
    """Negative control at the same N: reading the settings of the prompt first in a
    slot (instead of the prompt it serves now) mixes groups, which this test rejects."""
    target, _ = pair
    tokens = refill_samples["draft_model_adaptive"]
    for group, other in (("t0.6", "t1.0"), ("t1.3_topp0.8", "t1.3")):
        rows = tokens[list(GROUPS).index(group) :: len(GROUPS)]
        p = chi_square_pvalue(sequence_counts(rows, V), _exact(target, other, rows.shape[1]))
        assert p < FALSE_ALARM, f"{group} vs {other}: p = {p:.2e}"
