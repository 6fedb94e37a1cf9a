"""The decoder's constants and the pytrees its loop carries and returns.

`DecodeState` is the loop's carry, `GenerationResult` what a decoder returns, and
`GenerationStats` the counters it reports. Nothing here runs a model: what stays
fixed while a batch decodes (the models, the options, the features) is the
`~specjax.decoding.decoder.Decoder`, the loop is `specjax.decoding.loop`, and the
checks of the inputs that fill a state are `specjax.decoding.checks`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.slots import PromptOutputs, PromptQueue
from specjax.sampling import SamplingConfig
from specjax.verification.verifiers import VERIFIERS

# Default cache lengths are rounded up to this multiple, so that nearby values
# of max_new_tokens (or prompt lengths) share one compiled program.
CACHE_BUCKET = 64
# Prompt widths are padded up to this multiple, for the same reason; the padding is
# written to cache slots that are overwritten before they are read.
PROMPT_BUCKET = 16
# eos ids are padded with -1 (never a token) to a multiple of this, so that None, one
# id and a few ids are one compiled program.
EOS_BUCKET = 8
# The names ``verification=`` takes (`specjax.verification.verifiers`).
VERIFICATIONS = tuple(VERIFIERS)


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (one of the buckets above)."""
    return -(-n // multiple) * multiple


@struct.dataclass
class GenerationStats:
    """Counters of one decoding run.

    Attributes:
        target_calls: ``int32[]`` target forward calls in the loop (iterations).
        row_target_calls: ``int32[N]`` iterations in which each prompt was active.
        drafted: ``int32[N]`` tokens drafted (proposed) for each prompt.
        accepted: ``int32[N]`` drafted tokens the verifier accepted per prompt.
        accepted_hist: ``int32[γ+1]`` how often 0..γ drafts were accepted in
            one step (over active rows); one bin for plain decoding.
        position_drafted: ``int32[γ]`` drafts proposed at each draft position
            (position 0 is the first draft of a step), over active rows and steps;
            a tree's positions are its depths. Steps with a smaller γ (adaptive γ,
            ``draft_confidence``) propose fewer positions.
        position_reached: ``int32[γ]`` of those, the drafts the verifier judged: every
            earlier draft of the step was accepted.
        position_accepted: ``int32[γ]`` of those, the drafts it accepted.
    """

    target_calls: jax.Array
    row_target_calls: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    accepted_hist: jax.Array
    position_drafted: jax.Array
    position_reached: jax.Array
    position_accepted: jax.Array

    @property
    def acceptance_rate(self) -> jax.Array:
        """Accepted / drafted tokens over the whole batch."""
        return jnp.sum(self.accepted) / jnp.maximum(jnp.sum(self.drafted), 1)

    @property
    def row_acceptance_rate(self) -> jax.Array:
        """``float32[N]`` accepted / drafted tokens of each prompt (0 where none drafted)."""
        return self.accepted / jnp.maximum(self.drafted, 1)

    @property
    def acceptance_by_position(self) -> jax.Array:
        """``float32[γ]`` α_i: how often the draft at position i was accepted when judged.

        ``position_accepted / position_reached`` (0 where never judged): the per-draft
        acceptance the verifier decides, not diluted by drafts cut off by an earlier
        rejection. Their running product is the chance a step accepts i+1 drafts.
        """
        return self.position_accepted / jnp.maximum(self.position_reached, 1)


@struct.dataclass
class GenerationResult:
    """Output of :func:`generate`, :func:`speculative_generate` and :func:`result`.

    Attributes:
        tokens: ``int32[N, W]`` generated tokens of the N prompts, in prompt order
            (W = the largest ``max_new_tokens``, or fewer when the cache cannot hold
            that many); slots at or after a row's length hold ``-1``.
        lengths: ``int32[N]`` tokens generated per prompt, EOS included.
        from_draft: ``bool[N, W]`` which tokens were accepted drafts (the rest
            came from the target: corrections and bonus tokens).
        logprobs: ``float32[N, W]`` the target's log-probability of each token under
            the processed distribution it was sampled from (0 for greedy rows, whose
            distribution is one-hot); ``0`` after a row's length.
        top_ids: ``int32[N, W, k]`` with ``top_logprobs=k``: the k most probable ids at
            each emitted position, most probable first (ties: the lowest id); ``-1``
            after a row's length. ``k = 0`` (default): ``[N, W, 0]``.
        top_logprobs: ``float32[N, W, k]`` their log-probabilities, from the same
            processed distribution as ``logprobs`` (greedy rows: ``0`` then ``-inf``),
            or from the raw logits' log-softmax with ``raw_logprobs=True``.
        truncated: ``bool[N]`` rows stopped because their cache was full before
            reaching EOS or ``max_new_tokens``.
        invalid: ``bool[N]`` rows stopped because the target's logits were NaN or all
            ``-inf`` at the next position (a broken model or input); nothing is
            emitted for that position.
        stats: :class:`GenerationStats`.
        extras: what features plugged in with ``features=`` return, by feature name
            (`specjax.decoding.features.RowFeature.result`); empty by default.
    """

    tokens: jax.Array
    lengths: jax.Array
    from_draft: jax.Array
    logprobs: jax.Array
    truncated: jax.Array
    invalid: jax.Array
    stats: GenerationStats
    top_ids: jax.Array
    top_logprobs: jax.Array
    extras: dict = struct.field(default_factory=dict)

    @property
    def tokens_per_call(self) -> jax.Array:
        """Mean tokens emitted per target call per row (1.0 for plain decoding)."""
        return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.stats.row_target_calls), 1)

    def to_lists(self) -> list[list[int]]:
        """Each row's generated tokens as a Python list (a host transfer)."""
        tokens, lengths = jax.device_get((self.tokens, self.lengths))
        return [row[:n].tolist() for row, n in zip(tokens, lengths, strict=True)]


