"""Plain and speculative decoding, each one jitted ``lax.while_loop`` on device.

Both loops keep one invariant: a row's cache holds every token of the row
except the newest one, which is "pending" and fed at the start of the next
step. Slot ``s`` of the token buffer and of every cache holds position ``s``,
so rolling a cache back is only a change of per-row lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.drafters import Drafter, prefill
from specjax.sampling import SamplingConfig, check_sampling_config, probs_from_logits, sample
from specjax.verify import rejection_sample, rejection_sample_onehot

# Default cache lengths are rounded up to this multiple, so that nearby values
# of max_new_tokens (or prompt lengths) share one compiled program.
CACHE_BUCKET = 64


@struct.dataclass
class GenerationStats:
    """Counters of one decoding run.

    Attributes:
        target_calls: ``int32[]`` target forward calls in the loop (iterations).
        row_target_calls: ``int32[B]`` iterations in which each row was active.
        drafted: ``int32[B]`` tokens drafted for each row while it was active.
        accepted: ``int32[B]`` drafted tokens the verifier accepted per row.
        accepted_hist: ``int32[γ+1]`` how often 0..γ drafts were accepted in
            one step (over active rows); empty for plain decoding.
    """

    target_calls: jax.Array
    row_target_calls: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    accepted_hist: jax.Array

    @property
    def acceptance_rate(self) -> jax.Array:
        """Accepted / drafted tokens over the whole batch."""
        return jnp.sum(self.accepted) / jnp.maximum(jnp.sum(self.drafted), 1)


@struct.dataclass
class GenerationResult:
    """Output of :func:`generate` and :func:`speculative_generate`.

    Attributes:
        tokens: ``int32[B, N]`` generated tokens (N = ``max_new_tokens``); slots
            at or after a row's length hold ``-1``.
        lengths: ``int32[B]`` tokens generated per row, EOS included.
        from_draft: ``bool[B, N]`` which tokens were accepted drafts (the rest
            came from the target: corrections and bonus tokens).
        truncated: ``bool[B]`` rows stopped because their cache was full before
            reaching EOS or ``max_new_tokens``.
        stats: :class:`GenerationStats`.
    """

    tokens: jax.Array
    lengths: jax.Array
    from_draft: jax.Array
    truncated: jax.Array
    stats: GenerationStats

    @property
    def tokens_per_call(self) -> jax.Array:
        """Mean tokens emitted per target call per row (1.0 for plain decoding)."""
        return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.stats.row_target_calls), 1)

    def to_lists(self) -> list[list[int]]:
        """Each row's generated tokens as a Python list (a host transfer)."""
        tokens, lengths = jax.device_get((self.tokens, self.lengths))
        return [row[:n].tolist() for row, n in zip(tokens, lengths, strict=True)]


@struct.dataclass(kw_only=True)
class DecodeState:
    """The whole carry of the decode loop.

    Attributes:
        seq: ``int32[B, S]`` prompt then generated tokens; slot == position.
        seq_lengths: ``int32[B]`` valid tokens per row (prompt + generated).
        prompt_lengths: ``int32[B]``.
        from_draft: ``bool[B, S]`` slot holds an accepted draft token.
        done: ``bool[B]`` row has stopped.
        truncated: ``bool[B]`` row stopped on a full cache.
        target_cache: the target's :class:`~specjax.models.KVCache`.
        drafter_state: whatever the drafter carries (e.g. its cache).
        key: PRNG key, split every step.
        stats: :class:`GenerationStats`.
    """

    seq: jax.Array
    seq_lengths: jax.Array
    prompt_lengths: jax.Array
    from_draft: jax.Array
    done: jax.Array
    truncated: jax.Array
    target_cache: object
    drafter_state: object
    key: jax.Array
    stats: GenerationStats

    @property
    def num_generated(self) -> jax.Array:
        return self.seq_lengths - self.prompt_lengths


