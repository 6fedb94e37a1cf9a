"""Hugging Face interop: specjax must compute what transformers computes.

transformers and torch (CPU) are the oracle here and test-only dependencies.
Every tiny model gets random norm weights and biases too, so that a wrong
mapping cannot hide behind a unit norm or a zero bias.
"""

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import specjax
from specjax.io import config_from_hf, load_pretrained, save_pretrained
from specjax.models import Model, ModelConfig
from specjax.testing import perturbed

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4  # float32 on CPU; observed max |logit diff| is 1.5e-6 to 4.3e-6

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,  # so that greedy generation never stops early
    pad_token_id=None,
)
# Llama-3 scaling with these numbers hits all three frequency bands for
# head_dim 16 (wavelengths 6.3 < 16 < 20, 63 < 64 < 199).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
CASES = {
    "llama": ("LlamaConfig", dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "llama_tied": ("LlamaConfig", dict(tie_word_embeddings=True)),
    "llama3_rope": ("LlamaConfig", dict(rope_parameters=LLAMA3_ROPE)),
    "llama3_rope_tied_bias": (
        "LlamaConfig",
        dict(
            rope_parameters=LLAMA3_ROPE,
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=True,
        ),
    ),
    # A window shorter than the prompts, so the sliding mask really matters.
    "mistral": ("MistralConfig", dict(sliding_window=6)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    # An explicit head_dim that is not hidden_size // heads (64 / 4 = 16).
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
    "llama_linear_rope": (
        "LlamaConfig",
        dict(rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 3.0}),
    ),
    # Gemma 2: alternating sliding (window 6, shorter than the prompts) and full
    # layers; both soft-caps small enough that tanh bends the O(1) scores and
    # logits; a query_pre_attn_scalar that is not head_dim.
    "gemma2": (
        "Gemma2Config",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=6,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
    ),
    # Gemma 3: q/k norms, sliding and full layers with their own RoPE (local base
    # 100, global 10k with linear scaling, as the large Gemma 3 models scale it).
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=6,
            query_pre_attn_scalar=24,
            sliding_window_pattern=2,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
            },
        ),
    ),
}
PROMPT_LENGTHS = (1, 5, 11, 19)


