"""Hugging Face checkpoint import and export (safetensors only, never pickle).

:func:`load_pretrained` reads a Hugging Face style folder (``config.json`` plus
``model.safetensors`` or sharded ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, and ``tokenizer.json`` when present) into a
:class:`~specjax.models.llama.Model`; :func:`save_pretrained` writes one that
``transformers.AutoModelForCausalLM.from_pretrained`` loads unchanged.

Parameter names and layouts mirror Hugging Face's, so the mapping is
mechanical and never transposes: NNX path ``layers/3/self_attn/q_proj/weight``
(``[out, in]``, as ``nn.Linear``) is tensor ``model.layers.3.self_attn.q_proj.weight``;
the embedding table ``embed_tokens/embedding`` (``[V, E]``, tied or not) is
``model.embed_tokens.weight``; ``lm_head`` has no ``model.`` prefix.

Anything the Llama-family decoder here would not compute exactly like
``transformers`` (a MoE, another activation, another RoPE scaling, a sliding
window on only some layers, a missing, extra or mis-shaped tensor) is a
``ValueError`` naming the field or tensor; nothing is skipped silently.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import atomic
from specjax.models.config import GEMMA_MODEL_TYPES, SUPPORTED_MODEL_TYPES, ModelConfig
from specjax.models.llama import Model, Transformer
from specjax.validation import check_int

__all__ = [
    "check_save_target",
    "config_from_hf",
    "config_to_hf",
    "load_pretrained",
    "model_from_tensors",
    "read_chat_template",
    "save_pretrained",
]

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}

# config.json model_type -> ModelConfig.model_type, where they differ.
_MODEL_TYPES_FROM_HF = {"gemma3_text": "gemma3"}
_MODEL_TYPES_TO_HF = {v: k for k, v in _MODEL_TYPES_FROM_HF.items()}

# What transformers 5 assumes for a field that config.json leaves out (the
# class defaults of LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config).
# ``None`` for num_key_value_heads / head_dim means "derive it".
_HF_DEFAULTS = {
    "llama": dict(
        num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2,
    ),
    "mistral": dict(
        num_key_value_heads=8, head_dim=None, max_position_embeddings=4096 * 32,
        bos_token_id=1, eos_token_id=2, sliding_window=4096,
    ),
    "qwen2": dict(
        num_key_value_heads=32, head_dim=None, max_position_embeddings=32768,
        bos_token_id=None, eos_token_id=None,
    ),
    "qwen3": dict(
        num_key_value_heads=32, head_dim=128, max_position_embeddings=32768,
        bos_token_id=None, eos_token_id=None,
    ),
    "gemma2": dict(
        num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
        bos_token_id=2, eos_token_id=1, tie_word_embeddings=True, sliding_window=4096,
        query_pre_attn_scalar=256, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
    ),
    "gemma3": dict(
        num_key_value_heads=4, head_dim=256, max_position_embeddings=131072,
        bos_token_id=2, eos_token_id=1, tie_word_embeddings=True, sliding_window=4096,
        query_pre_attn_scalar=256, final_logit_softcapping=None, attn_logit_softcapping=None,
    ),
}  # fmt: skip

_REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)

# Non-zero values of these mean a mixture of experts.
_MOE_FIELDS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

# Buffers some old checkpoints saved although they are derived from the config.
_DERIVED_TENSOR = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")

_SAFETENSORS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

# safetensors dtype codes of the floating types a weight may be stored in; an
# integer or bool tensor where a weight is expected is refused, never cast.
_FLOAT_STORAGE = frozenset({"F16", "BF16", "F32", "F64"})

# What save_pretrained writes. A folder holding only these (and a config.json of
# the same model_type) is a checkpoint of the same family, which a save may
# replace whole; anything else in it would be lost, so needs overwrite=True.
_CHECKPOINT_FILES = frozenset(
    {"config.json", _SAFETENSORS, _INDEX, "tokenizer.json", "chat_template.jinja"}
)

_DTYPE_NAMES = {
    np.dtype(jnp.float32): "float32",
    np.dtype(jnp.bfloat16): "bfloat16",
    np.dtype(jnp.float16): "float16",
}


def _unsupported(field, value, why: str) -> ValueError:
    return ValueError(f"config.json field {field}={value!r} is not supported: {why}")


def _rope(rope: dict, hf: dict, get, where: str) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling)`` of one RoPE parameter dict of config.json."""
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "linear":
        if "factor" not in rope:
            raise ValueError(f"config.json {where[:-1]} (linear) has no factor")
        return theta, {"rope_type": "linear", "factor": float(rope["factor"])}
    if rope_type == "llama3":
        scaling = {"rope_type": "llama3"}
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            if key not in rope:
                raise ValueError(f"config.json {where[:-1]} (llama3) has no {key}")
            scaling[key] = float(rope[key])
        # transformers lets a top-level value win here (Phi-3 convention).
        scaling["original_max_position_embeddings"] = int(
            hf.get("original_max_position_embeddings")
            or rope.get("original_max_position_embeddings")
            or get("max_position_embeddings")
        )
        return theta, scaling
    raise _unsupported(
        f"{where}rope_type", rope_type, "only 'default', 'linear' and 'llama3' RoPE are implemented"
    )


