"""The decoders: greedy equivalence, exactness in distribution, stats, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from support import GREEDY, ragged_prompts

import specjax
from specjax import decoding
from specjax.drafters import Drafter, Proposal
from specjax.testing import (
    tiny_model,
)

V = 64


@struct.dataclass
class ConstantDrafter(Drafter):
    """A deliberately terrible drafter: always proposes the same token (one-hot q)."""

    token: int = struct.field(pytree_node=False, default=0)
    num_draft: int = struct.field(pytree_node=False, default=3)

    @property
    def vocab_size(self):
        return None

    def init(self, prompts_BS, seq_lengths_B, cache_len, hidden=None):
        return ()

    def propose(self, key, state, seq_BS, seq_lengths_B, sampling):
        tokens = jnp.full((seq_BS.shape[0], self.num_draft), self.token, jnp.int32)
        return Proposal(tokens=tokens, probs=None, state=state)

    def update(self, state, seq_lengths_B, hidden=None):
        return state


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab_size=V, init_scale=8.0)


def _drafters(target):
    return {
        "self": specjax.DraftModel(target, num_draft=4),
        "random_model": specjax.DraftModel(tiny_model(seed=7, vocab_size=V), num_draft=3),
        "lookup": specjax.PromptLookup(ngram=2, num_draft=3),
        "constant": ConstantDrafter(token=5, num_draft=4),
    }


@pytest.mark.parametrize("name", ["self", "random_model", "lookup", "constant"])
@pytest.mark.parametrize("batch", [1, 8])
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_greedy_speculative_equals_plain(target, name, batch):
    drafter = _drafters(target)[name]
    prompts = ragged_prompts(batch, seed=batch, high=8, repeat=2)
    key = jax.random.key(0)
    # Equal token for token at one forward width: the drafter's verify width.
    kw = dict(max_new_tokens=13, sampling=GREEDY, forward_width=specjax.drafters.lookahead(drafter))
    # 13 is not a multiple of γ + 1 for any γ used here.
    plain = specjax.generate(key, target, prompts, **kw)
    spec = specjax.speculative_generate(key, target, drafter, prompts, **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
    assert int(jnp.min(spec.lengths)) == 13

    # EOS hit mid-block: stop at a token that greedy decoding emits part-way.
    eos = int(plain.tokens[0, 6])
    plain_eos = specjax.generate(key, target, prompts, eos_id=eos, **kw)
    spec_eos = specjax.speculative_generate(key, target, drafter, prompts, eos_id=eos, **kw)
    np.testing.assert_array_equal(spec_eos.tokens, plain_eos.tokens)
    np.testing.assert_array_equal(spec_eos.lengths, plain_eos.lengths)
    row0 = spec_eos.to_lists()[0]
    assert row0[-1] == eos and eos not in row0[:-1] and len(row0) <= 7
    if name == "self":
        # The target drafting for itself is always accepted.
        assert float(spec.stats.acceptance_rate) == 1.0


def test_tokens_per_call_of_a_drafter_always_accepted(target):
    """tokens_per_call against a figure known without its formula: the target drafting
    for itself under greedy decoding has every draft accepted, so each target call emits
    γ + 1 = 5 tokens and 15 new tokens take 3 calls. (The setup of
    test_greedy_speculative_equals_plain's fast case, so that it reuses its program.)"""
    drafter = specjax.DraftModel(target, num_draft=4)
    out = specjax.speculative_generate(
        jax.random.key(0),
        target,
        drafter,
        ragged_prompts(1, seed=1, high=8, repeat=2),
        max_new_tokens=15,
        sampling=GREEDY,
        forward_width=specjax.drafters.lookahead(drafter),
    )
    assert np.asarray(out.lengths).tolist() == [15]
    assert np.asarray(out.stats.row_target_calls).tolist() == [3]
    assert float(out.tokens_per_call) == 5.0


def test_plain_greedy_matches_manual_argmax_loop(target):
    """generate() agrees with a naive full-recompute argmax loop (no cache)."""
    prompt = [3, 1, 4, 1, 5]
    out = specjax.generate(jax.random.key(0), target, [prompt], max_new_tokens=8, sampling=GREEDY)
    width = len(prompt) + 8
    # One full forward over a fixed width; causality makes the padding irrelevant.
    forward = jax.jit(lambda m, s: m(s, jnp.arange(width)[None], m.init_cache(1, width)).logits)
    seq = list(prompt)
    for _ in range(8):
        padded = jnp.asarray([seq + [0] * (width - len(seq))])
        seq.append(int(jnp.argmax(forward(target, padded)[0, len(seq) - 1])))
    assert out.to_lists()[0] == seq[len(prompt) :]


# Slow tier: 15 s, four programs (batch 3 and batch 1). A row's independence from its
# batch stays in the fast tier: tests/test_reproducible.py
# (test_a_row_does_not_depend_on_the_batch_around_it) and tests/test_models.py.
@pytest.mark.slow
def test_ragged_rows_equal_rows_alone(target):
    prompts = ragged_prompts(3, seed=3, high=8, repeat=2)
    drafter = specjax.DraftModel(tiny_model(seed=7, vocab_size=V), num_draft=3)
    key = jax.random.key(1)
    batched = specjax.speculative_generate(
        key, target, drafter, prompts, max_new_tokens=9, sampling=GREEDY
    ).to_lists()
    for row, prompt in zip(batched, prompts, strict=True):
        alone = specjax.speculative_generate(
            key, target, drafter, [prompt], max_new_tokens=9, sampling=GREEDY
        ).to_lists()[0]
        assert row == alone


# ----------------------------------------------------------------------------
# Exactness in distribution, end to end: tests/test_exact_per_row.py (every sampling
# setting, per row, for every drafter and verification mode, with negative controls).


# ----------------------------------------------------------------------------
# Reproducibility, compilation, statistics.


# Slow tier: compiles the decoder a second time inside a user's jit (about 16 s); the
# fast tier's reproducibility contract is in test_reproducible.py.
@pytest.mark.slow
def test_same_key_same_output_and_user_jit(target):
    drafter = specjax.DraftModel(tiny_model(seed=3, vocab_size=V), num_draft=3)
    prompts = jnp.asarray([[1, 2, 3, 4], [4, 3, 2, 1]], jnp.int32)
    sampling = specjax.SamplingConfig(temperature=0.9, top_p=0.95)
    run = lambda key: specjax.speculative_generate(  # noqa: E731
        key, target, drafter, prompts, max_new_tokens=10, sampling=sampling
    )
    a, b = run(jax.random.key(5)), run(jax.random.key(5))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    c = run(jax.random.key(6))
    assert not np.array_equal(a.tokens, c.tokens)

    @jax.jit
    def user_fn(key, params, prompts):
        model = target.replace(params=params)
        return specjax.speculative_generate(
            key, model, drafter, prompts, max_new_tokens=10, sampling=sampling
        ).tokens

    np.testing.assert_array_equal(user_fn(jax.random.key(5), target.params, prompts), a.tokens)


def test_no_recompilation_for_traced_settings(target, tmp_path):
    """Values are traced: one program per (model, drafter, shapes) whatever the settings.

    Covers temperature, top-k, top-p, min-p and vocab_limit (scalars and per-row arrays,
    and vocab_limit's default), eos_id (None, one id, a list), max_new_tokens (int and
    per row, within one cache bucket), seeds, prompt widths within one bucket of 16, a
    new DraftModel around an equal model, and a checkpoint loaded twice (its tokenizer
    compares by content).
    """
    from specjax.testing import tiny_tokenizer

    tok = tiny_tokenizer(V)
    specjax.save_pretrained(target.replace(tokenizer=tok), tmp_path / "m")
    loaded = [specjax.load_pretrained(tmp_path / "m") for _ in range(2)]
    key = jax.random.key(0)
    kwargs = dict(cache_len=64)
    per_row = dict(
        temperature=jnp.asarray([0.0, 0.7]),
        top_k=np.asarray([0, 3], np.int32),
        top_p=[1.0, 0.9],
        min_p=jnp.asarray([0.0, 0.1]),
    )
    variants = [
        dict(sampling=specjax.SamplingConfig(temperature=0.5, top_p=0.9), max_new_tokens=7),
        dict(sampling=specjax.SamplingConfig(temperature=0.0), eos_id=3, max_new_tokens=20),
        dict(
            sampling=specjax.SamplingConfig(temperature=1.0, top_k=5, min_p=0.2), eos_id=[3, 9, 11]
        ),
        dict(sampling=specjax.SamplingConfig(**per_row), max_new_tokens=[4, 9], seeds=[7, 1]),
        dict(prompts=[[4, 5, 6, 4, 5, 6, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1]]),  # width 16
        dict(sampling=specjax.SamplingConfig(temperature=0.0, vocab_limit=40)),
        dict(
            sampling=specjax.SamplingConfig(temperature=1.0, vocab_limit=np.asarray([V, 17])),
            eos_id=3,
        ),
    ]
    drafters = {
        "lookup": lambda model: specjax.PromptLookup(ngram=2, num_draft=3),
        # A new DraftModel each call, around the other of the two loads.
        "draft_model": lambda model: specjax.DraftModel(model, num_draft=2),
        "plain": lambda model: None,
    }

    def run(make, model, prompts=([1, 2, 3, 1, 2], [3, 4]), max_new_tokens=5, **kw):
        drafter = make(model)
        kw.update(max_new_tokens=max_new_tokens, **kwargs)
        if drafter is None:
            return specjax.generate(key, model, list(prompts), **kw)
        return specjax.speculative_generate(key, model, drafter, list(prompts), **kw)

    for name, make in drafters.items():
        run(make, loaded[0])
        before = decoding.api._generate_jit._cache_size()
        for i, variant in enumerate(variants):
            run(make, loaded[(i + 1) % 2], **variant)
        assert decoding.api._generate_jit._cache_size() == before, name


# Slow tier (about 7 s): the open loop's traced settings stay in the fast tier through
# test_vocab.py's open-loop test.
@pytest.mark.slow
def test_open_loop_run_compiles_once_for_any_chunk(target):
    drafter = specjax.DraftModel(tiny_model(seed=7, vocab_size=V), num_draft=3)
    sampling = specjax.SamplingConfig(temperature=jnp.asarray([1.0, 0.0, 0.6]))
    prompts = ragged_prompts(3, seed=4, high=8, repeat=2)
    decoder, state = decoding.init(
        jax.random.key(2), target, prompts, drafter=drafter, max_new_tokens=20, sampling=sampling
    )
    state = decoding.run(decoder, state, 1)
    before = decoding.api._run_jit._cache_size()
    for n in (2, 5, 0, 3, None):
        state = decoding.run(decoder, state, n)
    assert decoding.api._run_jit._cache_size() == before


# Slow tier: 7 s.
@pytest.mark.slow
def test_stats_consistent(target):
    drafter = specjax.DraftModel(tiny_model(seed=7, vocab_size=V), num_draft=3)
    prompts = ragged_prompts(5, seed=9, high=8, repeat=2)
    out = specjax.speculative_generate(
        jax.random.key(3),
        target,
        drafter,
        prompts,
        max_new_tokens=11,
        sampling=specjax.SamplingConfig(temperature=1.0),
        eos_id=7,
    )
    s = jax.device_get(out.stats)
    lengths = np.asarray(out.lengths)
    assert np.all(s.accepted <= s.drafted)
    assert np.all(s.drafted == 3 * s.row_target_calls)
    assert s.accepted_hist.sum() == s.row_target_calls.sum()
    assert np.all(s.row_target_calls <= s.target_calls)
    assert s.target_calls == s.row_target_calls.max()
    # Each step emits at most accepted + 1 tokens, at least 1.
    assert np.all(lengths <= s.accepted + s.row_target_calls)
    assert np.all(lengths >= s.row_target_calls)
    tokens = np.asarray(out.tokens)
    for row, n in zip(tokens, lengths, strict=True):
        assert np.all(row[n:] == -1) and np.all(row[:n] >= 0)
        assert 7 not in row[: n - 1]
    # from_draft marks exactly the accepted drafts that were emitted.
    assert np.asarray(out.from_draft).sum() <= s.accepted.sum()


# Slow tier: 8 s, two decode programs; the fast tier checks tokens_per_call with a
# drafter always accepted (test_tokens_per_call_of_a_drafter_always_accepted).
@pytest.mark.slow
def test_tokens_per_call_of_drafters_always_and_never_accepted_on_ragged_rows(target):
    """tokens_per_call against figures known without its formula, on 3 ragged rows.

    The target drafting for itself under greedy decoding has every draft accepted, so
    each target call emits γ + 1 = 5 tokens: 10 new tokens take 2 calls per row. A
    drafter that proposes a token greedy decoding never emits has its first draft
    rejected at every call, so each call emits exactly 1 token.
    """
    prompts = ragged_prompts(3, seed=3, high=8, repeat=2)
    kw = dict(max_new_tokens=10, sampling=GREEDY)  # 10 = 2 (γ + 1)
    always = specjax.speculative_generate(
        jax.random.key(0), target, specjax.DraftModel(target, num_draft=4), prompts, **kw
    )
    assert np.asarray(always.lengths).tolist() == [10, 10, 10]
    assert np.asarray(always.stats.row_target_calls).tolist() == [2, 2, 2]
    assert float(always.tokens_per_call) == 5.0

    # The smallest id that greedy decoding (the run above) never emits, always drafted.
    unused = min(set(range(V)) - set(np.asarray(always.tokens).ravel().tolist()))
    never = specjax.speculative_generate(
        jax.random.key(0), target, ConstantDrafter(token=unused, num_draft=4), prompts, **kw
    )
    assert unused not in np.asarray(never.tokens)  # so no draft was ever accepted
    assert np.asarray(never.stats.accepted).tolist() == [0, 0, 0]
    assert np.asarray(never.stats.row_target_calls).tolist() == [10, 10, 10]
    assert float(never.tokens_per_call) == 1.0


# Slow tier: 15 s; tests/test_bad_input.py keeps a truncated row in the fast tier.
@pytest.mark.slow
def test_cache_overflow_stops_row_cleanly(target):
    drafter = specjax.DraftModel(tiny_model(seed=7, vocab_size=V), num_draft=3)
    width = specjax.drafters.lookahead(drafter)
    prompts = [[1, 2, 3], list(range(1, 20))]
    out = specjax.speculative_generate(
        jax.random.key(0),
        target,
        drafter,
        prompts,
        max_new_tokens=40,
        sampling=GREEDY,
        cache_len=32,
        forward_width=width,
    )
    truncated = np.asarray(out.truncated)
    lengths = np.asarray(out.lengths)
    assert truncated.tolist() == [True, True]
    # Never more tokens than the cache holds; the generated prefix is still exact (plain
    # decoding at the same forward width).
    assert lengths[1] <= 32 - 19
    plain = specjax.generate(
        jax.random.key(0),
        target,
        prompts,
        max_new_tokens=40,
        sampling=GREEDY,
        forward_width=width,
    )
    for row, ref, n in zip(np.asarray(out.tokens), np.asarray(plain.tokens), lengths, strict=True):
        np.testing.assert_array_equal(row[:n], ref[:n])


# ----------------------------------------------------------------------------
# Bad input is rejected before compiling.


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=5, cache_len=4), "cache_len"),
        (dict(prompts=[]), "prompts"),
        (dict(prompts=[[1, 2], []]), r"prompts\[1\]"),
        (dict(prompts=[[1, 2, 999]]), "vocabulary"),
        (dict(prompts=jnp.zeros((2,), jnp.int32)), "prompts"),
        (dict(prompts=jnp.zeros((1, 3), jnp.float32)), "integer"),
        (dict(sampling=specjax.SamplingConfig(temperature=-1.0)), "temperature"),
    ],
)
def test_bad_input_errors(target, kwargs, match):
    args = dict(prompts=[[1, 2, 3]], max_new_tokens=5)
    args.update(kwargs)
    prompts = args.pop("prompts")
    drafter = specjax.PromptLookup(num_draft=2)
    with pytest.raises((ValueError, TypeError), match=match):
        specjax.speculative_generate(jax.random.key(0), target, drafter, prompts, **args)


def test_bad_drafter_errors(target):
    other_vocab = specjax.DraftModel(tiny_model(seed=1, vocab_size=V + 1), num_draft=2)
    with pytest.raises(ValueError, match="vocabulary size"):
        specjax.speculative_generate(
            jax.random.key(0), target, other_vocab, [[1]], max_new_tokens=3
        )
    with pytest.raises(ValueError, match="num_draft"):
        specjax.speculative_generate(
            jax.random.key(0), target, specjax.PromptLookup(num_draft=0), [[1]], max_new_tokens=3
        )
