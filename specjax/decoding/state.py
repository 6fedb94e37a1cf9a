"""The decoder's constants and the pytrees its loop carries and returns.

`DecodeState` is the loop's carry (plus its models), `GenerationResult` what a
decoder returns, and `GenerationStats` the counters both hold. Nothing here runs a
model: the loop is `specjax.decoding.loop`, the checks of the inputs that fill a
state are `specjax.decoding.checks`, and the `Decoder` is built by
`specjax.decoding.build`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding.slots import PromptOutputs, PromptQueue
from specjax.drafters.base import step_slots
from specjax.sampling import SamplingConfig

# Default cache lengths are rounded up to this multiple, so that nearby values
# of max_new_tokens (or prompt lengths) share one compiled program.
CACHE_BUCKET = 64
# Prompt widths are padded up to this multiple, for the same reason; the padding is
# written to cache slots that are overwritten before they are read.
PROMPT_BUCKET = 16
# eos ids are padded with -1 (never a token) to a multiple of this, so that None, one
# id and a few ids are one compiled program.
EOS_BUCKET = 8
VERIFICATIONS = ("rejection", "coupled")


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (one of the buckets above)."""
    return -(-n // multiple) * multiple


@struct.dataclass
class GenerationStats:
    """Counters of one decoding run.

    Attributes:
        target_calls: ``int32[]`` target forward calls in the loop (iterations).
        row_target_calls: ``int32[N]`` iterations in which each prompt was active
            (per slot, ``[B]``, inside a `DecodeState`).
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
class Decoder:
    """What stays fixed while a batch decodes: the models, the options and the features.

    Attributes:
        target: the target model (model contract).
        drafter: the `Drafter`; `~specjax.drafters.NoDraft` for plain decoding.
        features: the per-row `~specjax.decoding.features.RowFeature` parts, in the
            order they run (their tables are traced, their options static).
        eos_ids: ``int32[K]`` ids that end a row (``-1`` pads).
        draft_confidence: ``float32[]`` τ, or ``None``: a row stops proposing after
            its first draft whose own probability is below τ.
        verification: static ``"rejection"`` or ``"coupled"``.
        gamma_table: static ``((max_active_rows, γ), ...)`` pairs, ascending: a step
            with ``a`` active rows drafts the γ of the first pair with
            ``a <= max_active_rows`` (the last pair beyond). Empty: always the
            drafter's γ.
        forward_width: static W: every target forward of the loop scores exactly W
            columns (`specjax.decoding.numerics`), or ``None``: each scores only what
            its step needs (1 for plain decoding, the step's verify width otherwise).
    """

    target: object
    drafter: object
    features: tuple = ()
    eos_ids: jax.Array
    draft_confidence: jax.Array | None = None
    verification: str = struct.field(pytree_node=False, default="rejection")
    gamma_table: tuple[tuple[int, int], ...] = struct.field(pytree_node=False, default=())
    forward_width: int | None = struct.field(pytree_node=False, default=None)

    @property
    def lookahead(self) -> int:
        """Slots one step may write past a row's length: γ + 1 (N + 1 for a tree), or
        the forward width W when it is fixed."""
        return step_slots(self.drafter, self.forward_width)


@struct.dataclass(kw_only=True)
class DecodeState:
    """Everything needed to continue decoding: the loop's carry plus its `Decoder`.

    Build it with :func:`init`, advance it with :func:`step`, read it with
    :func:`result`. `step` donates the state's buffers: use the state it returns,
    not the one passed in. Slots are rows being decoded, ``[B]``; prompts are the N
    rows of the call, served by the slots in turn.

    Attributes:
        decoder: the `Decoder` (models, options, features).
        seq: ``int32[B, S]`` prompt then generated tokens; slot == position.
        seq_lengths: ``int32[B]`` valid tokens per row (prompt + generated).
        prompt_lengths: ``int32[B]``.
        status: the `RowStatus` flags (``done``, ``truncated``, ``invalid``).
        settings: the `RowSettings` of each slot's prompt.
        target_cache: the target's cache.
        drafter_state: whatever the drafter carries (e.g. its cache).
        features: each feature's per-slot state, in ``decoder.features``' order.
        queue: the `~specjax.decoding.slots.PromptQueue` of all N prompts.
        outputs: the `~specjax.decoding.slots.PromptOutputs` of the prompts handed on.
    """

    decoder: Decoder
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
    def target(self):
        return self.decoder.target

    @property
    def drafter(self):
        return self.decoder.drafter

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

    @property
    def lookahead(self) -> int:
        """Slots one step may write past a row's length (`Decoder.lookahead`)."""
        return self.decoder.lookahead

    @property
    def stats(self) -> GenerationStats:
        """The statistics of the rows in the slots (finished prompts' are in ``outputs``)."""
        return self.feature_state("statistics")

    def feature_state(self, name: str):
        """The per-slot state of the feature called ``name``."""
        for feature, state in zip(self.decoder.features, self.features, strict=True):
            if feature.name == name:
                return state
        raise KeyError(f"no feature {name!r} in this decoder")
