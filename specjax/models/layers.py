"""The building blocks every network here is made of: norms, linear maps and the MLP.

The decoder (`specjax.models.llama`), its attention (`specjax.models.attention`) and
the drafters' own layers (`specjax.drafters.block`, `specjax.drafters.eagle`) are built
from these, so a parameter has one layout and one name everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.matmul import matmul


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32 and cast back, as Hugging Face does.

    With ``plus_one`` (Gemma) the scale is ``1 + weight`` and is applied in
    float32 before the cast (Llama casts first, then scales); the weight starts
    at zero, so a fresh norm is the identity scale either way.
    """

    def __init__(self, dim: int, eps: float, dtype, plus_one: bool = False):
        self.weight = nnx.Param((jnp.zeros if plus_one else jnp.ones)((dim,), dtype))
        self.eps = eps
        self.plus_one = plus_one

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        weight = self.weight[...].reshape((1,) * (x.ndim - 1) + (-1,))
        if self.plus_one:
            return (x32 * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
        return weight * x32.astype(x.dtype)


def config_norm(config: ModelConfig, dim: int, dtype) -> RMSNorm:
    """The norm ``config``'s family uses: ``(1 + w)`` for Gemma, ``w`` otherwise."""
    return RMSNorm(dim, config.rms_norm_eps, dtype, plus_one=config.is_gemma)


class Dense(nnx.Module):
    """``x · weightᵀ + bias`` with ``weight`` stored ``[out, in]``, as ``torch.nn.Linear``.

    Not ``nnx.Linear``'s ``[in, out]``: on XLA:CPU a T-token matmul (T > 1, as
    in a verify forward) that contracts the last axis of both operands costs less
    than ``x @ kernel``, and T = 1 no more; `specjax.models.matmul` then runs 2 to
    16 rows weight-first, near the one-row cost. It is also Hugging Face's layout,
    so checkpoints map without a transpose. It computes in the parameter dtype.

    The weight is drawn ``[in, out]`` and transposed, and the zero bias takes
    a key, as in ``nnx.Linear``, so a seed draws the same weights as an
    ``nnx.Linear`` of that seed.
    """

    def __init__(self, din: int, dout: int, bias: bool, dtype, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        self.weight = nnx.Param(init(rngs.params(), (din, dout), dtype).T)
        zeros = nnx.initializers.zeros
        self.bias = nnx.Param(zeros(rngs.params(), (dout,), dtype)) if bias else None

    def __call__(self, x):
        y = matmul(x, self.weight[...])
        if self.bias is None:
            return y
        return y + self.bias[...].reshape((1,) * (y.ndim - 1) + (-1,))


_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


class MLP(nnx.Module):
    """The gated MLP ``down(act(gate(x)) · up(x))``: SwiGLU, or GeGLU for Gemma."""

    def __init__(self, config: ModelConfig, dtype, rngs):
        e, f, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Dense(e, f, bias, dtype, rngs)
        self.up_proj = Dense(e, f, bias, dtype, rngs)
        self.down_proj = Dense(f, e, bias, dtype, rngs)
        self.act = _ACTIVATIONS[config.hidden_act]

    def __call__(self, x):
        # One product when a quantized model fused the two (see Attention.project_qkv).
        fused = getattr(self, "gate_up_proj", None)
        if fused is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = jnp.split(fused(x), 2, axis=-1)
        return self.down_proj(self.act(gate) * up)
