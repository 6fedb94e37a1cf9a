"""The decode loop, as pure functions: one step, and the ``lax.while_loop`` that runs it.

A step (`_decode_step`) drafts γ tokens per row (or the drafter's tree), scores the
pending token and the drafts in one target call, verifies them exactly
(`_verify_chain`, `_verify_tree`) and commits the emitted tokens
(`specjax.decoding.commit`). `run_loop`
repeats it, with a refill of finished slots (`specjax.decoding.refill`) after every
step, until every row is done or a step budget runs out.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.validation import INT32_MAX
from specjax.decoding.commit import Verified, commit, num_leading_true
from specjax.decoding.decoder import Decoder
from specjax.decoding.refill import refill
from specjax.decoding.state import DecodeState
from specjax.models.cache import TreeMask
from specjax.models.forward import score
from specjax.sampling import RowSampling, mask_vocab, noise, probs_from_logits
from specjax.sampling.penalties import constrain
from specjax.sampling.vocab import pad_to_vocab
from specjax.verification.tree import path_nodes_with_root, tree_verify


def _draft_probs(proposal, drafter, batch: int, gamma: int, vocab: int):
    """The proposal's q as ``[B, γ, V]`` (or None), after a trace-time check of its shapes.

    A clear error, not a RoPE one, for a drafter with the wrong shapes. The q of a
    drafter with a smaller vocabulary (``[B, γ, V_d]``) is zero-padded to the target's
    V, which is exact (`specjax.sampling.vocab`).
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


def _body(decoder: Decoder, state: DecodeState, gamma: int) -> DecodeState:
    """One loop iteration: a decode step with ``gamma`` drafts, then refills."""
    return refill(decoder, _decode_step(decoder, state, gamma))


def _table_index(decoder: Decoder, state: DecodeState) -> jax.Array:
    """The ``gamma_table`` entry for the number of active rows now."""
    table = decoder.gamma_table
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
    return jnp.minimum(num_leading_true(q_at_BG >= threshold) + 1, gamma)


def _score_drafted(target, drafter, tokens_BG1, positions_BG1, cache, width_index):
    """The verify forward over only the ``width_index + 1`` leading positions.

    One precompiled forward per width, picked on device by ``lax.switch``; logits
    (and hidden states) are padded back to ``γ + 1`` columns. The padding is never read:
    no row drafted that far, so nothing there can be accepted or emitted.
    """
    g1 = tokens_BG1.shape[1]

    def forward(width):
        def run(cache):
            logits, cache, hidden = score(
                target,
                tokens_BG1[:, :width],
                positions_BG1[:, :width],
                cache,
                drafter.target_layers,
            )
            pad = [(0, 0), (0, g1 - width), (0, 0)]
            if hidden is not None:
                # Positions stay real, so padded hidden states land only in stale slots.
                hidden = hidden.replace(states=jnp.pad(hidden.states, pad), positions=positions_BG1)
            return jnp.pad(logits, pad), cache, hidden

        return run

    return jax.lax.switch(width_index, [forward(w) for w in range(1, g1 + 1)], cache)


def _usable(logits_BTV, sampling) -> jax.Array:
    """``bool[B, T]``: the logits give a distribution (not NaN or all -inf below the limit,
    and some id the row's constraint allows there, when ``sampling`` carries one).

    One reduction: max propagates NaN, and NaN > -inf is False.
    """
    return jnp.max(constrain(mask_vocab(logits_BTV, sampling.vocab_limit), sampling), -1) > -jnp.inf


def _history(decoder: Decoder, state: DecodeState) -> tuple:
    """The features' `~specjax.sampling.history.RowHistory` objects at the committed
    prefix (penalty counts, a constraint's cursor, a user's), in feature order."""
    histories = (
        feature.history(state, feature_state)
        for feature, feature_state in zip(decoder.features, state.features, strict=True)
    )
    return tuple(h for h in histories if h is not None)


def _along(state: DecodeState, histories: tuple, chain_BG) -> RowSampling:
    """The rows' sampling settings at each scored position of the step: position i is
    after the committed tokens and drafts ``0..i-1`` of ``chain_BG``."""
    return RowSampling.of(state.sampling, tuple(h.along(chain_BG) for h in histories))


