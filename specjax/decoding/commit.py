"""Committing a verified step: how many tokens each row emits, writing them, ending rows.

A step's verification (`specjax.decoding.stages`) decides a `Verified` block per row;
`commit` cuts it at EOS, the row's budget, the first position without a distribution
and each feature's cut (stop strings, a complete constraint), writes the emitted
tokens, lets every feature record them, advances the models (`StepModels`) and flags
the rows that end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.decoder import Decoder
from specjax.decoding.features.base import Emission, write_slots
from specjax.decoding.state import DecodeState


@struct.dataclass
class Verified:
    """What one step's verification decided, before it is committed: tokens and counts.

    Attributes:
        block: ``int32[B, G]`` the chain layout: accepted drafts, the target's token, -1.
        num_accepted: ``int32[B]``.
        num_drafted: ``int32[B]`` drafts the row proposed (the statistics' count).
        probs: ``float32[B, G, V]`` the target's p that decided each emitted position.
        usable: ``bool[B, G]`` that p is a distribution (not NaN / all masked).
        logits: ``[B, G, V]`` the target's raw logits at the emitted positions (read
            only for raw top log-probabilities).
        path: ``int32[B, D]`` a tree's accepted node at each depth
            (`specjax.verification.tree.tree_verify`), or None for a chain.
    """

    block: jax.Array
    num_accepted: jax.Array
    num_drafted: jax.Array
    probs: jax.Array
    usable: jax.Array
    logits: jax.Array
    path: jax.Array | None = None


@struct.dataclass
class StepModels:
    """The models as one step's forwards left them, in the chain layout (slot ==
    position for the emitted positions), before the commit advances them.

    Attributes:
        drafter: the drafter as it ran this step (γ may differ from the state's).
        drafter_state: the proposal's drafter state.
        target_cache: the target's cache after the step's forward.
        hidden: the target's `~specjax.models.forward.TargetHidden` at the G emitted
            positions (for a drafter that reads them), or None.
    """

    drafter: object
    drafter_state: object
    target_cache: object
    hidden: object

    def advance(self, seq_lengths_B: jax.Array) -> tuple:
        """``(target_cache, drafter_state)`` once each row holds ``seq_lengths_B`` tokens:
        everything after the last committed token dropped, the drafter told of them."""
        cache = self.target_cache.rollback(seq_lengths_B - 1)
        return cache, self.drafter.update(self.drafter_state, seq_lengths_B, self.hidden)


def num_leading_true(flags_BT) -> jax.Array:
    """``int32[B]``: how many of each row's flags are True before the first False."""
    return jnp.sum(jnp.cumprod(flags_BT.astype(jnp.int32), axis=1), axis=1, dtype=jnp.int32)


def _first_cut(hit_BG) -> jax.Array:
    """``int32[B]``: 1 + the index of the first hit, or G where none."""
    return jnp.where(jnp.any(hit_BG, axis=1), jnp.argmax(hit_BG, axis=1) + 1, hit_BG.shape[1])


def _num_emit(decoder: Decoder, state: DecodeState, verified: Verified):
    """``(num_emit, stopped, is_eos, num_usable)`` of each row.

    A row emits its accepted drafts and the target's token, cut after EOS, at its
    budget, before the first position with no distribution (NaN or all -inf logits),
    and at each feature's cut; finished rows emit nothing. ``stopped``: a feature's cut
    ended the row.
    """
    block_BG, num_accepted = verified.block, verified.num_accepted
    offsets_G = jnp.arange(block_BG.shape[1])
    active = ~state.done
    num_usable = num_leading_true(verified.usable)
    is_eos_BG = jnp.any(block_BG[..., None] == decoder.eos_ids[None, None], axis=-1)
    is_eos_BG &= offsets_G[None] <= num_accepted[:, None]
    budget = state.settings.max_new_tokens - state.num_generated
    num_emit = jnp.minimum(num_accepted + 1, _first_cut(is_eos_BG))
    num_emit = jnp.minimum(num_emit, jnp.minimum(budget, num_usable))
    stopped = jnp.zeros_like(active)
    for feature, feature_state in zip(decoder.features, state.features, strict=True):
        cut = feature.cut(state, feature_state, block_BG)
        if cut is not None:
            cut_B, ends_B = cut
            stopped |= ends_B & (cut_B <= num_emit)
            num_emit = jnp.minimum(num_emit, cut_B)
    num_emit = jnp.where(active, jnp.maximum(num_emit, 0), 0)
    return num_emit, stopped, is_eos_BG, num_usable


def _update_status(
    decoder: Decoder, state: DecodeState, before: DecodeState, num_emit, stopped, is_eos_BG, usable
):
    """Flags the rows that end with this step: EOS, a feature's stop, their budget, a full
    cache, or no distribution at the next position."""
    active = ~before.done
    emitted_BG = jnp.arange(is_eos_BG.shape[1])[None] < num_emit[:, None]
    hit_eos = jnp.any(emitted_BG & is_eos_BG, axis=1)
    finished = hit_eos | (active & stopped)
    finished |= state.num_generated >= state.settings.max_new_tokens
    invalid = active & (usable == 0)
    # Judged by the largest step, so that whether a row is truncated never depends on
    # which γ variant ran.
    cache_full = state.seq_lengths + decoder.step_slots > state.seq.shape[1]
    status = state.status
    return status.replace(
        done=status.done | (active & (finished | cache_full | invalid)),
        truncated=status.truncated | (active & cache_full & ~finished & ~invalid),
        invalid=status.invalid | invalid,
    )


def commit(
    decoder: Decoder, state: DecodeState, verified: Verified, models: StepModels
) -> DecodeState:
    """Emits the verified tokens, cut at EOS, budgets and features' cuts; advances every
    row, its models (`StepModels.advance`) and counts the step."""
    num_emit, stopped, is_eos_BG, num_usable = _num_emit(decoder, state, verified)
    emission = Emission(
        block=verified.block,
        num_emit=num_emit,
        num_accepted=verified.num_accepted,
        num_drafted=verified.num_drafted,
        start=state.seq_lengths,
        active=~state.done,
        probs=verified.probs,
        logits=verified.logits,
    )
    features = tuple(
        feature.commit(state, feature_state, emission)
        for feature, feature_state in zip(decoder.features, state.features, strict=True)
    )
    new_lengths = state.seq_lengths + num_emit
    block_BG = jnp.maximum(verified.block, 0)
    target_cache, drafter_state = models.advance(new_lengths)
    after = state.replace(
        step=state.step + 1,
        seq=write_slots(state.seq, block_BG, state.seq_lengths, num_emit),
        seq_lengths=new_lengths,
        target_cache=target_cache,
        drafter_state=drafter_state,
        features=features,
    )
    status = _update_status(decoder, after, state, num_emit, stopped, is_eos_BG, num_usable)
    return after.replace(status=status)