def config_from_hf(hf: dict) -> ModelConfig:
    """Maps a Hugging Face ``config.json`` dict onto :class:`ModelConfig`.

    Reads both the transformers 5 layout (``rope_parameters`` holding
    ``rope_theta`` and the scaling) and the older one (top-level ``rope_theta``
    plus ``rope_scaling``), with transformers' precedence: ``rope_scaling``
    replaces ``rope_parameters``, and a ``rope_theta`` inside the dict wins.
    A field left out of ``config.json`` takes the default of the transformers
    class of that ``model_type``.

    Raises:
        ValueError: naming the field, for an unknown ``model_type`` or any
            setting the decoder would not compute exactly as transformers does.
    """
    if not isinstance(hf, dict):
        raise ValueError(
            f"config.json must hold a JSON object (field: value), got a {type(hf).__name__}"
        )
    model_type = hf.get("model_type")
    if model_type == "gemma3" and "text_config" in hf:
        raise _unsupported(
            "model_type",
            model_type,
            "this is the multimodal Gemma3ForConditionalGeneration; only the text model "
            "(model_type gemma3_text, Gemma3ForCausalLM) is implemented",
        )
    model_type = _MODEL_TYPES_FROM_HF.get(model_type, model_type)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config.json model_type={model_type!r} is not supported; "
            f"expected one of {SUPPORTED_MODEL_TYPES}"
        )
    defaults = _HF_DEFAULTS[model_type]
    get = lambda key, default=None: hf[key] if key in hf else defaults.get(key, default)
    for field in _REQUIRED_FIELDS:
        if hf.get(field) is None:
            raise ValueError(f"config.json has no {field}")
    # Sizes first, under their config.json names: ModelConfig would name its own
    # fields (num_heads), and a zero would otherwise surface as a shape error.
    for field in (*_REQUIRED_FIELDS, "num_key_value_heads", "head_dim", "max_position_embeddings"):
        if hf.get(field) is not None:
            check_int(f"config.json {field}", hf[field], lo=1)

    rope_all = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(rope_all, dict):
        raise _unsupported("rope_parameters", rope_all, "expected an object")
    gemma = model_type in GEMMA_MODEL_TYPES
    if gemma:
        # Gemma's own field; older config.json files also carry hidden_act.
        act_field = "hidden_activation" if hf.get("hidden_activation") else "hidden_act"
        act = hf.get(act_field) or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise _unsupported(act_field, act, "only tanh-approximated GELU (GeGLU) is implemented")
        act = "gelu_pytorch_tanh"
        if hf.get("use_bidirectional_attention"):
            raise _unsupported(
                "use_bidirectional_attention", True, "only causal (decoder) Gemma is implemented"
            )
    else:
        act = hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise _unsupported("hidden_act", act, "only silu (SwiGLU) MLPs are implemented")
        act = "silu"
    for field in _MOE_FIELDS:
        if hf.get(field):
            raise _unsupported(field, hf[field], "mixture-of-experts models are not implemented")

    for where, value in (("", hf.get("partial_rotary_factor")), ("rope_parameters.", rope_all)):
        factor = value.get("partial_rotary_factor") if isinstance(value, dict) else value
        if factor is not None and factor != 1.0:
            raise _unsupported(
                f"{where}partial_rotary_factor", factor, "only full-width RoPE is implemented"
            )
    local_rope_theta = None
    if model_type == "gemma3":
        # One RoPE per layer type: `rope_parameters` keyed by it (transformers 5),
        # or the older rope_theta / rope_local_base_freq / rope_scaling fields.
        nested = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
        if nested and not all(isinstance(v, dict) for v in nested.values()):
            nested = {"full_attention": nested}
        full = dict(nested.get("full_attention") or {"rope_type": "default"})
        full.update(hf.get("rope_scaling") or {})
        full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        local = dict(nested.get("sliding_attention") or {"rope_type": "default"})
        local.setdefault("rope_theta", hf.get("rope_local_base_freq", 10_000.0))
        local_theta, local_scaling = _rope(local, hf, get, "rope_parameters.sliding_attention.")
        if local_scaling is not None:
            raise _unsupported(
                "rope_parameters.sliding_attention", local, "only default RoPE on sliding layers"
            )
        local_rope_theta = local_theta
        rope_theta, rope_scaling = _rope(full, hf, get, "rope_parameters.full_attention.")
    else:
        if any(isinstance(v, dict) for v in rope_all.values()):
            raise _unsupported(
                "rope_parameters", rope_all, f"per-layer-type RoPE is not a {model_type} feature"
            )
        rope_theta, rope_scaling = _rope(rope_all, hf, get, "rope_parameters.")

    sliding_window = layer_types = None
    if gemma:
        sliding_window = get("sliding_window")
        layer_types = hf.get("layer_types") or [
            # transformers' defaults: Gemma 2 alternates, Gemma 3 slides 5 layers in 6.
            "sliding_attention"
            if (i + 1) % (2 if model_type == "gemma2" else int(hf.get("sliding_window_pattern", 6)))
            else "full_attention"
            for i in range(int(hf["num_hidden_layers"]))
        ]
        if sliding_window is None:
            # transformers then gives every layer full attention.
            layer_types = ["full_attention"] * len(layer_types)
        layer_types = tuple(layer_types)
    elif model_type == "mistral":
        # MistralModel masks every layer with `sliding_window` when it is set.
        sliding_window = get("sliding_window")
        hf_layer_types = hf.get("layer_types")
        if hf_layer_types and len(set(hf_layer_types)) > 1:
            raise _unsupported(
                "layer_types", hf_layer_types, "alternating sliding/full layers are not implemented"
            )
    elif model_type in ("qwen2", "qwen3"):
        if hf.get("use_sliding_window"):
            raise _unsupported(
                "use_sliding_window", True, "Qwen's per-layer sliding window is not implemented"
            )
        hf_layer_types = hf.get("layer_types") or []
        if any(t != "full_attention" for t in hf_layer_types):
            raise _unsupported(
                "layer_types", hf_layer_types, "only full_attention layers are implemented"
            )

    # Which projections carry a bias, exactly as each transformers class builds them.
    if model_type == "llama":
        attention_bias = o_proj_bias = bool(hf.get("attention_bias", False))
        mlp_bias = bool(hf.get("mlp_bias", False))
    elif model_type == "qwen3":
        attention_bias = o_proj_bias = bool(hf.get("attention_bias", False))
        mlp_bias = False
    elif model_type == "qwen2":
        attention_bias, o_proj_bias, mlp_bias = True, False, False
    elif gemma:
        attention_bias = o_proj_bias = bool(hf.get("attention_bias", False))
        mlp_bias = False
    else:  # mistral: no biases whatever config.json says
        attention_bias = o_proj_bias = mlp_bias = False

    num_heads = int(hf["num_attention_heads"])
    num_kv_heads = get("num_key_value_heads") or num_heads
    head_dim = get("head_dim") or int(hf["hidden_size"]) // num_heads

    eos = get("eos_token_id")
    eos_ids = tuple(int(i) for i in eos) if isinstance(eos, (list, tuple)) else ()
    eos_id = eos_ids[0] if eos_ids else eos

    return ModelConfig(
        model_type=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        o_proj_bias=o_proj_bias,
        mlp_bias=mlp_bias,
        qk_norm=model_type in ("qwen3", "gemma3"),
        sliding_window=None if sliding_window is None else int(sliding_window),
        layer_types=layer_types,
        local_rope_theta=local_rope_theta,
        hidden_act=act,
        query_pre_attn_scalar=get("query_pre_attn_scalar"),
        attn_logit_softcapping=get("attn_logit_softcapping"),
        final_logit_softcapping=get("final_logit_softcapping"),
        max_position_embeddings=int(get("max_position_embeddings")),
        bos_token_id=get("bos_token_id"),
        eos_token_id=None if eos_id is None else int(eos_id),
        eos_token_ids=eos_ids,
    )


