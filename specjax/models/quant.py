"""int8 weights for decoding on a CPU: `quantize` a `Model`'s matrices, per output row.

At batch 1 a decode step reads every weight once, so its time is the weight bytes
over the memory bandwidth, and the weights' dtype sets the speed. XLA:CPU makes the
choice less simple than "fewer bytes, faster" (per-precision step costs: BENCHMARKS.md,
"What one forward width costs"): its one-row bf16 and int8 dots are much slower
than the f32 one, while from two rows an int8 × int8 → int32 dot runs faster than a
one-row f32 dot. Two modes, both with one float32 scale per output row of each matrix
(``w ≈ scale[o] · q[o, i]``, ``q`` int8, symmetric, ``scale = max|w[o]| / 127``):

* ``"int8"`` (weights and activations): each row of the input (each token) is
  quantized the same way, ``x ≈ s[t] · x_q[t]``, the product is an exact int8 × int8
  → int32 dot, and ``y[t, o] = s[t] · scale[o] · (x_q · q)[t, o]``. A one-row input
  is padded to two rows for the dot (the second is zeros and dropped): XLA:CPU's
  one-row int8 kernel is the slow one. No row depends on another, and the int32
  sum is exact whatever the kernel's blocking, so a row's logits do not depend on
  the batch. They do depend, slightly, on how many tokens one forward scores: the
  float32 parts (attention, norms) differ in their last bits between a one-token
  step and a (γ+1)-token verify, and rounding the next layer's input to int8 turns
  such a difference into a whole int8 step now and then, and greedy outputs of
  decoders that score different numbers of tokens per forward can part. At one
  forward width they are the same tokens (`specjax.decoding.numerics`); as a
  *drafter's* model it is exact at any width (the verifier needs only the q the
  drafts came from).
* ``"int8-weights"``: weights only; the int8 matrix is converted to float32 inside
  the jitted step and multiplied in float32.

Products of one input are fused (q, k and v; gate and up): one quantization of the
input and one kernel instead of three and two, the same values (each row keeps its
scale). The embedding lookup stays exact (an untied table is left in float32; a tied one is
quantized, as it is also the LM head, and looked up as ``scale[v] · q[v]``). Norms,
biases, attention and the logits' softmax stay in float32.

Exactness is relative to the model as loaded: a target of either mode with any
drafter, and any target with a drafter of either mode, give greedy speculative ==
greedy plain at the same forward width (tested).

Examples:
    >>> import specjax
    >>> from specjax.models.quant import quantize
    >>> model = quantize(specjax.testing.tiny_model(seed=0), "int8")
    >>> model.quantization
    'int8'
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.core.platform import by_platform
from specjax.models.attention import Attention
from specjax.models.layers import MLP, Dense
from specjax.models.llama import TiedEmbedding

MODES = ("int8", "int8-weights")

__all__ = [
    "MODES",
    "QuantizedDense",
    "QuantizedEmbedding",
    "quantize",
    "quantize_module",
    "quantize_rows",
]


@jax.jit
def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(q int8[..., N], scale float32[...])`` with ``x ≈ scale[..., None] · q``, per row.

    Symmetric absmax quantization of each row (last axis) to [-127, 127]; an all-zero
    row gets scale 1 (its q is zero).
    """
    x = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x), axis=-1)
    scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
    q = jnp.clip(jnp.round(x / scale[..., None]), -127, 127).astype(jnp.int8)
    return q, scale


# Up to this many rows a CPU takes the weight-first form of the int8 dot (`_int8_matmul`).
_WEIGHT_FIRST_MAX_ROWS = 4


def _int8_matmul(x_MI: jax.Array, q_OI: jax.Array, scale_O: jax.Array) -> jax.Array:
    """``x · dequant(q)ᵀ`` in float32 through an exact int8 × int8 → int32 dot.

    On a CPU, 1 to 4 rows are multiplied weight-first, ``q · x_qᵀ → [O, M]``, and
    transposed back after an optimization barrier (without it XLA folds the transpose
    into the dot and picks the row-first kernel again): XLA:CPU runs that form at about
    one row's cost up to four rows, and faster than the row-first ``x_q · qᵀ`` (whole
    int8 forwards of Qwen2.5-Coder-1.5B, ``scripts/benchmarks/results/int8_rows/``).
    From five rows, and on other backends, the dot is row-first. The int32 sums are
    exact in either form, so the values are the same.
    """
    rows = x_MI.shape[0]
    xq_MI, xs_M = quantize_rows(x_MI)
    dims = (((1,), (1,)), ((), ()))

    def row_first(xq_MI, q_OI):
        return jax.lax.dot_general(xq_MI, q_OI, dims, preferred_element_type=jnp.int32)

    def on_cpu(xq_MI, q_OI):
        if rows == 1:
            # XLA:CPU's one-row int8 dot is about 20x slower than its two-row one; the
            # zero row changes nothing in row 0 (rows are independent, sums exact).
            xq_MI = jnp.concatenate([xq_MI, jnp.zeros_like(xq_MI)], axis=0)
        if rows > _WEIGHT_FIRST_MAX_ROWS:
            return row_first(xq_MI, q_OI)[:rows]
        acc_OM = jax.lax.dot_general(q_OI, xq_MI, dims, preferred_element_type=jnp.int32)
        return jax.lax.optimization_barrier(acc_OM).T[:rows]

    # The form follows the platform the program is compiled for (`specjax.core.platform`).
    acc_MO = by_platform(xq_MI, q_OI, cpu=on_cpu, other=row_first)
    return acc_MO.astype(jnp.float32) * xs_M[:, None] * scale_O[None, :]


