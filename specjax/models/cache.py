"""The explicit key/value cache pytree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
    """Per-layer keys and values with static shape, plus per-row lengths.

    Slot ``s`` of row ``b`` holds the key/value of the token at position ``s``
    (slot == position). A forward call writes its T new entries at the slots
    given by its ``positions`` and every query attends only to slots ``<=`` its
    own position, so entries at or beyond a row's length are never read.
    Rolling back rejected tokens is therefore just ``cache.replace(lengths=...)``:
    no copy, the stale slots are overwritten by the next write.

    Layout: heads come before slots, and keys are stored transposed (slots
    minor), so that both attention products are plain batched matmuls over
    ``(B, K)``: ``q [G·T, D] @ k [D, S]`` and ``weights [G·T, S] @ v [S, D]``.
    With slots before heads, XLA:CPU copies (transposes) every layer's keys and
    values on every forward, which costs more than the attention itself
    (a profile of the compiled forward shows those copies per op).

    Attributes:
        k: ``[L, B, K, D, S]`` keys (K = kv heads, D = head dim, S = max cache length).
        v: ``[L, B, K, S, D]`` values.
        lengths: ``int32[B]`` number of valid slots per row.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @classmethod
    def zeros(cls, num_layers, batch_size, max_len, num_kv_heads, head_dim, dtype=jnp.float32):
        """An empty cache: every row of length 0.

        The arrays' axes are in this order whatever the order of the arguments:

        * ``k [L, B, K, D, S]``: layer, row, kv head, head width, slot. The key of the
          token at slot (position) ``s`` of row ``b``, head ``h``, layer ``l`` is
          ``k[l, b, h, :, s]``: keys are stored transposed, slots last.
        * ``v [L, B, K, S, D]``: layer, row, kv head, slot, head width. Its value is
          ``v[l, b, h, s, :]``: slots before the width.
        * ``lengths int32[B]``: the valid slots of each row, all 0 here.

        A model of its own that keeps this cache must write and read these layouts
        (the class doc says why keys are transposed).

        Args:
            num_layers: L, one set of keys and values per layer.
            batch_size: B rows.
            max_len: S slots per row (a row's positions ``0..S-1``).
            num_kv_heads: K key/value heads.
            head_dim: D, the width of one head.
            dtype: the keys' and values' dtype.

        Returns:
            ``KVCache(k=zeros[L, B, K, D, S], v=zeros[L, B, K, S, D], lengths=zeros[B])``.

        Examples:
            >>> import specjax
            >>> cache = specjax.KVCache.zeros(2, 1, 16, 4, 8)
            >>> cache.k.shape, cache.v.shape, cache.lengths.tolist()
            ((2, 1, 4, 8, 16), (2, 1, 4, 16, 8), [0])
        """
        return cls(
            k=jnp.zeros((num_layers, batch_size, num_kv_heads, head_dim, max_len), dtype),
            v=jnp.zeros((num_layers, batch_size, num_kv_heads, max_len, head_dim), dtype),
            lengths=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        """B, the rows."""
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        """S, the slots of each row."""
        return self.v.shape[3]

    def rollback(self, lengths: jax.Array) -> KVCache:
        """Returns the cache truncated to ``lengths`` (int32[B]) per row; O(1)."""
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))

    def compact_path(self, start_B: jax.Array, path_BD: jax.Array) -> KVCache:
        """Moves the accepted path's keys and values to consecutive slots.

        The tree part of the cache contract: after a tree forward the decoder calls
        this on the target's cache, so a model with another cache layout can use trees
        by giving its cache this method. Node j of the tree was written at slot
        ``start + j``; after this, the node accepted at depth d (``path_BD[:, d-1]``) is
        at slot ``start + d``: slot == position again. All D slots are moved (the ones
        past the accepted length are stale and rolled back by the caller). Sources are
        read before anything is written, and ``path[d-1] >= d`` (breadth first), so no
        source is overwritten before it is read; slots past the cache's end are
        neither read nor written.

        Args:
            start_B: ``int32[B]`` the root's slot.
            path_BD: ``int32[B, D]`` node indices (from `specjax.verification.tree.tree_verify`).

        Returns:
            The cache with moved entries; ``lengths`` unchanged.
        """
        b, depth = path_BD.shape
        if depth == 0:
            return self
        rows = jnp.arange(b)[:, None]
        src_BD = start_B[:, None] + path_BD
        dst_BD = start_B[:, None] + 1 + jnp.arange(depth)[None]
        last = self.max_len - 1
        # Split advanced indices put the broadcast [B, D] dims first: [B, D, L, K, Dh].
        k_src = self.k[:, rows, :, :, jnp.minimum(src_BD, last)]
        v_src = self.v[:, rows, :, jnp.minimum(src_BD, last)]
        k = self.k.at[:, rows, :, :, dst_BD].set(k_src, mode="drop")
        v = self.v.at[:, rows, :, dst_BD].set(v_src, mode="drop")
        return self.replace(k=k, v=v)


@struct.dataclass
class TreeMask:
    """Where a tree forward writes its tokens and what each of them sees.

    Passed to the model contract as ``tree=``. Token t of row b is written to cache
    slot ``slots[b, t]`` (not its position: the nodes of one depth share a position)
    and attends to

    * every committed slot ``s < start[b]``, and
    * the slots ``start[b] + r`` of the tree region (``0 <= r < R``) with
      ``visible[t, r]``: its ancestors in the tree, and itself.

    Without ``tree=`` a forward writes slot == position and is causal.

    Attributes:
        start: ``int32[B]`` the first slot of the tree region (the root's slot).
        slots: ``int32[B, T]`` the slot each new token is written to.
        visible: ``bool[T, R]`` which region slots each new token sees.
    """

    start: jax.Array
    slots: jax.Array
    visible: jax.Array

    def slot_visibility(self, num_slots: int) -> tuple[jax.Array, jax.Array]:
        """``(committed bool[B, 1, S], region bool[B, T, S])`` over ``S = num_slots`` slots.

        ``committed``: the slot is before ``start``; ``region``: it is a tree-region slot
        the token sees. A token's visible slots are ``committed | region`` (a model may
        narrow the committed part further, e.g. by a sliding window).
        """
        width = self.visible.shape[1]
        rel_BS = jnp.arange(num_slots)[None] - self.start[:, None]
        in_region_B1S = ((rel_BS >= 0) & (rel_BS < width))[:, None]
        # [T, R] gathered at each row's relative slot: [T, B, S] -> [B, T, S].
        mask_BTS = jnp.take(self.visible, jnp.clip(rel_BS, 0, width - 1), axis=1)
        return (rel_BS < 0)[:, None], in_region_B1S & mask_BTS.transpose(1, 0, 2)