def _check_expressible(c: ModelConfig) -> None:
    """Raises unless transformers' class for ``c.model_type`` has exactly this architecture."""
    mt = c.model_type
    wanted = {
        "llama": dict(o_proj_bias=c.attention_bias, qk_norm=False, sliding_window=None),
        "mistral": dict(
            attention_bias=False, o_proj_bias=False, mlp_bias=False, qk_norm=False
        ),
        "qwen2": dict(
            attention_bias=True, o_proj_bias=False, mlp_bias=False, qk_norm=False,
            sliding_window=None,
        ),
        "qwen3": dict(
            o_proj_bias=c.attention_bias, mlp_bias=False, qk_norm=True, sliding_window=None
        ),
        "gemma2": dict(
            o_proj_bias=c.attention_bias, mlp_bias=False, qk_norm=False, local_rope_theta=None,
        ),
        "gemma3": dict(o_proj_bias=c.attention_bias, mlp_bias=False, qk_norm=True),
    }[mt]  # fmt: skip
    wanted["hidden_act"] = "gelu_pytorch_tanh" if c.is_gemma else "silu"
    if not c.is_gemma:
        # Gemma's switches; the other families' transformers classes have none of them.
        wanted.update(
            local_rope_theta=None,
            query_pre_attn_scalar=float(c.head_dim),
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
        )
        if set(c.layer_windows) != {c.sliding_window}:
            raise ValueError(
                f"ModelConfig.layer_types={c.layer_types!r} (not every layer with "
                f"sliding_window={c.sliding_window}) cannot be expressed as a Hugging Face "
                f"{mt} checkpoint"
            )

    for field, value in wanted.items():
        if getattr(c, field) != value:
            raise ValueError(
                f"ModelConfig.{field}={getattr(c, field)!r} cannot be expressed as a "
                f"Hugging Face {mt} checkpoint (which needs {field}={value!r})"
            )