def _step_keys(state: DecodeState, width: int):
    """``(positions_BW, keys_BW)``: input i scores position ``length + i`` with its keys."""
    positions_BW = (state.seq_lengths - 1)[:, None] + jnp.arange(width)[None]
    return positions_BW, noise.position_keys(state.settings.keys, positions_BW + 1)


def _draft_keys(decoder: Decoder, keys_BG1, gamma: int):
    """The keys the drafter draws ``gamma`` drafts with: its verifier's noise stream."""
    return decoder.verifier.draft_keys(keys_BG1, gamma)


def _pad_columns(x_BT, width: int, value):
    """``x`` ``[B, T, ...]`` padded along axis 1 to ``width`` columns with ``value``."""
    pad = [(0, 0), (0, width - x_BT.shape[1])] + [(0, 0)] * (x_BT.ndim - 2)
    return jnp.pad(x_BT, pad, constant_values=value)


def _score_fixed(target, drafter, tokens_BW, positions_BW, cache, num_hidden: int):
    """The verify forward over all W columns, which XLA may not narrow.

    The logits of columns no row can emit are never read, and XLA would otherwise be
    free to drop them and shrink the last layer's and the head's products to fewer
    rows: another kernel, so other rounding, and a column's logits would depend on how
    much of the forward is read. The barrier keeps every product W rows wide. The
    hidden states are cut to the ``num_hidden`` leading columns (the drafter's γ + 1).
    """
    logits_BWV, cache, hidden = score(target, tokens_BW, positions_BW, cache, drafter.target_layers)
    if hidden is None:
        return jax.lax.optimization_barrier(logits_BWV), cache, None
    logits_BWV, states = jax.lax.optimization_barrier((logits_BWV, hidden.states))
    hidden = hidden.replace(states=states[:, :num_hidden], positions=positions_BW[:, :num_hidden])
    return logits_BWV, cache, hidden


@dataclasses.dataclass(frozen=True)
class _StepPlan:
    """How one step runs, read off the decoder's options once per trace (`_plan`); the
    step's other functions read the plan, never the options.

    Attributes:
        drafter: the drafter as the step runs it (its γ, under τ).
        gamma: drafts per row (a tree's depth).
        width: W, the columns of the step's target forward.
        fixed: W is the decoder's ``forward_width``: every column is scored and kept
            (`specjax.decoding.numerics`), and XLA may not narrow any product.
        confidence: τ (``float32[]``), or ``None``: every row proposes γ drafts.
    """

    drafter: object
    gamma: int
    width: int
    fixed: bool
    confidence: jax.Array | None

    @property
    def narrows(self) -> bool:
        """The forward scores only the longest chain a row proposed (rows stop under τ
        or by the drafter's own rule, and no width is fixed)."""
        varies = self.confidence is not None or self.drafter.drafts_fewer
        return not self.fixed and varies and self.gamma > 0


def _plan(decoder: Decoder, gamma: int) -> _StepPlan:
    """The `_StepPlan` of a step with ``gamma`` drafts (a tree: the drafter's tree)."""
    drafter, tree, confidence = decoder.drafter, decoder.drafter.tree, decoder.draft_confidence
    if tree is None:
        if gamma != drafter.num_draft:
            drafter = drafter.replace(num_draft=gamma)
        if confidence is not None:
            drafter = drafter.with_confidence(confidence)
    own_width = gamma + 1 if tree is None else tree.num_nodes + 1
    fixed = decoder.forward_width is not None
    return _StepPlan(
        drafter=drafter,
        gamma=gamma if tree is None else tree.depth,
        width=decoder.forward_width if fixed else own_width,
        fixed=fixed,
        confidence=confidence,
    )


