"""`SuffixDrafter`: what it drafts, that decoding with it stays exact, and its corpus.

Its drafts are checked against a brute-force search written here (the longest suffix of
the row matched in the row's own text and in the corpus, continuations cut at the end
of their document and at ``ceil(spec_factor · n)``); the corpus table against a count
of continuations done here. Exactness: greedy output equals plain decoding at the
forward width (float32, bfloat16, int8), and the joint law of the first K = 3 sampled
tokens under rejection and block verification against the target's own law
(`exact_sequence_probs`): V = 8, N = 3,000 rows, chi-square p < FALSE_ALARM = 1e-4, 2
tests. Negative control: the one-hot verifier patched to accept every drafted token
(the drafts then pass unjudged), the same test at the same N must reject; its law is
estimated from M = 60,000 rows and the power at N is asserted at least 0.99.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import assert_control_rejected, patched_runs, peaked_model

import specjax
from specjax.drafters.suffix import SIZES, SuffixDrafter, SuffixIndex, _hash_jnp, _hash_np
from specjax.models.quant import quantize
from specjax.testing import (
    chi_square_pvalue,
    exact_sequence_probs,
    sequence_counts,
)
from specjax.verification import chain

V = 8
PROMPT = [1, 2, 3, 4, 1, 2]
CORPUS = [[5, 6, 7, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7, 0], [3, 4, 5, 6]]
K, N, M = 3, 3_000, 60_000
FALSE_ALARM = 1e-4
SAMPLING = specjax.SamplingConfig(temperature=1.0)


def _brute_force(row, length, corpus, gamma, factor):
    """``(tokens, n)`` the drafter should propose for one row."""
    own = list(row[:length])
    best = (0, None, None)  # (n, source, start)
    for n in SIZES:
        if n >= len(row) or length < n + 1:
            continue
        suffix = own[length - n :]
        for i in range(length - n - 1, -1, -1):  # latest earlier window
            if own[i : i + n] == suffix:
                best = (n, "own", i + n) if n >= best[0] else best
                break
    flat = []
    for doc in corpus:
        flat += list(doc) + [-1]
    corpus_best = (0, None)
    for n in SIZES:
        if length < n + 1:
            continue
        suffix = own[length - n :]
        counts = {}
        for i in range(len(flat) - n):
            if flat[i : i + n] == suffix and flat[i + n] >= 0:
                counts.setdefault(flat[i + n], []).append(i + n)
        if counts:
            top = max(counts, key=lambda t: (len(counts[t]), max(counts[t])))
            corpus_best = (n, max(counts[top]))
    n = max(best[0], corpus_best[0])
    if n == 0:
        return [], 0
    if best[0] >= corpus_best[0]:
        start = best[2]
        follow = own[start:length]
    else:
        start = corpus_best[1]
        follow = []
        for t in flat[start:]:
            if t < 0:
                break
            follow.append(t)
    take = min(len(follow), math.ceil(factor * n), gamma)
    return follow[:take], n


def test_hashes_agree_on_host_and_device():
    windows = np.random.default_rng(0).integers(0, 150_000, size=(64, 4)).astype(np.int32)
    assert np.array_equal(_hash_np(windows), np.asarray(_hash_jnp(jnp.asarray(windows))))


@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_drafts_are_the_longest_matches_continuation(factor):
    rng = np.random.default_rng(1)
    drafter = SuffixDrafter.of(CORPUS, num_draft=5, spec_factor=factor)
    rows = [rng.integers(0, 8, size=rng.integers(2, 12)).tolist() for _ in range(40)]
    rows += [[5, 6, 7], [1, 2, 3], [9, 9], [2, 3, 4, 5, 6, 7]]
    width = max(len(r) for r in rows) + 2
    seq = np.zeros((len(rows), width), np.int32)
    for b, r in enumerate(rows):
        seq[b, : len(r)] = r
    lengths = np.asarray([len(r) for r in rows], np.int32)
    out = drafter.propose(None, (), jnp.asarray(seq), jnp.asarray(lengths), SAMPLING)
    tokens, drafted = np.asarray(out.tokens), np.asarray(out.num_drafted)
    for b, r in enumerate(rows):
        want, _ = _brute_force(seq[b], lengths[b], CORPUS, 5, factor)
        assert drafted[b] == len(want), (r, want, tokens[b], drafted[b])
        assert tokens[b, : drafted[b]].tolist() == want, (r, want)


def test_the_table_keeps_the_most_frequent_continuation():
    docs = [[1, 2, 7], [1, 2, 8], [1, 2, 8], [1, 2, 9]]
    index = SuffixIndex.build(docs)
    at = index.table[SIZES.index(2)][_hash_np(np.asarray([[1, 2]], np.int32))[0]]
    assert index.tokens[at] == 8 and at == 10  # twice, the latest of its two; 9 is later
    assert index.tokens.shape[0] == 1024 and set(index.tokens[16:].tolist()) == {-1}


@pytest.mark.first_case_fast
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_greedy_output_equals_plain_decoding_at_the_width(precision):
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    target = peaked_model(0, dtype)
    target = quantize(target, "int8") if precision == "int8" else target
    drafter = SuffixDrafter.of(CORPUS, num_draft=4)
    kw = dict(max_new_tokens=16, forward_width=5)
    prompts = [PROMPT, [5, 6, 7], [3, 4, 5, 6, 3, 4]]
    spec = specjax.speculative_generate(None, target, drafter, prompts, **kw)
    assert spec.to_lists() == specjax.generate(None, target, prompts, **kw).to_lists()
    assert int(jax.device_get(spec.stats.drafted).sum()) > 0


def _sampled(target, verification, n, key_seed=5):
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (n, len(PROMPT)))
    kw = dict(max_new_tokens=K, sampling=SAMPLING, verification=verification)
    drafter = SuffixDrafter.of(CORPUS, num_draft=3)
    out = specjax.speculative_generate(jax.random.key(key_seed), target, drafter, prompts, **kw)
    return np.asarray(out.tokens), out


@pytest.mark.parametrize("verification", ["rejection", "block"])
def test_sampled_output_follows_the_target(verification):
    target = peaked_model(0, jnp.float32)
    tokens, out = _sampled(target, verification, N)
    assert 0.05 < float(jax.device_get(out.stats).acceptance_rate) < 0.95
    law = exact_sequence_probs(target, PROMPT, K, SAMPLING)
    assert chi_square_pvalue(sequence_counts(tokens, V), law) >= FALSE_ALARM


@pytest.fixture(scope="module")
def unjudged_runs():
    target = peaked_model(0, jnp.float32)

    def accept_all(keys, drafts, target_probs):
        """Every proposed draft kept unjudged, then the target's sample."""
        width = drafts.shape[1] + 1
        drafted = jnp.sum(jnp.cumprod((drafts >= 0).astype(jnp.int32), axis=1), axis=1)
        sample_at = jnp.take_along_axis(
            chain.target_samples(keys, target_probs), drafted[:, None], axis=1
        )
        padded = jnp.pad(drafts, ((0, 0), (0, 1)), constant_values=-1)
        at = jnp.arange(width)[None]
        block = jnp.where(
            at < drafted[:, None], padded, jnp.where(at == drafted[:, None], sample_at, -1)
        )
        return block.astype(jnp.int32), drafted.astype(jnp.int32)

    from specjax.verification import verifiers

    def decode(rows, key_seed):
        kw = {} if key_seed is None else dict(key_seed=key_seed)
        return _sampled(target, "rejection", rows, **kw)[0]

    buggy, tokens = patched_runs(
        verifiers, "rejection_sample_onehot", accept_all, decode, m=M, n=N, vocab_size=V
    )
    return target, buggy, tokens


