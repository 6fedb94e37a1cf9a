"""The decode loop, as pure functions: one step, and the ``lax.while_loop`` that runs it.

A step (`_decode_step`) drafts γ tokens per row (or the drafter's tree), scores the
pending token and the drafts in one target call, verifies them exactly
(`_verify_chain`, `_verify_tree`) and commits the emitted tokens (`_commit`). `_run`
repeats it, with a refill of finished slots (`specjax.decoding.refill`) after every
step, until every row is done or a step budget runs out.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import noise
from specjax.constraints import AutomatonCursor
from specjax.decoding.refill import _refill
from specjax.decoding.state import DecodeState
from specjax.drafters.base import score
from specjax.models.cache import TreeMask
from specjax.penalties import along_drafts, constrain, prefix_counts
from specjax.sampling import mask_vocab, probs_from_logits
from specjax.stops import first_stop
from specjax.tree import path_nodes_with_root, tree_verify
from specjax.verify import coupled_verify, rejection_sample, rejection_sample_onehot
from specjax.vocab import pad_to_vocab


def _draft_probs(proposal, drafter, batch: int, gamma: int, vocab: int):
    """The proposal's q as ``[B, γ, V]`` (or None), after a trace-time check of its shapes.

    A clear error, not a RoPE one, for a drafter with the wrong shapes. The q of a
    drafter with a smaller vocabulary (``[B, γ, V_d]``) is zero-padded to the target's
    V, which is exact (`specjax.vocab`).
    """
    tokens = proposal.tokens
    if tuple(tokens.shape) != (batch, gamma) or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"drafter.propose must return integer tokens [B, γ] = [{batch}, {gamma}], got "
            f"{tokens.dtype}{list(tokens.shape)}"
        )
    if proposal.probs is None:
        return None
    widths = {vocab, drafter.vocab_size or vocab}
    shape = tuple(proposal.probs.shape)
    if shape[:2] != (batch, gamma) or len(shape) != 3 or shape[2] not in widths:
        expected = " or ".join(f"[{batch}, {gamma}, {w}]" for w in sorted(widths))
        raise ValueError(
            f"drafter.propose must return probs [B, γ, V] = {expected} or None, got {list(shape)}"
        )
    return pad_to_vocab(proposal.probs, vocab)


def _write(buffer_BS, values_BT, start_B, count_B):
    """``buffer[b, start[b] + t] = values[b, t]`` for ``t < count[b]``; nothing else changes.

    ``buffer`` is ``[B, S, ...]`` and ``values`` ``[B, T, ...]`` (the same trailing axes).
    """
    b, t = values_BT.shape[:2]
    rows = jnp.arange(b)[:, None]
    slots = start_B[:, None] + jnp.arange(t)[None]
    keep = (jnp.arange(t)[None] < count_B[:, None]).reshape((b, t) + (1,) * (values_BT.ndim - 2))
    old = buffer_BS[rows, jnp.minimum(slots, buffer_BS.shape[1] - 1)]
    # mode="drop": a slot past the end of the buffer is never written (or clamped).
    return buffer_BS.at[rows, slots].set(jnp.where(keep, values_BT, old), mode="drop")


def _num_leading_true(flags_BT):
    return jnp.sum(jnp.cumprod(flags_BT.astype(jnp.int32), axis=1), axis=1, dtype=jnp.int32)


def _body(state: DecodeState, gamma: int) -> DecodeState:
    """One loop iteration: a decode step with ``gamma`` drafts, then refills."""
    return _refill(_decode_step(state, gamma))


def _table_index(state: DecodeState) -> jax.Array:
    """The ``gamma_table`` entry for the number of active rows now."""
    table = state.gamma_table
    max_rows = jnp.asarray([rows for rows, _ in table], jnp.int32)
    active = jnp.sum(~state.done, dtype=jnp.int32)
    return jnp.minimum(jnp.searchsorted(max_rows, active), len(table) - 1)


def _confident_drafts(draft_tokens_BG, draft_probs_BGV, threshold):
    """``int32[B]`` drafts each row proposes: up to and including its first below τ.

    A row stops proposing after the first draft whose own probability ``q_i(x_i)`` is
    below τ, as HF's ``assistant_confidence_threshold`` does. That draft is still
    proposed: whether position i is proposed must depend only on the drafts before
    it. Cutting *at* the unconfident draft would make the proposal at i ``q_i``
    restricted to confident tokens while the verifier divides by ``q_i``, which is not
    exact (``tests/test_verify.py`` has that bug as a control, rejected).
    """
    gamma = draft_tokens_BG.shape[1]
    q_at_BG = jnp.take_along_axis(draft_probs_BGV, draft_tokens_BG[..., None], axis=-1)[..., 0]
    return jnp.minimum(_num_leading_true(q_at_BG >= threshold) + 1, gamma)


def _score_drafted(target, drafter, tokens_BG1, positions_BG1, cache, width_index):
    """The verify forward over only the ``width_index + 1`` leading positions.

    One precompiled forward per width, picked on device by ``lax.switch``; logits
    (and features) are padded back to ``γ + 1`` columns. The padding is never read:
    no row drafted that far, so nothing there can be accepted or emitted.
    """
    g1 = tokens_BG1.shape[1]

    def forward(width):
        def run(cache):
            logits, cache, features = score(
                target, tokens_BG1[:, :width], positions_BG1[:, :width], cache,
                drafter.target_layers,
            )  # fmt: skip
            pad = [(0, 0), (0, g1 - width), (0, 0)]
            if features is not None:
                # Positions stay real, so padded features land only in stale slots.
                features = features.replace(
                    hidden=jnp.pad(features.hidden, pad), positions=positions_BG1
                )
            return jnp.pad(logits, pad), cache, features

        return run

    return jax.lax.switch(width_index, [forward(w) for w in range(1, g1 + 1)], cache)


@struct.dataclass
class _Verified:
    """What one step's verification decided, before it is committed (`_commit`).

    Attributes:
        drafter: the drafter as it ran this step (γ may differ from the state's).
        drafter_state: the proposal's drafter state.
        block: ``int32[B, G]`` the chain layout: accepted drafts, the target's token, -1.
        num_accepted: ``int32[B]``.
        num_drafted: ``int32[B]`` drafts the row proposed (the statistics' count).
        probs: ``float32[B, G, V]`` the target's p that decided each emitted position.
        usable: ``bool[B, G]`` that p is a distribution (not NaN / all masked).
        target_cache: the target's cache, slot == position for the emitted positions.
        features: the drafter's `TargetFeatures` at the G emitted positions, or None.
        logits: ``[B, G, V]`` the target's raw logits at the emitted positions (read
            only for raw top log-probabilities).
    """

    drafter: object
    drafter_state: object
    block: jax.Array
    num_accepted: jax.Array
    num_drafted: jax.Array
    probs: jax.Array
    usable: jax.Array
    target_cache: object
    features: object
    logits: jax.Array


def _usable(logits_BTV, sampling) -> jax.Array:
    """``bool[B, T]``: the logits give a distribution (not NaN or all -inf below the limit,
    and some id the row's constraint allows there, when ``sampling.automaton`` is set).

    One reduction: max propagates NaN, and NaN > -inf is False.
    """
    return jnp.max(constrain(mask_vocab(logits_BTV, sampling.vocab_limit), sampling), -1) > -jnp.inf


def _cursor(state: DecodeState):
    """The rows' `AutomatonCursor` after their committed tokens, or None (no constraint)."""
    if state.constraint is None:
        return None
    return AutomatonCursor(state.constraint, state.automaton_state, state.eos_ids)


def _step_keys(state: DecodeState, width: int):
    """``(positions_BW, keys_BW)``: input i scores position ``length + i`` with its keys."""
    positions_BW = (state.seq_lengths - 1)[:, None] + jnp.arange(width)[None]
    return positions_BW, noise.position_keys(state.row_keys, positions_BW + 1)


def _cursor_along(cursor_B, drafts_BG):
    """The ``[B, G+1]`` cursor the verifier masks p with (position i: after drafts
    0..i-1), or None without a constraint."""
    return None if cursor_B is None else cursor_B.along(drafts_BG)


def _draft_keys(state: DecodeState, keys_BG1, gamma: int):
    draft_stream = noise.SAMPLE if state.verification == "coupled" else noise.DRAFT
    return noise.stream(keys_BG1[:, :gamma], draft_stream)


def _pad_columns(x_BT, width: int, value):
    """``x`` ``[B, T, ...]`` padded along axis 1 to ``width`` columns with ``value``."""
    pad = [(0, 0), (0, width - x_BT.shape[1])] + [(0, 0)] * (x_BT.ndim - 2)
    return jnp.pad(x_BT, pad, constant_values=value)


def _score_fixed(target, drafter, tokens_BW, positions_BW, cache, num_features: int):
    """The verify forward over all W columns, which XLA may not narrow.

    The logits of columns no row can emit are never read, and XLA would otherwise be
    free to drop them and shrink the last layer's and the head's products to fewer
    rows: another kernel, so other rounding, and a column's logits would depend on how
    much of the forward is read. The barrier keeps every product W rows wide. The
    features are cut to the ``num_features`` leading columns (the drafter's γ + 1).
    """
    logits_BWV, cache, features = score(
        target, tokens_BW, positions_BW, cache, drafter.target_layers
    )
    if features is None:
        return jax.lax.optimization_barrier(logits_BWV), cache, None
    logits_BWV, hidden = jax.lax.optimization_barrier((logits_BWV, features.hidden))
    features = features.replace(
        hidden=hidden[:, :num_features], positions=positions_BW[:, :num_features]
    )
    return logits_BWV, cache, features


def _verify_chain(state: DecodeState, gamma: int) -> _Verified:
    """Drafts a chain of ``gamma`` tokens, scores it in one target call, verifies it.

    The target scores ``W = γ + 1`` columns, or the state's fixed forward width: then
    the chain is padded with drafts that were not proposed (-1, fed to the target as
    id 0 at the following positions), which every verifier rejects, so the step is
    the same verification over W columns. Plain decoding (the null drafter) is coupled
    verification of such a chain: its token at each position is the target's sample
    there, drawn exactly as coupled speculative decoding draws it.
    """
    target = state.target
    drafter = state.drafter
    if gamma != drafter.num_draft:
        drafter = drafter.replace(num_draft=gamma)
    if state.draft_confidence is not None and drafter.stops_early:
        drafter = drafter.replace(stop_below=state.draft_confidence)
    b = state.seq.shape[0]
    rows = jnp.arange(b)
    lengths = state.seq_lengths
    g1 = gamma + 1
    width = g1 if state.forward_width is None else state.forward_width
    positions_BW, keys_BW = _step_keys(state, width)
    counts_BV = prefix_counts(state, target.vocab_size)
    cursor_B = _cursor(state)
    proposal = drafter.propose(
        _draft_keys(state, keys_BW, gamma), state.drafter_state, state.seq, lengths,
        state.sampling.replace(counts=counts_BV, automaton=cursor_B),
    )  # fmt: skip
    draft_probs = _draft_probs(proposal, drafter, b, gamma, target.vocab_size)
    draft_tokens_BG = proposal.tokens.astype(jnp.int32)
    active = ~state.done

    stopped_itself = proposal.num_drafted is not None
    if (
        state.draft_confidence is not None
        and draft_probs is None
        and not stopped_itself
        and gamma > 0
    ):
        raise ValueError(
            f"draft_confidence needs a drafter that returns its q, and the "
            f"{type(drafter).__name__} proposes one-hot drafts (probs=None): use a "
            "drafter that samples its drafts and returns their q (Proposal.probs)"
        )
    if state.draft_confidence is None or gamma == 0:
        num_drafted = jnp.full((b,), gamma, jnp.int32)
    else:
        num_drafted = (
            proposal.num_drafted.astype(jnp.int32)
            if stopped_itself
            else _confident_drafts(draft_tokens_BG, draft_probs, state.draft_confidence)
        )
    # A draft that was not proposed reads as out of vocabulary (-1): every verifier
    # rejects it with q := 0, so the row's next token comes from p itself, exactly.
    chain_BW1 = _pad_columns(
        jnp.where(jnp.arange(gamma)[None] < num_drafted[:, None], draft_tokens_BG, -1),
        width - 1, -1,
    )  # fmt: skip
    # Score the pending token and the chain in one target call; a drafter's features
    # come out of this same forward (no second target call).
    pending_B = state.seq[rows, lengths - 1]
    tokens_in = jnp.concatenate([pending_B[:, None], jnp.maximum(chain_BW1, 0)], axis=1)
    if state.forward_width is None and state.draft_confidence is not None and gamma > 0:
        width_index = jnp.max(jnp.where(active, num_drafted, 0))
        logits_BWV, target_cache, features = _score_drafted(
            target, drafter, tokens_in, positions_BW, state.target_cache, width_index
        )
    else:
        logits_BWV, target_cache, features = _score_fixed(
            target, drafter, tokens_in, positions_BW, state.target_cache, g1
        )
    # Position i's penalties count the prefix and drafts 0..i-1 (`specjax.penalties`);
    # its constraint mask is the automaton's state after them (`specjax.constraints`).
    counts_BWV = along_drafts(state.sampling, counts_BV, chain_BW1)
    scored = state.sampling.replace(counts=counts_BWV, automaton=_cursor_along(cursor_B, chain_BW1))
    target_probs = probs_from_logits(logits_BWV, scored)
    if state.verification == "coupled" or drafter.null_drafter:
        block_BW, num_accepted = coupled_verify(keys_BW, chain_BW1, target_probs)
    elif draft_probs is None:
        block_BW, num_accepted = rejection_sample_onehot(keys_BW, chain_BW1, target_probs)
    else:
        block_BW, num_accepted = rejection_sample(
            keys_BW, chain_BW1, _pad_columns(draft_probs, width - 1, 0.0), target_probs
        )
    return _Verified(
        drafter=drafter, drafter_state=proposal.state, block=block_BW,
        num_accepted=num_accepted, num_drafted=num_drafted, probs=target_probs,
        usable=_usable(logits_BWV, scored), target_cache=target_cache,
        features=features, logits=logits_BWV,
    )  # fmt: skip


def _verify_tree(state: DecodeState) -> _Verified:
    """Drafts the drafter's tree, scores all N + 1 nodes in one target call, verifies it.

    The root (the pending token) is at slot ``last`` and node j at slot ``last + j``,
    each at position ``last + depth``, attending to its ancestors only. At a fixed
    forward width W the nodes are followed by ``W - N - 1`` padding columns at later
    slots and positions, each seeing only itself, and p and the target's samples are
    computed at every column (`specjax.tree.tree_verify`'s ``every_node``). After the
    exact walk the accepted path is moved to consecutive slots, and the path's
    probabilities and features are what the commit reads.
    """
    target, drafter = state.target, state.drafter
    tree = drafter.tree
    b = state.seq.shape[0]
    rows = jnp.arange(b)
    last = state.seq_lengths - 1
    depth, n1 = tree.depth, tree.num_nodes + 1
    width = n1 if state.forward_width is None else state.forward_width
    _, keys_BD1 = _step_keys(state, depth + 1)
    proposal = drafter.propose(
        _draft_keys(state, keys_BD1, depth), state.drafter_state, state.seq,
        state.seq_lengths, state.sampling,
    )  # fmt: skip
    node_tokens = proposal.tokens
    if tuple(node_tokens.shape) != (b, tree.num_nodes) or proposal.probs is not None:
        raise ValueError(
            f"a tree drafter's propose must return tokens [B, N] = [{b}, {tree.num_nodes}] "
            f"and probs=None; got tokens{list(node_tokens.shape)}, probs "
            f"{None if proposal.probs is None else list(proposal.probs.shape)}"
        )
    node_tokens = node_tokens.astype(jnp.int32)
    tokens_in = _pad_columns(
        jnp.concatenate([state.seq[rows, last][:, None], node_tokens], axis=1), width, 0
    )
    # Padding sees only itself, and no node sees it (its slots follow the tree region).
    visible = np.eye(width, dtype=bool)
    visible[:n1, :n1] = tree.ancestors
    depth_W = np.concatenate([tree.depths, depth + np.arange(1, width - n1 + 1)])
    mask = TreeMask(
        start=last, slots=last[:, None] + jnp.arange(width)[None], visible=jnp.asarray(visible)
    )
    logits_BWV, target_cache, features = score(
        target, tokens_in, last[:, None] + jnp.asarray(depth_W)[None], state.target_cache,
        drafter.target_layers, tree=mask,
    )  # fmt: skip
    fixed = state.forward_width is not None
    if fixed:  # as in `_score_fixed`: every product stays W rows wide
        logits_BWV, features = jax.lax.optimization_barrier((logits_BWV, features))
    # Logits in: only the D + 1 nodes on the path become distributions (all W at a fixed
    # width).
    cursor_B = _cursor(state)
    block_BD1, num_accepted, path_BD, probs_BD1V = tree_verify(
        keys_BD1, node_tokens, logits_BWV if fixed else logits_BWV[:, :n1], tree,
        state.sampling.replace(automaton=cursor_B), every_node=fixed,
    )  # fmt: skip
    nodes_BD1 = path_nodes_with_root(path_BD)
    along = lambda x_BN1: jnp.take_along_axis(  # noqa: E731
        x_BN1, nodes_BD1.reshape(b, depth + 1, *([1] * (x_BN1.ndim - 2))), axis=1
    )
    if features is not None:
        features = features.replace(
            hidden=along(features.hidden), positions=last[:, None] + jnp.arange(depth + 1)[None]
        )
    return _Verified(
        drafter=drafter, drafter_state=drafter.keep_path(proposal.state, last, path_BD),
        block=block_BD1, num_accepted=num_accepted,
        num_drafted=jnp.full((b,), depth, jnp.int32),
        probs=probs_BD1V,
        usable=_usable(
            along(logits_BWV),
            state.sampling.replace(automaton=_cursor_along(cursor_B, block_BD1[:, :depth])),
        ),
        target_cache=target_cache.compact_path(last, path_BD), features=features,
        logits=along(logits_BWV),
    )  # fmt: skip


def _decode_step(state: DecodeState, gamma: int) -> DecodeState:
    """One decode step with γ = ``gamma`` drafts (at most the drafter's own γ), or a tree."""
    if state.drafter.tree is not None:
        return _commit(state, _verify_tree(state))
    return _commit(state, _verify_chain(state, gamma))


def _top_logprobs(state: DecodeState, verified: _Verified):
    """``(int32[B, G, k], float32[B, G, k])``: the k most probable ids at each emitted
    position and their log-probabilities, most probable first (ties: lowest id).

    From the processed distribution that decided the position (the one ``logprobs``
    reads), or from the raw logits' log-softmax when the state asks for raw ones. k is
    static: with k = 0 nothing is computed.
    """
    k = state.top_ids.shape[-1]
    b, g1 = verified.block.shape
    if k == 0:
        return jnp.zeros((b, g1, 0), jnp.int32), jnp.zeros((b, g1, 0), jnp.float32)
    if state.raw_logprobs:
        logits = verified.logits.astype(jnp.float32)
        log_dist = jax.nn.log_softmax(jnp.where(jnp.isnan(logits), -jnp.inf, logits), axis=-1)
    else:
        log_dist = jnp.log(verified.probs)
    values, ids = jax.lax.top_k(log_dist, k)
    return ids.astype(jnp.int32), values


def _commit(state: DecodeState, verified: _Verified) -> DecodeState:
    """Emits the verified tokens, cut at EOS and budgets, and advances every row."""
    max_gamma = state.drafter.num_draft
    block_BG1, num_accepted = verified.block, verified.num_accepted
    offsets = jnp.arange(block_BG1.shape[1])
    lengths = state.seq_lengths
    active = ~state.done
    # A position with no distribution (NaN or all -inf logits): emit nothing from it on,
    # and flag the row when it is the next position.
    num_usable = _num_leading_true(verified.usable)

    # Emit accepted drafts + the correction/bonus token, cut after EOS and
    # at the row's token budget; finished rows emit nothing.
    is_eos_BG1 = jnp.any(block_BG1[..., None] == state.eos_ids[None, None], axis=-1)
    is_eos_BG1 &= offsets[None] <= num_accepted[:, None]
    eos_cut = jnp.where(
        jnp.any(is_eos_BG1, axis=1), jnp.argmax(is_eos_BG1, axis=1) + 1, block_BG1.shape[1]
    )
    budget = state.max_new_tokens - state.num_generated
    num_emit = jnp.minimum(jnp.minimum(num_accepted + 1, eos_cut), jnp.minimum(budget, num_usable))
    if state.stop is not None:  # cut after the token that completes a stop string
        stop_cut, stop_hit = first_stop(
            state.stop, state.stop.active[state.queue.slot_prompt], state.seq,
            state.prompt_lengths, lengths, jnp.maximum(block_BG1, 0),
        )  # fmt: skip
        stopped = stop_hit & (stop_cut <= num_emit)
        num_emit = jnp.minimum(num_emit, stop_cut)
    else:
        stopped = jnp.zeros_like(active)
    if state.constraint is not None:
        # The automaton along the block; a row ends with the token that completes its
        # language (nothing can follow), as with a stop string.
        states_BG1 = _cursor(state).along(block_BG1).states[:, 1:]
        complete_BG1 = state.constraint.complete[states_BG1]
        complete_cut = jnp.where(
            jnp.any(complete_BG1, axis=1), jnp.argmax(complete_BG1, axis=1) + 1, block_BG1.shape[1]
        )
        stopped |= jnp.any(complete_BG1, axis=1) & (complete_cut <= num_emit)
        num_emit = jnp.minimum(num_emit, complete_cut)
    num_emit = jnp.where(active, jnp.maximum(num_emit, 0), 0)
    block_BG1 = jnp.maximum(block_BG1, 0)
    logprobs_BG1 = jnp.log(jnp.take_along_axis(verified.probs, block_BG1[..., None], -1)[..., 0])
    top_ids_BG1K, top_logprobs_BG1K = _top_logprobs(state, verified)

    new_lengths = lengths + num_emit
    active_i = active.astype(jnp.int32)
    accepted_one_hot = jax.nn.one_hot(num_accepted, max_gamma + 1, dtype=jnp.int32)
    accepted_one_hot *= active_i[:, None]
    # Per draft position i (the tree's depth i): proposed, judged (drafts 0..i-1 all
    # accepted) and accepted, over active rows.
    draft_positions = jnp.arange(max_gamma)[None]
    drafted_BG = (draft_positions < verified.num_drafted[:, None]) & active[:, None]
    reached_BG = drafted_BG & (draft_positions <= num_accepted[:, None])
    accepted_BG = drafted_BG & (draft_positions < num_accepted[:, None])
    count = lambda mask_BG: jnp.sum(mask_BG, axis=0, dtype=jnp.int32)  # noqa: E731
    stats = state.stats
    if state.constraint is not None:
        before_B1 = state.automaton_state[:, None]
        states_BG2 = jnp.concatenate([before_B1, states_BG1], axis=1)
        state = state.replace(
            automaton_state=jnp.take_along_axis(states_BG2, num_emit[:, None], axis=1)[:, 0]
        )
    state = state.replace(
        seq=_write(state.seq, block_BG1, lengths, num_emit),
        from_draft=_write(
            state.from_draft, offsets[None] < num_accepted[:, None], lengths, num_emit
        ),
        logprobs=_write(state.logprobs, logprobs_BG1, lengths, num_emit),
        top_ids=_write(state.top_ids, top_ids_BG1K, lengths, num_emit),
        top_logprobs=_write(state.top_logprobs, top_logprobs_BG1K, lengths, num_emit),
        seq_lengths=new_lengths,
        target_cache=verified.target_cache.rollback(new_lengths - 1),
        drafter_state=verified.drafter.update(
            verified.drafter_state, new_lengths, verified.features
        ),
        stats=stats.replace(
            target_calls=stats.target_calls + 1,
            row_target_calls=stats.row_target_calls + active_i,
            drafted=stats.drafted + verified.num_drafted * active_i,
            accepted=stats.accepted + num_accepted * active_i,
            accepted_hist=stats.accepted_hist + jnp.sum(accepted_one_hot, axis=0),
            position_drafted=stats.position_drafted + count(drafted_BG),
            position_reached=stats.position_reached + count(reached_BG),
            position_accepted=stats.position_accepted + count(accepted_BG),
        ),
    )

    emitted_BG1 = offsets[None] < num_emit[:, None]
    hit_eos = jnp.any(emitted_BG1 & is_eos_BG1, axis=1)
    finished = hit_eos | (active & stopped) | (state.num_generated >= state.max_new_tokens)
    invalid = active & (num_usable == 0)
    # Judged by the largest step, so that whether a row is truncated never depends on
    # which γ variant ran.
    cache_full = new_lengths + state.lookahead > state.seq.shape[1]
    state = state.replace(
        done=state.done | (active & (finished | cache_full | invalid)),
        truncated=state.truncated | (active & cache_full & ~finished & ~invalid),
        invalid=state.invalid | invalid,
    )
    return state


def _run(state: DecodeState, num_steps=None) -> DecodeState:
    """Runs the loop until every row is done, or for at most ``num_steps`` iterations.

    With a ``gamma_table``, one ``while_loop`` per entry runs in turn, from the most
    active rows to the fewest, each with its own γ. That is the table exactly: the
    number of active rows never grows (refill keeps every slot busy until the prompts
    run out, and then rows only finish), so the entry only ever moves down. Choosing
    the variant per step with ``lax.switch`` instead made XLA:CPU copy the loop state
    (caches included) into the branch every step: 2.2x slower at one slot.
    """
    if num_steps is None:
        running = lambda s: ~jnp.all(s.done)  # noqa: E731
    else:
        limit = state.stats.target_calls + jnp.maximum(jnp.asarray(num_steps, jnp.int32), 0)
        running = lambda s: ~jnp.all(s.done) & (s.stats.target_calls < limit)  # noqa: E731
    table = state.gamma_table
    if not table:
        return jax.lax.while_loop(running, partial(_body, gamma=state.drafter.num_draft), state)
    for index in reversed(range(len(table))):
        # ">=": the last loop (entry 0) runs to the end whatever the count.
        def cond(s, index=index):
            return running(s) & (_table_index(s) >= index)

        state = jax.lax.while_loop(cond, partial(_body, gamma=table[index][1]), state)
    return state
