"""A GGUF file's metadata as the Hugging Face ``config.json`` of its model.

:func:`gguf_hf_config` reads only the metadata and the tensor table of a llama.cpp
GGUF file, not the weights, and translates the keys (``llama.block_count``,
``llama.rope.freq_base``, ...) into the dict transformers would write, for
:func:`specjax.io.hf_config.config_from_hf`. A key that means a computation the
decoder does not do is refused, and Llama 3's ``rope_freqs`` divisors are turned back
into their ``llama3`` rope scaling parameters. The tensors are read by
:func:`specjax.io.gguf.load_gguf`.

``gguf`` is an optional dependency (``pip install "specjax[gguf]"``), imported only
when a file is read.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

__all__ = ["SUPPORTED_ARCHITECTURES", "gguf_hf_config"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")
"""``general.architecture`` values that load (Mistral files use ``llama``)."""

GEMMA_ARCHITECTURES = ("gemma2", "gemma3")

# Derived from the config, never a parameter: llama.cpp's Llama 3 RoPE divisors.
ROPE_FREQS = "rope_freqs.weight"

# Keys whose presence (with a value other than the neutral one) means a
# computation the decoder does not do.
_REFUSED_KEYS = {
    "expert_count": (0, "mixture-of-experts models are not implemented"),
    "logit_scale": (1.0, "scaled output logits are not implemented"),
    "embedding_scale": (1.0, "scaled input embeddings are not implemented"),
    "residual_scale": (1.0, "scaled residual connections are not implemented"),
    "attention.clamp_kqv": (0.0, "clamped q/k/v projections are not implemented"),
    "attention.causal": (True, "only causal (decoder) models are implemented"),
}


def import_gguf():
    """The ``gguf`` module, or an ImportError that says how to install it."""
    try:
        import gguf
    except ImportError as e:
        raise ImportError(
            "loading a GGUF file needs the gguf package (llama.cpp's reader): "
            'pip install "specjax[gguf]"'
        ) from e
    return gguf


def open_reader(path: Path):
    """A ``gguf.GGUFReader`` of ``path``; ValueError naming the file if it is not GGUF."""
    gguf = import_gguf()
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct.error, ...
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e


def read_metadata(reader) -> dict:
    """Key -> value (int, float, bool, str or a list of them); GGUF's own header fields dropped."""
    return {
        key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")
    }


def gguf_hf_config(path: str | os.PathLike) -> dict:
    """The Hugging Face ``config.json`` dict that describes a GGUF file's model.

    Reads only the metadata and the tensor table, not the weights. This is
    what :func:`load_gguf` hands to :func:`specjax.io.hf_config.config_from_hf`.

    Raises:
        ValueError: an unsupported architecture, or a key that cannot be
            mapped (named, with the file).
    """
    path = Path(path)
    reader = open_reader(path)
    return translate_config(
        read_metadata(reader), tensor_shapes(reader), rope_divisors(reader), path
    )


def rope_divisors(reader) -> np.ndarray | None:
    """The ``rope_freqs`` tensor (Llama 3's per-frequency RoPE divisors), if the file has one."""
    for t in reader.tensors:
        if t.name == ROPE_FREQS:
            return import_gguf().quants.dequantize(t.data, t.tensor_type)
    return None


def tensor_shapes(reader) -> dict[str, tuple[int, ...]]:
    # ggml lists dimensions fastest-moving first; numpy and torch the other way round.
    return {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}