class QuantizedDense(nnx.Module):
    """`~specjax.models.layers.Dense` with an int8 ``weight [out, in]`` and a float32
    ``scale [out]`` (see the module docstring for the two modes).

    Built from one or several ``Dense`` of one input (`fused`): their rows are stacked
    into one matrix, so the input is quantized once and read by one kernel; each row
    keeps its own scale, so the outputs are the same values as separate products.
    """

    def __init__(self, weight_OI, bias_O: jax.Array | None, mode: str):
        # A (q, scale) pair is taken as already quantized (`fused` quantizes its parts).
        q, scale = weight_OI if isinstance(weight_OI, tuple) else quantize_rows(weight_OI)
        self.weight = nnx.Param(q)
        self.scale = nnx.Param(scale)
        self.bias = None if bias_O is None else nnx.Param(bias_O.astype(jnp.float32))
        self.quantization = mode  # static: read by Model.quantization

    @classmethod
    def fused(cls, denses: list[Dense], mode: str) -> QuantizedDense:
        """One product for ``denses`` (each ``Dense`` of the same input), outputs concatenated."""
        # Rows are quantized one by one, so each part is quantized before they are joined
        # (joining the float32 parts first would hold a second copy of them). Axis -2 is
        # ``out`` both for one layer's [O, I] and for a scanned stack's [L, O, I].
        qs, scales = zip(*[quantize_rows(d.weight[...]) for d in denses], strict=True)
        weight = jnp.concatenate(qs, axis=-2), jnp.concatenate(scales, axis=-1)
        if all(d.bias is None for d in denses):
            bias = None
        else:
            zeros = lambda d: jnp.zeros(d.weight[...].shape[:-1])  # noqa: E731
            bias = jnp.concatenate(
                [zeros(d) if d.bias is None else d.bias[...] for d in denses], axis=-1
            )
        return cls(weight, bias, mode)

    def __call__(self, x):
        q, scale = self.weight[...], self.scale[...]
        lead = x.shape[:-1]
        if self.quantization == "int8":
            y = _int8_matmul(x.reshape(-1, x.shape[-1]), q, scale).reshape(*lead, -1)
        else:
            y = jnp.einsum("...i,oi->...o", x.astype(jnp.float32), q.astype(jnp.float32))
            y = y * scale.reshape((1,) * (y.ndim - 1) + (-1,))
        if self.bias is not None:
            y = y + self.bias[...].reshape((1,) * (y.ndim - 1) + (-1,))
        return y


class QuantizedEmbedding(nnx.Module):
    """`~specjax.models.llama.TiedEmbedding` with an int8 table ``[V, E]`` and a float32
    ``scale [V]``: the lookup returns ``scale[v] · q[v]``, the head is quantized."""

    def __init__(self, embedding: TiedEmbedding, mode: str):
        q, scale = quantize_rows(embedding.embedding[...])
        self.embedding = nnx.Param(q)
        self.scale = nnx.Param(scale)
        self.quantization = mode

    def __call__(self, tokens_BT):
        """Embeddings ``float32[B, T, E]`` of ``tokens``."""
        rows = jnp.take(self.embedding[...], tokens_BT, axis=0).astype(jnp.float32)
        return rows * jnp.take(self.scale[...], tokens_BT, axis=0)[..., None]

    def attend(self, hidden_BTE):
        """Logits ``float32[B, T, V]`` of hidden states."""
        q, scale = self.embedding[...], self.scale[...]
        b, t, e = hidden_BTE.shape
        if self.quantization == "int8":
            return _int8_matmul(hidden_BTE.reshape(b * t, e), q, scale).reshape(b, t, -1)
        logits = jnp.einsum("bte,ve->btv", hidden_BTE.astype(jnp.float32), q.astype(jnp.float32))
        return logits * scale[None, None, :]


