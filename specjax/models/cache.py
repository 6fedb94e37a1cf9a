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

    Attributes:
        k: ``[L, B, S, K, D]`` keys (S = max cache length, K = kv heads).
        v: ``[L, B, S, K, D]`` values.
        lengths: ``int32[B]`` number of valid slots per row.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @classmethod
    def zeros(cls, num_layers, batch_size, max_len, num_kv_heads, head_dim, dtype=jnp.float32):
        shape = (num_layers, batch_size, max_len, num_kv_heads, head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            lengths=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def rollback(self, lengths: jax.Array) -> KVCache:
        """Returns the cache truncated to ``lengths`` (int32[B]) per row; O(1)."""
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))
