"""`SuffixDrafter`: drafts what followed the longest match of the row's suffix, for free.

SuffixDecoding (Oliaro et al., arXiv 2411.04975) drafts from text seen before: the
prompt, the output so far, earlier outputs and a corpus. Agent and code-editing work
repeats itself, and a match there is a draft that costs no model. Here, all on device
and with static shapes:

* **the row's own text** (prompt and output so far) is searched for the most recent
  earlier occurrence of the row's last ``n`` tokens, for each ``n`` of `SIZES`, as
  `specjax.PromptLookup` does;
* **a corpus** (earlier outputs of a `specjax.Sampler`, files given as ``corpus=``) is
  one token array ``[C]`` with ``-1`` between documents, and a hash table per size
  ``n`` maps each n-gram to the occurrence whose next token is the most frequent
  after it (ties: the latest), built on the host once per corpus (`SuffixIndex`). A
  step hashes the row's last ``n`` tokens, looks each size up, and checks the hit
  token by token (a hash collision is a miss);
* the **longest** match wins (the row's own text on a tie), and its continuation is
  the draft, as long as ``ceil(spec_factor · n)`` tokens, at most γ and never past the
  end of what followed (a row with no match, or one shorter than ``min_match``, drafts
  nothing this step).

q is one-hot: the verifiers judge deterministic drafts exactly (rejection sampling's
one-hot form, block verification with ``q = δ``), so the output is the target's
whatever is drafted.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.drafters.base import Proposal, StatelessDrafter

__all__ = ["SIZES", "SuffixDrafter", "SuffixIndex"]

#: The suffix lengths matched, ascending: the longest with a match wins.
SIZES = (1, 2, 4, 8, 16)
#: Buckets of each size's hash table.
TABLE_BUCKETS = 1 << 16
_PRIME = 0x01000193  # FNV's 32-bit prime: the rolling hash's multiplier


def _hash_np(windows_NK: np.ndarray) -> np.ndarray:
    """The bucket of each row of ``windows [N, n]`` (uint32 arithmetic, as on device)."""
    h = np.zeros(windows_NK.shape[0], np.uint32)
    for k in range(windows_NK.shape[1]):
        h = h * np.uint32(_PRIME) + windows_NK[:, k].astype(np.uint32) + np.uint32(1)
    return (h % np.uint32(TABLE_BUCKETS)).astype(np.int32)


def _hash_jnp(windows_BK: jax.Array) -> jax.Array:
    h = jnp.zeros(windows_BK.shape[0], jnp.uint32)
    for k in range(windows_BK.shape[1]):
        h = h * jnp.uint32(_PRIME) + windows_BK[:, k].astype(jnp.uint32) + jnp.uint32(1)
    return (h % jnp.uint32(TABLE_BUCKETS)).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class SuffixIndex:
    """A corpus as the drafter reads it: its tokens and one hash table per size.

    Attributes:
        tokens: ``int32[C]`` the documents, ``-1`` between them and after the last
            (C is a power of two: a corpus that grows recompiles only when it doubles).
        table: ``int32[len(SIZES), TABLE_BUCKETS]`` per size and bucket, the corpus
            position just after the chosen occurrence of an n-gram (where its
            continuation starts), ``-1`` for an empty bucket.
    """

    tokens: np.ndarray
    table: np.ndarray

    @classmethod
    def build(cls, documents, min_size: int = 1024) -> SuffixIndex:
        """The index of ``documents`` (sequences of token ids), built on the host."""
        parts = []
        for doc in documents:
            doc = np.asarray(doc, np.int32).ravel()
            if doc.size:
                parts += [doc, np.full(1, -1, np.int32)]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        capacity = max(min_size, 1 << math.ceil(math.log2(max(flat.size, 1))))
        tokens = np.full(capacity, -1, np.int32)
        tokens[: flat.size] = flat
        table = np.full((len(SIZES), TABLE_BUCKETS), -1, np.int32)
        for index, n in enumerate(SIZES):
            table[index] = _table_of_size(flat, n)
        return cls(tokens=tokens, table=table)


def _table_of_size(flat: np.ndarray, n: int) -> np.ndarray:
    """Bucket -> start of the continuation of its most frequently continued n-gram."""
    out = np.full(TABLE_BUCKETS, -1, np.int32)
    if flat.size <= n:
        return out
    windows = np.lib.stride_tricks.sliding_window_view(flat, n)[:-1]  # [C - n, n]
    nxt = flat[n:]  # the token after each window
    ok = (windows >= 0).all(axis=1) & (nxt >= 0)
    starts = np.flatnonzero(ok)  # window start; its continuation starts at start + n
    if not starts.size:
        return out
    buckets = _hash_np(windows[starts])
    # Count (bucket, next token) pairs; per bucket keep the most frequent next token's
    # latest occurrence (a collision shares a bucket and competes by frequency).
    pairs = buckets.astype(np.int64) * (1 << 32) + nxt[starts].astype(np.int64)
    _, inverse, counts = np.unique(pairs, return_inverse=True, return_counts=True)
    order = np.lexsort((starts, counts[inverse], buckets))  # by bucket, count, recency
    last_of_bucket = np.r_[buckets[order][1:] != buckets[order][:-1], True]
    chosen = order[last_of_bucket]
    out[buckets[chosen]] = starts[chosen] + n
    return out


@struct.dataclass
class SuffixDrafter(StatelessDrafter):
    """Drafts the continuation of the row's longest matching suffix: in its own text,
    or in a corpus of earlier outputs and files (see the module docstring).

    Build it with `SuffixDrafter.of` (a corpus of token sequences) or plain
    ``SuffixDrafter()`` (the row's own text only).

    Attributes:
        corpus: ``int32[C]`` `SuffixIndex.tokens`.
        table: ``int32[len(SIZES), TABLE_BUCKETS]`` `SuffixIndex.table`.
        num_draft: γ, the most tokens drafted per step (static).
        spec_factor: a match of ``n`` tokens drafts at most ``ceil(spec_factor · n)``
            (static): a long match is trusted further than a short one.
        min_match: a match shorter than this drafts nothing (static): in a chain, the
            draft model drafts there instead.
    """

    corpus: jax.Array = None
    table: jax.Array = None
    num_draft: int = struct.field(pytree_node=False, default=8)
    spec_factor: float = struct.field(pytree_node=False, default=2.0)
    min_match: int = struct.field(pytree_node=False, default=1)
    drafts_fewer = True
    noun = "suffix drafter"

    def __post_init__(self):
        if self.corpus is None:
            empty = SuffixIndex.build([])
            object.__setattr__(self, "corpus", jnp.asarray(empty.tokens))
            object.__setattr__(self, "table", jnp.asarray(empty.table))

    @classmethod
    def of(
        cls, documents, num_draft: int = 8, spec_factor: float = 2.0, min_match: int = 1
    ) -> SuffixDrafter:
        """A drafter over a corpus of ``documents`` (token-id sequences), besides the
        row's own text."""
        index = SuffixIndex.build(documents)
        return cls(
            corpus=jnp.asarray(index.tokens),
            table=jnp.asarray(index.table),
            num_draft=num_draft,
            spec_factor=spec_factor,
            min_match=min_match,
        )

    def with_documents(self, documents) -> SuffixDrafter:
        """This drafter over a new corpus of ``documents`` (its settings kept)."""
        index = SuffixIndex.build(documents)
        return self.replace(corpus=jnp.asarray(index.tokens), table=jnp.asarray(index.table))

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        del keys_BG, sampling  # deterministic drafter
        b, s = seq_BS.shape
        gamma = self.num_draft
        last = seq_lengths_B - 1
        own_start, own_len = jnp.full((b,), -1, jnp.int32), jnp.zeros((b,), jnp.int32)
        hit_start, hit_len = jnp.full((b,), -1, jnp.int32), jnp.zeros((b,), jnp.int32)
        slots = jnp.arange(s)
        for index, n in enumerate(SIZES):
            if n >= s:
                break
            suffix_BN = jnp.take_along_axis(
                seq_BS, jnp.maximum(seq_lengths_B[:, None] - n + jnp.arange(n)[None], 0), axis=1
            )
            enough = seq_lengths_B >= n + 1
            # The row's own text: the latest earlier window equal to the suffix.
            match = jnp.ones((b, s), bool)
            for j in range(n):
                match &= jnp.roll(seq_BS, -j, axis=1) == suffix_BN[:, j : j + 1]
            match &= (slots[None] + n < seq_lengths_B[:, None]) & enough[:, None]
            latest = jnp.max(jnp.where(match, slots[None], -1), axis=1)
            found = latest >= 0
            own_start = jnp.where(found, latest + n, own_start)
            own_len = jnp.where(found, n, own_len)
            # The corpus: the table's occurrence, checked token by token.
            at = self.table[index][_hash_jnp(suffix_BN)]
            window = jnp.maximum(at[:, None] - n + jnp.arange(n)[None], 0)
            same = jnp.all(self.corpus[window] == suffix_BN, axis=1) & (at >= n) & enough
            hit_start = jnp.where(same, at, hit_start)
            hit_len = jnp.where(same, n, hit_len)
        use_own = own_len >= hit_len
        match_len = jnp.maximum(own_len, hit_len)
        offsets = jnp.arange(gamma)[None]
        own_idx = jnp.minimum(own_start[:, None] + offsets, last[:, None])
        own_tokens = jnp.take_along_axis(seq_BS, jnp.maximum(own_idx, 0), axis=1)
        # Own text: what followed, up to the row's last token (which it may reach).
        own_room = jnp.maximum(seq_lengths_B - own_start, 0)
        corpus_idx = jnp.clip(hit_start[:, None] + offsets, 0, self.corpus.shape[0] - 1)
        corpus_tokens = self.corpus[corpus_idx]
        # Corpus: what followed, up to the end of its document (-1).
        ended = jnp.cumsum(corpus_tokens < 0, axis=1) > 0
        corpus_room = jnp.sum(~ended, axis=1)
        tokens = jnp.where(use_own[:, None], own_tokens, corpus_tokens)
        room = jnp.where(use_own, own_room, corpus_room)
        trusted = jnp.ceil(jnp.float32(self.spec_factor) * match_len.astype(jnp.float32))
        trusted = trusted.astype(jnp.int32)
        num_drafted = jnp.minimum(jnp.minimum(room, trusted), gamma)
        num_drafted = jnp.where(match_len >= self.min_match, num_drafted, 0).astype(jnp.int32)
        tokens = jnp.where(offsets < num_drafted[:, None], tokens, 0)
        return Proposal(
            tokens=jnp.maximum(tokens, 0).astype(jnp.int32),
            probs=None,
            state=state,
            num_drafted=num_drafted,
        )
