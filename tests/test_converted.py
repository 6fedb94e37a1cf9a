"""Quantized loads: ``load_pretrained(path, quantize=mode)`` and the converted-weights
cache's quantized entries must give exactly ``quantize(load_pretrained(path), mode)``."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specjax
import specjax.io.gguf as gguf_module
from specjax.models.quant import MODES, quantize
from specjax.testing import perturbed, tiny_model

pytest.importorskip("gguf")
from test_gguf import write_tiny_gguf  # noqa: E402  (needs gguf, checked above)


def _same_model(a, b):
    """Equal bit for bit: config, module tree, every leaf's dtype, shape and value."""
    assert a.config == b.config
    assert a.quantization == b.quantization

    def nodes(model):
        module = nnx.merge(model.graphdef, model.params)
        return [(p, type(n).__name__) for p, n in nnx.iter_graph(module)]

    assert nodes(a) == nodes(b)
    for (pa, x), (pb, y) in zip(
        nnx.to_flat_state(a.params), nnx.to_flat_state(b.params), strict=True
    ):
        x, y = x.get_value(), y.get_value()
        assert pa == pb and x.dtype == y.dtype and x.shape == y.shape, (pa, pb)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(pa))
    assert a.chat_template == b.chat_template
    text = "hello world, the cat is here"
    assert (a.tokenizer is None) == (b.tokenizer is None)
    if a.tokenizer is not None:
        assert a.tokenizer.encode(text).ids == b.tokenizer.encode(text).ids


def _logits(model, tokens):
    cache = model.init_cache(1, len(tokens))
    out = model(jnp.asarray(tokens)[None], jnp.arange(len(tokens))[None], cache)
    return np.asarray(out.logits[0])


@pytest.fixture
def weight_cache(tmp_path, monkeypatch):
    root = tmp_path / "converted"
    monkeypatch.setenv("SPECJAX_WEIGHT_CACHE", str(root))
    return root


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scan", [False, True])
def test_a_folder_loaded_quantized_equals_the_quantized_float_load(tied, dtype, scan, tmp_path):
    model = perturbed(tiny_model(seed=0, vocab_size=64, tie_word_embeddings=tied), seed=3)
    specjax.save_pretrained(model, tmp_path / "m")
    for mode in MODES:
        expected = quantize(specjax.load_pretrained(tmp_path / "m", dtype, scan_layers=scan), mode)
        loaded = specjax.load_pretrained(tmp_path / "m", dtype, scan_layers=scan, quantize=mode)
        _same_model(loaded, expected)


@pytest.mark.parametrize(("case", "mode"), [("qwen2", "int8"), ("mistral", "int8-weights")])
def test_a_quantized_gguf_load_is_cached_quantized_and_read_back_exactly(
    case, mode, tmp_path, weight_cache, monkeypatch
):
    path = write_tiny_gguf(tmp_path / f"{case}.gguf", case)
    float_model = gguf_module.load_gguf(path)
    expected = quantize(float_model, mode)
    first = specjax.load_pretrained(path, quantize=mode)
    (entry,) = weight_cache.iterdir()
    assert entry.name.startswith(f"{case}-float32-{mode}-")
    assert {p.name for p in entry.iterdir()} >= {"quantized.safetensors", "config.json"}
    assert not (entry / "model.safetensors").exists()  # no float copy is kept

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again despite the cached entry")

    monkeypatch.setattr(gguf_module, "load_gguf", no_conversion)
    second = specjax.load_pretrained(path, quantize=mode)
    for model in (first, second):
        _same_model(model, expected)
    _same_model(
        specjax.load_pretrained(path, scan_layers=True, quantize=mode),
        quantize(float_model.with_scan_layers(True), mode),
    )
    prompt = np.random.default_rng(0).integers(0, expected.vocab_size, 8)
    np.testing.assert_array_equal(_logits(second, prompt), _logits(expected, prompt))


def test_float_and_quantized_entries_are_separate_and_the_quantized_one_is_smaller(
    tmp_path, weight_cache
):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    specjax.load_pretrained(path)
    (float_entry,) = weight_cache.iterdir()
    specjax.load_pretrained(path, quantize="int8")
    specjax.load_pretrained(path, quantize="int8-weights")
    specjax.load_pretrained(path, jnp.bfloat16, quantize="int8")
    entries = sorted(p.name for p in weight_cache.iterdir())
    assert len(entries) == 4 and float_entry.name in entries  # one per dtype and mode
    assert float_entry.name.startswith("m-float32-") and float_entry.name.count("-") == 2
    quantized = next(weight_cache.glob("m-float32-int8-*")) / "quantized.safetensors"
    assert quantized.stat().st_size < (float_entry / "model.safetensors").stat().st_size / 2


def test_a_quantized_entry_is_a_safetensors_file_of_the_leaves(tmp_path, weight_cache):
    from safetensors.numpy import load_file

    path = write_tiny_gguf(tmp_path / "m.gguf", "mistral")  # untied: a bfloat16 table stays
    expected = quantize(gguf_module.load_gguf(path, jnp.bfloat16), "int8")
    specjax.load_pretrained(path, jnp.bfloat16, quantize="int8")
    (entry,) = weight_cache.iterdir()
    stored = load_file(entry / "quantized.safetensors")
    leaves = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(expected.params)}
    assert stored.keys() == leaves.keys()
    assert stored["embed_tokens.embedding"].dtype == jnp.bfloat16
    for name, array in stored.items():
        assert array.dtype == leaves[name].dtype, name
        np.testing.assert_array_equal(array, np.asarray(leaves[name]), err_msg=name)
    _same_model(specjax.load_pretrained(path, jnp.bfloat16, quantize="int8"), expected)


def test_a_corrupt_quantized_entry_warns_and_is_rewritten(tmp_path, weight_cache):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    expected = quantize(gguf_module.load_gguf(path), "int8")
    specjax.load_pretrained(path, quantize="int8")
    (entry,) = weight_cache.iterdir()
    weights = entry / "quantized.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.warns(UserWarning, match="unreadable converted-weights entry"):
        _same_model(specjax.load_pretrained(path, quantize="int8"), expected)
    _same_model(specjax.load_pretrained(path, quantize="int8"), expected)


def test_the_cache_off_still_loads_quantized(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_WEIGHT_CACHE", "off")
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    loaded = specjax.load_pretrained(path, quantize="int8")
    _same_model(loaded, quantize(gguf_module.load_gguf(path), "int8"))


def test_an_unknown_mode_is_refused_by_name(tmp_path):
    specjax.save_pretrained(tiny_model(seed=0), tmp_path / "m")
    with pytest.raises(ValueError, match="quantize must be one of .*'int4'"):
        specjax.load_pretrained(tmp_path / "m", quantize="int4")
