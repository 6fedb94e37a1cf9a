"""llama.cpp GGUF files as :class:`~specjax.models.model.Model` (:func:`load_gguf`).

A GGUF file goes through the same door as a Hugging Face folder, so both get
the same checks:

1. its metadata (``llama.block_count``, ``llama.rope.freq_base``, ...) is
   translated into the ``config.json`` dict transformers would write for the
   model, and read by :func:`specjax.io.hf_config.config_from_hf`;
2. its tensors (``blk.0.attn_q.weight``) are renamed to Hugging Face names
   (``model.layers.0.self_attn.q_proj.weight``), dequantized with the ``gguf``
   package (llama.cpp's own reader) and handed, ``[out, in]`` like
   ``torch.nn.Linear``, to :func:`specjax.io.tensors.model_from_tensors`.

On the way, llama.cpp's conversions are undone:

* ``llama`` files (Llama, Mistral, SmolLM) store the rows of the query and key
  projections interleaved per head (llama.cpp's converter permutes them for its
  RoPE kernel); they are put back in Hugging Face's half-split order.
* Gemma files store every RMSNorm weight as ``1 + w``; ``1`` is subtracted,
  since Hugging Face's Gemma stores ``w`` and computes ``x * (1 + w)``.
* Llama 3 files carry their RoPE scaling as a ``rope_freqs`` tensor of
  per-frequency divisors; the ``llama3`` scaling parameters that produce
  exactly those divisors are recovered, or the file is refused.

Step 1 is :mod:`specjax.io.gguf_config`. ``gguf`` is an optional dependency
(``pip install "specjax[gguf]"``), imported only when a file is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.io.gguf_config import (
    GEMMA_ARCHITECTURES,
    ROPE_FREQS,
    SUPPORTED_ARCHITECTURES,
    gguf_hf_config,
    import_gguf,
    open_reader,
    read_metadata,
    rope_divisors,
    tensor_shapes,
    translate_config,
)
from specjax.io.gguf_tokenizer import tokenizer_from_gguf
from specjax.io.hf_config import config_from_hf
from specjax.io.tensors import LazyTensors, model_from_tensors
from specjax.models.model import Model

__all__ = ["SUPPORTED_ARCHITECTURES", "gguf_hf_config", "load_gguf"]

# Architectures whose converter interleaves the q/k rows (llama.cpp's
# ``LlamaModel.permute``); Qwen and Gemma are written in Hugging Face order.
_PERMUTED_QK = ("llama",)

# GGUF tensor name (after ``blk.N.``) -> Hugging Face module path (after
# ``model.layers.N.``); the ``.weight`` / ``.bias`` suffix carries over.
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# The norm after attention is ``ffn_norm`` in Llama-style files; Gemma's
# sandwich norms take four names.
_NORMS = {
    "llama": {"ffn_norm": "post_attention_layernorm"},
    "gemma": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
_TOP_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def _hf_tensor_name(name: str, arch: str, path: Path) -> str:
    norms = _NORMS["gemma" if arch in GEMMA_ARCHITECTURES else "llama"]
    stem, dot, leaf = name.rpartition(".")
    if leaf not in ("weight", "bias"):
        stem, dot, leaf = name, "", ""
    if stem in _TOP_TENSORS:
        return f"{_TOP_TENSORS[stem]}{dot}{leaf}"
    parts = stem.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        module = _BLOCK_TENSORS.get(parts[2]) or norms.get(parts[2])
        if module is not None:
            return f"model.layers.{parts[1]}.{module}{dot}{leaf}"
    raise ValueError(f"{path}: tensor {name} has no counterpart in a {arch} model")


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes the converter's q/k permutation: rows ``(head, pair, 2)`` -> ``(head, 2, pair)``."""
    shape = w.shape
    return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _from_llama_cpp(
    w: np.ndarray, gguf_name: str, hf_name: str, arch: str, heads: dict[str, int]
) -> np.ndarray:
    """Undoes llama.cpp's storage conventions on one dequantized float32 tensor.

    ``heads`` maps the modules whose rows the converter permuted (``q_proj``,
    ``k_proj``) to their number of heads.
    """
    module = hf_name.rsplit(".", 2)[-2]
    if arch in _PERMUTED_QK and module in heads:
        w = _unpermute_rows(w, heads[module])
    if arch in GEMMA_ARCHITECTURES and gguf_name.endswith("norm.weight"):
        w = w - np.float32(1.0)  # stored as 1 + w; subtracted in float32, before any cast
    return w