def translate_config(meta: dict, shapes: dict[str, tuple[int, ...]], divisors, path: Path) -> dict:
    """``gguf_hf_config`` of read metadata, tensor shapes and ``rope_freqs`` divisors."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: general.architecture={arch!r} is not supported; expected one of "
            f"{SUPPORTED_ARCHITECTURES}"
        )

    def key(name, default=KeyError):
        full = f"{arch}.{name}"
        if full in meta:
            return meta[full]
        if default is KeyError:
            raise ValueError(f"{path} has no {full}")
        return default

    def uniform(name, value):
        # Some files list a value per layer; the decoder has one for all layers.
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise ValueError(
                    f"{path}: {arch}.{name}={value} differs between layers, which is not supported"
                )
            return value[0]
        return value

    for name, (neutral, why) in _REFUSED_KEYS.items():
        if f"{arch}.{name}" in meta and meta[f"{arch}.{name}"] != neutral:
            raise ValueError(
                f"{path}: {arch}.{name}={meta[f'{arch}.{name}']!r} is not supported: {why}"
            )

    hidden = int(key("embedding_length"))
    num_layers = int(key("block_count"))
    num_heads = int(uniform("attention.head_count", key("attention.head_count")))
    num_kv_heads = int(
        uniform("attention.head_count_kv", key("attention.head_count_kv", num_heads))
    )
    head_dim = int(key("attention.key_length", hidden // num_heads))
    value_dim = int(key("attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ValueError(
            f"{path}: {arch}.attention.value_length={value_dim} differs from "
            f"{arch}.attention.key_length={head_dim}, which is not supported"
        )
    rotary = key("rope.dimension_count", None)
    if rotary is not None and int(rotary) != head_dim:
        raise ValueError(
            f"{path}: {arch}.rope.dimension_count={rotary} rotates part of a head of {head_dim}; "
            "only full-width RoPE is implemented"
        )

    embed = shapes.get("token_embd.weight")
    if embed is None or len(embed) != 2:
        raise ValueError(f"{path} has no 2-D token_embd.weight tensor")
    vocab_size = embed[0]
    stated = key("vocab_size", None)
    if stated is not None and int(stated) != vocab_size:
        raise ValueError(
            f"{path}: {arch}.vocab_size={stated} but token_embd.weight has {vocab_size} rows"
        )

    model_type = arch
    if arch == "llama" and _names_mistral(meta):
        model_type = "mistral"
    config = {
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(key("context_length")),
        # llama.cpp writes the output projection only when it is not the embedding.
        "tie_word_embeddings": "output.weight" not in shapes,
        **_special_ids(meta),
    }
    config["rope_theta"] = float(key("rope.freq_base", 10000.0))
    config["rope_scaling"] = _rope_scaling(meta, arch, path)
    if divisors is not None:
        if config["rope_scaling"] is not None:
            raise ValueError(f"{path} has both {arch}.rope.scaling.type and a {ROPE_FREQS} tensor")
        config["rope_scaling"] = _llama3_scaling(divisors, config, path)

    if arch in GEMMA_ARCHITECTURES:
        config.update(_gemma_fields(meta, arch, config, key, path))
    else:
        config["attention_bias"] = "blk.0.attn_q.bias" in shapes
        # No sliding window: llama.cpp runs these architectures with full
        # attention (Mistral's window, if any, is not carried into GGUF).
        if model_type == "llama":
            config["mlp_bias"] = "blk.0.ffn_up.bias" in shapes
        elif model_type == "mistral":
            config["sliding_window"] = None
        else:
            config["use_sliding_window"] = False
    return config


def _names_mistral(meta: dict) -> bool:
    # Mistral models convert to the llama architecture; only the name tells.
    names = (meta.get(k) for k in ("general.name", "general.basename"))
    return any(isinstance(n, str) and "mistral" in n.lower() for n in names)


def _special_ids(meta: dict) -> dict:
    ids = {}
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if bos is not None:
        ids["bos_token_id"] = int(bos)
    # End of generation: EOS, and the end-of-turn / end-of-message ids of chat models.
    eos = [
        int(meta[k])
        for k in (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        )
        if meta.get(k) is not None
    ]
    eos = list(dict.fromkeys(eos))
    if eos:
        ids["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    pad = meta.get("tokenizer.ggml.padding_token_id")
    if pad is not None:
        ids["pad_token_id"] = int(pad)
    return ids


def _rope_scaling(meta: dict, arch: str, path: Path) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind == "none" and f"{arch}.rope.scale_linear" in meta:  # the older key
        kind, factor = "linear", meta[f"{arch}.rope.scale_linear"]
    if kind == "none" or (kind == "linear" and factor == 1.0):
        return None
    if kind != "linear":
        raise ValueError(
            f"{path}: {arch}.rope.scaling.type={kind!r} is not supported; only 'none' and "
            "'linear' RoPE scaling (and Llama 3's rope_freqs tensor) are implemented"
        )
    if factor is None:
        raise ValueError(
            f"{path}: {arch}.rope.scaling.type='linear' without {arch}.rope.scaling.factor"
        )
    return {"rope_type": "linear", "factor": float(factor)}


def _gemma_fields(meta: dict, arch: str, config: dict, key, path: Path) -> dict:
    num_layers = config["num_hidden_layers"]
    fields = {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False}
    # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B models
    # (recognized by their depth), which use 1/sqrt(hidden / heads), as their
    # Hugging Face configs do through query_pre_attn_scalar.
    big = num_layers == {"gemma2": 46, "gemma3": 62}[arch]
    scalar = config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"]
    scale = key("attention.scale", None)
    if scale is not None:
        scalar = 1.0 / float(scale) ** 2
    fields["query_pre_attn_scalar"] = scalar

    window = key("attention.sliding_window", None)
    pattern = key("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(
                f"{path}: {arch}.attention.sliding_window_pattern has {len(pattern)} entries "
                f"for {num_layers} layers"
            )
        sliding = [bool(p) for p in pattern]
    else:
        # llama.cpp's set_swa_pattern(n): every n-th layer is global.
        n = int(pattern)
        sliding = [n == 0 or i % n < n - 1 for i in range(num_layers)]
    if window is None:
        if arch == "gemma2":
            raise ValueError(f"{path} has no gemma2.attention.sliding_window")
        # Gemma 3 files without a window are all-global (llama.cpp's reading).
        sliding = [False] * num_layers
    fields["sliding_window"] = None if window is None else int(window)
    fields["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]

    if arch == "gemma2":
        # llama.cpp's defaults when the file does not say.
        fields["attn_logit_softcapping"] = float(key("attn_logit_softcapping", 50.0))
        fields["final_logit_softcapping"] = float(key("final_logit_softcapping", 30.0))
        if config["rope_scaling"] is not None:
            raise ValueError(f"{path}: RoPE scaling is not a Gemma 2 feature")
    else:
        final = key("final_logit_softcapping", None)
        attn = key("attn_logit_softcapping", None)
        fields["final_logit_softcapping"] = float(final) if final else None
        fields["attn_logit_softcapping"] = float(attn) if attn else None
        # Sliding layers rotate with their own base (llama.cpp's default 10k).
        fields["rope_local_base_freq"] = float(key("rope.freq_base_swa", 10000.0))
    return fields


def _llama3_scaling(divisors: np.ndarray, config: dict, path: Path) -> dict:
    """The ``llama3`` rope_scaling whose per-frequency divisors are ``divisors``.

    llama.cpp writes Llama 3's scaling as the divisor of each rotary frequency:
    1 for short wavelengths, ``factor`` for long ones, and a smooth blend in
    between that depends on ``original_max_position_embeddings`` and the low /
    high frequency factors. Those are solved for (with Llama 3's
    ``low_freq_factor=1``) and checked by recomputing every divisor.
    """
    d = config["head_dim"]
    inv_freq = 1.0 / config["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d)
    divisors = np.asarray(divisors, np.float64).reshape(-1)
    if divisors.shape != inv_freq.shape:
        raise ValueError(f"{path}: {ROPE_FREQS} has {divisors.size} entries, expected {d // 2}")
    factor = float(divisors.max())
    if np.allclose(divisors, 1.0):
        return None
    wavelen = 2 * math.pi / inv_freq
    blend = (divisors > 1 + 1e-6) & (divisors < factor - 1e-6 * factor)
    low = 1.0
    refused = ValueError(
        f"{path}: the {ROPE_FREQS} tensor is not a Llama 3 RoPE scaling with low_freq_factor=1; "
        "this scaling is not supported"
    )
    if blend.sum() < 2:
        raise refused
    # In the blend, 1/divisor = (1 - s)/factor + s with s linear in 1/wavelength:
    # s = orig / wavelen / (high - low) - low / (high - low).
    s = (1.0 / divisors[blend] - 1.0 / factor) / (1.0 - 1.0 / factor)
    slope, intercept = np.polyfit(1.0 / wavelen[blend], s, 1)
    high = low - low / intercept if intercept != 0 else math.inf
    orig = slope * (high - low)
    if not (np.isfinite(high) and high > low and orig > 0):
        raise refused
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": float(round(high, 6)),
        "original_max_position_embeddings": int(round(orig)),
    }
    # Check: these parameters must give back every divisor.
    orig, high = scaling["original_max_position_embeddings"], scaling["high_freq_factor"]
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    expected = 1.0 / ((1 - smooth) / factor + smooth)
    if not np.allclose(expected, divisors, rtol=1e-5, atol=0):
        raise refused
    return scaling
