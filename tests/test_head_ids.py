"""A draft model whose LM head scores a subset of the vocabulary (`Model.with_head_ids`).

Restricting the head changes what the draft proposes, never what the decoders emit:
the draft samples from (or takes the argmax among) the kept ids, and its q is zero
elsewhere. Checked here: the restricted logits against the full model's, the picks
of `specjax.sampling.vocab.frequent_ids`, greedy speculative == plain at the same forward
width (including rows whose
next target token the draft can never propose, and B = 3 = γ+1), bad input, and in
the slow tier the sampled law.

Statistical test (slow tier): V = 8, the draft keeps ids {0, 2, 5} (so it never
proposes 5 of the 8 ids), γ = 2, rejection and coupled verification, T = 0.6 and
T = 1.3 rows interleaved in one batch; the first K = 3 tokens of N = 4,000 rows per
group are chi-square tested against the target's exact law (`exact_sequence_probs`)
at FALSE_ALARM = 1e-4 each: 4 tests, family-wise 0.04%. The negative control is a
broken drafter that samples from the restricted head but tells the verifier its q
sits at ids 0..K-1 (zero-padded at the end, as a smaller vocabulary would be): the
test must reject it at the same N. The power calculation
(`test_sample_size_has_power`) finds the N at which the test rejects the draft's own
law, what a verifier that kept every draft would emit, with power 0.999, and checks
that N_PER_GROUP is at least twice it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from support import group_rows, peaked_pair

import specjax
from specjax.sampling.vocab import frequent_ids
from specjax.testing import (
    chi_square_pvalue,
    exact_sequence_probs,
    min_sample_size,
    sequence_counts,
    tiny_model,
    tiny_tokenizer,
)

V = 8
KEPT = [0, 2, 5]
PROMPT = [1, 2, 3, 1, 2]
K = 3
N_PER_GROUP = 4_000
FALSE_ALARM = 1e-4
GROUPS = {"t0.6": 0.6, "t1.3": 1.3}


@pytest.fixture(scope="module")
def pair():
    target, draft = peaked_pair(V)
    return target, draft, draft.with_head_ids(KEPT)


def test_kept_ids_score_as_in_the_whole_head_and_others_are_minus_inf(pair):
    _, draft, restricted = pair
    tokens = jnp.asarray([[1, 2, 3, 4, 6]])
    positions = jnp.arange(5)[None]
    full = jax.jit(lambda m: m(tokens, positions, m.init_cache(1, 8)).logits)(draft)
    part = jax.jit(lambda m: m(tokens, positions, m.init_cache(1, 8)).logits)(restricted)
    assert part.shape == full.shape == (1, 5, V)
    np.testing.assert_allclose(part[..., KEPT], full[..., KEPT], rtol=1e-5, atol=1e-5)
    others = np.setdiff1d(np.arange(V), KEPT)
    assert np.all(np.asarray(part)[..., others] == -np.inf)
    np.testing.assert_array_equal(restricted.head_ids, KEPT)
    assert draft.head_ids is None


def test_restriction_survives_quantization_and_layer_layout(pair):
    from specjax.models.quant import quantize

    _, _, restricted = pair
    for model in (quantize(restricted, "int8"), restricted.with_scan_layers(False)):
        np.testing.assert_array_equal(model.head_ids, KEPT)
        logits = model(jnp.asarray([[1, 2]]), jnp.arange(2)[None], model.init_cache(1, 4)).logits
        assert np.isinf(np.asarray(logits)).sum() == 2 * (V - len(KEPT))
    again = restricted.with_head_ids([1, 7])  # restricting again starts from the whole head
    np.testing.assert_array_equal(again.head_ids, [1, 7])


@pytest.mark.parametrize(
    "ids, match",
    [
        ([], "non-empty"),
        ([[0, 1]], "1-D"),
        ([0.5, 1.0], "ints"),
        ([0, 8], r"\[0, 8\)"),
        ([-1, 2], r"\[0, 8\)"),
        ([1, 1, 2], "1 repeated"),
    ],
)
def test_bad_ids_are_refused_by_name(pair, ids, match):
    _, draft, _ = pair
    with pytest.raises(ValueError, match="ids") as err:
        draft.with_head_ids(ids)
    assert err.match(match)


def test_a_quantized_model_is_refused(pair):
    from specjax.models.quant import quantize

    with pytest.raises(ValueError, match="restrict the float model"):
        quantize(pair[1], "int8").with_head_ids(KEPT)


def test_frequent_ids_takes_added_tokens_then_counts_then_lowest_ids():
    tokenizer = tiny_tokenizer(64)
    tokenizer.add_special_tokens(["<|end|>"])  # id 64: an added token, like EOS
    model = tiny_model(seed=0, vocab_size=72).replace(tokenizer=tokenizer)
    assert sorted(tokenizer.get_added_tokens_decoder()) == [64]
    texts = [[40, 40, 40, 41, 41, 63], [63, 63, 63, 63]]
    assert frequent_ids(model, 1, texts=texts).tolist() == [64]
    assert frequent_ids(model, 3, texts=texts).tolist() == [40, 63, 64]
    assert frequent_ids(model, 6, texts=texts).tolist() == [0, 1, 40, 41, 63, 64]
    assert frequent_ids(model, 72).tolist() == list(range(72))
    from_text = frequent_ids(model, 2, texts=[tokenizer.decode([40, 40, 41])])
    assert from_text.dtype == np.int32 and 64 in from_text


def test_frequent_ids_bad_input_is_named():
    model = tiny_model(seed=0, vocab_size=16)
    for num in (0, 17):
        with pytest.raises(ValueError, match=r"num_ids must be in \[1, 16\]"):
            frequent_ids(model, num)
    with pytest.raises(ValueError, match="no tokenizer"):
        frequent_ids(model, 4, texts=["text"])


@pytest.mark.parametrize("greedy_draft", [False, True])
# Fast tier: the first case; the second runs with -m slow.
@pytest.mark.first_case_fast
def test_greedy_speculative_equals_plain(pair, greedy_draft):
    """B = 3 = γ+1 ragged rows; the draft never proposes 5 of the 8 ids, so many steps
    reject at a position the draft cannot reach. Both at the same forward width."""
    target, _, restricted = pair
    prompts = [[1, 2, 3], [4, 5, 6, 7, 1], [6]]
    greedy = specjax.SamplingConfig.greedy()
    key = jax.random.key(0)
    drafter = specjax.DraftModel(restricted, num_draft=2, greedy_draft=greedy_draft)
    kwargs = dict(
        max_new_tokens=12, sampling=greedy, forward_width=specjax.drafters.lookahead(drafter)
    )
    plain = specjax.generate(key, target, prompts, **kwargs)
    spec = specjax.speculative_generate(key, target, drafter, prompts, **kwargs)
    assert spec.to_lists() == plain.to_lists()
    emitted = {t for row in plain.to_lists() for t in row}
    assert emitted - set(KEPT), "the check needs target tokens the draft cannot propose"
    assert int(spec.stats.accepted.sum()) > 0


@struct.dataclass
class PrefixPaddedQ(specjax.DraftModel):
    """Broken on purpose: reports the kept ids' probabilities at ids 0..K-1, as if the
    restricted head were a smaller vocabulary zero-padded at the end
    (`specjax.sampling.vocab.pad_to_vocab`), instead of at the kept ids themselves.

    (Dropping q altogether, a one-hot claim, would not do as a control: verifying a
    draft as if it were certain is exact for any proposal; see `DraftModel`.)
    """

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        proposal = super().propose(keys_BG, state, seq_BS, seq_lengths_B, sampling)
        kept_BGK = proposal.probs[..., jnp.asarray(KEPT)]
        wrong = jnp.zeros_like(proposal.probs).at[..., : len(KEPT)].set(kept_BGK)
        return proposal.replace(probs=wrong)


@pytest.fixture(scope="module")
def samples(pair):
    target, _, restricted = pair
    rows = N_PER_GROUP * len(GROUPS)
    temperature = np.asarray([list(GROUPS.values())[i % len(GROUPS)] for i in range(rows)])
    sampling = specjax.SamplingConfig(temperature=temperature)
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (rows, len(PROMPT)))
    out = {}
    for name, cls, verification in (
        ("rejection", specjax.DraftModel, "rejection"),
        ("coupled", specjax.DraftModel, "coupled"),
        ("prefix-padded q", PrefixPaddedQ, "rejection"),
    ):
        res = specjax.speculative_generate(
            jax.random.key(2026),
            target,
            cls(restricted, num_draft=2),
            prompts,
            max_new_tokens=K,
            sampling=sampling,
            verification=verification,
        )
        assert int(jnp.min(res.lengths)) == K
        out[name] = np.asarray(res.tokens)
    return out


def _exact_law(model, group):
    """The exact law of a group's first K tokens (``[V] * K``) under ``model``."""
    return exact_sequence_probs(model, PROMPT, K, specjax.SamplingConfig(temperature=GROUPS[group]))


@pytest.mark.slow  # 8,000 rows through two verifications and a control: ~20 s
@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("verification", ["rejection", "coupled"])
def test_sampled_output_has_the_target_law(pair, samples, verification, group):
    rows = group_rows(samples[verification], GROUPS, group, (N_PER_GROUP, K))
    p = chi_square_pvalue(sequence_counts(rows, V), _exact_law(pair[0], group))
    assert p > FALSE_ALARM, f"{verification}/{group}: p = {p:.2e}"


@pytest.mark.slow  # the negative control of the test above, on the same draw
def test_control_prefix_padded_q_is_rejected(pair, samples):
    for group in GROUPS:
        rows = group_rows(samples["prefix-padded q"], GROUPS, group, (N_PER_GROUP, K))
        p = chi_square_pvalue(sequence_counts(rows, V), _exact_law(pair[0], group))
        assert p < FALSE_ALARM, f"{group}: p = {p:.2e} (the test has no power)"


@pytest.mark.slow
def test_sample_size_has_power(pair):
    target, _, restricted = pair
    for group in GROUPS:
        need = min_sample_size(
            _exact_law(target, group), _exact_law(restricted, group), FALSE_ALARM, power=0.999
        )
        assert 2 * need <= N_PER_GROUP, (group, need)