def config_to_hf(config: ModelConfig, dtype=jnp.float32) -> dict:
    """The ``config.json`` dict transformers needs to rebuild ``config`` exactly.

    Writes the transformers 5 ``rope_parameters`` and, for older readers, the
    same values as ``rope_theta`` / ``rope_scaling`` (both agree, so either
    reading gives the same model).
    """
    c = config
    _check_expressible(c)
    dtype_name = _DTYPE_NAMES.get(np.dtype(dtype))
    if dtype_name is None:
        raise ValueError(f"dtype {np.dtype(dtype)} has no Hugging Face name")
    rope_parameters = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        rope_parameters = {**c.rope_scaling_dict, "rope_theta": c.rope_theta}
        rope_parameters["rope_type"] = rope_parameters.pop("type", rope_parameters["rope_type"])
    eos = list(c.eos_token_ids) if len(c.eos_token_ids) > 1 else c.eos_token_id
    hf = {
        "architectures": [_ARCHITECTURES[c.model_type]],
        "model_type": _MODEL_TYPES_TO_HF.get(c.model_type, c.model_type),
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos,
        "use_cache": True,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,
    }
    if c.rope_scaling is not None and not c.is_gemma:
        hf["rope_scaling"] = {k: v for k, v in rope_parameters.items() if k != "rope_theta"}
    if c.is_gemma:
        del hf["hidden_act"]
        layer_types = c.layer_types or (
            ("sliding_attention" if c.sliding_window else "full_attention",) * c.num_layers
        )
        hf.update(
            hidden_activation=c.hidden_act,
            attention_bias=c.attention_bias,
            # transformers' strict config wants an int where it is one.
            query_pre_attn_scalar=_int_if_whole(c.query_pre_attn_scalar),
            sliding_window=c.sliding_window,
            layer_types=list(layer_types),
            attn_logit_softcapping=c.attn_logit_softcapping,
            final_logit_softcapping=c.final_logit_softcapping,
        )
        if c.model_type == "gemma3":
            # Keyed by layer type; the legacy top-level fields would be re-read
            # with Gemma 3's own defaults, so they are left out.
            local = {"rope_type": "default", "rope_theta": c.local_rope_theta}
            if c.local_rope_theta is None:
                local = dict(rope_parameters)
            hf["rope_parameters"] = {"full_attention": rope_parameters, "sliding_attention": local}
            del hf["rope_theta"]
    elif c.model_type == "llama":
        hf.update(attention_bias=c.attention_bias, mlp_bias=c.mlp_bias)
    elif c.model_type == "mistral":
        hf.update(sliding_window=c.sliding_window)
    else:
        hf.update(
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=c.num_layers,
            layer_types=["full_attention"] * c.num_layers,
        )
        if c.model_type == "qwen3":
            hf.update(attention_bias=c.attention_bias)
    return hf


def _int_if_whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _hf_name(path: tuple) -> str:
    """``('layers', 0, 'mlp', 'up_proj', 'weight')`` -> ``model.layers.0.mlp.up_proj.weight``."""
    *modules, leaf = (str(p) for p in path)
    leaf = "weight" if leaf == "embedding" else leaf
    name = ".".join([*modules, leaf])
    return name if modules[0] == "lm_head" else f"model.{name}"


