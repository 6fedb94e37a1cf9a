"""Reproducible for every key: batch invariance, coupled verification, the open loop.

Every draw for row b at position t comes from ``fold_in(fold_in(key, seeds[b]), t)``
(`specjax.sampling.noise`), so a row's tokens depend on its key, seed and prompt only. These
tests compare exact token sequences, not distributions: there is no false-alarm rate.

Float rounding: a row's logits are computed in batches of different shapes (alone,
inside 8 rows, in a γ+1-token verify instead of a 1-token step), and XLA may round
them differently in the last bits. A sampled token could then flip only where two
candidates' race scores tie to within that rounding (about 1e-6 relative). The tests
here assert that no row differs for these seeds, and name the rows that do.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import make_drafter, ragged_prompts

import specjax
from specjax import decoding
from specjax.testing import tiny_model

V = 64
SEED = 42
SAMPLED = specjax.SamplingConfig(temperature=1.0, top_p=0.95)


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=0, vocab_size=V, init_scale=6.0), tiny_model(seed=5, vocab_size=V)


def _prompts(batch, seed):
    """Repetitive prompts of 4 to 16 tokens (prompt lookup finds matches)."""
    return ragged_prompts(batch, seed, high=16, repeat=2, lengths=(2, 8))


def _run(target, drafter, prompts, seeds, verification="rejection", **kw):
    kw = dict(max_new_tokens=24, sampling=SAMPLED, seeds=seeds) | kw
    key = jax.random.key(3)
    if drafter is None:
        return specjax.generate(key, target, prompts, **kw)
    return specjax.speculative_generate(
        key, target, drafter, prompts, verification=verification, **kw
    )


def _differing_rows(rows, reference) -> list[int]:
    """Indices of the rows whose tokens differ from the reference's."""
    return [b for b, (row, ref) in enumerate(zip(rows, reference, strict=True)) if row != ref]


@pytest.mark.parametrize("name", ["plain", "draft_model", "lookup"])
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_a_row_does_not_depend_on_the_batch_around_it(pair, name):
    """Seed 42's row: alone, at index 0 and at index 5 of 8 different prompts."""
    target, draft = pair
    drafter = make_drafter(name, target, draft, 3)
    row = _prompts(1, seed=0)[0]
    alone = _run(target, drafter, [row], [SEED]).to_lists()[0]
    for index in (0, 5):
        prompts = _prompts(8, seed=1 + index)
        prompts[index] = row
        seeds = [100 + i for i in range(8)]
        seeds[index] = SEED
        batched = _run(target, drafter, prompts, seeds).to_lists()
        assert batched[index] == alone, (name, index)
    # Another seed gives another sample (the test above is not vacuous).
    assert _run(target, drafter, [row], [SEED + 1]).to_lists()[0] != alone


@pytest.mark.parametrize("gamma", [2, 6])
@pytest.mark.parametrize("name", ["draft_model", "lookup"])
# Slow tier (about 15 s a case): coupled == plain stays in the fast tier through
# test_block_drafter.py's B == γ+1 case and test_verify.py's enumerated coupled test.
@pytest.mark.slow
def test_coupled_equals_plain_alone_and_in_a_batch(pair, name, gamma):
    target, draft = pair
    drafter = make_drafter(name, target, draft, gamma)
    # Coupled equals plain token for token only at one forward width: the verify width.
    width = specjax.drafters.lookahead(drafter)
    row = _prompts(1, seed=0)[0]
    plain = _run(target, None, [row], [SEED], forward_width=width).to_lists()[0]
    prompts = _prompts(8, seed=9)
    prompts[5] = row
    seeds = list(range(200, 208))
    seeds[5] = SEED
    plain_batch = _run(target, None, prompts, seeds, forward_width=width).to_lists()
    coupled = _run(target, drafter, prompts, seeds, verification="coupled", forward_width=width)
    assert coupled.to_lists() == plain_batch
    assert coupled.to_lists()[5] == plain
    alone = _run(
        target, drafter, [row], [SEED], verification="coupled", forward_width=width
    ).to_lists()[0]
    assert alone == plain
    assert int(coupled.stats.accepted.sum()) > 0  # the drafter did contribute tokens


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [specjax.SamplingConfig(temperature=1.0), specjax.SamplingConfig(temperature=0.8, top_p=0.95)],
    ids=["t1", "t0.8_topp0.95"],
)
def test_coupled_equals_generate_on_the_bundled_pair(sampling):
    """16 held-out-style prompts x 64 tokens, each drafter, token for token (plain
    decoding at the same forward width)."""
    target, draft, tokenizer = specjax.default_pair()
    texts = [
        "def fibonacci(n):",
        "import os\n\nclass Config:",
        "for i in range(",
        "# Copyright",
        "def __init__(self,",
        "try:\n    import",
        "return self.",
        "if __name__ ==",
        "class Error(Exception):",
        "with open(path) as f:",
        "raise ValueError(",
        "@property\ndef",
        "x = [i for i in",
        "def test_",
        "assert isinstance(",
        "while True:\n    ",
    ]
    prompts = [tokenizer.encode(t).ids for t in texts]
    drafters = (specjax.DraftModel(draft, num_draft=4), specjax.PromptLookup(num_draft=4))
    # One forward width for plain and every drafter (both verify γ + 1 = 5 columns).
    width = max(specjax.drafters.lookahead(d) for d in drafters)
    kw = dict(max_new_tokens=64, sampling=sampling, forward_width=width)
    key = jax.random.key(0)
    plain = specjax.generate(key, target, prompts, **kw).to_lists()
    for drafter in drafters:
        out = specjax.speculative_generate(
            key, target, drafter, prompts, verification="coupled", **kw
        )
        differ = _differing_rows(out.to_lists(), plain)
        assert not differ, f"{type(drafter).__name__}: rows {differ} differ from plain decoding"


