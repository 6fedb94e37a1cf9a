"""`ChainDrafter`: a cheap drafter first, the draft model only where it has nothing.

``--drafter suffix,model``: each step a row takes the first member's drafts when that
member drafts anything for it (a drafter that drafts fewer by its own rule: a
`SuffixDrafter` drafts only where its match is at least ``min_match`` long, 4 in a
chain), else the last member's (a draft model). At batch 1 the choice is a
``lax.cond``: a step the first member serves runs no draft model at all. At batch > 1
every member drafts and each row takes its own choice, so such a step costs both.

The draft model sits out the steps the first member served, so its cache falls behind
the row; it then catches up, a few tokens a forward, when it drafts again
(`DraftModel.catch_up`): every committed token is still fed to it once. Its q, where it
drafts, is its own; the first member's drafts are one-hot. The verifiers are exact for
any proposal, so the output is the target's whatever the chain chooses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.drafters.base import Drafter, Proposal

__all__ = ["ChainDrafter"]


@struct.dataclass
class ChainDrafter(Drafter):
    """Drafts with the first member where it is confident, else with the last.

    Attributes:
        members: ``(first, last)``: a drafter that drafts fewer by its own rule
            (``drafts_fewer``, reporting `Proposal.num_drafted`) and any chain
            drafter (a `specjax.DraftModel` catches up on what it sat out).
        num_draft: γ, the most drafts per step (static): the first member drafts up
            to γ, the last up to its own γ (at most γ).
    """

    members: tuple
    num_draft: int = struct.field(pytree_node=False, default=8)
    noun = "drafter chain"
    drafts_fewer = True

    @classmethod
    def of(cls, first, last, *, min_match: int = 4) -> ChainDrafter:
        """The chain of ``first`` then ``last``, at the larger γ of the two; a suffix
        drafter first drafts only on matches of at least ``min_match`` tokens."""
        if not getattr(first, "drafts_fewer", False):
            raise ValueError(
                f"a chain's first member must say when it has nothing to draft (a "
                f"SuffixDrafter); got a {type(first).__name__}"
            )
        if getattr(last, "tree", None) is not None or getattr(first, "tree", None) is not None:
            raise ValueError("a drafter chain drafts chains, not trees")
        if hasattr(last, "catch_up"):
            last = last.replace(catch_up=max(first.num_draft, last.num_draft) + 2)
        if hasattr(first, "min_match"):
            first = first.replace(min_match=min_match)
        gamma = max(first.num_draft, last.num_draft)
        return cls(members=(first, last), num_draft=gamma)

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.members[1].target_layers

    @property
    def vocab_size(self):
        return self.members[1].vocab_size

    def with_draft(self, num_draft: int | None = None, mode: str | None = None) -> ChainDrafter:
        if num_draft is None and mode is None:
            return self
        first, last = self.members
        gamma = self.num_draft if num_draft is None else num_draft
        first = first.with_draft(gamma)
        last = last.with_draft(min(last.num_draft, gamma) if num_draft is None else gamma, mode)
        return self.replace(members=(first, last), num_draft=gamma)

    def with_confidence(self, threshold):
        first, last = self.members
        return self.replace(members=(first, last.with_confidence(threshold)))

    def own_models(self) -> dict[str, object]:
        return {
            f"members.{i}.{name}": model
            for i, member in enumerate(self.members)
            for name, model in member.own_models().items()
        }

    def state_bytes(self, batch_size: int, cache_len: int) -> int:
        return sum(m.state_bytes(batch_size, cache_len) for m in self.members)

    def check(self) -> None:
        for member in self.members:
            member.check()

    def init(self, prompts_BS, seq_lengths_B, cache_len, hidden=None):
        first, last = self.members
        return (
            first.init(prompts_BS, seq_lengths_B, cache_len),
            last.init(prompts_BS, seq_lengths_B, cache_len, hidden),
        )

    def update(self, state, seq_lengths_B, hidden=None):
        first, last = self.members
        return (first.update(state[0], seq_lengths_B), last.update(state[1], seq_lengths_B, hidden))

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        b, gamma = seq_BS.shape[0], self.num_draft
        # A step of an adaptive γ may draft fewer than the members' own γ.
        first, last = (m.with_draft(min(m.num_draft, gamma)) for m in self.members)
        ahead = first.propose(keys_BG, state[0], seq_BS, seq_lengths_B, sampling)
        served_B = ahead.num_drafted > 0
        vocab = last.vocab_size

        def padded(p: Proposal, drafted_B) -> tuple:
            width = p.tokens.shape[1]
            tokens = jnp.pad(p.tokens, ((0, 0), (0, gamma - width)))
            if drafted_B is None:
                drafted_B = jnp.full((b,), width, jnp.int32)
            if vocab is not None:  # an id the last member cannot score ends the chain there
                fits = jnp.cumprod(tokens < vocab, axis=1).astype(bool)
                drafted_B = jnp.minimum(drafted_B, jnp.sum(fits, axis=1, dtype=jnp.int32))
            return tokens, drafted_B.astype(jnp.int32)

        def first_choice(model_state):
            tokens, drafted = padded(ahead, ahead.num_drafted)
            probs = None
            if not _one_hot(last):
                probs = jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)
            return tokens, probs, drafted, model_state

        def last_choice(model_state):
            p = last.propose(
                keys_BG[:, : last.num_draft], model_state, seq_BS, seq_lengths_B, sampling
            )
            tokens, drafted = padded(p, p.num_drafted)
            probs = p.probs
            if probs is not None:
                probs = jnp.pad(probs, ((0, 0), (0, gamma - probs.shape[1]), (0, 0)))
            return tokens, probs, drafted, p.state

        if b == 1:
            tokens, probs, drafted, model_state = jax.lax.cond(
                served_B[0], first_choice, last_choice, state[1]
            )
        else:
            t1, q1, d1, _ = first_choice(state[1])
            t2, q2, d2, drafted_state = last_choice(state[1])
            tokens = jnp.where(served_B[:, None], t1, t2)
            drafted = jnp.where(served_B, d1, d2)
            probs = None if q2 is None else _chosen_probs(served_B, q1, q2)
            # Rows the first member served forget the model's drafts: it catches up on
            # what they commit instead.
            model_state = _keep_rows(drafted_state, state[1], ~served_B)
        return Proposal(
            tokens=tokens, probs=probs, state=(ahead.state, model_state), num_drafted=drafted
        )


def _chosen_probs(served_B, first_q, last_q):
    """Each row's q: the one its drafts came from."""
    return jnp.where(served_B[:, None, None], first_q, last_q)


def _one_hot(drafter) -> bool:
    """Whether ``drafter`` proposes one-hot drafts (no q)."""
    return bool(getattr(drafter, "greedy_draft", False)) or not hasattr(drafter, "model")


def _keep_rows(new_cache, old_cache, rows_B):
    """The cache with ``new_cache``'s lengths where ``rows_B``, ``old_cache``'s elsewhere
    (entries past a row's length are forgotten)."""
    if not hasattr(new_cache, "rollback"):
        return new_cache
    return new_cache.rollback(jnp.where(rows_B, new_cache.lengths, old_cache.lengths))
