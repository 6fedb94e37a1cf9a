"""`PromptLookup`: drafting by n-gram copying, without weights."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from specjax.drafters.base import Proposal, StatelessDrafter


@struct.dataclass
class PromptLookup(StatelessDrafter):
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
        from specjax.core.validation import check_int

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