def _randomize_(hf_model, seed):
    """Draws every weight (norms and biases included) so that logits are O(1)."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda p: torch.randn(p.shape, generator=gen, dtype=p.dtype)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * randn(p))
            elif name.endswith("bias"):
                p.copy_(0.3 * randn(p))
            else:
                p.copy_(randn(p) / np.sqrt(p.shape[-1]))


def _hf_model(case, seed=0):
    config_cls, overrides = CASES[case]
    config = getattr(transformers, config_cls)(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    _randomize_(model, seed)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """``checkpoint(case) -> (hf_model, folder)``, built once per case."""
    built = {}

    def get(case):
        if case not in built:
            hf = _hf_model(case)
            folder = tmp_path_factory.mktemp(case)
            hf.save_pretrained(folder)
            built[case] = (hf, folder)
        return built[case]

    return get


@jax.jit
def _forward(model, tokens, positions, cache):
    out = model(tokens, positions, cache)
    return out.logits, out.cache


def _hf_logits(hf_model, tokens):
    with torch.no_grad():
        return hf_model(torch.tensor(np.asarray(tokens)[None])).logits[0].numpy()


def _prompts(vocab_size, lengths=PROMPT_LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, n).astype(np.int32) for n in lengths]


def _ragged_logits(model, prompts):
    """All prompts in one right-padded batch, each row at its own positions."""
    t = max(len(p) for p in prompts)
    tokens = np.zeros((len(prompts), t), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = p
    positions = np.broadcast_to(np.arange(t, dtype=np.int32), tokens.shape)
    logits, _ = _forward(model, tokens, positions, model.init_cache(len(prompts), t))
    return [np.asarray(logits[b, : len(p)]) for b, p in enumerate(prompts)]


def _max_logit_diff(model, hf_model, prompts):
    ours = _ragged_logits(model, prompts)
    return max(
        float(np.abs(o - _hf_logits(hf_model, p)).max()) for o, p in zip(ours, prompts, strict=True)
    )


def _greedy_reference(model, prompt, max_new_tokens):
    """Greedy decoding written against the bare Model contract: prefill, then one token a step."""
    n = len(prompt)
    cache = model.init_cache(1, n + max_new_tokens)
    logits, cache = _forward(model, prompt[None], np.arange(n, dtype=np.int32)[None], cache)
    out = [int(jnp.argmax(logits[0, -1]))]
    for i in range(max_new_tokens - 1):
        tokens = np.array([[out[-1]]], np.int32)
        logits, cache = _forward(model, tokens, np.array([[n + i]], np.int32), cache)
        out.append(int(jnp.argmax(logits[0, -1])))
    return out


# Each entry maps (model, prompt int32[T], max_new_tokens) -> list of new token ids.
# Adding specjax's own decoder here makes it face the same transformers oracle.
def _specjax_generate(model, prompt, max_new_tokens):
    out = specjax.generate(
        jax.random.key(0),
        model,
        [prompt.tolist()],
        max_new_tokens=max_new_tokens,
        sampling=specjax.SamplingConfig.greedy(),
    )
    return out.to_lists()[0]


def _specjax_speculative(model, prompt, max_new_tokens):
    # The target drafting for itself is the hardest case for cache bookkeeping:
    # every draft is accepted, so every step ends on a bonus token.
    out = specjax.speculative_generate(
        jax.random.key(0),
        model,
        specjax.DraftModel(model, num_draft=3),
        [prompt.tolist()],
        max_new_tokens=max_new_tokens,
        sampling=specjax.SamplingConfig.greedy(),
    )
    return out.to_lists()[0]


GREEDY_GENERATORS = {
    "reference_loop": _greedy_reference,
    "specjax_generate": _specjax_generate,
    "specjax_speculative": _specjax_speculative,
}


@pytest.mark.parametrize("case", list(CASES))
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_logits_match_transformers(case, checkpoint):
    hf, folder = checkpoint(case)
    model = load_pretrained(folder)
    assert model.config.model_type == hf.config.model_type.removesuffix("_text")
    diff = _max_logit_diff(model, hf, _prompts(model.vocab_size))
    assert diff < ATOL, f"{case}: max |logit diff| = {diff:.2e}"


@pytest.mark.parametrize("generator", list(GREEDY_GENERATORS))
@pytest.mark.parametrize(
    "case", ["llama3_rope_tied_bias", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"]
)
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_greedy_generation_matches_transformers(case, generator, checkpoint):
    hf, folder = checkpoint(case)
    model = load_pretrained(folder)
    prompt = _prompts(model.vocab_size, lengths=(7,), seed=1)[0]
    new_tokens = 12
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompt[None].astype(np.int64)),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            do_sample=False,
            max_new_tokens=new_tokens,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert len(expected) == new_tokens
    assert GREEDY_GENERATORS[generator](model, prompt, new_tokens) == expected


def test_sharded_checkpoint_loads(checkpoint, tmp_path):
    hf, _ = checkpoint("qwen3")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (tmp_path / "model.safetensors").exists()
    model = load_pretrained(tmp_path)
    assert _max_logit_diff(model, hf, _prompts(model.vocab_size, (3, 9))) < ATOL


ROUND_TRIP = {
    "llama3_tied": ModelConfig(
        model_type="llama",
        vocab_size=97,
        num_layers=2,
        tie_word_embeddings=True,
        rope_scaling={k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"},
        eos_token_ids=(3, 5),
    ),
    "mistral": ModelConfig(model_type="mistral", vocab_size=97, sliding_window=5, bos_token_id=1),
    "qwen2": ModelConfig(model_type="qwen2", vocab_size=97, intermediate_size=96),
    "qwen3": ModelConfig(model_type="qwen3", vocab_size=97, head_dim=8, num_kv_heads=1),
    "gemma2": ModelConfig(
        model_type="gemma2",
        vocab_size=97,
        num_layers=2,
        tie_word_embeddings=True,
        sliding_window=4,
        layer_types=("sliding_attention", "full_attention"),
        query_pre_attn_scalar=20,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=2.0,
        eos_token_ids=(1, 7),
    ),
    "gemma3": ModelConfig(
        model_type="gemma3",
        vocab_size=97,
        num_layers=3,
        tie_word_embeddings=True,
        sliding_window=4,
        layer_types=("sliding_attention", "sliding_attention", "full_attention"),
        rope_theta=5000.0,
        local_rope_theta=50.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
}


@pytest.mark.parametrize("case", list(ROUND_TRIP))
def test_round_trip_through_transformers(case, tmp_path):
    model = perturbed(Model.random(ROUND_TRIP[case], seed=1), seed=2)
    # Shard the qwen3 save, so transformers reads specjax's index file too.
    save_pretrained(model, tmp_path, max_shard_size="40KB" if case == "qwen3" else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == (case == "qwen3")
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    assert (
        type(hf).__name__ == json.loads((tmp_path / "config.json").read_text())["architectures"][0]
    )
    assert hf.dtype == torch.float32
    diff = _max_logit_diff(model, hf, _prompts(model.vocab_size, (4, 13)))
    assert diff < ATOL, f"{case}: max |logit diff| = {diff:.2e}"

    # ... and back into specjax, bit for bit.
    again = load_pretrained(tmp_path)
    assert again.config == model.config
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(a, b)


# Slow tier: 8 s: a scanned model through transformers and back.
@pytest.mark.slow
def test_scanned_layers_load_save_and_decode_like_transformers(checkpoint, tmp_path):
    """load_pretrained(scan_layers=True) stacks the layers; greedy speculative decoding
    on it still equals transformers; saving unstacks, so transformers reads it back."""
    hf, folder = checkpoint("gemma2")
    model = load_pretrained(folder, scan_layers=True)
    assert model.config.scan_layers
    assert model.params["layers"]["mlp"]["up_proj"]["weight"][...].shape[0] == 3
    assert _max_logit_diff(model, hf, _prompts(model.vocab_size)) < ATOL
    prompt = _prompts(model.vocab_size, lengths=(7,), seed=1)[0]
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompt[None].astype(np.int64)),
            do_sample=False,
            max_new_tokens=12,
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert _specjax_speculative(model, prompt, 12) == expected
    save_pretrained(model, tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert _max_logit_diff(model, again, _prompts(model.vocab_size, (4, 13))) < ATOL


def test_bfloat16_save_is_read_as_bfloat16(tmp_path):
    model = perturbed(Model.random(ROUND_TRIP["qwen2"], dtype=jnp.bfloat16))
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf.dtype == torch.bfloat16
    ours = np.asarray(model.params["embed_tokens"]["embedding"][...].astype(jnp.float32))
    np.testing.assert_array_equal(hf.model.embed_tokens.weight.detach().float().numpy(), ours)
    loaded = load_pretrained(tmp_path, dtype=jnp.bfloat16)
    assert loaded.dtype == jnp.bfloat16


def test_tokenizer_json_is_loaded_and_saved(checkpoint, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _, folder = checkpoint("llama")
    shutil.copytree(folder, tmp_path / "ckpt")
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(97)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "ckpt" / "tokenizer.json"))

    model = load_pretrained(tmp_path / "ckpt")
    assert model.tokenizer.encode("w3 w41 w96").ids == [3, 41, 96]
    # The tokenizer is static pytree metadata: the model still jits.
    tokens = np.array([[3, 41]], np.int32)
    logits, _ = _forward(model, tokens, np.array([[0, 1]], np.int32), model.init_cache(1, 4))
    assert logits.shape == (1, 2, 97)

    save_pretrained(model, tmp_path / "out")
    assert load_pretrained(tmp_path / "out").tokenizer.encode("w7").ids == [7]


def test_config_defaults_follow_transformers(tmp_path):
    """A config.json that leaves fields out means what transformers makes of it."""
    required = {k: TINY[k] for k in ("vocab_size", "intermediate_size", "num_hidden_layers")}
    # 32 heads: Mistral defaults to 8 kv heads and Qwen to 32.
    required.update(hidden_size=256, num_attention_heads=32)
    for model_type in ("llama", "mistral", "qwen2", "qwen3"):
        hf_json = {"model_type": model_type, **required}
        (tmp_path / "config.json").write_text(json.dumps(hf_json))
        hf = transformers.AutoConfig.from_pretrained(tmp_path)
        ours = config_from_hf(hf_json)
        assert ours.num_kv_heads == hf.num_key_value_heads, model_type
        assert ours.head_dim == (getattr(hf, "head_dim", None) or 256 // 32), model_type
        assert ours.max_position_embeddings == hf.max_position_embeddings, model_type
        assert ours.rms_norm_eps == hf.rms_norm_eps, model_type
        assert ours.rope_theta == hf.rope_parameters["rope_theta"], model_type
        assert ours.tie_word_embeddings == hf.tie_word_embeddings, model_type
        assert (ours.bos_token_id, ours.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
        assert ours.sliding_window == getattr(hf, "sliding_window", None), model_type


def test_legacy_rope_fields_and_eos_list():
    base = {"model_type": "llama", **{k: v for k, v in TINY.items() if v is not None}}
    v5 = config_from_hf({**base, "rope_parameters": LLAMA3_ROPE, "eos_token_id": [7, 9]})
    legacy_scaling = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    v4 = config_from_hf(
        {**base, "rope_theta": 10000.0, "rope_scaling": legacy_scaling, "eos_token_id": [7, 9]}
    )
    assert v4 == v5
    assert v5.rope_scaling_dict["factor"] == 4.0
    assert (v5.eos_token_id, v5.eos_token_ids) == (7, (7, 9))


def _copy(folder, dest):
    shutil.copytree(folder, dest)
    return dest


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_pickle_only_folder_is_refused(checkpoint, tmp_path):
    _, folder = checkpoint("llama")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(ValueError, match=r"pickle.*pytorch_model\.bin.*safetensors"):
        load_pretrained(tmp_path)


# (checkpoint, config.json changes, what the error must name)
UNSUPPORTED_CONFIGS = [
    ("llama", dict(model_type="gpt2"), "model_type='gpt2'"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("llama", dict(num_local_experts=8), "num_local_experts=8"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 2.0}), "rope_type='yarn'"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    ("llama", dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_type='dynamic'"),
    (
        "llama",
        dict(rope_parameters={"full_attention": {}, "sliding_attention": {}}),
        "per-layer-type",
    ),
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window"),
    ("qwen2", dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    ("gemma3", dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("gemma3", dict(model_type="gemma3", text_config={}), "multimodal"),
    (
        "gemma3",
        dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
        "only default RoPE on sliding layers",
    ),
]


@pytest.mark.parametrize("case, changes, field", UNSUPPORTED_CONFIGS)
def test_unsupported_config_fields_raise(case, changes, field, checkpoint, tmp_path):
    _, folder = checkpoint(case)
    folder = _copy(folder, tmp_path / "ckpt")
    _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=re.escape(field)):
        load_pretrained(folder)


def _edit_tensors(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor_is_named(checkpoint, tmp_path):
    folder = _copy(checkpoint("llama")[1], tmp_path / "ckpt")
    _edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_pretrained(folder)


def test_misshaped_tensor_names_both_shapes(checkpoint, tmp_path):
    folder = _copy(checkpoint("llama")[1], tmp_path / "ckpt")
    name = "model.layers.0.self_attn.k_proj.weight"  # [2 kv heads * 16, 64]

    def edit(t):
        t[name] = np.zeros((32, 63), np.float32)

    _edit_tensors(folder, edit)
    with pytest.raises(ValueError, match=rf"{name} has shape \(32, 63\), expected \(32, 64\)"):
        load_pretrained(folder)


def test_unexpected_tensor_is_named(checkpoint, tmp_path):
    folder = _copy(checkpoint("llama")[1], tmp_path / "ckpt")
    name = "model.layers.0.self_attn.o_proj.bias"  # llama without attention_bias has none

    def edit(t):
        t[name] = np.zeros((64,), np.float32)

    _edit_tensors(folder, edit)
    with pytest.raises(ValueError, match=rf"unexpected.*{name}"):
        load_pretrained(folder)


def test_gemma_config_defaults_and_legacy_fields_follow_transformers(tmp_path):
    """What transformers makes of a Gemma config.json that leaves fields out, or uses
    the pre-v5 fields (rope_theta / rope_local_base_freq / rope_scaling, hidden_act)."""
    required = {k: TINY[k] for k in ("vocab_size", "intermediate_size", "num_attention_heads")}
    required.update(hidden_size=64, num_hidden_layers=7)
    legacy = dict(
        rope_theta=1e5,
        rope_local_base_freq=50.0,
        hidden_act="gelu_pytorch_tanh",
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window_pattern=3,
    )
    for model_type, extra in (("gemma2", {}), ("gemma3_text", {}), ("gemma3_text", legacy)):
        hf_json = {"model_type": model_type, **required, **extra}
        (tmp_path / "config.json").write_text(json.dumps(hf_json))
        hf = transformers.AutoConfig.from_pretrained(tmp_path)
        ours = config_from_hf(hf_json)
        assert ours.layer_types == tuple(hf.layer_types), model_type
        for field in ("sliding_window", "query_pre_attn_scalar", "head_dim", "tie_word_embeddings"):
            assert getattr(ours, field) == getattr(hf, field), (model_type, field)
        for field in ("attn_logit_softcapping", "final_logit_softcapping"):
            assert getattr(ours, field) == getattr(hf, field), (model_type, field)
        assert (ours.bos_token_id, ours.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
        assert (ours.num_kv_heads, ours.max_position_embeddings) == (
            hf.num_key_value_heads,
            hf.max_position_embeddings,
        )
        if model_type == "gemma2":
            assert ours.rope_theta == hf.rope_parameters["rope_theta"]
            assert ours.local_rope_theta is None
        else:
            full, local = (
                hf.rope_parameters["full_attention"],
                hf.rope_parameters["sliding_attention"],
            )
            assert (ours.rope_theta, ours.local_rope_theta) == (
                full["rope_theta"],
                local["rope_theta"],
            )
            assert (ours.rope_scaling_dict or {}).get("factor") == full.get("factor")


def test_unexpressible_config_is_not_saved(tmp_path):
    config = ModelConfig(model_type="qwen2", vocab_size=97, attention_bias=False)
    with pytest.raises(ValueError, match="attention_bias=False"):
        save_pretrained(Model.random(config), tmp_path)