def quantize(model, mode: str = "int8"):
    """``model`` with every matrix of its layers and its LM head in int8.

    Args:
        model: a float `~specjax.models.Model` (float32 or bfloat16), not quantized.
        mode: ``"int8"`` (int8 weights and per-token int8 activations, int32 sums)
            or ``"int8-weights"`` (int8 weights, float32 products).

    Returns:
        The quantized `~specjax.models.Model` (``model.quantization == mode``); its
        norms, biases and KV cache are float32, and an untied input embedding (only
        looked up) keeps the checkpoint's dtype. It is a model like any other for the
        decoders, drafters and `specjax.check_model`; it is not saved as a Hugging
        Face checkpoint (save the float model and quantize after loading).

    Raises:
        ValueError: an unknown ``mode``, or a model that is already quantized.
        TypeError: ``model`` is not a specjax `~specjax.models.Model`.
    """
    from specjax.models.model import Model

    if not isinstance(model, Model):
        raise TypeError(f"model must be a specjax Model, got {type(model).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if model.quantization is not None:
        raise ValueError(
            f"model is already quantized ({model.quantization!r}); quantize the float one"
        )
    # An untied input embedding (`nnx.Embed`) is only looked up, never multiplied: it
    # keeps its checkpoint's dtype. Widened to float32 it would take twice the memory,
    # and `nnx.Embed` converts its whole table to its compute dtype before taking rows
    # (a bfloat16 model's 151,936-row table, at every step).
    tables = {
        path: sub.embedding[...]
        for path, sub in nnx.iter_graph(nnx.merge(model.graphdef, model.params))
        if isinstance(sub, nnx.Embed)
    }
    # A scanned model is quantized as it is, its stacked [L, O, I] matrices row by row:
    # unrolling it first would copy every weight (twice the model's memory at the peak).
    if model.dtype != jnp.float32:
        # Scales and the activations' arithmetic are float32: start from float32.
        model = model.replace(params=jax.tree.map(lambda p: p.astype(jnp.float32), model.params))
    module = nnx.merge(model.graphdef, model.params)
    for path, sub in nnx.iter_graph(module):
        if isinstance(sub, nnx.Embed) and path in tables:
            sub.embedding = nnx.Param(tables[path])
    quantize_module(module, mode)
    graphdef, params = nnx.split(module)
    return model.replace(graphdef=graphdef, params=params)


def quantize_module(module: nnx.Module, mode: str) -> None:
    """Swaps, in place, every float matrix product inside ``module`` for its int8 form.

    The step `quantize` applies to a whole model, for a loader that quantizes a model
    part by part as it reads it (`specjax.io.tensors.model_from_tensors`), so that the
    float weights of only one part are in memory at a time. Attention and MLP blocks
    get their fused products, every other ``Dense`` a `QuantizedDense`, a tied embedding
    a `QuantizedEmbedding`; parts already quantized are left as they are, and an untied
    ``nnx.Embed`` keeps its table (only looked up, it is not multiplied). ``module``
    itself is never replaced, only what it holds.

    Args:
        module: an NNX module whose floating parameters are float32.
        mode: a mode of `MODES`.
    """
    # Products of one input become one (q, k, v; gate, up): one quantization of the
    # input and one kernel each, instead of three and two.
    for _, sub in list(nnx.iter_graph(module)):
        if isinstance(sub, Attention) and hasattr(sub, "q_proj"):
            sub.qkv_proj = QuantizedDense.fused([sub.q_proj, sub.k_proj, sub.v_proj], mode)
            del sub.q_proj, sub.k_proj, sub.v_proj
        elif isinstance(sub, MLP) and hasattr(sub, "gate_proj"):
            sub.gate_up_proj = QuantizedDense.fused([sub.gate_proj, sub.up_proj], mode)
            del sub.gate_proj, sub.up_proj
    swaps = [
        (path, sub)
        for path, sub in nnx.iter_graph(module)
        if isinstance(sub, (Dense, TiedEmbedding)) and path
    ]
    for path, sub in swaps:
        parent = module
        for key in path[:-1]:
            parent = parent[key] if isinstance(key, int) else getattr(parent, key)
        if isinstance(sub, Dense):
            bias = None if sub.bias is None else sub.bias[...]
            new = QuantizedDense(sub.weight[...], bias, mode)
        else:
            new = QuantizedEmbedding(sub, mode)
        if isinstance(path[-1], int):
            parent[path[-1]] = new
        else:
            setattr(parent, path[-1], new)
    for _, sub in nnx.iter_graph(module):
        if isinstance(sub, nnx.Embed):
            # Looked up in the dtype of its table, which quantizing does not change.
            sub.dtype = sub.param_dtype = sub.embedding[...].dtype
