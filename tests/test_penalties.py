"""Penalties, logit bias and forbidden ids, exact under speculation.

The reference here is written independently of `specjax.sampling.penalties`, in numpy float64:
for every continuation of a short prompt, each position's logits come from one full
forward of the whole sequence, and the transforms follow their published semantics
(transformers' repetition penalty over prompt + generated tokens; OpenAI's presence
and frequency penalties over generated tokens; an additive bias; forbidden ids at
-inf). The exact law of the first K tokens is enumerated over V = 8.

Statistical tests (slow tier): one batch mixes three groups of rows, interleaved (row
i is group i % 3) with per-row settings ([B] penalties, a [B, V] bias, ragged per-row
forbidden ids): plain decoding, the draft model, prompt lookup and the block drafter
(sampling its drafts, so its q matters), each under rejection and coupled
verification, γ = 2 and K = 3 tokens (one step can emit all three, so the drafted
positions are where penalties read the step's earlier drafts). Each group's rows are
tested against the exact law with a chi-square test at p < FALSE_ALARM = 1e-4; the
file runs 7 × 3 = 21 such tests (family-wise false alarm below 0.21%, Bonferroni).

Power and the negative control. The known-wrong variant is the common one:
penalties that count the committed prefix but not the step's earlier drafts. With the
target drafting for itself the draft at position 0 is always accepted, so that
variant's second token follows the "prefix-blind" law (penalties that never see the
generated tokens). `test_sample_size_has_power_against_the_controls` computes, with
`specjax.testing.chi_square_power`, that N_PER_GROUP = 1,200 rejects the prefix-blind
law with power above 0.999 for every group: the smallest N with that power is 548
(repetition group), 342 (presence/frequency) and 214 (bias, forbidden ids and all
penalties) against the prefix-blind law, and 367, 342 and 88 against the bare law; N
is more than twice the largest (the test checks it). And
`test_control_penalties_without_the_steps_drafts_is_rejected` runs that broken decoder
and checks that the test rejects its samples. A second control tests a group's rows
against the law without any penalty.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import group_rows, make_drafter, peaked_pair

import specjax
from specjax.sampling import RowSampling
from specjax.sampling.penalties import TokenCounts, apply_logit_transforms, token_counts
from specjax.testing import (
    chi_square_power,
    chi_square_pvalue,
    continuation_logits,
    min_sample_size,
    sequence_counts,
    tiny_model,
)

V = 8
PROMPT = [1, 2, 3, 1, 2]
K = 3
GAMMA = 2
N_PER_GROUP = 1_200
FALSE_ALARM = 1e-4
_BIAS = np.asarray([0.0, 0.5, -0.5, 1.0, 0.0, -1.0, 0.25, 0.0], np.float32)
GROUPS = {
    "repetition": dict(temperature=1.0, repetition_penalty=2.5),
    "presence_frequency": dict(temperature=1.0, presence_penalty=1.5, frequency_penalty=1.0),
    "bias_forbidden_all": dict(
        temperature=0.8,
        repetition_penalty=1.5,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias=_BIAS,
        forbidden_ids=[4, 6],
    ),
}
DECODERS = [
    ("plain", "rejection"),
    ("draft_model", "rejection"),
    ("draft_model", "coupled"),
    ("lookup", "rejection"),
    ("lookup", "coupled"),
    ("block", "rejection"),
    ("block", "coupled"),
]


pair = pytest.fixture(peaked_pair, scope="module", name="pair")


def _settings(group):
    """A group's settings with the defaults filled in, as plain Python/numpy values."""
    g = GROUPS[group]
    return dict(
        temperature=g["temperature"],
        repetition=g.get("repetition_penalty", 1.0),
        presence=g.get("presence_penalty", 0.0),
        frequency=g.get("frequency_penalty", 0.0),
        bias=g.get("logit_bias", np.zeros(V, np.float32)),
        forbidden=g.get("forbidden_ids", []),
    )


def _mixed_config(num_rows):
    """Row i gets group i % 3's settings: [B] penalties, a [B, V] bias, ragged forbidden ids."""
    rows = [_settings(list(GROUPS)[i % len(GROUPS)]) for i in range(num_rows)]
    return specjax.SamplingConfig(
        temperature=np.asarray([r["temperature"] for r in rows]),
        repetition_penalty=np.asarray([r["repetition"] for r in rows]),
        presence_penalty=np.asarray([r["presence"] for r in rows]),
        frequency_penalty=np.asarray([r["frequency"] for r in rows]),
        logit_bias=np.stack([r["bias"] for r in rows]),
        forbidden_ids=[list(r["forbidden"]) for r in rows],
    )


# --------------------------------------------------------------------------------------
# The reference: numpy, float64, from the published semantics.