# ----------------------------------------------------------------------------
# Input handling (host side, before anything is compiled).


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def pad_prompts(prompts) -> tuple[jax.Array, jax.Array]:
    """Normalises prompts to right-padded ``int32[B, P]`` plus ``int32[B]`` lengths.

    Args:
        prompts: an integer array ``[B, P]`` (every row a full prompt) or a
            sequence of token-id sequences of possibly different lengths.

    Raises:
        ValueError / TypeError naming ``prompts`` on empty or malformed input.
    """
    if isinstance(prompts, (jax.Array, np.ndarray)):
        if prompts.ndim != 2:
            raise ValueError(f"prompts must be [batch, length], got shape {prompts.shape}")
        if not jnp.issubdtype(prompts.dtype, jnp.integer):
            raise TypeError(f"prompts must hold integer token ids, got dtype {prompts.dtype}")
        b, p = prompts.shape
        if b < 1 or p < 1:
            raise ValueError(
                f"prompts must have at least one row and one token, got {prompts.shape}"
            )
        return jnp.asarray(prompts, jnp.int32), jnp.full((b,), p, jnp.int32)
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise TypeError(
            "prompts must be an int array [B, P] or a list of token-id lists, "
            f"got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("prompts is empty: need at least one prompt")
    rows = []
    for i, row in enumerate(prompts):
        arr = np.asarray(row)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {row!r:.60}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"prompts[{i}] must hold integer token ids, got dtype {arr.dtype}")
        rows.append(arr)
    lengths = np.array([len(r) for r in rows], np.int32)
    padded = np.zeros((len(rows), lengths.max()), np.int32)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    return jnp.asarray(padded), jnp.asarray(lengths)


def _check_tokens_in_vocab(prompts_BP, vocab_size: int):
    if _is_concrete(prompts_BP):
        lo, hi = int(jnp.min(prompts_BP)), int(jnp.max(prompts_BP))
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"prompts hold token ids in [{lo}, {hi}], outside the model's vocabulary "
                f"[0, {vocab_size})"
            )