def _num_drafted(plan: _StepPlan, proposal, draft_probs):
    """``int32[B]`` drafts each row proposes: γ, or fewer under ``draft_confidence``."""
    b, gamma = proposal.tokens.shape[0], plan.gamma
    if proposal.num_drafted is not None and gamma:  # the drafter stopped its rows itself
        return proposal.num_drafted.astype(jnp.int32)
    if plan.confidence is None or gamma == 0:
        return jnp.full((b,), gamma, jnp.int32)
    if draft_probs is None:
        raise ValueError(
            f"draft_confidence needs a drafter that returns its q, and the "
            f"{type(plan.drafter).__name__} proposes one-hot drafts (probs=None): use a "
            "drafter that samples its drafts and returns their q (Proposal.probs)"
        )
    return _confident_drafts(proposal.tokens.astype(jnp.int32), draft_probs, plan.confidence)


def _propose_chain(decoder: Decoder, state: DecodeState, plan: _StepPlan, keys_BW, history):
    """``(proposal, q [B, γ, V] or None, num_drafted [B], chain [B, W-1])``.

    The chain holds the proposed drafts, then -1: a draft that was not proposed reads
    as out of vocabulary, which every verifier rejects with q := 0, so the row's next
    token comes from p itself, exactly.
    """
    b, vocab, gamma = state.seq.shape[0], decoder.target.vocab_size, plan.gamma
    proposal = plan.drafter.propose(
        _draft_keys(decoder, keys_BW, gamma),
        state.drafter_state,
        state.seq,
        state.seq_lengths,
        RowSampling.of(state.sampling, history),
    )
    draft_probs = _draft_probs(proposal, plan.drafter, b, gamma, vocab)
    num_drafted = _num_drafted(plan, proposal, draft_probs)
    proposed_BG = jnp.arange(gamma)[None] < num_drafted[:, None]
    chain_BG = jnp.where(proposed_BG, proposal.tokens.astype(jnp.int32), -1)
    return proposal, draft_probs, num_drafted, _pad_columns(chain_BG, plan.width - 1, -1)


def _score_chain(
    decoder: Decoder, state: DecodeState, plan: _StepPlan, chain_BW1, positions_BW, num_drafted
):
    """Scores the pending token and the chain in one target call: ``(logits, cache,
    hidden)``; a drafter's hidden come out of this same forward."""
    pending_B = state.seq[jnp.arange(state.seq.shape[0]), state.seq_lengths - 1]
    tokens_BW = jnp.concatenate([pending_B[:, None], jnp.maximum(chain_BW1, 0)], axis=1)
    target, cache = decoder.target, state.target_cache
    if plan.narrows:
        width_index = jnp.max(jnp.where(~state.done, num_drafted, 0))
        return _score_drafted(target, plan.drafter, tokens_BW, positions_BW, cache, width_index)
    return _score_fixed(target, plan.drafter, tokens_BW, positions_BW, cache, plan.gamma + 1)


def _verify_block(decoder: Decoder, keys_BW, chain_BW1, draft_probs, target_probs):
    """``(block [B, W], num_accepted [B])`` by the decoder's verifier; q is padded with
    zeros to the W - 1 columns of the chain (no draft there)."""
    if draft_probs is not None:
        draft_probs = _pad_columns(draft_probs, keys_BW.shape[1] - 1, 0.0)
    return decoder.verifier.verify(keys_BW, chain_BW1, draft_probs, target_probs)


def _verify_chain(decoder: Decoder, state: DecodeState, plan: _StepPlan) -> Verified:
    """Drafts a chain of γ tokens, scores it in one target call, verifies it.

    The target scores ``W = γ + 1`` columns, or the decoder's fixed forward width: then
    the chain is padded with drafts that were not proposed (-1, fed to the target as
    id 0 at the following positions), which every verifier rejects, so the step is
    the same verification over W columns. Plain decoding (the null drafter) is coupled
    verification of such a chain: its token at each position is the target's sample
    there, drawn exactly as coupled speculative decoding draws it.
    """
    positions_BW, keys_BW = _step_keys(state, plan.width)
    history = _history(decoder, state)
    proposal, draft_probs, num_drafted, chain_BW1 = _propose_chain(
        decoder, state, plan, keys_BW, history
    )
    logits_BWV, target_cache, hidden = _score_chain(
        decoder, state, plan, chain_BW1, positions_BW, num_drafted
    )
    # Position i's penalties count the prefix and drafts 0..i-1 (`specjax.sampling.penalties`);
    # its constraint mask is the automaton's state after them (`specjax.sampling.constraints`).
    scored = _along(state, history, chain_BW1)
    target_probs = probs_from_logits(logits_BWV, scored)
    block_BW, num_accepted = _verify_block(decoder, keys_BW, chain_BW1, draft_probs, target_probs)
    return Verified(
        drafter=plan.drafter,
        drafter_state=proposal.state,
        block=block_BW,
        num_accepted=num_accepted,
        num_drafted=num_drafted,
        probs=target_probs,
        usable=_usable(logits_BWV, scored),
        target_cache=target_cache,
        hidden=hidden,
        logits=logits_BWV,
    )


