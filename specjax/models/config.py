"""Model configuration of the decoder families (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3)."""

from __future__ import annotations

import dataclasses

from specjax.core.validation import check_float, check_int

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3")

# The Gemma families share one block layout: (1 + w) RMSNorms computed in
# float32, a norm after attention and around the MLP, embeddings scaled by
# sqrt(E), and a tanh-GELU GLU.
GEMMA_MODEL_TYPES = ("gemma2", "gemma3")

HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")

# Sizes that must be positive integers; a zero would otherwise surface as a
# misleading shape error (or a division by zero) far from its cause.
_POSITIVE_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "max_position_embeddings",
)

_ROPE_KEYS = {"linear": ("factor",)}
_LLAMA3_ROPE_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters of a Llama-family decoder.

    Frozen (hashable) so that it can be a static part of a jitted pytree. The
    four families differ only in a few switches, which default to what the
    family uses when left as ``None``: ``ModelConfig(model_type="qwen3", ...)``
    is a Qwen3 (q/k norm), ``model_type="qwen2"`` a Qwen2 (q/k/v bias).

    Attributes:
        model_type: one of ``SUPPORTED_MODEL_TYPES``.
        vocab_size: V, the number of output logits.
        hidden_size: model width E.
        intermediate_size: SwiGLU hidden width F.
        num_layers: number of decoder blocks L.
        num_heads: query heads H.
        num_kv_heads: key/value heads K (grouped-query attention; H % K == 0).
        head_dim: per-head width D (Qwen3 sets it explicitly; otherwise E // H).
        rms_norm_eps: epsilon of every RMSNorm.
        rope_theta: rotary base frequency.
        rope_scaling: ``None`` or a sorted tuple of ``(key, value)`` pairs of a
            ``rope_scaling`` dict (hashable form; a dict is accepted and
            converted): Llama-3 style (``rope_type="llama3"``, ``factor``,
            ``low_freq_factor``, ``high_freq_factor``,
            ``original_max_position_embeddings``) or linear position
            interpolation (``rope_type="linear"``, ``factor``). It applies to the
            full-attention layers, and to sliding layers unless
            ``local_rope_theta`` gives those their own RoPE.
        tie_word_embeddings: the LM head reuses the embedding matrix.
        attention_bias: q/k/v projections carry a bias. ``None``: True for
            Qwen2, else False.
        o_proj_bias: the attention output projection carries a bias. ``None``:
            same as ``attention_bias`` for Llama and Qwen3 (Hugging Face's
            ``attention_bias`` covers q/k/v/o there), False for Qwen2 and Mistral.
        mlp_bias: gate/up/down projections carry a bias (Llama's ``mlp_bias``).
        qk_norm: per-head RMSNorm on queries and keys. ``None``: True for Qwen3.
        sliding_window: ``None`` or W: a query at position p of a sliding layer
            attends only to positions in ``(p - W, p]``. The cache still keeps
            every position (slot == position); only the mask changes.
        layer_types: ``None`` or one of ``LAYER_TYPES`` per layer. ``None``: every
            layer slides when ``sliding_window`` is set (Mistral), else none
            does. Gemma interleaves them (Gemma 2: sliding on even layers;
            Gemma 3: five sliding layers to one full one).
        local_rope_theta: RoPE base of the sliding layers, which then take no
            ``rope_scaling`` (Gemma 3: 10k locally, ``rope_theta`` = 1M globally).
            ``None``: sliding layers use the global RoPE.
        hidden_act: the GLU's activation, ``"silu"`` (SwiGLU) or
            ``"gelu_pytorch_tanh"`` (GeGLU with tanh-approximated GELU).
            ``None``: GELU for Gemma, SiLU otherwise.
        query_pre_attn_scalar: attention scores are scaled by
            ``query_pre_attn_scalar ** -0.5``. ``None``: ``head_dim``, the usual
            ``1 / sqrt(D)``.
        attn_logit_softcapping: ``None`` or c: attention scores become
            ``c · tanh(scores / c)`` before the mask (Gemma 2).
        final_logit_softcapping: ``None`` or c: the same on the output logits.
        scan_layers: run the layers as one ``jax.lax.scan`` over parameters
            stacked ``[L, ...]`` (compile time independent of depth) instead of
            unrolling them. Not part of the checkpoint: ``load_pretrained(...,
            scan_layers=True)`` or ``Model.with_scan_layers()`` choose it.
        max_position_embeddings: context length the model was trained for.
        bos_token_id: optional beginning-of-sequence id.
        eos_token_id: optional end-of-sequence id; the first of
            ``eos_token_ids`` when a checkpoint lists several.
        eos_token_ids: every end-of-sequence id (Llama-3 chat models list
            several); defaults to ``(eos_token_id,)``. Stop on any of these.
    """

    model_type: str = "llama"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    o_proj_bias: bool | None = None
    mlp_bias: bool = False
    qk_norm: bool | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    local_rope_theta: float | None = None
    hidden_act: str | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    scan_layers: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; "
                f"expected one of {SUPPORTED_MODEL_TYPES}"
            )
        # Normalised to Python ints/floats as well as checked, so that numpy
        # scalars do not reach config.json (json cannot write them).
        for name in _POSITIVE_SIZES:
            set_(name, check_int(name, getattr(self, name), lo=1))
        for name in ("head_dim", "sliding_window"):
            if getattr(self, name) is not None:
                set_(name, check_int(name, getattr(self, name), lo=1))
        for name in ("bos_token_id", "eos_token_id"):
            if getattr(self, name) is not None:
                set_(name, check_int(name, getattr(self, name), lo=0))
        set_("rms_norm_eps", check_float("rms_norm_eps", self.rms_norm_eps, lo=0, lo_open=True))
        set_("rope_theta", check_float("rope_theta", self.rope_theta, lo=0, lo_open=True))
        for name in (
            "local_rope_theta",
            "query_pre_attn_scalar",
            "attn_logit_softcapping",
            "final_logit_softcapping",
        ):
            if getattr(self, name) is not None:
                set_(name, check_float(name, getattr(self, name), lo=0, lo_open=True))
        if self.hidden_act is None:
            set_("hidden_act", "gelu_pytorch_tanh" if self.is_gemma else "silu")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"hidden_act={self.hidden_act!r} is not one of {HIDDEN_ACTS}")
        if self.layer_types is not None:
            if isinstance(self.layer_types, str) or not hasattr(self.layer_types, "__iter__"):
                raise TypeError(
                    f"layer_types must be a sequence of strings, got {self.layer_types!r}"
                )
            set_("layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries, "
                    f"expected one per layer (num_layers={self.num_layers})"
                )
            unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if unknown:
                raise ValueError(f"layer_types holds {unknown}, expected entries of {LAYER_TYPES}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError(
                    "layer_types has sliding_attention layers but sliding_window is None"
                )
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by "
                    f"num_heads={self.num_heads}; set head_dim explicitly"
                )
            set_("head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.query_pre_attn_scalar is None:
            set_("query_pre_attn_scalar", float(self.head_dim))
        if self.attention_bias is None:
            set_("attention_bias", self.model_type == "qwen2")
        if self.o_proj_bias is None:
            set_("o_proj_bias", self.attention_bias and self.model_type in ("llama", "qwen3"))
        if self.qk_norm is None:
            set_("qk_norm", self.model_type in ("qwen3", "gemma3"))
        if isinstance(self.rope_scaling, dict):
            set_("rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            rope_type = scaling.get("rope_type", scaling.get("type"))
            if rope_type not in ("llama3", "linear"):
                raise ValueError(
                    f"rope_scaling rope_type={rope_type!r} is not supported; "
                    "only 'llama3' and 'linear' are"
                )
            keys = _LLAMA3_ROPE_KEYS if rope_type == "llama3" else _ROPE_KEYS[rope_type]
            missing = [k for k in keys if k not in scaling]
            if missing:
                raise ValueError(f"rope_scaling is missing {missing}")
        if isinstance(self.eos_token_ids, (str, bytes)) or not hasattr(
            self.eos_token_ids, "__iter__"
        ):
            raise TypeError(f"eos_token_ids must be a sequence of ints, got {self.eos_token_ids!r}")
        eos_ids = tuple(check_int("eos_token_ids", i, lo=0) for i in self.eos_token_ids)
        if not eos_ids and self.eos_token_id is not None:
            eos_ids = (int(self.eos_token_id),)
        if eos_ids and self.eos_token_id is None:
            set_("eos_token_id", eos_ids[0])
        if self.eos_token_id is not None and self.eos_token_id not in eos_ids:
            raise ValueError(f"eos_token_id={self.eos_token_id} is not in eos_token_ids={eos_ids}")
        set_("eos_token_ids", eos_ids)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def is_gemma(self) -> bool:
        """The Gemma block layout (see ``GEMMA_MODEL_TYPES``)."""
        return self.model_type in GEMMA_MODEL_TYPES

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """The sliding window of each layer, ``None`` for a full-attention layer."""
        if self.layer_types is None:
            return (self.sliding_window,) * self.num_layers
        return tuple(
            self.sliding_window if t == "sliding_attention" else None for t in self.layer_types
        )

    def num_params(self) -> int:
        """Number of parameters, counting a tied embedding once."""
        e, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        h, k = self.num_heads, self.num_kv_heads
        attn = e * d * (h * 2 + k * 2)
        if self.attention_bias:
            attn += d * (h + 2 * k)
        if self.o_proj_bias:
            attn += e
        if self.qk_norm:
            attn += 2 * d
        mlp = 3 * e * f + ((2 * f + e) if self.mlp_bias else 0)
        block = attn + mlp + (4 if self.is_gemma else 2) * e
        emb = self.vocab_size * e * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * block + emb + e
