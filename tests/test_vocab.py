"""Padded vocabularies: a smaller draft model, and `SamplingConfig.vocab_limit`.

The setting is a padded family, as with Qwen2.5 (0.5B: 151,936 embedding rows, 7B:
152,064, one tokenizer of 151,665 tokens), shrunk: the target has V = 64 rows, of which
the last 4 are padding, and the real vocabulary is the 60 words of its tokenizer; the
draft model has exactly V = 60 rows and the same tokenizer. The target's padded rows are
made to matter: its LM-head columns 60..63 are ±6 times two real columns, so in every
context one padded id of each pair has a large logit (unmasked, they take most of the
mass, as a test below shows). The default ``vocab_limit`` is the tokenizer's size, 60.

1. Greedy: speculative decoding with the V = 60 draft equals plain greedy decoding token
   for token at the same forward width (ragged prompts, an EOS inside a block), and no
   padded id is chosen, while plain greedy decoding without the limit does choose them.
2. Sampled output is exact (chi-square against the distribution enumerated by
   `specjax.testing.exact_sequence_probs` over all 64² two-token continuations, padded
   ids included, which have probability 0 and make the p-value 0 if ever drawn). The
   draft model drafts γ = 2 tokens at temperature 1, so the two tokens tested cover the
   first step's accept/reject at both drafted positions (acceptance measured 0.24, so
   both paths carry weight). Three tests: the default limit (a scalar) on N = 6,000
   rows, and a per-row ``[B]`` limit of 60 and 56 on alternate rows of another N rows
   (3,000 per group, each group against its own distribution). Each rejects at
   p < FALSE_ALARM = 1e-4, so the family-wise false-alarm rate is below 3e-4
   (Bonferroni). Keys are fixed, so the outcome is deterministic (measured p = 0.67,
   0.41 and 0.38).
3. Negative controls, at the same N and threshold: a drafter whose q is zero-padded on
   the wrong side (shifted by 4 ids) is rejected, and so is plain decoding with the
   padded rows left unmasked (``vocab_limit=64``; 99% of its tokens are padded ids).
4. Coupled verification with the V = 60 draft reproduces plain decoding token for token
   at the same forward width.
5. Padded ids are never emitted: N rows × 4 tokens at temperature 2, plain and
   speculative; per-row limits with B == γ + 1 (where limits read along the γ+1
   positions instead of the rows would raise no shape error) keep each row below its own
   limit, and each row does emit ids just below it.
6. `probs_from_logits` masks per row along the leading axis, greedy or sampled, with
   top-k/top-p. ``vocab_limit`` is traced: new values do not recompile the open loop
   (here) or the closed one (tests/test_decode.py). Bad drafters, tokenizers and
   limits are refused with errors that name the sizes (bad values: test_bad_input.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct
from support import GREEDY

import specjax
from specjax import decoding
from specjax.sampling.vocab import default_vocab_limit
from specjax.testing import (
    chi_square_pvalue,
    exact_sequence_probs,
    sequence_counts,
    tiny_model,
    tiny_tokenizer,
)

V, V_REAL = 64, 60
PROMPT = [1, 2, 3, 1, 2]
N = 6_000
FALSE_ALARM = 1e-4
GAMMA = 2


def _with_padded_rows(model, scale: float = 6.0):
    """``model`` whose LM-head rows 60..63 are ``scale`` × (+r0, -r0, +r1, -r1)."""
    flat = []
    for path, var in nnx.to_flat_state(model.params):
        if path == ("lm_head", "weight"):  # [V, E]
            weight = var.get_value()
            r0, r1 = weight[0], weight[1]
            padded = scale * jnp.stack([r0, -r0, r1, -r1])
            var = var.replace(weight.at[V_REAL:].set(padded))
        flat.append((path, var))
    return model.replace(params=nnx.from_flat_state(flat))


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(V_REAL)


@pytest.fixture(scope="module")
def target(tokenizer):
    model = tiny_model(seed=21, vocab_size=V, init_scale=12.0)
    return _with_padded_rows(model).replace(tokenizer=tokenizer)


@pytest.fixture(scope="module")
def draft(tokenizer):
    return tiny_model(seed=22, vocab_size=V_REAL, init_scale=12.0).replace(tokenizer=tokenizer)


def _sampled(temperature=1.0, **kw):
    return specjax.SamplingConfig(temperature=temperature, **kw)


# --------------------------------------------------------------------------------------
# The default limit.


def test_default_vocab_limit_is_the_tokenizer_size_when_smaller(target, draft):
    assert default_vocab_limit(target) == V_REAL
    assert default_vocab_limit(target.replace(tokenizer=None)) == V
    # A tokenizer larger than V (another vocabulary) does not raise the limit past V.
    assert default_vocab_limit(draft.replace(tokenizer=tiny_tokenizer(V))) == V_REAL


def test_probs_from_logits_masks_ids_at_and_above_the_limit():
    """Masked ids get probability 0 at any setting; per-row limits follow the leading axis
    of ``[B, γ+1, V]`` logits (B == γ+1 here); a row whose allowed logits are all -inf is
    uniform over the allowed ids only."""
    logits = jax.random.normal(jax.random.key(0), (3, 3, 8)).at[..., 5:].add(10.0)
    limits = np.asarray([5, 6, 8], np.int32)
    probs_fn = jax.jit(specjax.sampling.probs_from_logits)
    for config in (
        _sampled(1.0, vocab_limit=limits),
        _sampled(0.0, vocab_limit=limits),
        _sampled(2.0, top_p=0.9, top_k=3, vocab_limit=limits),
    ):
        probs = np.asarray(probs_fn(logits, config))
        for row, limit in enumerate(limits):
            assert (probs[row, :, limit:] == 0).all() and (probs[row, :, :limit] >= 0).all()
            np.testing.assert_allclose(probs[row].sum(-1), 1.0, rtol=1e-6)
    greedy = np.asarray(probs_fn(logits, _sampled(0.0, vocab_limit=limits)))
    expected = np.argmax(np.where(np.arange(8) < limits[:, None, None], logits, -np.inf), -1)
    np.testing.assert_array_equal(np.argmax(greedy, -1), expected)
    dead = jnp.full((1, 8), -jnp.inf).at[0, 6].set(1.0)  # only a masked id is finite
    np.testing.assert_allclose(probs_fn(dead, _sampled(vocab_limit=4))[0], [0.25] * 4 + [0] * 4)
    # None masks nothing.
    np.testing.assert_allclose(
        probs_fn(logits, _sampled()), jax.nn.softmax(logits, axis=-1), rtol=1e-5
    )


# --------------------------------------------------------------------------------------
# Greedy.


# Small-batch runs share one prompt batch (ragged, 3 rows), so that they share programs.
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 4, 5], [9]]


def test_greedy_with_a_smaller_draft_equals_plain_greedy(target, draft):
    key = jax.random.key(0)
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    kw = dict(max_new_tokens=13, sampling=GREEDY, forward_width=specjax.drafters.lookahead(drafter))
    plain = specjax.generate(key, target, PROMPTS, **kw)
    spec = specjax.speculative_generate(key, target, drafter, PROMPTS, **kw)
    assert plain.to_lists() == spec.to_lists()
    assert int(np.max(plain.tokens)) < V_REAL
    # An EOS that greedy decoding emits part-way, so that it can land inside a block.
    eos = int(plain.tokens[0, 5])
    plain_eos = specjax.generate(key, target, PROMPTS, eos_id=eos, **kw)
    spec_eos = specjax.speculative_generate(key, target, drafter, PROMPTS, eos_id=eos, **kw)
    assert plain_eos.to_lists() == spec_eos.to_lists()
    assert plain_eos.to_lists()[0][-1] == eos
    # Unmasked, greedy decoding picks the padded ids.
    unmasked = specjax.generate(
        key, target, PROMPTS, max_new_tokens=13, sampling=specjax.SamplingConfig(0.0, vocab_limit=V)
    )
    assert int(np.max(unmasked.tokens)) >= V_REAL


# --------------------------------------------------------------------------------------
# Sampled exactness, with negative controls.


@struct.dataclass
class WronglyPadded(specjax.DraftModel):
    """Negative control: q zero-padded on the wrong side (ids shifted by 4)."""

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        proposal = super().propose(keys_BG, state, seq_BS, seq_lengths_B, sampling)
        probs = jnp.pad(proposal.probs, [(0, 0), (0, 0), (V - V_REAL, 0)])
        return proposal.replace(probs=probs)


def _rows(num_rows):
    return np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))


def _speculative_tokens(target, drafter, sampling, num_rows, seed=2026):
    out = specjax.speculative_generate(
        jax.random.key(seed), target, drafter, _rows(num_rows), max_new_tokens=2, sampling=sampling
    )
    assert int(jnp.min(out.lengths)) == 2
    return np.asarray(out.tokens), out


def _exact(target, limit):
    return exact_sequence_probs(target, PROMPT, 2, _sampled(vocab_limit=limit))


@pytest.fixture(scope="module")
def exact(target):
    return {limit: _exact(target, limit) for limit in (56, V_REAL)}


# Slow tier: 10 s: statistical.
@pytest.mark.slow
def test_sampled_output_is_exact_with_the_default_limit(target, draft, exact):
    tokens, out = _speculative_tokens(
        target, specjax.DraftModel(draft, num_draft=GAMMA), _sampled(), N
    )
    # Both paths carry weight: drafts are accepted and rejected.
    assert 0.1 < float(out.stats.acceptance_rate) < 0.9
    p = chi_square_pvalue(sequence_counts(tokens, V), exact[V_REAL])
    assert p > FALSE_ALARM, f"chi-square p = {p:.2e}"


@pytest.fixture(scope="module")
def per_row_tokens(target, draft):
    limits = np.where(np.arange(N) % 2 == 0, V_REAL, 56)
    tokens, _ = _speculative_tokens(
        target, specjax.DraftModel(draft, num_draft=GAMMA), _sampled(vocab_limit=limits), N
    )
    return {V_REAL: tokens[0::2], 56: tokens[1::2]}


@pytest.mark.parametrize("limit", [V_REAL, 56])
# Slow tier: statistical: 10 s of samples.
@pytest.mark.slow
def test_sampled_output_is_exact_with_per_row_limits(per_row_tokens, exact, limit):
    tokens = per_row_tokens[limit]
    assert tokens.shape == (N // 2, 2)
    p = chi_square_pvalue(sequence_counts(tokens, V), exact[limit])
    assert p > FALSE_ALARM, f"vocab_limit {limit}: chi-square p = {p:.2e}"


# Slow tier: 6 s: the negative control of the statistical test above.
@pytest.mark.slow
def test_control_wrongly_padded_q_is_rejected(target, draft, exact):
    tokens, _ = _speculative_tokens(target, WronglyPadded(draft, num_draft=GAMMA), _sampled(), N)
    p = chi_square_pvalue(sequence_counts(tokens, V), exact[V_REAL])
    assert p < FALSE_ALARM, f"p = {p:.2e}: the test has no power against a misaligned q"


# Slow tier: the negative control of the statistical test above.
@pytest.mark.slow
def test_control_unmasked_padded_rows_are_rejected(target, exact):
    out = specjax.generate(
        jax.random.key(2026), target, _rows(N), max_new_tokens=2, sampling=_sampled(vocab_limit=V)
    )
    p = chi_square_pvalue(sequence_counts(np.asarray(out.tokens), V), exact[V_REAL])
    assert p < FALSE_ALARM, f"p = {p:.2e}"


# Slow tier: 6 s; widens the smaller-draft contract (greedy, fast tier) to coupled mode.
@pytest.mark.slow
def test_coupled_with_a_smaller_draft_equals_plain(target, draft):
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    kw = dict(max_new_tokens=12, sampling=_sampled(0.8, top_p=0.95), seeds=[5, 6, 7])
    kw.update(forward_width=specjax.drafters.lookahead(drafter))
    plain = specjax.generate(jax.random.key(3), target, PROMPTS, **kw)
    coupled = specjax.speculative_generate(
        jax.random.key(3), target, drafter, PROMPTS, verification="coupled", **kw
    )
    assert coupled.to_lists() == plain.to_lists()


# --------------------------------------------------------------------------------------
# Padded ids are never emitted.


# Slow tier: 14 s: a padded model through both decoders.
@pytest.mark.slow
def test_padded_ids_are_never_emitted(target, draft):
    """N rows × 4 tokens at temperature 2 (the programs of the exactness tests)."""
    kw = dict(max_new_tokens=4, sampling=_sampled(2.0))
    runs = {
        "plain": specjax.generate(jax.random.key(1), target, _rows(N), **kw),
        "draft_model": specjax.speculative_generate(
            jax.random.key(1), target, specjax.DraftModel(draft, num_draft=GAMMA), _rows(N), **kw
        ),
    }
    for name, out in runs.items():
        tokens = np.asarray(out.tokens)
        assert (tokens >= 0).all() and tokens.max() < V_REAL, name
    # Unmasked, the padded rows would take a large share of the tokens.
    kw["sampling"] = _sampled(2.0, vocab_limit=V)
    unmasked = specjax.generate(jax.random.key(1), target, _rows(N), **kw)
    assert np.mean(np.asarray(unmasked.tokens) >= V_REAL) > 0.3


def test_per_row_limits_with_b_equal_to_gamma_plus_one(target, draft):
    """Three rows, γ = 2: each row stays below its own limit and reaches just below it.

    Limits read along the γ+1 scored positions instead of the rows would raise no shape
    error here; they would let row 0 emit ids up to 59 at its third position.
    """
    limits = np.asarray([50, 56, V_REAL], np.int32)
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    kw = dict(max_new_tokens=50, sampling=_sampled(3.0, vocab_limit=limits))
    tokens = np.concatenate(
        [
            np.asarray(specjax.speculative_generate(key, target, drafter, PROMPTS, **kw).tokens)
            for key in jax.random.split(jax.random.key(4), 8)
        ],
        axis=1,
    )  # [B, 8 × 50]
    assert tokens.shape == (GAMMA + 1, 400) and (tokens >= 0).all()
    for row, limit in enumerate(limits):
        assert tokens[row].max() < limit, row
        assert (tokens[row] >= limit - 4).any(), row


# --------------------------------------------------------------------------------------
# Traced, and refused when wrong.


def test_vocab_limit_is_traced_in_the_open_loop(target):
    def run(sampling):
        decoder, state = decoding.init(
            jax.random.key(0), target, PROMPTS, max_new_tokens=12, sampling=sampling
        )
        return decoding.result(decoder, decoding.run(decoder, state, 20))

    first = run(_sampled())
    compiled = lambda: (  # noqa: E731
        decoding.api._init_jit._cache_size(),
        decoding.api._run_jit._cache_size(),
    )
    before = compiled()
    for limit in (30, np.asarray([56, 60, 10]), jnp.int32(10)):
        out = run(_sampled(vocab_limit=limit))
        assert (np.asarray(out.tokens) < np.asarray(limit).reshape(-1, 1)).all()
    assert compiled() == before
    # The open loop gives the tokens of one call (the default limit in both).
    one_call = specjax.generate(
        jax.random.key(0), target, PROMPTS, max_new_tokens=12, sampling=_sampled()
    )
    assert first.to_lists() == one_call.to_lists()


def test_a_larger_drafter_is_refused_naming_both_sizes(draft, target):
    with pytest.raises(
        ValueError, match="drafter vocabulary size 64 is larger than the target's 60"
    ):
        specjax.speculative_generate(
            jax.random.key(0), draft, specjax.DraftModel(target), [[1]], max_new_tokens=3
        )


def test_a_limit_beyond_the_drafters_vocabulary_is_refused(target, draft):
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    no_tokenizer = target.replace(tokenizer=None)  # default limit: V = 64 > 60
    for model, sampling in ((no_tokenizer, None), (target, _sampled(vocab_limit=62))):
        with pytest.raises(ValueError, match=r"vocab_limit is 6\d, but the drafter's vocabulary"):
            specjax.speculative_generate(
                jax.random.key(0), model, drafter, [[1]], max_new_tokens=3, sampling=sampling
            )
    with pytest.raises(ValueError, match="outside the drafter's vocabulary"):
        specjax.speculative_generate(
            jax.random.key(0),
            target,
            drafter,
            [[1, 61]],
            max_new_tokens=3,
            sampling=_sampled(vocab_limit=60),
        )


def test_a_disagreeing_drafter_tokenizer_is_refused(target, draft):
    from tokenizers import Tokenizer, models

    words = {f"w{i}": i for i in range(V_REAL)}
    words["w7"], words["w8"] = 8, 7  # two ids swapped
    other = Tokenizer(models.WordLevel(words, unk_token="w0"))
    drafter = specjax.DraftModel(draft.replace(tokenizer=other), num_draft=GAMMA)
    with pytest.raises(ValueError, match=r"id 7 is 'w7' for the target and 'w8' .* \(2 ids differ"):
        specjax.speculative_generate(jax.random.key(0), target, drafter, [[1]], max_new_tokens=3)
    # A tokenizer that only adds ids beyond the draft's vocabulary agrees on the shared ones.
    larger = specjax.DraftModel(draft.replace(tokenizer=tiny_tokenizer(V)), num_draft=GAMMA)
    decoding.check_drafter(target, larger)