def _abstract_model(config: ModelConfig, dtype):
    module = nnx.eval_shape(lambda: Transformer(config, dtype=dtype, rngs=nnx.Rngs(0)))
    return nnx.split(module)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _weight_files(folder: Path) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files to read and, when sharded, the index's weight map."""
    if (folder / _INDEX).is_file():
        index = _read_json(folder / _INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise ValueError(
                f"{folder / _INDEX} has no weight_map object (tensor name -> shard file), "
                f"got {type(weight_map).__name__}"
            )
        shards = sorted(set(weight_map.values()))
        # The index names files inside this folder; a path could point anywhere.
        bad = [f for f in shards if Path(f).name != f or not f.endswith(".safetensors")]
        if bad:
            raise ValueError(f"{folder / _INDEX} weight_map names {bad[0]!r}, not a shard file")
        return shards, weight_map
    if (folder / _SAFETENSORS).is_file():
        return [_SAFETENSORS], None
    pickles = sorted(p.name for p in folder.iterdir() if p.name.endswith(_PICKLE_SUFFIXES))
    if pickles:
        raise ValueError(
            f"{folder} holds only PyTorch pickle weights ({', '.join(pickles)}). specjax "
            "never unpickles (loading a pickle can run arbitrary code); it reads "
            f"{_SAFETENSORS} or a sharded {_INDEX}. Convert once in a trusted "
            "environment, e.g. transformers.AutoModelForCausalLM.from_pretrained(path)"
            ".save_pretrained(out, safe_serialization=True)."
        )
    raise FileNotFoundError(f"{folder} has neither {_SAFETENSORS} nor {_INDEX}")


def load_pretrained(
    path: str | os.PathLike, dtype=jnp.float32, *, scan_layers: bool = False
) -> Model:
    """Loads a Hugging Face checkpoint folder or a llama.cpp GGUF file.

    Families: Llama, Mistral, Qwen2, Qwen3, Gemma 2 and Gemma 3 (text).

    Args:
        path: folder with ``config.json`` and ``model.safetensors`` (or shards
            listed in ``model.safetensors.index.json``); ``tokenizer.json``, if
            present, is loaded into ``Model.tokenizer`` and the chat template
            (``chat_template.jinja`` or ``tokenizer_config.json``) into
            ``Model.chat_template``. Or a ``.gguf`` file, or a folder holding
            exactly one and no ``config.json``: it is dequantized with the
            optional ``gguf`` package (``pip install "specjax[gguf]"``), and its
            tokenizer, chat template and end-of-turn ids come from the file
            (see :func:`specjax.models.gguf.load_gguf`). Pickle formats
            (``.bin``, ``.pt``, ``.pth``) are refused, never opened.
        dtype: parameter dtype (the checkpoint's tensors are cast to it);
            float32 by default, bfloat16 supported; must be a floating dtype.
            Logits are float32 either way.
        scan_layers: run the layers as one ``lax.scan`` over stacked parameters
            (``ModelConfig.scan_layers``): compile time no longer grows with
            depth. See README, "Layer scan", for its cost per step.

    Returns:
        The :class:`Model`. ``config.eos_token_id`` is the first end-of-sequence
        id and ``config.eos_token_ids`` all of them when config.json lists several.

    Raises:
        FileNotFoundError: no ``config.json`` or no weights.
        TypeError: ``dtype`` is not a floating dtype.
        ValueError: a ``config.json`` or index that is not the expected JSON object,
            an unsupported ``model_type`` or config field (a non-positive size
            included), a pickle-only folder, or a missing, unexpected, mis-shaped
            or non-floating tensor (named, with both shapes or its dtype).
    """
    from safetensors import safe_open

    _check_float_dtype(dtype)
    folder = Path(path)
    gguf_file = _gguf_file(folder)
    if gguf_file is not None:
        from specjax.models.gguf import load_gguf

        return load_gguf(gguf_file, dtype=dtype).with_scan_layers(scan_layers)
    config_path = folder / "config.json"
    if not config_path.is_file():
        hint = ""
        displaced = atomic.find_displaced(folder)
        if not folder.exists() and displaced:
            hint = f"; a save into it was interrupted, the previous checkpoint is {displaced[-1]}"
        raise FileNotFoundError(
            f"{folder} has no config.json (expected a Hugging Face folder){hint}"
        )
    hf_config = _read_json(config_path)
    if not isinstance(hf_config, dict):
        raise ValueError(
            f"{config_path} must hold a JSON object (field: value), "
            f"got a {type(hf_config).__name__}"
        )
    config = dataclasses.replace(config_from_hf(hf_config), scan_layers=scan_layers)
    files, weight_map = _weight_files(folder)

    handles = {}
    located = {}  # tensor name -> file
    try:
        for file in files:
            try:
                handles[file] = safe_open(str(folder / file), framework="np")
            except Exception as e:  # the Rust error type is not a public class
                raise ValueError(f"{folder / file} is not a readable safetensors file: {e}") from e
            for name in handles[file].keys():
                located[name] = file
        if weight_map is not None:
            misplaced = [n for n, f in weight_map.items() if located.get(n) != f]
            if misplaced:
                raise ValueError(
                    f"{_INDEX} maps {misplaced[0]!r} to {weight_map[misplaced[0]]!r}, "
                    f"but that file does not hold it"
                )
        storage = {n: handles[f].get_slice(n).get_dtype() for n, f in located.items()}
        bad = [n for n, code in storage.items() if code not in _FLOAT_STORAGE]
        if bad:
            # Casting integers to float would load a model that computes garbage.
            raise ValueError(
                f"tensor {bad[0]} is stored as {storage[bad[0]]}, expected a floating "
                f"dtype ({', '.join(sorted(_FLOAT_STORAGE))})"
            )
        tensors = LazyTensors(
            {n: (lambda n=n: handles[located[n]].get_tensor(n)) for n in located},
            {n: tuple(handles[located[n]].get_slice(n).get_shape()) for n in located},
        )
        model = model_from_tensors(
            config,
            tensors,
            dtype=dtype,
            tokenizer=_read_tokenizer(folder),
            chat_template=read_chat_template(folder),
        )
    finally:
        handles.clear()
    return model


class LazyTensors(Mapping):
    """Hugging Face tensor name -> array, read (or dequantized) only when looked up.

    ``shapes`` (name -> shape) is known up front, so that :func:`model_from_tensors`
    checks every shape before any tensor is read. Safetensors folders and GGUF files
    both hand their tensors over this way.
    """

    def __init__(self, readers: dict[str, Callable[[], np.ndarray]], shapes: dict):
        self._readers = readers
        self.shapes = shapes

    def __getitem__(self, name: str) -> np.ndarray:
        return self._readers[name]()

    def __contains__(self, name) -> bool:
        return name in self._readers

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)