def _reference_logits(x, prefix, num_prompt, s, *, blind=False, plain=False):
    """The transformed logits after ``prefix`` (prompt then generated tokens).

    ``blind``: the penalties see the prompt only (never the generated tokens), the
    law of the broken variant. ``plain``: no transform at all (the other control).
    """
    x = np.asarray(x, np.float64).copy()
    if plain:
        return x
    x[list(s["forbidden"])] = -np.inf
    x += s["bias"]
    seen = prefix[:num_prompt] if blind else prefix
    generated = [] if blind else prefix[num_prompt:]
    for token in set(seen):
        x[token] = x[token] / s["repetition"] if x[token] > 0 else x[token] * s["repetition"]
    counts = np.bincount(np.asarray(generated, np.int64), minlength=V)
    return x - s["presence"] * (counts > 0) - s["frequency"] * counts


def _softmax(x, temperature):
    z = (x - x.max()) / temperature
    e = np.exp(z)
    return e / e.sum()


@pytest.fixture(scope="module")
def forward_logits(pair):
    """Next-token logits ``[V^K, P+K, V]`` of every K-token continuation of PROMPT."""
    conts = np.array(list(itertools.product(range(V), repeat=K)), np.int32)
    return conts, continuation_logits(pair[0], PROMPT, K)


def _penalised_law(forward_logits, group, num_tokens=K, **variant):
    """Exact ``[V] * num_tokens`` law of a group's first tokens (or a control's)."""
    conts, logits = forward_logits
    s = _settings(group)
    p0 = len(PROMPT) - 1
    law = np.zeros((V,) * num_tokens)
    for cont in itertools.product(range(V), repeat=num_tokens):
        row = np.ravel_multi_index(cont + (0,) * (K - num_tokens), (V,) * K)
        prob = 1.0
        for i in range(num_tokens):
            prefix = PROMPT + list(cont[:i])
            x = _reference_logits(logits[row, p0 + i], prefix, len(PROMPT), s, **variant)
            prob *= _softmax(x, s["temperature"])[cont[i]]
        law[cont] = prob
    return law


# --------------------------------------------------------------------------------------
# Fast tier: the transform against the reference, greedy equality, bad input.


def test_the_transform_follows_the_published_semantics():
    """`apply_logit_transforms` on random logits and prefixes equals the numpy reference,
    per row, with [B, T, V] counts as the verifier uses them."""
    rng = np.random.default_rng(0)
    b, s_len, num_prompt = 3, 9, 4
    seq = rng.integers(0, V, (b, s_len)).astype(np.int32)
    lengths = np.asarray([9, 6, 4], np.int32)
    drafts = rng.integers(0, V, (b, 2)).astype(np.int32)
    x = rng.normal(size=(b, 3, V)).astype(np.float32) * 3
    rows = [_settings(g) for g in GROUPS]
    config = _mixed_config(b)
    counts = token_counts(
        jnp.asarray(seq), jnp.full((b,), num_prompt), jnp.asarray(lengths), V
    ).along(jnp.asarray(drafts))
    got = np.asarray(
        apply_logit_transforms(
            jnp.asarray(x), RowSampling.of(specjax.sampling.per_row(config, b), (counts,))
        )
    )
    for r in range(b):
        for i in range(3):
            prefix = list(seq[r, : lengths[r]]) + list(drafts[r, :i])
            want = _reference_logits(x[r, i], prefix, num_prompt, rows[r])
            np.testing.assert_allclose(got[r, i], want, rtol=1e-6, atol=1e-6)


def test_counts_ignore_slots_past_the_length_and_the_prompt_for_generated():
    seq = jnp.asarray([[1, 1, 2, 3, 3, 3, 7]], jnp.int32)
    counts = token_counts(seq, jnp.asarray([2]), jnp.asarray([5]), V)
    np.testing.assert_array_equal(counts.all[0], [0, 2, 1, 2, 0, 0, 0, 0])
    np.testing.assert_array_equal(counts.generated[0], [0, 0, 1, 2, 0, 0, 0, 0])
    along = TokenCounts(all=counts.all, generated=counts.generated).along(jnp.asarray([[3, -1]]))
    np.testing.assert_array_equal(along.generated[0, :, 3], [2, 3, 3])  # -1: not proposed


def _greedy_config(form, b):
    """The penalised greedy settings as scalars or per-row arrays."""
    if form == "scalar":
        return specjax.SamplingConfig(
            temperature=0.0,
            repetition_penalty=1.3,
            presence_penalty=0.7,
            frequency_penalty=0.4,
            logit_bias=np.linspace(-0.5, 0.5, 64),
            forbidden_ids=[5, 9],
        )
    return specjax.SamplingConfig(
        temperature=np.zeros(b),
        repetition_penalty=np.linspace(1.0, 2.0, b),
        presence_penalty=np.linspace(0.0, 1.5, b),
        frequency_penalty=np.linspace(1.0, 0.0, b),
        logit_bias=np.random.default_rng(1).normal(size=(b, 64)),
        forbidden_ids=[[5], [], [9, 11]][:b] + [[1]] * (b - 3),
    )


