"""The model contract, in pure JAX: cached decoding is exact, rows are independent.

Every check compares two ways of computing the same logits. The weights are
redrawn so that logits are O(1) and norms and biases are not trivially 1 and 0.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.models import KVCache, Model, ModelConfig
from specjax.testing import perturbed

# Same math, different association order (cached vs full attention), in float32.
ATOL = 2e-5

CONFIGS = {
    "llama_gqa": ModelConfig(model_type="llama", vocab_size=61, num_heads=4, num_kv_heads=2),
    # The window (3) is shorter than the sequences, so decoding must mask by position.
    "mistral_window": ModelConfig(model_type="mistral", vocab_size=61, sliding_window=3),
    "qwen3_tied": ModelConfig(
        model_type="qwen3", vocab_size=61, head_dim=8, num_kv_heads=1, tie_word_embeddings=True
    ),
    # Sliding (window 3) and full layers with their own RoPE bases, soft-capped scores.
    "gemma3_mixed": ModelConfig(
        model_type="gemma3",
        vocab_size=61,
        num_layers=3,
        sliding_window=3,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
        local_rope_theta=100.0,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=5.0,
        tie_word_embeddings=True,
    ),
}


_MODELS = {}


def _model(name) -> Model:
    if name not in _MODELS:
        _MODELS[name] = perturbed(Model.random(CONFIGS[name], seed=1), seed=2)
    return _MODELS[name]


@jax.jit
def _forward(model, tokens, positions, cache):
    out = model(tokens, positions, cache)
    return out.logits, out.cache


def _tokens(shape, vocab=61, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def _positions(start, t, batch=1):
    return np.broadcast_to(np.arange(start, start + t, dtype=np.int32), (batch, t))


def _full(model, tokens, max_len=None):
    b, t = tokens.shape
    cache = model.init_cache(b, max_len or t)
    return _forward(model, tokens, _positions(0, t, b), cache)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_then_token_by_token_equals_full_forward(name):
    model = _model(name)
    tokens = _tokens((2, 10))
    full, _ = _full(model, tokens)
    assert full.dtype == jnp.float32 and float(jnp.std(full)) > 0.5  # logits are O(1)

    logits, cache = _full(model, tokens[:, :4], max_len=10)
    steps = [logits]
    for i in range(4, 10):
        logits, cache = _forward(model, tokens[:, i : i + 1], _positions(i, 1, 2), cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=ATOL, rtol=0)
    np.testing.assert_array_equal(cache.lengths, [10, 10])


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_window", "gemma3_mixed"])
def test_several_tokens_against_cache_equal_single_steps(name):
    model = _model(name)
    tokens = _tokens((2, 11), seed=1)
    _, cache = _full(model, tokens[:, :3], max_len=16)

    block, block_cache = _forward(model, tokens[:, 3:11], _positions(3, 8, 2), cache)
    singles = []
    for i in range(3, 11):
        logits, cache = _forward(model, tokens[:, i : i + 1], _positions(i, 1, 2), cache)
        singles.append(logits)
    np.testing.assert_allclose(block, jnp.concatenate(singles, axis=1), atol=ATOL, rtol=0)
    np.testing.assert_allclose(block_cache.k, cache.k, atol=ATOL, rtol=0)
    np.testing.assert_array_equal(block_cache.lengths, cache.lengths)


def test_ragged_rows_equal_each_row_alone():
    """Right-padded prompts of different lengths, then one decode step per row at its position."""
    model = _model("llama_gqa")
    lengths = [3, 8, 5]
    prompts = [_tokens((n,), seed=10 + n) for n in lengths]
    next_tokens = np.array([[7], [11], [13]], np.int32)
    batch = np.zeros((3, 8), np.int32)
    for b, p in enumerate(prompts):
        batch[b, : len(p)] = p
    prefill, cache = _full(model, batch, max_len=12)
    # The padding wrote junk past each row's end; dropping it is a rollback.
    cache = cache.rollback(np.array(lengths, np.int32))
    step, _ = _forward(model, next_tokens, np.array(lengths, np.int32)[:, None], cache)

    for b, p in enumerate(prompts):
        alone, alone_cache = _full(model, p[None], max_len=12)
        alone_step, _ = _forward(
            model, next_tokens[b : b + 1], np.array([[len(p)]], np.int32), alone_cache
        )
        np.testing.assert_allclose(prefill[b, : len(p)], alone[0], atol=ATOL, rtol=0)
        np.testing.assert_allclose(step[b], alone_step[0], atol=ATOL, rtol=0)


def test_rollback_then_redecode_equals_never_decoding_rejected_tokens():
    model = _model("llama_gqa")
    prompt = _tokens((2, 5), seed=3)
    _, cache = _full(model, prompt, max_len=12)
    # Draft 4 tokens; row 0 keeps 1 of them, row 1 keeps 3.
    draft = _tokens((2, 4), seed=4)
    _, cache = _forward(model, draft, _positions(5, 4, 2), cache)
    cache = cache.rollback(np.array([6, 8], np.int32))
    fix = _tokens((2, 2), seed=5)
    positions = np.array([[6, 7], [8, 9]], np.int32)
    logits, cache = _forward(model, fix, positions, cache)

    for b, keep in enumerate([1, 3]):
        clean = np.concatenate([prompt[b], draft[b, :keep], fix[b]])[None]
        expected, _ = _full(model, clean, max_len=12)
        np.testing.assert_allclose(logits[b], expected[0, -2:], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(cache.lengths, [8, 10])


def test_writes_past_the_cache_end_are_dropped_not_clamped():
    model = _model("llama_gqa")
    tokens = _tokens((1, 8), seed=6)
    _, full_cache = _full(model, tokens, max_len=8)  # every slot 0..7 written

    # Positions 8 and 9 do not exist: the cache must come back unchanged.
    logits, after = _forward(model, _tokens((1, 2), seed=7), _positions(8, 2), full_cache)
    np.testing.assert_array_equal(after.k, full_cache.k)
    np.testing.assert_array_equal(after.v, full_cache.v)
    assert np.isfinite(np.asarray(logits)).all()

    # Positions 7 and 8: slot 7 gets position 7's entry; position 8 must not land on it.
    _, prefix_cache = _full(model, tokens[:, :7], max_len=8)
    pair = np.array([[tokens[0, 7], 5]], np.int32)
    _, both = _forward(model, pair, _positions(7, 2), prefix_cache)
    np.testing.assert_allclose(both.k, full_cache.k, atol=ATOL, rtol=0)
    np.testing.assert_allclose(both.v, full_cache.v, atol=ATOL, rtol=0)


def test_logits_do_not_depend_on_later_tokens():
    model = _model("qwen3_tied")
    tokens = _tokens((1, 9), seed=8)
    changed = tokens.copy()
    changed[0, 5:] = (changed[0, 5:] + 1) % 61
    a, _ = _full(model, tokens)
    b, _ = _full(model, changed)
    # Masked scores get exactly zero weight, so this is bit-exact, not approximate.
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_bfloat16_params_give_finite_float32_logits_close_to_float32():
    f32 = _model("llama_gqa")
    bf16 = f32.replace(params=jax.tree.map(lambda x: x.astype(jnp.bfloat16), f32.params))
    # Compare against float32 compute on the very same (bf16-rounded) weights, so
    # the difference measures bf16 activations only, not weight rounding.
    rounded = bf16.replace(params=jax.tree.map(lambda x: x.astype(jnp.float32), bf16.params))
    tokens = _tokens((2, 12), seed=9)
    logits, cache = _full(bf16, tokens)
    reference, _ = _full(rounded, tokens)
    assert bf16.dtype == jnp.bfloat16 and cache.k.dtype == jnp.bfloat16
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
    # bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3). With ~10
    # rounded activations per layer over 2 layers, logits of spread ~1 drift by
    # ~1e-2 (observed 0.018): 0.05 leaves ~3x margin and is 20x below the spread.
    assert float(jnp.std(reference)) > 0.5
    np.testing.assert_allclose(logits, reference, atol=0.05, rtol=0)
    assert (np.argmax(logits, -1) == np.argmax(reference, -1)).mean() > 0.9


def test_cache_contract():
    model = _model("qwen3_tied")
    cache = model.init_cache(3, 16)
    c = model.config
    assert isinstance(cache, KVCache)
    assert cache.k.shape == (c.num_layers, 3, c.num_kv_heads, c.head_dim, 16)
    assert cache.v.shape == (c.num_layers, 3, c.num_kv_heads, 16, c.head_dim)
    assert (cache.batch_size, cache.max_len) == (3, 16)
    positions = np.array([[0, 1], [4, 5], [2, 3]], np.int32)
    logits, new = _forward(model, _tokens((3, 2)), positions, cache)
    assert logits.shape == (3, 2, model.vocab_size)
    np.testing.assert_array_equal(new.lengths, [2, 6, 4])


def test_weights_are_stored_out_by_in_and_the_embedding_vocab_by_hidden():
    # Hugging Face's layouts: Dense weights [out, in]; one [V, E] table serves a
    # tied model's lookup (its rows) and head. Untied: the same table plus lm_head [V, E].
    tied, untied = _model("qwen3_tied"), Model.random(ModelConfig(vocab_size=61))
    c = tied.config
    table = tied.params["embed_tokens"]["embedding"][...]
    assert table.shape == (c.vocab_size, c.hidden_size)
    assert "lm_head" not in tied.params
    assert tied.params["layers"][0]["mlp"]["up_proj"]["weight"][...].shape == (
        c.intermediate_size,
        c.hidden_size,
    )
    module = nnx.merge(tied.graphdef, tied.params)
    tokens = _tokens((2, 3))
    np.testing.assert_array_equal(module.embed_tokens(tokens), np.asarray(table)[tokens])
    assert untied.params["embed_tokens"]["embedding"][...].shape == (61, untied.config.hidden_size)
    assert untied.params["lm_head"]["weight"][...].shape == (61, untied.config.hidden_size)


# Slow tier: 4 s; a memory property, not an output one.
@pytest.mark.slow
def test_decoding_copies_no_weight():
    """The compiled decode loop reads every weight matrix in place.

    The head as ``hidden @ table.T`` made XLA:CPU transpose (copy) the whole
    table on every step; contracting the last axis of both operands must not.
    Shapes are chosen so that no activation has a weight's shape.
    """
    import re

    import specjax

    config = ModelConfig(
        vocab_size=1000,
        hidden_size=40,
        intermediate_size=72,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=True,
    )
    model = Model.random(config)

    @jax.jit
    def decode(model, prompts):
        greedy, key = specjax.SamplingConfig.greedy(), jax.random.key(0)
        return specjax.generate(key, model, prompts, max_new_tokens=4, sampling=greedy).tokens

    hlo = decode.lower(model, jnp.zeros((1, 3), jnp.int32)).compile().as_text()
    matrices = {v.get_value().shape for _, v in nnx.to_flat_state(model.params)}
    matrices = {s for s in matrices if len(s) == 2} | {s[::-1] for s in matrices if len(s) == 2}
    assert (1000, 40) in matrices
    moved = [
        line.strip()
        for line in hlo.splitlines()
        if (m := re.search(r"= f32\[(\d+),(\d+)\]\{[^}]*\} (copy|transpose)\(", line))
        and (int(m[1]), int(m[2])) in matrices
    ]
    assert not moved, moved


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(model_type="qwen2", vocab_size=61, mlp_bias=True),
        ModelConfig(model_type="llama", attention_bias=True, tie_word_embeddings=True),
        ModelConfig(model_type="qwen3", head_dim=24),
        ModelConfig(model_type="gemma2", tie_word_embeddings=True),
        ModelConfig(model_type="gemma3", attention_bias=True),
    ],
    ids=["qwen2", "llama_bias_tied", "qwen3", "gemma2", "gemma3"],
)
def test_num_params_counts_the_actual_parameters(config):
    params = nnx.eval_shape(lambda: Model.random(config).params)
    assert config.num_params() == sum(x.size for x in jax.tree.leaves(params))


def test_family_switches_default_by_model_type():
    qwen2, qwen3 = ModelConfig(model_type="qwen2"), ModelConfig(model_type="qwen3")
    assert (qwen2.attention_bias, qwen2.o_proj_bias, qwen2.qk_norm) == (True, False, False)
    assert (qwen3.attention_bias, qwen3.qk_norm) == (False, True)
    llama = ModelConfig(attention_bias=True, eos_token_ids=[5, 9])
    assert llama.o_proj_bias and llama.eos_token_id == 5 and llama.eos_token_ids == (5, 9)
    assert hash(ModelConfig(rope_scaling=_LLAMA3)) == hash(ModelConfig(rope_scaling=_LLAMA3))
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        ModelConfig(rope_scaling={**_LLAMA3, "rope_type": "yarn"})


_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


# ----------------------------------------------------------------------------
# Layer scan: the same model with its layers as one lax.scan over stacked params.


@pytest.mark.parametrize("name", ["llama_gqa", "gemma3_mixed"])
def test_scanned_layers_compute_what_the_unrolled_layers_compute(name):
    unrolled = _model(name)
    scanned = unrolled.with_scan_layers()
    q = scanned.params["layers"]["self_attn"]["q_proj"]["weight"][...]
    assert q.shape[0] == unrolled.config.num_layers  # stacked [L, H·D, E]
    tokens = _tokens((2, 9))
    positions = _positions(0, 9, 2)

    @jax.jit
    def run(model, cache):
        layers = (unrolled.config.num_layers - 1, 0)  # out of order on purpose
        return model(tokens, positions, cache, feature_layers=layers)

    for cache in (unrolled.init_cache(2, 12), None):  # decoding, and scoring without a cache
        want, got = run(unrolled, cache), run(scanned, cache)
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
    # Both layouts of one seed hold the same weights, and converting back is exact.
    fresh = Model.random(scanned.config, seed=1).with_scan_layers(False)
    reference = Model.random(CONFIGS[name], seed=1)
    for a, b in zip(jax.tree.leaves(fresh.params), jax.tree.leaves(reference.params), strict=True):
        np.testing.assert_array_equal(a, b)
    back = scanned.with_scan_layers(False)
    assert back.config == unrolled.config
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(unrolled.params), strict=True):
        np.testing.assert_array_equal(a, b)


# Slow tier: 2 s; a compile-size property; scanned == unrolled stays in the fast tier.
@pytest.mark.slow
def test_scanned_program_does_not_grow_with_depth():
    """Compile time follows program size: scanned, 2 and 8 layers lower to the same
    program (one layer body); unrolled, 8 layers lower to about 4× as much."""

    def hlo_size(num_layers, scan):
        config = ModelConfig(vocab_size=61, num_layers=num_layers, scan_layers=scan)
        model = nnx.eval_shape(lambda: Model.random(config))
        tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
        cache = jax.eval_shape(lambda: model.init_cache(1, 8))
        return len(jax.jit(lambda m, t, c: m(t, t, c)).lower(model, tokens, cache).as_text())

    assert hlo_size(8, True) < 1.05 * hlo_size(2, True)
    assert hlo_size(8, False) > 3 * hlo_size(2, False)


@pytest.mark.parametrize("name", ["llama_gqa", "gemma3_mixed"])
def test_a_prompt_longer_than_a_chunk_prefills_as_one_forward_does(name):
    """`prefill` of ragged prompts 4 tokens at a time (a padded last chunk) writes the
    cache, its lengths and the requested hidden states that one forward writes."""
    from specjax.models.forward import prefill

    model = _model(name)
    lengths = jnp.asarray([10, 3, 7], jnp.int32)
    prompts = jnp.asarray(_tokens((3, 10), seed=5))
    run = jax.jit(prefill, static_argnames=("cache_len", "feature_layers", "chunk"))
    whole, whole_hidden = run(model, prompts, lengths, cache_len=16, feature_layers=(0, 1))
    chunked, chunked_hidden = run(
        model, prompts, lengths, cache_len=16, feature_layers=(0, 1), chunk=4
    )
    np.testing.assert_array_equal(chunked.lengths, lengths - 1)
    np.testing.assert_array_equal(whole.lengths, lengths - 1)
    # Slots past a row's pending token are rewritten before they are read.
    for b, n in enumerate(lengths.tolist()):
        np.testing.assert_allclose(
            chunked.k[:, b, ..., : n - 1], whole.k[:, b, ..., : n - 1], atol=ATOL, rtol=0
        )
        np.testing.assert_allclose(
            chunked.v[:, b, :, : n - 1], whole.v[:, b, :, : n - 1], atol=ATOL, rtol=0
        )
        np.testing.assert_allclose(
            chunked_hidden.states[b, :n], whole_hidden.states[b, :n], atol=ATOL, rtol=0
        )
    np.testing.assert_array_equal(chunked_hidden.positions, whole_hidden.positions)
    assert chunked_hidden.states.shape == whole_hidden.states.shape