def _read_tokenizer(folder: Path):
    if not (folder / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"{folder / 'tokenizer.json'} cannot be read: {e}") from e


def read_chat_template(folder: str | os.PathLike) -> str | None:
    """The chat template of a Hugging Face folder, or ``None`` if it has none.

    transformers 5 writes it to ``chat_template.jinja``; older checkpoints keep
    it as ``chat_template`` in ``tokenizer_config.json`` (a string, or a list of
    ``{"name", "template"}`` of which the one named ``default`` is used).
    """
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    template = _read_json(config_path)
    template = template.get("chat_template") if isinstance(template, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{config_path} chat_template must be a string, got {template!r}")
    return template


def model_from_tensors(
    config: ModelConfig,
    tensors,
    *,
    dtype=jnp.float32,
    tokenizer=None,
    chat_template: str | None = None,
) -> Model:
    """Builds a :class:`Model` from tensors named and laid out as in Hugging Face.

    The one place where a checkpoint becomes parameters: safetensors folders and
    GGUF files (after undoing llama.cpp's conventions) both come through here,
    so both get the same checks.

    Args:
        config: the architecture.
        tensors: mapping of Hugging Face tensor name (``model.layers.0.mlp.up_proj.weight``)
            to a floating numpy array (``nn.Linear`` layout ``[out, in]``). It may
            carry ``shapes`` (name -> shape) so that shapes are checked before any
            tensor is read.
        dtype: parameter dtype the tensors are cast to.
        tokenizer: optional ``tokenizers.Tokenizer`` for ``Model.tokenizer``.
        chat_template: optional Jinja chat template for ``Model.chat_template``.

    Raises:
        ValueError: a missing, unexpected, mis-shaped or non-floating tensor,
            named, with both shapes or its dtype.
    """
    # Tensors are per layer; a scanned model is stacked once they are all read.
    unrolled = dataclasses.replace(config, scan_layers=False)
    graphdef, abstract = _abstract_model(unrolled, dtype)
    flat = list(nnx.to_flat_state(abstract))
    expected = {_hf_name(p): (p, v) for p, v in flat}
    shapes = getattr(tensors, "shapes", None)
    shape_of = (lambda n: shapes[n]) if shapes is not None else (lambda n: np.shape(tensors[n]))

    missing = [n for n in expected if n not in tensors]
    if missing:
        raise ValueError(f"checkpoint is missing tensor(s) {missing} for {config.model_type}")
    extra = [n for n in tensors if n not in expected and not _DERIVED_TENSOR.match(n)]
    embed = "model.embed_tokens.weight"
    if config.tie_word_embeddings and "lm_head.weight" in extra:
        # Some tied checkpoints store the head too; accept it only if it is the embedding.
        if not np.array_equal(tensors["lm_head.weight"], tensors[embed]):
            raise ValueError("tie_word_embeddings=true but lm_head.weight differs from " + embed)
        extra.remove("lm_head.weight")
    if extra:
        raise ValueError(
            f"checkpoint has unexpected tensor(s) {extra} that a {config.model_type} "
            f"with this config.json does not use"
        )
    for name, (_, var) in expected.items():
        want = tuple(var.get_value().shape)
        found = tuple(shape_of(name))
        if found != want:
            raise ValueError(f"tensor {name} has shape {found}, expected {want} from config.json")

    leaves = []
    for name, (p, var) in expected.items():
        array = tensors[name]
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise ValueError(f"tensor {name} is stored as {array.dtype}, expected a floating dtype")
        leaves.append((p, var.replace(jnp.asarray(array, dtype=dtype))))
    params = nnx.from_flat_state(leaves)
    model = Model(
        graphdef=graphdef,
        params=params,
        config=unrolled,
        tokenizer=tokenizer,
        chat_template=chat_template,
    )
    return model.with_scan_layers(config.scan_layers)


def _gguf_file(path: Path) -> Path | None:
    """``path`` itself if it is a ``.gguf`` file, the one ``.gguf`` of a folder
    without ``config.json``, else ``None``."""
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (expected a GGUF file)")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) > 1:
        raise ValueError(
            f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}); "
            "pass the path of the one to load"
        )
    return found[0] if found else None