_DRAFTERS = {
    "self": lambda target, draft: specjax.DraftModel(target, num_draft=GAMMA),
    "draft_model": lambda target, draft: specjax.DraftModel(draft, num_draft=GAMMA),
    "lookup": lambda target, draft: specjax.PromptLookup(ngram=2, num_draft=GAMMA),
    "block": lambda target, draft: specjax.BlockDrafter.random(
        target, key=jax.random.key(3), num_draft=GAMMA
    ),
}


@pytest.fixture(scope="module")
def greedy_pair():
    return tiny_model(seed=0, vocab_size=64), tiny_model(seed=1, vocab_size=64)


@pytest.mark.parametrize("drafter_name", list(_DRAFTERS))
@pytest.mark.parametrize("form", ["per_row", "scalar"])
# Fast tier: the target drafting for itself with per-row settings (about 10 s); the
# other drafters and the scalar form (two programs each) run with -m slow.
@pytest.mark.first_case_fast
def test_greedy_speculative_equals_plain_with_penalties(greedy_pair, form, drafter_name):
    """B = 3 = γ + 1 (γ = 2), per-row and scalar settings; the penalties change the
    output (else this would prove nothing) and forbidden ids never appear."""
    target, draft = greedy_pair
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5], [6, 7, 8, 6, 7, 8, 6]]
    sampling = _greedy_config(form, len(prompts))
    key = jax.random.key(0)
    drafter = _DRAFTERS[drafter_name](target, draft)
    # Equal token for token only at one forward width: the drafter's verify width.
    kw = dict(max_new_tokens=16, forward_width=specjax.drafters.lookahead(drafter))
    plain = specjax.generate(key, target, prompts, sampling=sampling, **kw)
    # No transform, in the same structure (a zero bias, forbidden ids all padding):
    # the same compiled program as `plain`.
    bare = specjax.generate(
        key,
        target,
        prompts,
        **kw,
        sampling=sampling.replace(
            repetition_penalty=np.float32(1),
            presence_penalty=np.float32(0),
            frequency_penalty=np.float32(0),
            logit_bias=np.zeros_like(sampling.logit_bias),
            forbidden_ids=np.full_like(sampling.forbidden_ids, -1),
        ),
    )
    assert plain.to_lists() != bare.to_lists()
    forbidden = np.asarray(sampling.forbidden_ids)
    for r, row in enumerate(plain.to_lists()):
        assert not set(row) & set((forbidden if forbidden.ndim == 1 else forbidden[r]).tolist())
    out = specjax.speculative_generate(key, target, drafter, prompts, sampling=sampling, **kw)
    assert out.to_lists() == plain.to_lists()
    if drafter_name == "self":  # the draft's q reads its own earlier drafts: all accepted
        assert float(out.stats.acceptance_rate) == 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(repetition_penalty=-1.0), "repetition_penalty must be > 0"),
        (dict(presence_penalty=2.5), "presence_penalty must be in"),
        (dict(frequency_penalty=[0.0, np.nan]), "frequency_penalty must be in"),
        (dict(logit_bias=np.zeros(63)), r"logit_bias has shape \[63\].*V = 64"),
        (dict(logit_bias=np.zeros((3, 64))), r"logit_bias has shape \[3, 64\].*\[2, \.\.\.\]"),
        (dict(logit_bias=np.full(64, np.nan)), "logit_bias must not hold NaN"),
        (dict(forbidden_ids=[64]), "forbidden_ids holds id 64"),
        (dict(forbidden_ids=[-2]), "forbidden_ids must be ids >= 0"),
        (dict(forbidden_ids=[0.5]), "forbidden_ids must be integer ids"),
        (dict(repetition_penalty=[1.0, 1.0, 1.0]), r"repetition_penalty has shape \[3\]"),
    ],
)
def test_bad_settings_are_refused_by_name_before_compiling(kwargs, match):
    target = tiny_model(seed=0, vocab_size=64)
    with pytest.raises((ValueError, TypeError), match=match):
        specjax.generate(
            jax.random.key(0),
            target,
            [[1, 2], [3]],
            max_new_tokens=4,
            sampling=specjax.SamplingConfig(**kwargs),
        )


