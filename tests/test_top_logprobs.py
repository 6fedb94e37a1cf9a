"""Top-k log-probabilities per emitted token (`top_logprobs=k`).

The reference is numpy: one full forward of each row's prompt + output gives the
target's logits at every emitted position; the processed distribution is the softmax at
the row's temperature followed by its top-k filter (greedy rows: the one-hot of the
argmax), and the raw one is the log-softmax of the logits. The decoders' k entries must
be that distribution's k most probable ids, in order, with their log-probabilities.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.testing import tiny_model

V = 64
K = 4
PROMPTS = [[1, 2, 3, 1, 2], [4, 5], [6, 7, 8]]  # B = 3 = γ + 1 at γ = 2
SAMPLING = specjax.SamplingConfig(temperature=[1.0, 0.0, 0.7], top_k=[0, 0, 3])
TEMPERATURES, TOP_KS = [1.0, 0.0, 0.7], [0, 0, 3]


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=0, vocab_size=V), tiny_model(seed=1, vocab_size=V)


def _reference(target, out, raw=False):
    """``(ids [B, W, K], log-probabilities [B, W, K])`` per emitted position, numpy."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    ids_all, values_all = [], []
    for b, prompt in enumerate(PROMPTS):
        seq = np.asarray(prompt + tokens[b, : lengths[b]].tolist(), np.int32)[None]
        positions = np.arange(seq.shape[1], dtype=np.int32)[None]
        logits = target(seq, positions, target.init_cache(1, seq.shape[1])).logits
        logits = np.asarray(logits[0, len(prompt) - 1 : -1], np.float64)  # [n, V]
        if raw:
            shifted = logits - logits.max(-1, keepdims=True)
            log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        elif TEMPERATURES[b] == 0:
            log_p = np.where(np.arange(V) == logits.argmax(-1)[:, None], 0.0, -np.inf)
        else:
            z = logits / TEMPERATURES[b]
            p = np.exp(z - z.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            if TOP_KS[b]:
                kth = np.sort(p, -1)[:, -TOP_KS[b]][:, None]
                p = np.where(p >= kth, p, 0.0)
                p /= p.sum(-1, keepdims=True)
            with np.errstate(divide="ignore"):
                log_p = np.log(p)
        order = np.argsort(-log_p, axis=-1, kind="stable")[:, :K]  # ties: lowest id first
        ids_all.append(order)
        values_all.append(np.take_along_axis(log_p, order, -1))
    return ids_all, values_all


def _check(target, out, raw=False):
    ids, values = _reference(target, out, raw)
    lengths = np.asarray(out.lengths)
    assert out.top_ids.shape == out.top_logprobs.shape == out.tokens.shape + (K,)
    for b, n in enumerate(lengths):
        got_values = np.asarray(out.top_logprobs[b, :n], np.float64)
        np.testing.assert_allclose(got_values, values[b], rtol=1e-4, atol=1e-4)
        # Ids compare where the reference's values are not tied with a neighbour.
        got_ids = np.asarray(out.top_ids[b, :n])
        clear = np.isfinite(values[b]) & ~np.isclose(np.diff(values[b], prepend=np.inf), 0)
        np.testing.assert_array_equal(got_ids[clear], ids[b][clear])
        assert (np.asarray(out.top_ids[b, n:]) == -1).all()
        if not raw:  # the chosen token's log-probability, where it is among the k
            chosen = np.asarray(out.tokens[b, :n])
            for t in range(n):
                hit = got_ids[t] == chosen[t]
                if hit.any():
                    np.testing.assert_allclose(
                        got_values[t][hit][0], float(out.logprobs[b, t]), rtol=1e-5, atol=1e-5
                    )


def test_plain_top_logprobs_are_the_processed_distributions(pair):
    """Per-row settings: a sampled row, a greedy one, a top-k one."""
    target, _ = pair
    plain = specjax.generate(
        jax.random.key(0), target, PROMPTS, max_new_tokens=8, sampling=SAMPLING, top_logprobs=K
    )
    _check(target, plain)


@pytest.mark.slow  # two more decode programs (about 15 s)
def test_speculative_top_logprobs_are_plains(pair):
    """B = γ + 1; the draft model's coupled run emits plain's tokens at the same forward
    width, so its k entries must be plain's too (accepted drafts and target tokens alike)."""
    target, draft = pair
    key = jax.random.key(0)
    drafter = specjax.DraftModel(draft, num_draft=2)
    kw = dict(
        max_new_tokens=8,
        sampling=SAMPLING,
        top_logprobs=K,
        forward_width=specjax.drafters.lookahead(drafter),
    )
    plain = specjax.generate(key, target, PROMPTS, **kw)
    spec = specjax.speculative_generate(key, target, drafter, PROMPTS, verification="coupled", **kw)
    assert spec.to_lists() == plain.to_lists()
    assert int(spec.stats.accepted.sum()) > 0
    np.testing.assert_allclose(spec.top_logprobs, plain.top_logprobs, rtol=1e-5, atol=1e-5)
    _check(target, spec)


@pytest.mark.slow  # two more decode programs (about 10 s)
@pytest.mark.parametrize("drafter", ["lookup", "draft_model"])
def test_raw_top_logprobs_are_the_logits_log_softmax(pair, drafter):
    target, draft = pair
    made = (
        specjax.PromptLookup(ngram=2, num_draft=2)
        if drafter == "lookup"
        else specjax.DraftModel(draft, num_draft=2)
    )
    out = specjax.speculative_generate(
        jax.random.key(1),
        target,
        made,
        PROMPTS,
        max_new_tokens=8,
        sampling=SAMPLING,
        top_logprobs=K,
        raw_logprobs=True,
    )
    _check(target, out, raw=True)


@pytest.mark.slow  # continuous batching: one more program (about 6 s)
def test_continuous_batching_keeps_each_prompts_entries(pair):
    target, _ = pair
    key = jax.random.key(2)
    alone = specjax.generate(
        key, target, PROMPTS, max_new_tokens=[3, 8, 5], sampling=SAMPLING, top_logprobs=K
    )
    slots = specjax.generate(
        key,
        target,
        PROMPTS,
        max_new_tokens=[3, 8, 5],
        sampling=SAMPLING,
        top_logprobs=K,
        num_slots=1,
    )
    assert slots.to_lists() == alone.to_lists()
    np.testing.assert_array_equal(slots.top_ids, alone.top_ids)
    np.testing.assert_allclose(slots.top_logprobs, alone.top_logprobs, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # one more program (about 5 s)
def test_default_is_no_entries(pair):
    target, _ = pair
    out = specjax.generate(jax.random.key(0), target, [[1, 2]], max_new_tokens=3)
    assert out.top_ids.shape == out.top_logprobs.shape == (1, 3, 0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(top_logprobs=-1), ValueError, r"top_logprobs must be an int in \[0, V = 64\]"),
        (dict(top_logprobs=65), ValueError, "top_logprobs must be an int"),
        (dict(top_logprobs=1.5), ValueError, "top_logprobs must be an int"),
        (dict(top_logprobs=True), ValueError, "top_logprobs must be an int"),
        (dict(raw_logprobs="yes"), TypeError, "raw_logprobs must be True or False"),
    ],
)
def test_bad_arguments_are_refused_by_name(pair, kwargs, error, match):
    target, _ = pair
    with pytest.raises(error, match=match):
        specjax.generate(jax.random.key(0), target, [[1, 2]], max_new_tokens=3, **kwargs)
    with pytest.raises(error, match=match):
        specjax.speculative_generate(
            jax.random.key(0),
            target,
            specjax.PromptLookup(ngram=2, num_draft=2),
            [[1, 2]],
            max_new_tokens=3,
            **kwargs,
        )


@pytest.mark.slow  # the open loop's two programs (about 6 s)
def test_open_loop_keeps_them(pair):
    target, _ = pair
    decoder, state = specjax.decoding.init(
        jax.random.key(0), target, PROMPTS, max_new_tokens=8, sampling=SAMPLING, top_logprobs=K
    )
    out = specjax.decoding.result(decoder, specjax.decoding.run(decoder, state))
    assert out.top_ids.shape[-1] == K and bool(jnp.all(out.top_ids[:, 0] >= 0))