def _check_float_dtype(dtype):
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype must be a floating dtype such as jnp.float32, got {dtype!r}"
        ) from None
    if not jnp.issubdtype(np_dtype, jnp.floating):
        raise TypeError(
            f"dtype must be a floating dtype such as jnp.float32 or jnp.bfloat16, got {np_dtype}"
        )
    return np_dtype


def _parse_size(size: int | str) -> int:
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 1:
            raise ValueError(f"max_shard_size={size} must be a positive number of bytes")
        return size
    if not isinstance(size, str):
        raise TypeError(f"max_shard_size must be an int or a string like '5GB', got {size!r}")
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", size.upper())
    if not match:
        raise ValueError(f"max_shard_size={size!r} is not like 5GB, 500MB or 100KiB")
    number, unit = float(match[1]), match[2]
    base = 1024 if "I" in unit else 1000
    return int(number * base ** "BKMGT".index(unit[0]))


def _folder_contents(folder: Path, keep: Iterable[str]) -> tuple[str | None, list[str]]:
    """The ``model_type`` of the checkpoint in ``folder`` (or ``None``) and its foreign entries.

    Foreign entries are those a save would delete: anything but the files
    :func:`save_pretrained` writes and the names in ``keep``.
    """
    names = sorted(p.name for p in folder.iterdir())
    keep = set(keep)
    foreign = [n for n in names if n not in _CHECKPOINT_FILES and not _SHARD.match(n)]
    foreign = [n for n in foreign if n not in keep]
    model_type = None
    config = folder / "config.json"
    if config.is_file():
        try:
            hf = json.loads(config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            hf = None
        if isinstance(hf, dict) and isinstance(hf.get("model_type"), str):
            model_type = hf["model_type"]
    return model_type, foreign


def check_save_target(
    path: str | os.PathLike, model_type: str, *, overwrite: bool = False, keep: Iterable[str] = ()
) -> None:
    """Refuses a ``path`` that :func:`save_pretrained` must not replace.

    ``path`` may be missing, an empty folder, or a checkpoint of the same family
    (``config.json`` with this ``model_type``, and no files but the ones a save
    writes, plus the names in ``keep``). Anything else (a file, a checkpoint of
    another family, a folder with other files or without ``config.json``) would
    lose data when replaced whole, so it needs ``overwrite=True``; a file, the
    working directory or a file-system root are refused even then.

    Raises:
        ValueError: naming ``path`` and what it holds.
    """
    folder = Path(path).resolve()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"path {folder} is a file, not a folder; a checkpoint is a folder")
    if folder.parent == folder or Path.cwd().resolve().is_relative_to(folder):
        raise ValueError(
            f"path {folder} is a file-system root or holds the working directory; "
            "refusing to replace it"
        )
    if not folder.exists() or overwrite:
        return
    existing, foreign = _folder_contents(folder, keep)
    names = [p.name for p in folder.iterdir()]
    has_checkpoint_files = any(n in _CHECKPOINT_FILES or _SHARD.match(n) for n in names)
    if not foreign and (existing == model_type or not has_checkpoint_files):
        # A checkpoint of this family, or empty but for `keep` entries (a
        # training run that has not exported a model yet).
        return
    parts = []
    if existing is not None:
        other = "" if existing == model_type else f" (the model being saved is a {model_type})"
        parts.append(f"a {existing} checkpoint{other}")
    elif (folder / "config.json").exists():
        parts.append("a config.json without a model_type")
    elif has_checkpoint_files:
        parts.append("weight files without a config.json")
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        parts.append(f"other files ({shown})")
    raise ValueError(
        f"path {folder} holds {' and '.join(parts)}, which saving would delete (a save "
        "replaces the folder whole); pass overwrite=True to replace it, or choose another folder"
    )


