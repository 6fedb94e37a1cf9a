"""Attention: the one implementation the decoder and the drafters' layers share.

It owns every part of attention in specjax:

* RoPE (`rope_inv_freq`, `apply_rope`) and the q/k norms (`split_heads`);
* grouped-query attention over any number of key sets (`attend`), with Gemma's
  soft-capping (`softcap`) and a finite mask value;
* which keys a query sees (`visible_slots`): causal by position, inside a sliding
  window, or a tree's ancestors (`~specjax.models.cache.TreeMask`);
* writing and reading the KV cache (`write_kv`, `cache_layout`), slot == position;
* the projections around it (`Attention`, with Hugging Face's parameter names).

A query attends to one or more `Keys`. The decoder attends to its cache, or without
one to the tokens themselves; the block drafter to the context of its cache and to
its own block; the EAGLE head's training-time test to step 0's keys and to one key
per query of each earlier draft step. Every set is scored, masked and normalised in
one softmax, so a set is as good as one more slot of the cache.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from specjax.core.platform import by_platform
from specjax.models.cache import TreeMask
from specjax.models.config import ModelConfig
from specjax.models.layers import Dense, config_norm
from specjax.models.matmul import einsum_f32


def rope_inv_freq(config: ModelConfig, *, local: bool = False) -> jax.Array:
    """Rotary inverse frequencies ``float32[D/2]``, scaled if configured.

    Args:
        config: the architecture.
        local: the frequencies of a sliding layer, which has its own base and no
            scaling when ``config.local_rope_theta`` is set (Gemma 3).
    """
    d = config.head_dim
    local = local and config.local_rope_theta is not None
    theta = config.local_rope_theta if local else config.rope_theta
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    scaling = None if local else config.rope_scaling_dict
    if scaling is None:
        return inv_freq
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        # Position interpolation: every position is divided by `factor`.
        return inv_freq / scaling["factor"]
    # Llama-3 style: low frequencies are divided by `factor`, high ones kept,
    # and the band in between is interpolated smoothly.
    factor = scaling["factor"]
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def apply_rope(x_BTHD, positions_BT, inv_freq):
    """Rotates ``x`` ([B, T, H, D]) by ``positions`` using the rotate-half layout of HF."""
    angles = positions_BT[..., None].astype(jnp.float32) * inv_freq[None, None, :]  # [B, T, D/2]
    cos = jnp.cos(jnp.concatenate([angles, angles], -1))[:, :, None, :]
    sin = jnp.sin(jnp.concatenate([angles, angles], -1))[:, :, None, :]
    x32 = x_BTHD.astype(jnp.float32)
    half = x32.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], -1)
    return (x32 * cos + rotated * sin).astype(x_BTHD.dtype)


def softcap(x, cap: float | None):
    """``cap · tanh(x / cap)`` (Gemma's soft-capping), or ``x`` when ``cap`` is None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def split_heads(y_BTF, positions_BT, inv_freq, head_dim: int, norm=None, *, rotate=True):
    """A projection's heads ``[B, T, N, D]``: normed by ``norm`` (q/k norms), then rotated.

    ``rotate=False`` (values) only splits.
    """
    b, t, _ = y_BTF.shape
    y = y_BTF.reshape(b, t, -1, head_dim)
    if norm is not None:
        y = norm(y)
    return apply_rope(y, positions_BT, inv_freq) if rotate else y


class Keys(NamedTuple):
    """Keys and values a block of T queries attends to, and which of them each sees.

    Attributes:
        k: ``[B, K, D, S]`` keys in the cache's layout (every query scores all S), or,
            with ``per_query``, ``[B, T, K, D]``: one key for each query.
        v: ``[B, K, S, D]`` values, or ``[B, T, K, D]`` with ``per_query``.
        visible: ``bool`` broadcastable to ``[B, T, S]``; ignored with ``per_query``,
            whose key each query always sees.
        per_query: whether query t scores only its own key ``k[:, t]``.
    """

    k: jax.Array
    v: jax.Array
    visible: jax.Array | None = None
    per_query: bool = False

    @property
    def width(self) -> int:
        """The slots each query scores: S, or 1 per query."""
        return 1 if self.per_query else self.k.shape[-1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[2] if self.per_query else self.k.shape[1]

    def scores(self, q_BKQD, g: int) -> jax.Array:
        """Scores ``float32[B, K, G·T, width]`` of queries grouped as in `attend`."""
        if not self.per_query:
            return einsum_f32("bkqd,bkds->bkqs", q_BKQD, self.k)
        b, kh, _, d = q_BKQD.shape
        q = q_BKQD.reshape(b, kh, g, -1, d)
        return einsum_f32("bkgtd,btkd->bkgt", q, self.k).reshape(b, kh, -1, 1)

    def mask(self, b: int, t: int) -> jax.Array:
        """``bool[B, T, width]``: which of these slots each query sees."""
        if self.per_query:
            return jnp.ones((b, t, 1), bool)
        return jnp.broadcast_to(self.visible, (b, t, self.width))

    def mix(self, weights_BKQS, g: int) -> jax.Array:
        """The values weighted by ``weights [B, K, G·T, width]``: ``[B, K, G·T, D]``."""
        if not self.per_query:
            return jnp.einsum("bkqs,bksd->bkqd", weights_BKQS, self.v)
        b, kh, _, _ = weights_BKQS.shape
        w = weights_BKQS.reshape(b, kh, g, -1)
        return jnp.einsum("bkgt,btkd->bkgtd", w, self.v).reshape(b, kh, -1, self.v.shape[-1])


def cache_layout(k_BTKD, v_BTKD) -> tuple[jax.Array, jax.Array]:
    """Keys ``[B, K, D, T]`` and values ``[B, K, T, D]`` of T tokens, as a cache holds them."""
    return k_BTKD.transpose(0, 2, 3, 1), v_BTKD.transpose(0, 2, 1, 3)


def write_kv(k_LBKDS, v_LBKSD, layer, slots_BT, k_BTKD, v_BTKD) -> tuple[jax.Array, jax.Array]:
    """The cache's keys and values with ``k``, ``v`` written at ``slots`` of ``layer``.

    The whole cache (keys ``[L, B, K, D, S]``, values ``[L, B, K, S, D]``) goes in and
    out, so that inside a loop that carries it XLA updates it in place instead of
    copying a layer. A write at a slot at or beyond the cache's end is a no-op (not
    clamped onto the last slot). A row's slots are consecutive (``slots[b, t] ==
    slots[b, 0] + t``), as every writer in specjax writes them: slot == position from
    the row's length, and a tree's nodes at consecutive slots.

    In a program compiled for a CPU the write is one scatter. On TPUs and GPUs each
    row's T slots are written as one block (`write_rows`): a scatter along the slots
    there makes XLA copy the whole cache into another layout around it, at every layer
    of every step, and a block update is done in place.
    """
    k_new, v_new = k_BTKD.astype(k_LBKDS.dtype), v_BTKD.astype(v_LBKSD.dtype)

    def scatter(k_LBKDS, v_LBKSD, slots_BT, k_new, v_new):
        # Indexing puts the broadcast [B, T] dims first: [B, T, K, D].
        rows = jnp.arange(k_LBKDS.shape[1])[:, None]
        k_LBKDS = k_LBKDS.at[layer, rows, :, :, slots_BT].set(k_new, mode="drop")
        v_LBKSD = v_LBKSD.at[layer, rows, :, slots_BT].set(v_new, mode="drop")
        return k_LBKDS, v_LBKSD

    def blocks(k_LBKDS, v_LBKSD, slots_BT, k_new, v_new):
        return write_rows(k_LBKDS, v_LBKSD, layer, slots_BT[:, 0], k_new, v_new)

    if k_BTKD.shape[1] > k_LBKDS.shape[-1]:  # more tokens than slots: no block fits
        return scatter(k_LBKDS, v_LBKSD, slots_BT, k_new, v_new)
    return by_platform(k_LBKDS, v_LBKSD, slots_BT, k_new, v_new, cpu=scatter, other=blocks)


def write_rows(k_LBKDS, v_LBKSD, layer, start_B, k_BTKD, v_BTKD) -> tuple[jax.Array, jax.Array]:
    """`write_kv` of each row's T tokens at slots ``start .. start + T - 1``, one block
    update per row (in place in a loop); slots at or past the cache's end are dropped.

    The block is written at ``min(start, S - T)``, where it fits whole, with the
    tokens shifted into their slots and the block's other slots keeping what they
    held, so that a row near the end writes exactly its slots that exist.
    """

    def row(b, kv, layer, start_B, k_BTKD, v_BTKD):
        k_LBKDS, v_LBKSD = kv
        s, (_, t, kh, d) = k_LBKDS.shape[-1], k_BTKD.shape  # this chip's heads
        at = jnp.clip(start_B[b], 0, s - t)
        source_T = jnp.arange(t) + at - start_B[b]  # the token each block slot receives
        written_T = (source_T >= 0) & (source_T < t)
        source_T = jnp.clip(source_T, 0, t - 1)
        k_KDT = jnp.take(k_BTKD[b], source_T, axis=0).transpose(1, 2, 0)
        v_KTD = jnp.take(v_BTKD[b], source_T, axis=0).transpose(1, 0, 2)
        old_k = jax.lax.dynamic_slice(k_LBKDS, (layer, b, 0, 0, at), (1, 1, kh, d, t))
        old_v = jax.lax.dynamic_slice(v_LBKSD, (layer, b, 0, at, 0), (1, 1, kh, t, d))
        k_block = jnp.where(written_T[None, None, None, None, :], k_KDT[None, None], old_k)
        v_block = jnp.where(written_T[None, None, None, :, None], v_KTD[None, None], old_v)
        k_LBKDS = jax.lax.dynamic_update_slice(k_LBKDS, k_block, (layer, b, 0, 0, at))
        v_LBKSD = jax.lax.dynamic_update_slice(v_LBKSD, v_block, (layer, b, 0, at, 0))
        return k_LBKDS, v_LBKSD

    def rows(layer, k_LBKDS, v_LBKSD, start_B, k_BTKD, v_BTKD):
        def one(b, kv):
            return row(b, kv, layer, start_B, k_BTKD, v_BTKD)

        return jax.lax.fori_loop(0, k_LBKDS.shape[1], one, (k_LBKDS, v_LBKSD))

    start_B = jnp.asarray(start_B, jnp.int32)
    split = _CACHE_SPLIT.get()
    if split is None:
        return rows(layer, k_LBKDS, v_LBKSD, start_B, k_BTKD, v_BTKD)
    # The loop indexes the rows with a traced row number; on a slice whose rows are
    # split over chips that would gather the whole cache onto every chip at every
    # layer. Each chip loops over its own rows instead.
    mesh, spec = split
    cache, row_B, new_BTKD = spec, P(spec[1]), P(spec[1], None, spec[2], None)
    split_axes = {a for a in spec if a is not None}
    if not split_axes:
        return rows(layer, k_LBKDS, v_LBKSD, start_B, k_BTKD, v_BTKD)
    return jax.shard_map(
        rows,
        mesh=mesh,
        in_specs=(P(), cache, cache, row_B, new_BTKD, new_BTKD),
        out_specs=(cache, cache),
        axis_names=split_axes,  # the other axes stay the compiler's
        check_vma=False,
    )(jnp.asarray(layer, jnp.int32), k_LBKDS, v_LBKSD, start_B, k_BTKD, v_BTKD)


# The mesh and the `PartitionSpec` of the cache's keys and values (``[L, B, K, D, S]``
# and ``[L, B, K, S, D]`` alike) while a `~specjax.models.sharding.ShardedModel`
# traces its model; set only during tracing, by `split_cache_writes`.
_CACHE_SPLIT: contextvars.ContextVar = contextvars.ContextVar("cache_split", default=None)


@contextlib.contextmanager
def split_cache_writes(mesh, spec):
    """While tracing inside it, `write_rows` writes each chip's own rows of a cache
    laid out as ``spec`` over ``mesh`` (``spec``: ``P(None, rows, heads, None, None)``)."""
    token = _CACHE_SPLIT.set((mesh, spec))
    try:
        yield
    finally:
        _CACHE_SPLIT.reset(token)


def visible_slots(key_pos_BS, query_pos_BT, window=None, tree: TreeMask | None = None):
    """``bool[B, T, S]``: the keys at ``key_pos`` each query at ``query_pos`` sees.

    Causal by position (``key <= query``), and inside ``window`` positions when given
    (a sliding layer). With ``tree`` the keys are cache slots, and a query sees the
    committed slots before ``tree.start`` (still causal and windowed) and the
    tree-region slots of its ancestors and itself.
    """
    key_pos = key_pos_BS[:, None, :]
    query_pos = query_pos_BT[:, :, None]
    visible = key_pos <= query_pos
    if window is not None:
        # In a tree region a key's slot is >= its position, and the tree is shallower
        # than the window (checked by the decoder), so every tree key is inside it.
        visible &= key_pos > query_pos - window
    if tree is not None:
        committed_B1S, region_BTS = tree.slot_visibility(key_pos_BS.shape[-1])
        visible = region_BTS | (committed_B1S & visible)
    return visible


def attend(q_BTHD, keys: Sequence[Keys], config: ModelConfig):
    """Grouped-query attention of ``q`` over the key sets ``keys``, in one softmax.

    Args:
        q_BTHD: rotated queries ``[B, T, H, D]``; H is a multiple of the keys' K.
        keys: the `Keys` sets, scored side by side.
        config: the layer's config: scores are scaled by ``query_pre_attn_scalar **
            -0.5``, then soft-capped by ``attn_logit_softcapping`` (Gemma) if set.

    Returns:
        ``[B, T, H·D]``, in the values' dtype.
    """
    b, t, h, d = q_BTHD.shape
    kh = keys[0].num_kv_heads
    g = h // kh  # query heads per kv head
    # Queries grouped by kv head, rows ordered (g, t): [B, K, G*T, D]. Both
    # products are then plain batched matmuls over (B, K), with no copy of
    # the cache (the reason for its layout).
    q_BKQD = q_BTHD.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)
    scores = jnp.concatenate([kv.scores(q_BKQD, g) for kv in keys], axis=-1)
    scale = config.query_pre_attn_scalar**-0.5
    scores = softcap(scale * scores, config.attn_logit_softcapping)
    visible = jnp.concatenate([kv.mask(b, t) for kv in keys], axis=-1)
    visible_BQS = jnp.tile(visible, (1, g, 1))  # rows (g, t), as in q_BKQD
    # A finite minimum rather than -inf: a query with nothing visible (only
    # possible for positions beyond the cache, whose writes are dropped)
    # gets uniform weights instead of NaNs that could leak downstream.
    scores = jnp.where(visible_BQS[:, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(keys[0].v.dtype)
    out_BKQD, start = None, 0
    for kv in keys:
        part = kv.mix(weights[..., start : start + kv.width], g)
        out_BKQD = part if out_BKQD is None else out_BKQD + part
        start += kv.width
    return out_BKQD.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h * d)


class Attention(nnx.Module):
    """The q, k, v and o projections (with optional q/k norms) around `attend`.

    The decoder calls it on its KV cache (``__call__``); the block drafter's layers
    project their context (`keys_values`) and attend to it and to their own block
    (`heads`, `over`).
    """

    def __init__(self, config: ModelConfig, dtype, rngs):
        c = config
        self.config = c
        d = c.head_dim
        self.q_proj = Dense(c.hidden_size, c.num_heads * d, c.attention_bias, dtype, rngs)
        self.k_proj = Dense(c.hidden_size, c.num_kv_heads * d, c.attention_bias, dtype, rngs)
        self.v_proj = Dense(c.hidden_size, c.num_kv_heads * d, c.attention_bias, dtype, rngs)
        self.o_proj = Dense(c.num_heads * d, c.hidden_size, c.o_proj_bias, dtype, rngs)
        if c.qk_norm:
            self.q_norm = config_norm(c, d, dtype)
            self.k_norm = config_norm(c, d, dtype)

    def project_qkv(self, x_BTE):
        """The query, key and value projections ``[B, T, H·D]``, ``[B, T, K·D]`` twice.

        Three products, or one when a quantized model fused them (``qkv_proj``, see
        `specjax.models.quant`): the rows of one input are then quantized once and
        read by one kernel, and slicing its output gives the same values.
        """
        fused = getattr(self, "qkv_proj", None)
        if fused is None:
            return self.q_proj(x_BTE), self.k_proj(x_BTE), self.v_proj(x_BTE)
        nq = self.config.num_heads * self.config.head_dim
        nk = self.config.num_kv_heads * self.config.head_dim
        y = fused(x_BTE)
        return y[..., :nq], y[..., nq : nq + nk], y[..., nq + nk :]

    def heads(self, x_BTE, positions_BT, inv_freq):
        """Rotated queries ``[B, T, H, D]``, rotated keys and values ``[B, T, K, D]``."""
        q, k, v = self.project_qkv(x_BTE)
        d = self.config.head_dim
        return (
            split_heads(q, positions_BT, inv_freq, d, getattr(self, "q_norm", None)),
            split_heads(k, positions_BT, inv_freq, d, getattr(self, "k_norm", None)),
            split_heads(v, positions_BT, inv_freq, d, rotate=False),
        )

    def keys_values(self, x_BTE, positions_BT, inv_freq):
        """Rotated keys and values ``[B, T, K, D]`` of ``x`` (no query projection)."""
        d, k_norm = self.config.head_dim, getattr(self, "k_norm", None)
        k = split_heads(self.k_proj(x_BTE), positions_BT, inv_freq, d, k_norm)
        return k, split_heads(self.v_proj(x_BTE), positions_BT, inv_freq, d, rotate=False)

    def over(self, q_BTHD, keys: Sequence[Keys]):
        """`attend` with this layer's config, then the output projection."""
        return self.o_proj(attend(q_BTHD, keys, self.config))

    def __call__(
        self, x_BTE, positions_BT, k_LBKDS, v_LBKSD, layer: int, inv_freq, window, tree=None
    ):
        """Attends ``x`` to the cache after writing its keys/values into layer ``layer``.

        ``inv_freq`` and ``window`` (``None`` for full attention) are this layer's
        RoPE frequencies and sliding window. ``tree`` (a `TreeMask`) gives the slots
        written and the tree region's visibility instead of slot == position. With
        ``k_LBKDS is None`` there is no cache (training, scoring whole sequences):
        ``x`` attends to itself, its keys at their own positions.

        Returns:
            ``(out [B, T, E], k_LBKDS, v_LBKSD)``: the whole cache, written (see
            `write_kv`).
        """
        q, k, v = self.heads(x_BTE, positions_BT, inv_freq)
        if k_LBKDS is None:
            keys_BKDS, values_BKSD = cache_layout(k, v)
            key_pos_BS = positions_BT
        else:
            slots_BT = positions_BT if tree is None else tree.slots
            k_LBKDS, v_LBKSD = write_kv(k_LBKDS, v_LBKSD, layer, slots_BT, k, v)
            keys_BKDS, values_BKSD = k_LBKDS[layer], v_LBKSD[layer]
            key_pos_BS = jnp.arange(values_BKSD.shape[2])[None]
        visible = visible_slots(key_pos_BS, positions_BT, window, tree)
        out = self.over(q, [Keys(keys_BKDS, values_BKSD, visible)])
        return out, k_LBKDS, v_LBKSD
