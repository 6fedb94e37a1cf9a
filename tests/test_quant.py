"""int8 models (`specjax.models.quant`): close to float32, rows independent, and exact
under speculation relative to the quantized model itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import GREEDY, ragged_prompts

import specjax
from specjax.models.quant import MODES, quantize, quantize_rows
from specjax.testing import perturbed, tiny_model

V = 64


@pytest.fixture(scope="module")
def target():
    # Untied LM head and biases: every kind of matrix the quantizer swaps is present.
    return perturbed(tiny_model(seed=0, vocab_size=V, tie_word_embeddings=False), seed=3)


@pytest.fixture(scope="module")
def tied():
    return perturbed(tiny_model(seed=1, vocab_size=V, tie_word_embeddings=True), seed=4)


def _logits(model, tokens_BT):
    b, t = tokens_BT.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    return jax.jit(lambda m, x: m(x, positions, m.init_cache(b, t)).logits)(model, tokens_BT)


def _tokens(b, t, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (b, t)), jnp.int32)


def test_quantize_rows_round_trips_within_half_a_step():
    x = jax.random.normal(jax.random.key(0), (5, 33)) * jnp.arange(1, 6)[:, None]
    x = x.at[2].set(0.0)  # an all-zero row
    q, scale = quantize_rows(x)
    assert q.dtype == jnp.int8 and q.shape == (5, 33) and scale.shape == (5,)
    err = jnp.abs(q.astype(jnp.float32) * scale[:, None] - x)
    assert bool(jnp.all(err <= scale[:, None] / 2 + 1e-6))
    assert bool(jnp.all(q[2] == 0)) and float(scale[2]) == 1.0
    assert bool(jnp.all(jnp.max(jnp.abs(q[jnp.array([0, 1, 3, 4])]), axis=-1) == 127))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["untied", "tied"])
@pytest.mark.first_case_fast
def test_quantized_logits_are_close_to_float32_and_quantization_matters(mode, which, target, tied):
    model = target if which == "untied" else tied
    qmodel = quantize(model, mode)
    assert qmodel.quantization == mode and model.quantization is None
    assert qmodel.dtype == jnp.float32
    int8 = [x for x in jax.tree.leaves(qmodel.params) if x.dtype == jnp.int8]
    assert len(int8) == 4 * model.config.num_layers + 1  # qkv, o, gate+up, down; head
    tokens = _tokens(3, 9)
    ref, got = _logits(model, tokens), _logits(qmodel, tokens)
    err = float(jnp.max(jnp.abs(got - ref)))
    scale = float(jnp.max(jnp.abs(ref)))
    # int8 steps are 1/254 of each row's range: a few percent of the logits' range at
    # most through 2 layers, and not zero (the weights really are int8).
    assert 1e-4 * scale < err < 0.08 * scale, (err, scale)
    assert float(jnp.mean(jnp.argmax(got, -1) == jnp.argmax(ref, -1))) >= 0.9


@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.first_case_fast
def test_int8_rows_do_not_depend_on_the_batch_or_the_width(batch, target):
    """Each row's logits are the row's alone, bit for bit: the one-row padding and the
    batch change nothing (exact int32 sums, per-row scales). Not across forward widths:
    the float32 parts (attention, norms) round differently by width, which is why the
    decoders fix one (`specjax.decoding.numerics`, tests/test_numerics.py)."""
    qmodel = quantize(target, "int8")
    tokens = _tokens(batch, 6, seed=batch)
    together = np.asarray(_logits(qmodel, tokens))
    for row in range(batch):
        alone = np.asarray(_logits(qmodel, tokens[row : row + 1]))
        np.testing.assert_array_equal(together[row], alone[0])


# Slow tier: two more compiled models; the unrolled path is the fast tier's.
@pytest.mark.slow
def test_scanned_and_unrolled_quantized_models_agree(target):
    tokens = _tokens(2, 7)
    unrolled = quantize(target, "int8")
    scanned = quantize(target.with_scan_layers(True), "int8")
    assert scanned.config.scan_layers and scanned.quantization == "int8"
    np.testing.assert_allclose(_logits(scanned, tokens), _logits(unrolled, tokens), atol=1e-5)


@pytest.mark.parametrize("draft_mode", MODES)
@pytest.mark.parametrize("drafter_name", ["draft_model", "lookup"])
@pytest.mark.parametrize("batch", [1, 5])  # 5 == γ + 1 for the draft model
# Slow tier: two decode programs per case (about 16 s); the fast tier keeps the
# quantized logits and their batch independence, which this exactness rests on.
@pytest.mark.slow
def test_greedy_speculative_equals_plain_with_quantized_models(
    draft_mode, drafter_name, batch, target
):
    """A weight-only int8 target (its products are float32, as a float target's) with a
    draft model in either mode, or prompt lookup: greedy speculative == greedy plain at
    the same forward width."""
    qtarget = quantize(target, "int8-weights")
    drafter = {
        "draft_model": specjax.DraftModel(
            quantize(tiny_model(seed=7, vocab_size=V), draft_mode), num_draft=4
        ),
        "lookup": specjax.PromptLookup(ngram=2, num_draft=3),
    }[drafter_name]
    prompts = ragged_prompts(batch, seed=batch, high=8, repeat=2)
    key = jax.random.key(0)
    kw = dict(max_new_tokens=13, sampling=GREEDY, forward_width=specjax.drafters.lookahead(drafter))
    plain = specjax.generate(key, qtarget, prompts, **kw)
    spec = specjax.speculative_generate(key, qtarget, drafter, prompts, **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
    assert int(jnp.min(spec.lengths)) == 13


# Slow tier: 8 s; the fast tier keeps the greedy equality with an int8 draft.
@pytest.mark.slow
def test_coupled_at_t1_equals_plain_sampling_with_an_int8_draft(target):
    """Coupled verification's guarantee (output == plain for the same key, at the same
    forward width) holds for a float target with an int8 draft of itself, at T = 1."""
    drafter = specjax.DraftModel(quantize(target, "int8"), num_draft=3)
    prompts = ragged_prompts(4, seed=11, high=8, repeat=2)
    sampling = specjax.SamplingConfig(temperature=1.0)
    key = jax.random.key(5)
    kw = dict(
        max_new_tokens=12, sampling=sampling, forward_width=specjax.drafters.lookahead(drafter)
    )
    plain = specjax.generate(key, target, prompts, **kw)
    spec = specjax.speculative_generate(key, target, drafter, prompts, verification="coupled", **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert float(spec.stats.acceptance_rate) > 0.5  # the drafts are really used


# Slow: tests/test_numerics.py shows the same equality for an int8 target in the fast
# tier, at jax's default flags, with every drafter; this one is the suite's flags.
@pytest.mark.slow
def test_an_int8_activation_target_speculates_and_equals_plain_at_its_width(target):
    """An int8 target (weights and activations) is a target like any other: at one
    forward width its speculative output is its plain output, token for token."""
    qtarget = quantize(target, "int8")
    drafter = specjax.PromptLookup(ngram=2, num_draft=3)
    prompts = ragged_prompts(4, seed=3, high=8, repeat=2)  # B == γ + 1 == W
    key = jax.random.key(0)
    kw = dict(max_new_tokens=13, sampling=GREEDY, forward_width=4)
    plain = specjax.generate(key, qtarget, prompts, **kw)
    spec = specjax.speculative_generate(key, qtarget, drafter, prompts, **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert float(spec.stats.acceptance_rate) > 0  # drafts were accepted, not only bonuses


def test_bad_input_is_refused_by_name(target, tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        quantize(target, "int4")
    with pytest.raises(TypeError, match="model must be a specjax Model"):
        quantize(object(), "int8")
    qmodel = quantize(target, "int8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(qmodel, "int8")
    with pytest.raises(ValueError, match="is quantized .* no Hugging Face form"):
        specjax.save_pretrained(qmodel, tmp_path / "out")
    assert not (tmp_path / "out").exists()