def resolve_cache_len(cache_len, max_prompt_len: int, max_new_tokens, lookahead: int) -> int:
    """The static cache length a decoder uses: ``cache_len`` checked, or the default.

    The default is ``max_prompt_len + max_new_tokens + lookahead`` rounded up to a
    multiple of ``CACHE_BUCKET`` (``lookahead`` is 1 for plain decoding, γ + 1 for
    speculative decoding).
    """
    if cache_len is None:
        if not _is_concrete(max_new_tokens):
            raise ValueError(
                "cache_len must be given explicitly when max_new_tokens is traced "
                "(it fixes the static cache shape)"
            )
        needed = max_prompt_len + int(max_new_tokens) + lookahead
        return -(-needed // CACHE_BUCKET) * CACHE_BUCKET
    if not isinstance(cache_len, (int, np.integer)) or cache_len < 1:
        raise ValueError(f"cache_len must be a positive int, got {cache_len!r}")
    if max_prompt_len + lookahead > cache_len:
        raise ValueError(
            f"the longest prompt ({max_prompt_len} tokens) plus the {lookahead} slots one "
            f"step needs does not fit in cache_len={cache_len}"
        )
    return int(cache_len)


def _check_max_new_tokens(max_new_tokens):
    if _is_concrete(max_new_tokens):
        if jnp.ndim(max_new_tokens) != 0 or int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def _prepare(model, prompts, max_new_tokens, sampling, eos_id, cache_len, lookahead):
    """Validates the inputs of a decoder on the host, before anything compiles.

    Returns:
        ``((prompts_BP, prompt_lengths_B, max_new_tokens, sampling, eos_id), cache_len)``:
        the traced arguments of the jitted loop, and its static cache length.
    """
    sampling = SamplingConfig() if sampling is None else sampling
    check_sampling_config(sampling)
    _check_max_new_tokens(max_new_tokens)
    prompts_BP, lengths_B = pad_prompts(prompts)
    _check_tokens_in_vocab(prompts_BP, model.vocab_size)
    cache_len = resolve_cache_len(cache_len, prompts_BP.shape[1], max_new_tokens, lookahead)
    max_new = jnp.asarray(max_new_tokens, jnp.int32)
    return (prompts_BP, lengths_B, max_new, sampling, _eos_array(eos_id)), cache_len


def _eos_array(eos_id) -> jax.Array:
    # -1 never matches a token, so "no EOS" is the same compiled program.
    return jnp.asarray(-1 if eos_id is None else eos_id, jnp.int32)


def _finish(state: DecodeState, num_out: int) -> GenerationResult:
    """Gathers each row's generated slots into ``[B, num_out]`` (padded with -1)."""
    lengths = state.num_generated
    idx = state.prompt_lengths[:, None] + jnp.arange(num_out)[None]
    valid = jnp.arange(num_out)[None] < lengths[:, None]
    idx = jnp.minimum(idx, state.seq.shape[1] - 1)
    tokens = jnp.where(valid, jnp.take_along_axis(state.seq, idx, axis=1), -1)
    from_draft = valid & jnp.take_along_axis(state.from_draft, idx, axis=1)
    return GenerationResult(
        tokens=tokens,
        lengths=lengths,
        from_draft=from_draft,
        truncated=state.truncated,
        stats=state.stats,
    )


def _initial_state(key, target, prompts_BP, prompt_lengths_B, cache_len, drafter_state, hist_len):
    b, p = prompts_BP.shape
    _, target_cache = prefill(target, prompts_BP, prompt_lengths_B, cache_len)
    seq = jnp.zeros((b, cache_len), jnp.int32).at[:, :p].set(prompts_BP)
    zeros = jnp.zeros((b,), jnp.int32)
    return DecodeState(
        seq=seq,
        seq_lengths=prompt_lengths_B,
        prompt_lengths=prompt_lengths_B,
        from_draft=jnp.zeros((b, cache_len), bool),
        done=jnp.zeros((b,), bool),
        truncated=jnp.zeros((b,), bool),
        target_cache=target_cache,
        drafter_state=drafter_state,
        key=key,
        stats=GenerationStats(
            target_calls=jnp.zeros((), jnp.int32),
            row_target_calls=zeros,
            drafted=zeros,
            accepted=zeros,
            accepted_hist=jnp.zeros((hist_len,), jnp.int32),
        ),
    )


def _write_block(state, block_BT, num_emit_B, num_from_draft_B):
    """Writes ``block[b, :num_emit[b]]`` at each row's own end of sequence."""
    b, t = block_BT.shape
    rows = jnp.arange(b)[:, None]
    slots = state.seq_lengths[:, None] + jnp.arange(t)[None]
    keep = jnp.arange(t)[None] < num_emit_B[:, None]
    safe = jnp.minimum(slots, state.seq.shape[1] - 1)
    new_tok = jnp.where(keep, block_BT, state.seq[rows, safe])
    new_flag = jnp.where(
        keep, jnp.arange(t)[None] < num_from_draft_B[:, None], state.from_draft[rows, safe]
    )
    # mode="drop": a slot past the end of the buffer is never written (or clamped).
    return state.replace(
        seq=state.seq.at[rows, slots].set(new_tok, mode="drop"),
        from_draft=state.from_draft.at[rows, slots].set(new_flag, mode="drop"),
    )


def _stop(state, new_tokens_BT, num_emit_B, active_B, max_new_tokens, eos_id, lookahead):
    """Updates done/truncated after ``num_emit`` tokens were appended per row."""
    emitted = jnp.arange(new_tokens_BT.shape[1])[None] < num_emit_B[:, None]
    hit_eos = jnp.any(emitted & (new_tokens_BT == eos_id), axis=1)
    budget_spent = state.num_generated >= max_new_tokens
    finished = hit_eos | budget_spent
    cache_full = state.seq_lengths + lookahead > state.seq.shape[1]
    return state.replace(
        done=state.done | (active_B & (finished | cache_full)),
        truncated=state.truncated | (active_B & cache_full & ~finished),
    )


# ----------------------------------------------------------------------------
# Plain autoregressive decoding.


def _generate_loop(
    key, model, prompts_BP, prompt_lengths_B, max_new_tokens, sampling, eos_id, cache_len
):
    b = prompts_BP.shape[0]
    rows = jnp.arange(b)
    state = _initial_state(key, model, prompts_BP, prompt_lengths_B, cache_len, (), 0)

    def body(state: DecodeState) -> DecodeState:
        key, step_key = jax.random.split(state.key)
        last = state.seq_lengths - 1
        logits, cache = model(state.seq[rows, last][:, None], last[:, None], state.target_cache)
        token = sample(step_key, probs_from_logits(logits[:, 0], sampling))
        active = ~state.done
        num_emit = active.astype(jnp.int32)
        state = _write_block(state, token[:, None], num_emit, jnp.zeros_like(num_emit))
        stats = state.stats
        state = state.replace(
            seq_lengths=state.seq_lengths + num_emit,
            target_cache=cache.rollback(state.seq_lengths + num_emit - 1),
            key=key,
            stats=stats.replace(
                target_calls=stats.target_calls + 1,
                row_target_calls=stats.row_target_calls + num_emit,
            ),
        )
        return _stop(state, token[:, None], num_emit, active, max_new_tokens, eos_id, 1)

    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


_generate_jit = jax.jit(_generate_loop, static_argnames=("cache_len",))


def generate(
    key: jax.Array,
    model,
    prompts,
    *,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id: int | None = None,
    cache_len: int | None = None,
) -> GenerationResult:
    """Plain autoregressive decoding: prefill, then one ``lax.while_loop``.

    The baseline speculative decoding must match. Compiles once per
    (model, batch size, prompt width, ``cache_len``); temperature, top-k/p,
    ``max_new_tokens`` (within one cache bucket), ``eos_id`` and the prompt
    contents are traced.

    Args:
        key: PRNG key (unused at temperature 0, but always required).
        model: a model following the contract (e.g. :class:`specjax.Model`).
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens to generate per row (>= 1), EOS included.
        sampling: :class:`SamplingConfig`; default samples at temperature 1.
        eos_id: optional token that ends a row (it is emitted).
        cache_len: static cache length S; default ``P + max_new_tokens + 1``
            rounded up to a multiple of 64.

    Returns:
        :class:`GenerationResult` with ``tokens int32[B, max_new_tokens]``.

    Example:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> out = specjax.generate(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=5,
        ...                        sampling=specjax.SamplingConfig.greedy())
        >>> out.tokens.shape
        (1, 5)
    """
    args, cache_len = _prepare(model, prompts, max_new_tokens, sampling, eos_id, cache_len, 1)
    state = _generate_jit(key, model, *args, cache_len=cache_len)
    return _finish(state, _output_width(max_new_tokens, cache_len))


def _output_width(max_new_tokens, cache_len):
    return int(max_new_tokens) if _is_concrete(max_new_tokens) else cache_len


# ----------------------------------------------------------------------------
# Speculative decoding.


def _speculative_loop(
    key, target, drafter, prompts_BP, prompt_lengths_B, max_new_tokens, sampling, eos_id, cache_len
):
    gamma = drafter.num_draft
    b = prompts_BP.shape[0]
    rows = jnp.arange(b)
    lookahead = gamma + 1  # slots one step may write past a row's length
    drafter_state = drafter.init(prompts_BP, prompt_lengths_B, cache_len)
    state = _initial_state(
        key, target, prompts_BP, prompt_lengths_B, cache_len, drafter_state, gamma + 1
    )

    def body(state: DecodeState) -> DecodeState:
        key, draft_key, verify_key = jax.random.split(state.key, 3)
        lengths = state.seq_lengths
        proposal = drafter.propose(draft_key, state.drafter_state, state.seq, lengths, sampling)

        # Score the pending token and the γ drafts in one target call.
        pending = state.seq[rows, lengths - 1]
        tokens_in = jnp.concatenate([pending[:, None], proposal.tokens], axis=1)
        positions = (lengths - 1)[:, None] + jnp.arange(gamma + 1)[None]
        logits, target_cache = target(tokens_in, positions, state.target_cache)
        target_probs = probs_from_logits(logits, sampling)
        if proposal.probs is None:
            block, num_accepted = rejection_sample_onehot(verify_key, proposal.tokens, target_probs)
        else:
            block, num_accepted = rejection_sample(
                verify_key, proposal.tokens, proposal.probs, target_probs
            )

        # Emit accepted drafts + the correction/bonus token, cut after EOS and
        # at the row's token budget; finished rows emit nothing.
        active = ~state.done
        t = jnp.arange(gamma + 1)[None]
        is_eos = (block == eos_id) & (t <= num_accepted[:, None])
        eos_cut = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, gamma + 1)
        budget = max_new_tokens - state.num_generated
        num_emit = jnp.minimum(jnp.minimum(num_accepted + 1, eos_cut), budget)
        num_emit = jnp.where(active, num_emit, 0)
        state = _write_block(state, jnp.maximum(block, 0), num_emit, num_accepted)

        new_lengths = lengths + num_emit
        active_i = active.astype(jnp.int32)
        accepted_one_hot = (
            jax.nn.one_hot(num_accepted, gamma + 1, dtype=jnp.int32) * active_i[:, None]
        )
        stats = state.stats
        state = state.replace(
            seq_lengths=new_lengths,
            target_cache=target_cache.rollback(new_lengths - 1),
            drafter_state=drafter.update(proposal.state, new_lengths),
            key=key,
            stats=stats.replace(
                target_calls=stats.target_calls + 1,
                row_target_calls=stats.row_target_calls + active_i,
                drafted=stats.drafted + gamma * active_i,
                accepted=stats.accepted + num_accepted * active_i,
                accepted_hist=stats.accepted_hist + jnp.sum(accepted_one_hot, axis=0),
            ),
        )
        return _stop(state, block, num_emit, active, max_new_tokens, eos_id, lookahead)

    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