def _host_tensors(model: Model) -> dict[str, np.ndarray]:
    model = model.with_scan_layers(False)  # Hugging Face names each layer's tensors
    tensors = {}
    for p, var in nnx.to_flat_state(model.params):
        tensors[_hf_name(p)] = np.asarray(jax.device_get(var.get_value()))
    return tensors


def _write_pretrained(model: Model, folder: Path, max_shard_size: int | str = "5GB") -> None:
    """Writes the checkpoint files into the existing, empty ``folder`` (not atomic)."""
    from safetensors.numpy import save_file

    hf_config = config_to_hf(model.config, model.dtype)
    limit = _parse_size(max_shard_size)
    tensors = _host_tensors(model)
    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, array in tensors.items():
        if shards[-1] and shard_bytes + array.nbytes > limit:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = array
        shard_bytes += array.nbytes

    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    if len(shards) == 1:
        save_file(shards[0], str(folder / _SAFETENSORS), metadata=metadata)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / file), metadata=metadata)
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(a.nbytes for a in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save(str(folder / "tokenizer.json"))
    if model.chat_template is not None:
        (folder / "chat_template.jinja").write_text(model.chat_template, encoding="utf-8")


def save_pretrained(
    model: Model,
    path: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    keep: Iterable[str] = (),
) -> None:
    """Writes ``model`` as a Hugging Face checkpoint folder, atomically.

    ``config.json`` (with ``architectures``, ``model_type`` and ``dtype`` /
    ``torch_dtype``), the weights as ``model.safetensors`` (or, above
    ``max_shard_size``, shards plus ``model.safetensors.index.json``), and
    ``tokenizer.json`` when ``model.tokenizer`` is set.
    ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads the result
    and computes the same logits.

    The folder is written under a temporary name next to ``path``, flushed to
    disk and renamed into place (see :func:`specjax.atomic.replace_folder`); an
    existing folder is replaced whole, so no stale file of an earlier save
    remains. A failure at any point (a full disk, a permission error) leaves
    the old folder loadable and unchanged.

    Args:
        model: the model to write.
        path: the checkpoint folder. It may be missing, empty, or a checkpoint of
            the same ``model_type`` holding only files a save writes; anything
            else is refused unless ``overwrite`` is set.
        max_shard_size: largest shard, as bytes or a string like ``"5GB"``.
        overwrite: replace ``path`` whole whatever it holds (a checkpoint of
            another family, other files).
        keep: names of entries of an existing ``path`` to carry over into the new
            folder instead of deleting them (e.g. a training run's ``checkpoints``).

    Raises:
        ValueError: if the config has no exact transformers counterpart (e.g. a
            Qwen2 without q/k/v bias), naming the field; or ``path`` is a file or
            holds something other than a checkpoint of this family (without
            ``overwrite``).
        OSError: writing failed; the old folder, if any, is intact.
    """
    # Everything that can be refused is refused before the disk is touched.
    config_to_hf(model.config, model.dtype)
    _parse_size(max_shard_size)
    keep = tuple(keep)
    folder = Path(path).resolve()
    check_save_target(folder, model.config.model_type, overwrite=overwrite, keep=keep)
    atomic.replace_folder(
        folder, lambda tmp: _write_pretrained(model, tmp, max_shard_size), keep=keep
    )
