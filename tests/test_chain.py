"""`ChainDrafter` (``--drafter suffix,model``): exact, and the draft model sits out steps.

Exactness: greedy output equals plain decoding at the forward width, at batch 1 (the
``lax.cond`` that skips the draft model) and batch 3 (each row its own choice), in
float32, bfloat16 and int8; and the joint law of the first K = 3 sampled tokens under
rejection and block verification against the target's own (`exact_sequence_probs`):
V = 8, N = 3,000 prompts, once through one slot (every step at batch 1, the cond path)
and once 3,000 rows at a time (per-row choice); chi-square p < FALSE_ALARM = 1e-4, 3
tests. Negative control: the per-row choice patched to judge the suffix drafter's
drafts against the draft model's q (`_chosen_probs` keeps the last member's q), the same
test at the same N must reject; its law is estimated from M = 60,000 rows and the power
at N asserted at least 0.99.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import assert_control_rejected, patched_runs, peaked_model

import specjax
from specjax.drafters import chain as chain_module
from specjax.drafters.chain import ChainDrafter
from specjax.drafters.suffix import SuffixDrafter
from specjax.models.quant import quantize
from specjax.testing import (
    chi_square_pvalue,
    exact_sequence_probs,
    sequence_counts,
)

V = 8
PROMPT = [1, 2, 3, 4, 1, 2]
CORPUS = [[2, 3, 4, 5, 6, 7], [1, 2, 3, 5, 6]]
K, N, M = 3, 3_000, 60_000
FALSE_ALARM = 1e-4
SAMPLING = specjax.SamplingConfig(temperature=1.0)


def _chain(draft, gamma: int = 3) -> ChainDrafter:
    suffix = SuffixDrafter.of(CORPUS, num_draft=gamma)
    # Matches of two tokens serve (the default asks four): both members draft often here.
    return ChainDrafter.of(suffix, specjax.DraftModel(draft, num_draft=2), min_match=2)


@pytest.mark.first_case_fast
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_greedy_output_equals_plain_decoding_at_batch_1_and_3(precision, rows):
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    target, draft = peaked_model(0, dtype), peaked_model(1, dtype)
    if precision == "int8":
        target, draft = quantize(target, "int8"), quantize(draft, "int8")
    kw = dict(max_new_tokens=16, forward_width=4)
    prompts = [PROMPT, [5, 6, 7], [3, 1, 2, 3]][:rows]
    spec = specjax.speculative_generate(None, target, _chain(draft), prompts, **kw)
    assert spec.to_lists() == specjax.generate(None, target, prompts, **kw).to_lists()


def test_the_draft_model_catches_up_on_what_it_sat_out():
    """A long run of suffix-served steps, then the draft model again: its cache is fed
    the committed tokens (`DraftModel.catch_up`), so its drafts are those of a draft
    model that saw everything (the same as a draft model drafting alone there)."""
    target, draft = peaked_model(0), peaked_model(1)
    text = [1, 2, 3, 4, 5, 6, 7, 0] * 4
    drafter = _chain(draft, gamma=6)
    kw = dict(max_new_tokens=24, forward_width=7)
    spec = specjax.speculative_generate(None, target, drafter, [text], **kw)
    assert spec.to_lists() == specjax.generate(None, target, [text], **kw).to_lists()
    cache = drafter.members[1].init(jnp.asarray([text + [0] * 40]), jnp.asarray([len(text)]), 80)
    behind = cache.rollback(jnp.asarray([3]))
    seq = jnp.asarray([text + [0] * 40])
    caught = drafter.members[1]._catch_up(behind, seq, jnp.asarray([len(text) - 1]))
    assert int(caught.lengths[0]) == len(text) - 2
    np.testing.assert_allclose(
        np.asarray(caught.k[:, :, :, :, : len(text) - 2]),
        np.asarray(cache.k[:, :, :, :, : len(text) - 2]),
        rtol=1e-5,
        atol=1e-5,
    )


def _sampled(target, drafter, verification: str, n: int, *, one_slot: bool, key_seed=11):
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (n, len(PROMPT)))
    kw = dict(max_new_tokens=K, sampling=SAMPLING, verification=verification)
    if one_slot:
        kw["num_slots"] = 1
    out = specjax.speculative_generate(jax.random.key(key_seed), target, drafter, prompts, **kw)
    return np.asarray(out.tokens), out


@pytest.mark.parametrize(
    "verification, one_slot", [("rejection", True), ("rejection", False), ("block", False)]
)
def test_sampled_output_follows_the_target(verification, one_slot):
    target, draft = peaked_model(0), peaked_model(1)
    tokens, out = _sampled(target, _chain(draft), verification, N, one_slot=one_slot)
    assert 0.05 < float(jax.device_get(out.stats).acceptance_rate) < 0.95
    law = exact_sequence_probs(target, PROMPT, K, SAMPLING)
    assert chi_square_pvalue(sequence_counts(tokens, V), law) >= FALSE_ALARM


@pytest.fixture(scope="module")
def wrong_q_runs():
    target, draft = peaked_model(0), peaked_model(1)

    def decode(rows, key_seed):
        kw = dict(one_slot=False) if key_seed is None else dict(one_slot=False, key_seed=key_seed)
        return _sampled(target, _chain(draft), "rejection", rows, **kw)[0]

    def wrong_q(served, first_q, last_q):
        return last_q

    buggy, tokens = patched_runs(
        chain_module, "_chosen_probs", wrong_q, decode, m=M, n=N, vocab_size=V
    )
    return target, buggy, tokens


def test_negative_control_the_suffix_drafts_judged_by_the_model_q_are_rejected(wrong_q_runs):
    target, buggy, tokens = wrong_q_runs
    law = exact_sequence_probs(target, PROMPT, K, SAMPLING)
    assert_control_rejected(law, buggy, tokens, vocab_size=V, false_alarm=FALSE_ALARM)


def test_a_chain_needs_a_first_member_that_says_when_it_has_nothing():
    draft = peaked_model(1)
    with pytest.raises(ValueError, match="first member must say when it has nothing"):
        ChainDrafter.of(specjax.PromptLookup(), specjax.DraftModel(draft))