def test_a_tree_drafter_with_penalties_is_refused():
    target = tiny_model(seed=0, vocab_size=64)
    drafter = specjax.DraftModel(tiny_model(seed=1, vocab_size=64)).with_tree((2, 1))
    with pytest.raises(ValueError, match="not supported with a tree drafter"):
        specjax.speculative_generate(
            jax.random.key(0),
            target,
            drafter,
            [[1, 2]],
            max_new_tokens=4,
            sampling=specjax.SamplingConfig(presence_penalty=0.5),
        )


# --------------------------------------------------------------------------------------
# Slow tier: the statistical tests and their controls.


def _sample(pair, name, verification, num_rows, forward_width=None):
    target, draft = pair
    key = jax.random.key(2026)
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))
    kw = dict(max_new_tokens=K, sampling=_mixed_config(num_rows), forward_width=forward_width)
    if name == "plain":
        res = specjax.generate(key, target, prompts, **kw)
    else:
        drafter = make_drafter(name, target, draft, GAMMA)
        res = specjax.speculative_generate(
            key, target, drafter, prompts, verification=verification, **kw
        )
    assert int(jnp.min(res.lengths)) == K
    return np.asarray(res.tokens)


@pytest.fixture(scope="module")
def mixed_samples(pair):
    num_rows = N_PER_GROUP * len(GROUPS)
    # One forward width for every decoder, at least each drafter's verify width: coupled
    # output equals plain output only at the same width.
    width = max(
        specjax.drafters.lookahead(make_drafter(name, *pair, GAMMA))
        for name, _ in DECODERS
        if name != "plain"
    )
    return {d: _sample(pair, *d, num_rows, width) for d in DECODERS}


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: "-".join(d))
def test_each_group_follows_the_penalised_law(forward_logits, mixed_samples, decoder, group):
    rows = group_rows(mixed_samples[decoder], GROUPS, group, (N_PER_GROUP, K))
    p = chi_square_pvalue(sequence_counts(rows, V), _penalised_law(forward_logits, group))
    assert p > FALSE_ALARM, f"{decoder}/{group}: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_coupled_output_equals_plain_output_token_for_token(mixed_samples):
    plain = mixed_samples["plain", "rejection"]
    for name in ("draft_model", "lookup", "block"):
        np.testing.assert_array_equal(mixed_samples[name, "coupled"], plain, err_msg=name)


@pytest.mark.slow
def test_sample_size_has_power_against_the_controls(forward_logits):
    """N_PER_GROUP against the prefix-blind law (the broken variant's) and the bare law.

    The smallest N with power 0.999 at FALSE_ALARM, per group, is computed here and
    must be at most N_PER_GROUP / 2 (so N is at least twice it).
    """
    for group in GROUPS:
        law = _penalised_law(forward_logits, group)
        for variant in (dict(blind=True), dict(plain=True)):
            alternative = _penalised_law(forward_logits, group, **variant)
            n_min = min_sample_size(law, alternative, FALSE_ALARM, power=0.999)
            assert 2 * n_min <= N_PER_GROUP, (group, variant, n_min)
            power = chi_square_power(law, alternative, N_PER_GROUP, FALSE_ALARM)
            assert power > 0.999, (group, variant, power)


@pytest.mark.slow
def test_control_penalties_without_the_steps_drafts_is_rejected(pair, forward_logits, monkeypatch):
    """The broken variant, run: the verifier's penalties count the committed prefix at
    every position of a step (not drafts 0..i-1). The target drafts for itself, so the
    first draft is always accepted and the second token follows the broken law."""
    target, _ = pair

    def broken(counts_BV, drafts_BG):
        g1 = drafts_BG.shape[1] + 1
        grow = lambda c: jnp.broadcast_to(c[:, None], (c.shape[0], g1, c.shape[1]))  # noqa: E731
        return counts_BV.replace(all=grow(counts_BV.all), generated=grow(counts_BV.generated))

    monkeypatch.setattr(TokenCounts, "along", broken)
    jax.clear_caches()  # the correct program must not be reused
    try:
        tokens = _sample((target, target), "draft_model", "rejection", N_PER_GROUP * len(GROUPS))
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    for group in GROUPS:
        rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
        p = chi_square_pvalue(sequence_counts(rows, V), _penalised_law(forward_logits, group))
        assert p < FALSE_ALARM, f"{group}: the broken variant passed, p = {p:.2e}"


@pytest.mark.slow
def test_control_the_law_without_penalties_is_rejected(forward_logits, mixed_samples):
    """A group's rows (draft model, rejection) fail against the law of the bare logits."""
    for group in GROUPS:
        rows = group_rows(
            mixed_samples["draft_model", "rejection"], GROUPS, group, (N_PER_GROUP, K)
        )
        p = chi_square_pvalue(
            sequence_counts(rows, V), _penalised_law(forward_logits, group, plain=True)
        )
        assert p < FALSE_ALARM, f"{group}: p = {p:.2e}"
