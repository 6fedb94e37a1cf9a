"""Block verification (``verification="block"``) is exact, and greedy rows stay greedy.

The promise: the tokens `specjax.speculative_generate` emits under block verification
are distributed exactly as the target's own sampling. It is checked on the joint law of
the first K = 3 tokens (a chain of γ = 3 drafts, so the three tokens span one step or
several, with drafts kept past a failed one), for a draft model that samples its drafts
(full q), for prompt lookup (one-hot q), and for a draft model whose rows stop drafting
under ``draft_confidence`` (drafts not proposed), the first in float32, bfloat16 and
int8.

Setup, every seed fixed: target ``tiny_model(seed=0, V=8, init_scale=15,
num_layers=1)`` (peaked, prefix-dependent distributions), draft ``tiny_model(seed=1)``
of the same shape, temperature 1. Each test decodes N = 3,000 copies of one prompt in
one call (``key(KEY_SEED)``, seeds 0..N-1). The null law is `exact_sequence_probs` of
the target alone, no decoder, in the model's own precision. Pearson's chi-square over
the 512 cells (expected counts below 5 pooled) rejects at p < FALSE_ALARM = 1e-4; the
file runs 5 such null tests, so its family-wise false-alarm rate is below 5e-4.

Negative control: the real verifier patched into a known bug, ``τ`` = the number of
leading coins that pass (token-wise stopping with block verification's thresholds,
instead of the last coin that passes), decoded at the same N, must be rejected. Its
law is estimated from M = 60,000 rows of the patched decoder (another key), and the
test's power against it at N must be at least MIN_POWER = 0.99 (asserted; it is
above 1 - 1e-9).

Greedy: at temperature 0 block verification keeps the drafts equal to the target's
argmax up to the first that is not: its output equals plain decoding's at the same
forward width, token for token, in float32, bfloat16 and int8, rows greedy in a sampled
batch included.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import assert_control_rejected, patched_runs, peaked_model

import specjax
from specjax.models.quant import quantize
from specjax.testing import (
    chi_square_pvalue,
    exact_sequence_probs,
    sequence_counts,
)
from specjax.verification import block

V = 8
PROMPT = [1, 2, 3, 1, 2]  # repeats: prompt lookup proposes from it
GAMMA = 3
K = 3
N = 3_000
M = 60_000
FALSE_ALARM = 1e-4
MIN_POWER = 0.99
KEY_SEED = 2031
SAMPLING = specjax.SamplingConfig(temperature=1.0)


def _models(precision: str):
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    target, draft = peaked_model(0, dtype), peaked_model(1, dtype)
    if precision == "int8":
        target, draft = quantize(target, "int8"), quantize(draft, "int8")
    return target, draft


def _decode(target, drafter, n: int, key_seed: int = KEY_SEED, **kw):
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (n, len(PROMPT)))
    key = jax.random.key(key_seed)
    kw |= dict(max_new_tokens=K, sampling=SAMPLING, verification="block")
    out = specjax.speculative_generate(key, target, drafter, prompts, **kw)
    return np.asarray(out.tokens), out


def _law(target) -> np.ndarray:
    return exact_sequence_probs(target, PROMPT, K, SAMPLING)


@pytest.mark.first_case_fast
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_block_verification_of_a_sampling_draft_model_is_exact(precision):
    target, draft = _models(precision)
    tokens, out = _decode(target, specjax.DraftModel(draft, num_draft=GAMMA), N)
    stats = jax.device_get(out.stats)
    # Drafts were both kept and thrown away: the test exercises the rule.
    assert 0.05 < float(stats.acceptance_rate) < 0.95
    assert chi_square_pvalue(sequence_counts(tokens, V), _law(target)) >= FALSE_ALARM


def test_block_verification_of_one_hot_drafts_is_exact():
    target, _ = _models("float32")
    tokens, out = _decode(target, specjax.PromptLookup(num_draft=GAMMA), N)
    assert float(jax.device_get(out.stats).acceptance_rate) > 0.05
    assert chi_square_pvalue(sequence_counts(tokens, V), _law(target)) >= FALSE_ALARM


def test_block_verification_with_drafts_not_proposed_is_exact():
    target, draft = _models("float32")
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    tokens, out = _decode(target, drafter, N, draft_confidence=0.6)
    reached = np.asarray(jax.device_get(out.stats).position_reached)
    assert reached[-1] < reached[0]  # some rows stopped drafting early
    assert chi_square_pvalue(sequence_counts(tokens, V), _law(target)) >= FALSE_ALARM


@pytest.fixture(scope="module")
def first_failure_runs():
    """``(law estimated from M rows, N rows' tokens)`` of the decoder patched to stop
    at the first failed coin (a module fixture: its decodes are not the test's time)."""
    target, draft = _models("float32")
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)

    def first_failure(passed_G):
        return jnp.sum(jnp.cumprod(passed_G.astype(jnp.int32)), dtype=jnp.int32)

    def decode(rows, key_seed):
        return _decode(target, drafter, rows, key_seed=key_seed or KEY_SEED)[0]

    return patched_runs(block, "_last_passed", first_failure, decode, m=M, n=N, vocab_size=V)


def test_negative_control_stopping_at_the_first_failed_coin_is_rejected(first_failure_runs):
    buggy_law, tokens = first_failure_runs
    law = _law(_models("float32")[0])
    assert_control_rejected(law, buggy_law, tokens, vocab_size=V, false_alarm=FALSE_ALARM)


@pytest.mark.first_case_fast
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_greedy_rows_equal_plain_decoding_at_the_forward_width(precision):
    target, draft = _models(precision)
    width = GAMMA + 1
    prompts = [PROMPT, PROMPT[:3], [4, 5, 6, 7, 4, 5]]
    temperature = jnp.asarray([0.0, 1.0, 0.0])
    sampling = specjax.SamplingConfig(temperature=temperature)
    kw = dict(max_new_tokens=12, sampling=sampling, forward_width=width)
    key = jax.random.key(3)
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    spec = specjax.speculative_generate(key, target, drafter, prompts, verification="block", **kw)
    spec = spec.to_lists()
    plain = specjax.generate(key, target, prompts, **kw).to_lists()
    assert spec[0] == plain[0] and spec[2] == plain[2]


def test_a_tree_is_refused_with_block_verification():
    target, draft = _models("float32")
    tree = specjax.DraftModel(draft).with_tree((2, 1))
    with pytest.raises(ValueError, match="verification='block' judges a chain"):
        specjax.speculative_generate(
            None, target, tree, [PROMPT], max_new_tokens=4, verification="block"
        )