def test_negative_control_drafts_accepted_unjudged_are_rejected(unjudged_runs):
    target, buggy, tokens = unjudged_runs
    law = exact_sequence_probs(target, PROMPT, K, SAMPLING)
    assert_control_rejected(law, buggy, tokens, vocab_size=V, false_alarm=FALSE_ALARM)


def test_a_sampler_drafts_from_its_earlier_outputs_and_its_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    target, _, tokenizer = specjax.default_pair()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.py").write_text("def add(a, b):\n    return a + b\n")
    sampler = specjax.Sampler(target, drafter="suffix", gamma=4, corpus=tmp_path / "corpus")
    assert sampler.drafter.corpus.shape[0] >= 1024
    first = sampler.sample("class Stack:", max_new_tokens=24, return_result=True)[1]
    again = sampler.sample("class Stack:", max_new_tokens=24, return_result=True)[1]
    assert again.to_lists() == first.to_lists()  # greedy, exact
    # The second request drafts the first one's output.
    assert float(again.stats.acceptance_rate) * int(again.stats.drafted.sum()) > float(
        first.stats.acceptance_rate
    ) * int(first.stats.drafted.sum())
    with pytest.raises(ValueError, match="corpus= is what a suffix drafter drafts from"):
        specjax.Sampler(target, drafter="lookup", corpus=["x"])


def test_a_corpus_is_tokenised_once_per_content_and_tokenizer(tmp_path, monkeypatch):
    from specjax.text import corpus as corpus_module

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    _, _, tokenizer = specjax.default_pair()
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world\n")
    (folder / "b.bin").write_bytes(b"\0\1\2")
    calls = []
    real = corpus_module._texts
    monkeypatch.setattr(corpus_module, "_texts", lambda files: calls.append(1) or real(files))
    first = corpus_module.load_corpus(folder, tokenizer)
    assert len(first) == 1 and first[0].tolist() == tokenizer.encode("hello world\n").ids
    cached = list((tmp_path / "cache" / "corpus").glob("*.npz"))
    assert len(cached) == 1
    (folder / "a.txt").write_text("hello there\n")
    second = corpus_module.load_corpus(folder, tokenizer)
    assert second[0].tolist() == tokenizer.encode("hello there\n").ids
    assert len(list((tmp_path / "cache" / "corpus").glob("*.npz"))) == 2
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        corpus_module.load_corpus(tmp_path / "missing", tokenizer)
