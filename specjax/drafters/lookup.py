"""Drafters without weights: `PromptLookup` (n-gram copying) and `NoDraft` (γ = 0)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from specjax.drafters.base import Drafter, Proposal


class _Stateless(Drafter):
    """A drafter without weights or state: any vocabulary, nothing to build or roll back."""

    @property
    def vocab_size(self) -> None:
        return None

    def init(self, prompts_BS, seq_lengths_B, cache_len, features=None):
        return ()

    def update(self, state, seq_lengths_B, features=None):
        return state


@struct.dataclass
class PromptLookup(_Stateless):
    """Drafts by copying what followed the latest earlier match of the current n-gram.

    For ``n = ngram, ngram-1, ..., 1`` it looks for the most recent earlier
    occurrence of the row's last ``n`` tokens in the prompt and text generated
    so far, and proposes the γ tokens that followed it (the longest ``n`` with a
    match wins). Rows with no match propose their last token repeated. All on
    device with vectorised comparisons, no model; q is one-hot.

    Attributes:
        ngram: longest suffix length to match (static).
        num_draft: γ, tokens proposed per step (static).
    """

    ngram: int = struct.field(pytree_node=False, default=3)
    num_draft: int = struct.field(pytree_node=False, default=4)

    def __post_init__(self):
        # ngram < 1 would match nothing and silently propose the last token forever.
        # num_draft is left to the decoder's drafter check, which names it.
        from specjax.validation import check_int

        check_int("PromptLookup.ngram", self.ngram, lo=1)

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        del keys_BG, sampling  # deterministic drafter
        b, s = seq_BS.shape
        slots = jnp.arange(s)
        lengths = seq_lengths_B[:, None]
        best_start = jnp.full((b,), -1, jnp.int32)
        # Shortest n first, so a longer match found later overrides it.
        for n in range(1, self.ngram + 1):
            # match[b, i]: seq[b, i:i+n] == seq[b, L-n:L], with the window ending
            # before the last token so that at least one continuation token exists.
            match = jnp.ones((b, s), bool)
            for j in range(n):
                suffix_tok = jnp.take_along_axis(seq_BS, jnp.maximum(lengths - n + j, 0), axis=1)
                window_tok = jnp.roll(seq_BS, -j, axis=1)
                match &= window_tok == suffix_tok
            valid = (slots[None] + n < lengths) & (lengths >= n + 1)
            match &= valid
            latest = jnp.max(jnp.where(match, slots[None], -1), axis=1)
            best_start = jnp.where(latest >= 0, latest + n, best_start)
        # Continuation tokens, clamped to the valid part of the row; with no
        # match the row proposes its last token repeatedly.
        last = seq_lengths_B - 1
        start = jnp.where(best_start >= 0, best_start, last)
        idx = jnp.minimum(start[:, None] + jnp.arange(self.num_draft)[None], last[:, None])
        tokens = jnp.take_along_axis(seq_BS, idx, axis=1)
        return Proposal(tokens=tokens.astype(jnp.int32), probs=None, state=state)


@struct.dataclass
class NoDraft(_Stateless):
    """The null drafter (γ = 0): with it, speculative decoding *is* plain decoding.

    Each step then scores only the pending token and emits the target's own sample,
    drawn with the same position-keyed noise that speculative decoding uses for its
    bonus tokens. `specjax.generate` runs the one decode loop with this drafter.
    """

    num_draft: int = struct.field(pytree_node=False, default=0)
    null_drafter = True

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        tokens = jnp.zeros((seq_BS.shape[0], 0), jnp.int32)
        return Proposal(tokens=tokens, probs=None, state=state)