def _propose_tree(decoder: Decoder, state: DecodeState, keys_BD1):
    """``(proposal, node tokens int32[B, N])`` after a trace-time check of the shapes."""
    drafter = decoder.drafter
    tree, b = drafter.tree, state.seq.shape[0]
    proposal = drafter.propose(
        _draft_keys(decoder, keys_BD1, tree.depth),
        state.drafter_state,
        state.seq,
        state.seq_lengths,
        RowSampling.of(state.sampling),  # a tree drafter is given no history
    )
    node_tokens = proposal.tokens
    if tuple(node_tokens.shape) != (b, tree.num_nodes) or proposal.probs is not None:
        raise ValueError(
            f"a tree drafter's propose must return tokens [B, N] = [{b}, {tree.num_nodes}] "
            f"and probs=None; got tokens{list(node_tokens.shape)}, probs "
            f"{None if proposal.probs is None else list(proposal.probs.shape)}"
        )
    return proposal, node_tokens.astype(jnp.int32)


def _score_tree(decoder: Decoder, state: DecodeState, plan: _StepPlan, node_tokens_BN):
    """Scores the root (the pending token) and every node in one target call.

    The root is at slot ``last`` and node j at slot ``last + j``, each at position
    ``last + depth``, attending to its ancestors only. At a fixed forward width W the
    nodes are followed by ``W - N - 1`` padding columns at later slots and positions,
    each seeing only itself (and no node sees them: their slots follow the tree's).
    """
    tree, width = decoder.drafter.tree, plan.width
    last = state.seq_lengths - 1
    n1 = tree.num_nodes + 1
    pending_B = state.seq[jnp.arange(state.seq.shape[0]), last]
    nodes_BN1 = jnp.concatenate([pending_B[:, None], node_tokens_BN], axis=1)
    tokens_BW = _pad_columns(nodes_BN1, width, 0)
    visible = np.eye(width, dtype=bool)
    visible[:n1, :n1] = tree.ancestors
    depth_W = np.concatenate([tree.depths, tree.depth + np.arange(1, width - n1 + 1)])
    slots_BW = last[:, None] + jnp.arange(width)[None]
    mask = TreeMask(start=last, slots=slots_BW, visible=jnp.asarray(visible))
    positions_BW = last[:, None] + jnp.asarray(depth_W)[None]
    logits_BWV, target_cache, hidden = score(
        decoder.target,
        tokens_BW,
        positions_BW,
        state.target_cache,
        decoder.drafter.target_layers,
        tree=mask,
    )
    if plan.fixed:  # as in `_score_fixed`
        logits_BWV, hidden = jax.lax.optimization_barrier((logits_BWV, hidden))
    return logits_BWV, target_cache, hidden