@struct.dataclass
class RowStatus:
    """Why rows stopped, per slot.

    Attributes:
        done: ``bool[B]`` the row has stopped.
        truncated: ``bool[B]`` it stopped on a full cache.
        invalid: ``bool[B]`` it stopped on a NaN or empty target distribution.
    """

    done: jax.Array
    truncated: jax.Array
    invalid: jax.Array

    @classmethod
    def starting(cls, done_B: jax.Array, truncated_B: jax.Array) -> RowStatus:
        return cls(done=done_B, truncated=truncated_B, invalid=jnp.zeros_like(done_B))


@struct.dataclass
class RowSettings:
    """What a row takes from its prompt: its randomness, sampling settings and budget.

    ``[B]`` leaves per slot (`DecodeState.settings`), ``[N]`` per prompt
    (`~specjax.decoding.slots.PromptQueue.settings`); a refill copies one into the other.

    Attributes:
        keys: ``key[B]`` ``fold_in(key, seed)``: the row's own randomness.
        sampling: `SamplingConfig` with ``[B]`` leaves (``vocab_limit`` resolved).
        max_new_tokens: ``int32[B]`` the row's token budget.
    """

    keys: jax.Array
    sampling: SamplingConfig
    max_new_tokens: jax.Array


@struct.dataclass(kw_only=True)
class DecodeState:
    """The decode loop's carry: everything that changes while a batch decodes.

    Build it with `specjax.decoding.init` (which also returns its
    `~specjax.decoding.Decoder`), advance it with `specjax.decoding.run`, read it with
    `specjax.decoding.result`. `run` donates the state's buffers: use the state it
    returns, not the one passed in. Slots are rows being decoded, ``[B]``; prompts are
    the N rows of the call, served by the slots in turn. Every per-slot leaf carries
    the slots on one axis, so a refill writes a slot as one row
    (`~specjax.decoding.slots.insert_row`).

    Attributes:
        step: ``int32[]`` loop iterations run so far (each one target forward).
        seq: ``int32[B, S]`` prompt then generated tokens; slot == position.
        seq_lengths: ``int32[B]`` valid tokens per row (prompt + generated).
        prompt_lengths: ``int32[B]``.
        status: the `RowStatus` flags (``done``, ``truncated``, ``invalid``).
        settings: the `RowSettings` of each slot's prompt.
        target_cache: the target's cache.
        drafter_state: whatever the drafter carries (e.g. its cache).
        features: each feature's per-slot state, in the decoder's ``features`` order.
        queue: the `~specjax.decoding.slots.PromptQueue` of all N prompts.
        outputs: the `~specjax.decoding.slots.PromptOutputs` of the prompts handed on.
    """

    step: jax.Array
    seq: jax.Array
    seq_lengths: jax.Array
    prompt_lengths: jax.Array
    status: RowStatus
    settings: RowSettings
    target_cache: object
    drafter_state: object
    features: tuple
    queue: PromptQueue
    outputs: PromptOutputs

    @property
    def done(self) -> jax.Array:
        """``bool[B]`` the slot's row has stopped."""
        return self.status.done

    @property
    def sampling(self) -> SamplingConfig:
        """The slots' `SamplingConfig` (``[B]`` leaves)."""
        return self.settings.sampling

    @property
    def num_generated(self) -> jax.Array:
        """``int32[B]`` tokens generated so far per row."""
        return self.seq_lengths - self.prompt_lengths