def _check_dequantizable(reader, path: Path) -> None:
    """Refuses, before anything is decoded, a tensor type the gguf package cannot decode."""
    gguf = import_gguf()
    seen = {}
    for t in reader.tensors:
        seen.setdefault(t.tensor_type, t.name)
    for qtype, name in seen.items():
        block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
        try:
            gguf.quants.dequantize(np.zeros((1, block_bytes), np.uint8), qtype)
        except NotImplementedError:
            raise ValueError(
                f"{path}: tensor {name} is stored as {qtype.name}, which gguf "
                f"{_gguf_version()} cannot dequantize; re-quantize the file to a supported type "
                "(e.g. Q8_0, Q4_K_M or F16)"
            ) from None


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def load_gguf(path: str | os.PathLike, dtype=jnp.float32, *, quantize: str | None = None) -> Model:
    """Loads a llama.cpp GGUF file (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3).

    Usually reached through :func:`specjax.load_pretrained`, which sends a
    ``.gguf`` path (or a folder holding one ``.gguf`` and no ``config.json``)
    here.

    Args:
        path: the ``.gguf`` file.
        dtype: parameter dtype; every tensor is dequantized to float32 and cast
            to it (so a Q4 file loads as float32 weights by default, with the
            values the quantized blocks encode).
        quantize: a `specjax.models.quant` mode, applied layer by layer as the file is
            dequantized (`~specjax.io.tensors.model_from_tensors`).

    Returns:
        The :class:`Model`, with ``tokenizer`` rebuilt from the file's vocabulary
        (``None`` if it has none), ``chat_template`` from
        ``tokenizer.chat_template``, and ``config.eos_token_ids`` holding EOS
        plus the end-of-turn / end-of-message ids the file names.

    Raises:
        ImportError: the ``gguf`` package is not installed.
        ValueError: not a GGUF file, an unsupported architecture, metadata key,
            tensor type (one the ``gguf`` package cannot dequantize) or tensor,
            each named with the file; or any config or tensor check of
            :func:`~specjax.io.tensors.model_from_tensors`.
    """
    path = Path(path)
    gguf = import_gguf()
    reader = open_reader(path)
    meta = read_metadata(reader)
    by_name = {t.name: t for t in reader.tensors}
    shapes = tensor_shapes(reader)
    hf_config = translate_config(meta, shapes, rope_divisors(reader), path)
    arch = meta["general.architecture"]
    config = config_from_hf(hf_config)
    _check_dequantizable(reader, path)

    heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}  # whose rows are permuted

    def reader_for(tensor, hf_name):
        def read() -> np.ndarray:
            w = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
            w = w.reshape(shapes[tensor.name])
            return _from_llama_cpp(w, tensor.name, hf_name, arch, heads)

        return read

    readers, hf_shapes = {}, {}
    for name, tensor in by_name.items():
        if name == ROPE_FREQS:
            continue
        hf_name = _hf_tensor_name(name, arch, path)
        readers[hf_name] = reader_for(tensor, hf_name)
        hf_shapes[hf_name] = shapes[name]
    template = meta.get("tokenizer.chat_template")
    return model_from_tensors(
        config,
        LazyTensors(readers, hf_shapes),
        dtype=dtype,
        tokenizer=tokenizer_from_gguf(meta, architecture=arch, source=str(path)),
        chat_template=template if isinstance(template, str) else None,
        quantize=quantize,
    )