def _verify_tree(decoder: Decoder, state: DecodeState, plan: _StepPlan) -> Verified:
    """Drafts the drafter's tree, scores all N + 1 nodes in one target call, verifies it.

    Every node's p and the target's samples are computed only on the D + 1 nodes of
    the path (all W columns at a fixed forward width: `specjax.verification.tree.tree_verify`'s
    ``every_node``). After the exact walk the accepted path is moved to consecutive
    slots, and the path's probabilities and hidden are what the commit reads.
    """
    drafter, tree = decoder.drafter, decoder.drafter.tree
    b, depth, n1 = state.seq.shape[0], tree.depth, tree.num_nodes + 1
    last = state.seq_lengths - 1
    fixed = plan.fixed
    _, keys_BD1 = _step_keys(state, depth + 1)
    proposal, node_tokens = _propose_tree(decoder, state, keys_BD1)
    logits_BWV, target_cache, hidden = _score_tree(decoder, state, plan, node_tokens)
    history = _history(decoder, state)
    block_BD1, num_accepted, path_BD, probs_BD1V = tree_verify(
        keys_BD1,
        node_tokens,
        logits_BWV if fixed else logits_BWV[:, :n1],
        tree,
        RowSampling.of(state.sampling, history),
        every_node=fixed,
    )
    nodes_BD1 = path_nodes_with_root(path_BD)

    def along_path(x_BN1):
        index = nodes_BD1.reshape(b, depth + 1, *([1] * (x_BN1.ndim - 2)))
        return jnp.take_along_axis(x_BN1, index, axis=1)

    if hidden is not None:
        positions_BD1 = last[:, None] + jnp.arange(depth + 1)[None]
        hidden = hidden.replace(states=along_path(hidden.states), positions=positions_BD1)
    path_logits = along_path(logits_BWV)
    return Verified(
        drafter=drafter,
        drafter_state=drafter.keep_path(proposal.state, last, path_BD),
        block=block_BD1,
        num_accepted=num_accepted,
        num_drafted=jnp.full((b,), depth, jnp.int32),
        probs=probs_BD1V,
        usable=_usable(path_logits, _along(state, history, block_BD1[:, :depth])),
        target_cache=target_cache.compact_path(last, path_BD),
        hidden=hidden,
        logits=path_logits,
    )


def _decode_step(decoder: Decoder, state: DecodeState, gamma: int) -> DecodeState:
    """One decode step with γ = ``gamma`` drafts (at most the drafter's own γ), or a tree."""
    plan = _plan(decoder, gamma)
    if decoder.drafter.tree is not None:
        return commit(decoder, state, _verify_tree(decoder, state, plan))
    return commit(decoder, state, _verify_chain(decoder, state, plan))


def step(decoder: Decoder, state: DecodeState, gamma: int | None = None) -> DecodeState:
    """One step of the loop, without the refill of finished slots that follows it.

    The unit a decode's time is made of: `specjax.chips` compiles it alone to predict
    what it costs on a chip. ``gamma``: drafts (default the drafter's own γ).
    """
    return _decode_step(decoder, state, decoder.drafter.num_draft if gamma is None else gamma)


def run_loop(decoder: Decoder, state: DecodeState, num_steps=None) -> DecodeState:
    """Runs the loop until every row is done, or for at most ``num_steps`` iterations.

    With a ``gamma_table``, one ``while_loop`` per entry runs in turn, from the most
    active rows to the fewest, each with its own γ. That is the table exactly: the
    number of active rows never grows (refill keeps every slot busy until the prompts
    run out, and then rows only finish), so the entry only ever moves down. Choosing
    the variant per step with ``lax.switch`` instead makes XLA:CPU copy the loop state
    (caches included) into the branch every step, which slows every step down.
    """
    if num_steps is None:
        running = lambda s: ~jnp.all(s.done)  # noqa: E731
    else:
        # Clamped so that the limit never wraps around int32.
        room = jnp.int32(INT32_MAX) - state.step
        limit = state.step + jnp.clip(jnp.asarray(num_steps, jnp.int32), 0, room)
        running = lambda s: ~jnp.all(s.done) & (s.step < limit)  # noqa: E731
    table = decoder.gamma_table
    if not table:
        body = partial(_body, decoder, gamma=decoder.drafter.num_draft)
        return jax.lax.while_loop(running, body, state)
    for index in reversed(range(len(table))):
        # ">=": the last loop (entry 0) runs to the end whatever the count.
        def cond(s, index=index):
            return running(s) & (_table_index(decoder, s) >= index)

        state = jax.lax.while_loop(cond, partial(_body, decoder, gamma=table[index][1]), state)
    return state