# --------------------------------------------------------------------------------------
# The open loop.


@pytest.mark.parametrize(
    "name, verification",
    [("plain", "rejection"), ("draft_model", "rejection"), ("lookup", "coupled")],
)
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_chunks_of_steps_equal_one_call(pair, name, verification):
    target, draft = pair
    drafter = make_drafter(name, target, draft, 3)
    prompts = _prompts(3, seed=4)
    seeds = [7, 8, 9]
    whole = _run(target, drafter, prompts, seeds, verification)
    kw = dict(max_new_tokens=24, sampling=SAMPLED, seeds=seeds, verification=verification)
    decoder, state = decoding.init(jax.random.key(3), target, prompts, drafter=drafter, **kw)
    partial = []
    for n in (1, 3, 2, 7):
        state = decoding.run(decoder, state, n)
        partial.append(decoding.result(decoder, state).to_lists())
    state = decoding.run(decoder, state)
    out = decoding.result(decoder, state)
    assert out.to_lists() == whole.to_lists()
    np.testing.assert_array_equal(out.tokens, whole.tokens)
    np.testing.assert_array_equal(out.logprobs, whole.logprobs)
    np.testing.assert_array_equal(out.stats.accepted, whole.stats.accepted)
    # Every intermediate result is a prefix of the final one.
    for rows in partial:
        for row, final in zip(rows, whole.to_lists(), strict=True):
            assert final[: len(row)] == row
    assert [len(r) for r in partial[0]] <= [len(r) for r in partial[-1]]


# Slow tier: 7 s: the open loop's stream, chunk by chunk.
@pytest.mark.slow
def test_stream_yields_every_token_once(pair):
    target, draft = pair
    prompts = _prompts(2, seed=6)
    drafter = make_drafter("draft_model", target, draft, 3)
    whole = _run(target, drafter, prompts, [1, 2]).to_lists()
    kw = dict(max_new_tokens=24, sampling=SAMPLED, seeds=[1, 2], verification="rejection")
    decoder, start = decoding.init(jax.random.key(3), target, prompts, drafter=drafter, **kw)
    streamed = [[], []]
    chunks = 0
    for state, new in decoding.stream(decoder, start, steps_per_chunk=2):  # noqa: B007 (used below)
        chunks += 1
        for row, tokens in zip(streamed, new, strict=True):
            row.extend(tokens)
    assert streamed == whole and chunks > 2
    assert bool(state.done.all())


@pytest.mark.parametrize("name", ["plain", "draft_model"])
# Slow tier (about 10 s a case): the fast tier checks the chosen token's log-probability
# in test_top_logprobs.py.
@pytest.mark.slow
def test_logprobs_are_the_targets_processed_log_probabilities(pair, name):
    """Against a teacher-forced forward over prompt + output (no cache reuse)."""
    target, draft = pair
    sampling = specjax.SamplingConfig(temperature=jnp.asarray([0.7, 1.0, 0.0]), top_k=[5, 0, 0])
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    out = _run(target, make_drafter(name, target, draft, 3), prompts, None, sampling=sampling)
    for b, (prompt, tokens) in enumerate(zip(prompts, out.to_lists(), strict=True)):
        seq = jnp.asarray([prompt + tokens])
        logits = target(seq, jnp.arange(seq.shape[1])[None], None).logits
        row_config = specjax.SamplingConfig(
            temperature=sampling.temperature[b], top_k=sampling.top_k[b]
        )
        probs = specjax.sampling.probs_from_logits(logits[0, len(prompt) - 1 : -1], row_config)
        expected = np.log(np.asarray(probs)[np.arange(len(tokens)), tokens])
        np.testing.assert_allclose(out.logprobs[b, : len(tokens)], expected, atol=2e-5)
    assert (np.asarray(out.logprobs[2]) == 0).all()  # greedy: one-hot, log 1