_speculative_jit = jax.jit(_speculative_loop, static_argnames=("cache_len",))


def check_drafter(target, drafter: Drafter):
    """Raises ValueError if ``drafter`` cannot serve ``target``."""
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a specjax Drafter, got {type(drafter).__name__}")
    gamma = drafter.num_draft
    if not isinstance(gamma, (int, np.integer)) or gamma < 1:
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    if drafter.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"drafter vocabulary size {drafter.vocab_size} differs from the target's "
            f"{target.vocab_size}: speculative decoding needs one shared vocabulary"
        )


def speculative_generate(
    key: jax.Array,
    target,
    drafter: Drafter,
    prompts,
    *,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id: int | None = None,
    cache_len: int | None = None,
) -> GenerationResult:
    """Speculative decoding in one jitted ``lax.while_loop``, exact in distribution.

    Every step the drafter proposes γ tokens per row, the target scores the
    row's pending token and the γ drafts in one forward, and rejection sampling
    (greedy matching at temperature 0) keeps a prefix per row plus one target
    token. Rows accept different numbers of tokens and stop independently; the
    loop ends when every row is done. There is no host round trip inside.

    The output has exactly the distribution of :func:`generate` with the same
    target and ``sampling`` (token for token at temperature 0); only the keys
    are consumed differently, so the two do not give the same sample for one key.

    Args:
        key: PRNG key.
        target: the target model (model contract).
        drafter: a :class:`~specjax.drafters.Drafter` (e.g. ``DraftModel``,
            ``PromptLookup``) with the target's vocabulary.
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens to generate per row (>= 1), EOS included.
        sampling: :class:`SamplingConfig` applied identically to target and draft.
        eos_id: optional token that ends a row; drafts after it are discarded.
        cache_len: static cache length S; default ``P + max_new_tokens + γ + 1``
            rounded up to a multiple of 64. A row that would overflow it stops
            and is flagged in ``truncated``.

    Returns:
        :class:`GenerationResult` with ``tokens int32[B, max_new_tokens]``.

    Example:
        >>> import jax, specjax
        >>> target = specjax.testing.tiny_model(seed=0)
        >>> drafter = specjax.DraftModel(specjax.testing.tiny_model(seed=1), num_draft=3)
        >>> out = specjax.speculative_generate(jax.random.key(0), target, drafter, [[1, 2, 3]],
        ...                                    max_new_tokens=6)
        >>> out.tokens.shape
        (1, 6)
    """
    check_drafter(target, drafter)
    lookahead = drafter.num_draft + 1
    args, cache_len = _prepare(
        target, prompts, max_new_tokens, sampling, eos_id, cache_len, lookahead
    )
    state = _speculative_jit(key, target, drafter, *args, cache_len=cache_len)
    return _finish(state, _output_width(max_new_tokens, cache_len))
