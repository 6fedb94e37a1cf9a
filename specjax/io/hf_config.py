"""Hugging Face ``config.json`` <-> :class:`~specjax.models.config.ModelConfig`.

:func:`config_from_hf` reads the ``config.json`` dict of a Hugging Face folder
(:mod:`specjax.io.hf`) or the one :mod:`specjax.io.gguf` builds from a GGUF
file's metadata; :func:`config_to_hf` writes the dict that transformers needs to
rebuild a config exactly.

Anything the Llama-family decoder here would not compute exactly like
``transformers`` (a MoE, another activation, another RoPE scaling, a sliding
window on only some layers) is a ``ValueError`` naming the field; nothing is
skipped silently.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from specjax.core.validation import check_int
from specjax.models.config import GEMMA_MODEL_TYPES, SUPPORTED_MODEL_TYPES, ModelConfig

__all__ = ["config_from_hf", "config_to_hf"]

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
_DEFAULT_FIELDS = (
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "bos_token_id",
    "eos_token_id",
)


def _gemma_defaults(final_logit_softcapping, attn_logit_softcapping) -> dict:
    """Gemma's further defaults: a tied head, local layers and its query scale."""
    return dict(
        tie_word_embeddings=True,
        sliding_window=4096,
        query_pre_attn_scalar=256,
        final_logit_softcapping=final_logit_softcapping,
        attn_logit_softcapping=attn_logit_softcapping,
    )


_HF_DEFAULTS = {
    model_type: dict(zip(_DEFAULT_FIELDS, values, strict=True), **more)
    for model_type, values, more in (
        ("llama", (None, None, 2048, 1, 2), {}),
        ("mistral", (8, None, 4096 * 32, 1, 2), dict(sliding_window=4096)),
        ("qwen2", (32, None, 32768, None, None), {}),
        ("qwen3", (32, 128, 32768, None, None), {}),
        ("gemma2", (4, 256, 8192, 2, 1), _gemma_defaults(30.0, 50.0)),
        ("gemma3", (4, 256, 131072, 2, 1), _gemma_defaults(None, None)),
    )
}

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
        "mistral": dict(attention_bias=False, o_proj_bias=False, mlp_bias=False, qk_norm=False),
        "qwen2": dict(
            attention_bias=True,
            o_proj_bias=False,
            mlp_bias=False,
            qk_norm=False,
            sliding_window=None,
        ),
        "qwen3": dict(
            o_proj_bias=c.attention_bias, mlp_bias=False, qk_norm=True, sliding_window=None
        ),
        "gemma2": dict(
            o_proj_bias=c.attention_bias,
            mlp_bias=False,
            qk_norm=False,
            local_rope_theta=None,
        ),
        "gemma3": dict(o_proj_bias=c.attention_bias, mlp_bias=False, qk_norm=True),
    }[mt]
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
