"""Verifiers: the exact rule that keeps a prefix of each row's drafted chain, as objects.

A decoder holds one verifier, chosen by its ``verification=`` argument: `Block` (the
default for a chain of drafts), `Rejection` (speculative rejection sampling, the default
for a tree) or `Coupled`. Each says which noise the
drafter draws its drafts with and verifies a step's chain in one call; the proofs are
in `specjax.verification.chain`. Plain decoding (the null drafter, which proposes
nothing) is `Coupled` verification of an empty chain: its token at each position is the
target's sample there, drawn exactly as coupled speculative decoding draws it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from specjax.sampling import noise
from specjax.verification.block import block_keys, block_verify
from specjax.verification.chain import coupled_verify, rejection_sample, rejection_sample_onehot


@dataclasses.dataclass(frozen=True)
class Verifier:
    """How a step's chain is verified (a static, hashable part of the decoder)."""

    #: The name ``verification=`` takes.
    name: ClassVar[str] = ""
    #: The noise stream the drafter draws its drafts with (`specjax.sampling.noise`).
    draft_noise: ClassVar[int] = noise.DRAFT

    def draft_keys(self, keys_BW: jax.Array, gamma: int) -> jax.Array:
        """The keys ``[B, gamma]`` the drafter draws a step's drafts with: its
        `draft_noise` stream of each position's key."""
        return noise.stream(keys_BW[:, :gamma], self.draft_noise)

    def verify(
        self,
        keys_BW: jax.Array,
        chain_BW1: jax.Array,
        draft_probs_BW1V: jax.Array | None,
        target_probs_BWV: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        """``(block int32[B, W], num_accepted int32[B])`` of one step.

        Args:
            keys_BW: each row's keys at the step's W positions.
            chain_BW1: ``int32[B, W-1]`` the drafts, ``-1`` where none was proposed.
            draft_probs_BW1V: the q each draft was drawn from, or ``None`` for a
                drafter that proposes one-hot drafts.
            target_probs_BWV: the target's p at the W positions.
        """
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Rejection(Verifier):
    """Accepts draft i with probability ``min(1, p_i/q_i)``, else resamples from
    ``max(0, p_i - q_i)`` normalised; a bonus token when every draft passes. The output
    has exactly the target's distribution."""

    name: ClassVar[str] = "rejection"
    draft_noise: ClassVar[int] = noise.DRAFT

    def verify(self, keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV):
        if draft_probs_BW1V is None:
            return rejection_sample_onehot(keys_BW, chain_BW1, target_probs_BWV)
        return rejection_sample(keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV)


@dataclasses.dataclass(frozen=True)
class Coupled(Verifier):
    """Drafts are drawn with the noise the target samples each position with, and a draft
    is accepted iff it equals the target's sample: the output equals plain decoding's
    for the same key and seeds."""

    name: ClassVar[str] = "coupled"
    draft_noise: ClassVar[int] = noise.SAMPLE

    def verify(self, keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV):
        return coupled_verify(keys_BW, chain_BW1, target_probs_BWV)


@dataclasses.dataclass(frozen=True)
class Block(Verifier):
    """Block verification (`specjax.verification.block`): the chain judged as a whole,
    the most accepted drafts on average of any exact verifier. The drafts and coins of
    a step come from the step's own noise, so the output has exactly the target's
    distribution."""

    name: ClassVar[str] = "block"
    draft_noise: ClassVar[int] = noise.DRAFT

    def draft_keys(self, keys_BW, gamma):
        return block_keys(keys_BW, 0)[:, :gamma]

    def verify(self, keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV):
        return block_verify(keys_BW, chain_BW1, draft_probs_BW1V, target_probs_BWV)


#: The verifiers by the name ``verification=`` takes.
VERIFIERS: dict[str, Verifier] = {v.name: v for v in (Rejection(), Coupled(), Block())}
