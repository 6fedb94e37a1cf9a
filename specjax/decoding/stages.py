"""The stages of one decode step: what it reads once, then propose, score, verify.

`StepContext` is what every stage reads, computed once per step from the state: the
positions and keys of the step (one trip into `specjax.sampling.noise`), the rows'
history and the `StepPlan`. A `ChainStep` (γ drafts per row) or a `TreeStep` (the
drafter's tree) runs the stages on it: ``propose`` (the drafter's proposal),
``score`` (the pending token and the drafts in one target forward), ``verify``
(tokens and counts, exactly) and ``models`` (the models in the chain layout, for
`specjax.decoding.commit` to advance).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.commit import StepModels, Verified, num_leading_true
from specjax.decoding.decoder import Decoder
from specjax.decoding.state import DecodeState
from specjax.models.cache import TreeMask
from specjax.models.forward import score
from specjax.sampling import RowSampling, mask_vocab, noise, probs_from_logits
from specjax.sampling.penalties import constrain
from specjax.sampling.vocab import pad_to_vocab
from specjax.verification import tree as tree_verification


def confident_drafts(draft_tokens_BG, draft_probs_BGV, threshold):
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
class StepPlan:
    """How one step runs, read off the decoder's options once per trace (`of`); the
    step's other functions read the plan, never the options.

    Attributes:
        drafter: the drafter as the step runs it (its γ, under τ).
        gamma: drafts per row (a tree's depth).
        width: W, the columns of the step's target forward.
        num_keys: the positions the step draws at (W for a chain, D + 1 for a tree).
        fixed: W is the decoder's ``forward_width``: every column is scored and kept
            (`specjax.decoding.numerics`), and XLA may not narrow any product.
        confidence: τ (``float32[]``), or ``None``: every row proposes γ drafts.
    """

    drafter: object
    gamma: int
    width: int
    num_keys: int
    fixed: bool
    confidence: jax.Array | None

    @property
    def narrows(self) -> bool:
        """The forward scores only the longest chain a row proposed (rows stop under τ
        or by the drafter's own rule, and no width is fixed)."""
        varies = self.confidence is not None or self.drafter.drafts_fewer
        return not self.fixed and varies and self.gamma > 0

    @classmethod
    def of(cls, decoder: Decoder, gamma: int) -> StepPlan:
        """The plan of a step with ``gamma`` drafts (a tree: the drafter's tree)."""
        drafter, tree, confidence = decoder.drafter, decoder.drafter.tree, decoder.draft_confidence
        if tree is None:
            if gamma != drafter.num_draft:
                drafter = drafter.replace(num_draft=gamma)
            if confidence is not None:
                drafter = drafter.with_confidence(confidence)
        own_width = gamma + 1 if tree is None else tree.num_nodes + 1
        fixed = decoder.forward_width is not None
        width = decoder.forward_width if fixed else own_width
        return cls(
            drafter=drafter,
            gamma=gamma if tree is None else tree.depth,
            width=width,
            num_keys=width if tree is None else tree.depth + 1,
            fixed=fixed,
            confidence=confidence,
        )


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What every stage of one step reads, computed once from the state (`of`).

    Attributes:
        decoder: the decoder.
        state: the state the step starts from.
        plan: the step's `StepPlan`.
        last_B: ``int32[B]`` each row's pending slot (its last committed token's).
        positions_BK: ``int32[B, K]`` input i of a chain is at position ``length - 1 + i``,
            for the plan's K = ``num_keys``.
        keys_BK: the keys that decide the token at position ``length + i``.
        history: the features' `~specjax.sampling.history.RowHistory` objects at the
            committed prefix (penalty counts, a constraint's cursor, a user's), in
            feature order.
    """

    decoder: Decoder
    state: DecodeState
    plan: StepPlan
    last_B: jax.Array
    positions_BK: jax.Array
    keys_BK: jax.Array
    history: tuple

    @classmethod
    def of(cls, decoder: Decoder, state: DecodeState, plan: StepPlan) -> StepContext:
        """The context of a step from ``state``: its keys drawn in one call, each
        feature's history read once."""
        last_B = state.seq_lengths - 1
        positions_BK = last_B[:, None] + jnp.arange(plan.num_keys)[None]
        histories = (
            feature.history(state, feature_state)
            for feature, feature_state in zip(decoder.features, state.features, strict=True)
        )
        return cls(
            decoder=decoder,
            state=state,
            plan=plan,
            last_B=last_B,
            positions_BK=positions_BK,
            keys_BK=noise.position_keys(state.settings.keys, positions_BK + 1),
            history=tuple(h for h in histories if h is not None),
        )

    @property
    def batch(self) -> int:
        """B, the rows."""
        return self.state.seq.shape[0]

    @property
    def sampling(self) -> RowSampling:
        """The rows' sampling settings at the committed prefix."""
        return RowSampling.of(self.state.sampling, self.history)

    def pending_then(self, tokens_BT) -> jax.Array:
        """``int32[B, 1 + T]``: each row's pending token (scored first), then ``tokens_BT``."""
        seq = self.state.seq
        pending_B = seq[jnp.arange(seq.shape[0]), self.last_B]
        return jnp.concatenate([pending_B[:, None], tokens_BT], axis=1)

    def draft_keys(self, gamma: int) -> jax.Array:
        """The keys the drafter draws ``gamma`` drafts with: its verifier's noise stream."""
        return self.decoder.verifier.draft_keys(self.keys_BK, gamma)

    def along(self, chain_BG) -> RowSampling:
        """The rows' sampling settings at each scored position of the step: position i is
        after the committed tokens and drafts ``0..i-1`` of ``chain_BG``."""
        return RowSampling.of(self.state.sampling, tuple(h.along(chain_BG) for h in self.history))

    def propose(self, drafter, gamma: int, sampling: RowSampling):
        """The drafter's `~specjax.drafters.Proposal` of ``gamma`` drafts (a tree's depth)."""
        state = self.state
        keys = self.draft_keys(gamma)
        return drafter.propose(keys, state.drafter_state, state.seq, state.seq_lengths, sampling)


class Drafted(NamedTuple):
    """A step's proposal: the drafter's, and its drafts as the verifier reads them."""

    proposal: object
    tokens: jax.Array
    probs: jax.Array | None
    num_drafted: jax.Array


class Scored(NamedTuple):
    """The target's one forward of a step: logits, its cache after it, and the hidden
    states a drafter reads (or None)."""

    logits: jax.Array
    target_cache: object
    hidden: object


@dataclasses.dataclass(frozen=True)
class ChainStep:
    """A step that drafts a chain of γ tokens, scores it in one target call, verifies it.

    The target scores ``W = γ + 1`` columns, or the decoder's fixed forward width: then
    the chain is padded with drafts that were not proposed (-1, fed to the target as
    id 0 at the following positions), which every verifier rejects, so the step is
    the same verification over W columns. Plain decoding (the null drafter) is coupled
    verification of such a chain: its token at each position is the target's sample
    there, drawn exactly as coupled speculative decoding draws it.
    """

    ctx: StepContext

    def draft_probs(self, proposal) -> jax.Array | None:
        """The proposal's q as ``[B, γ, V]`` (or None), after a trace-time check of its shapes.

        A clear error, not a RoPE one, for a drafter with the wrong shapes. The q of a
        drafter with a smaller vocabulary (``[B, γ, V_d]``) is zero-padded to the target's
        V, which is exact (`specjax.sampling.vocab`).
        """
        plan, tokens = self.ctx.plan, proposal.tokens
        batch, gamma, vocab = self.ctx.batch, plan.gamma, self.ctx.decoder.target.vocab_size
        if tuple(tokens.shape) != (batch, gamma) or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(
                f"drafter.propose must return integer tokens [B, γ] = [{batch}, {gamma}], got "
                f"{tokens.dtype}{list(tokens.shape)}"
            )
        if proposal.probs is None:
            return None
        widths = {vocab, plan.drafter.vocab_size or vocab}
        shape = tuple(proposal.probs.shape)
        if shape[:2] != (batch, gamma) or len(shape) != 3 or shape[2] not in widths:
            expected = " or ".join(f"[{batch}, {gamma}, {w}]" for w in sorted(widths))
            raise ValueError(
                f"drafter.propose must return probs [B, γ, V] = {expected} or None, got "
                f"{list(shape)}"
            )
        return pad_to_vocab(proposal.probs, vocab)

    def num_drafted(self, proposal, draft_probs) -> jax.Array:
        """``int32[B]`` drafts each row proposes: γ, or fewer under ``draft_confidence``."""
        plan = self.ctx.plan
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
        return confident_drafts(proposal.tokens.astype(jnp.int32), draft_probs, plan.confidence)

    def propose(self) -> Drafted:
        """The drafts as a chain ``[B, W-1]``: the proposed drafts, then -1.

        A draft that was not proposed reads as out of vocabulary, which every verifier
        rejects with q := 0, so the row's next token comes from p itself, exactly.
        """
        ctx, plan = self.ctx, self.ctx.plan
        proposal = ctx.propose(plan.drafter, plan.gamma, ctx.sampling)
        draft_probs = self.draft_probs(proposal)
        num_drafted = self.num_drafted(proposal, draft_probs)
        proposed_BG = jnp.arange(plan.gamma)[None] < num_drafted[:, None]
        chain_BG = jnp.where(proposed_BG, proposal.tokens.astype(jnp.int32), -1)
        chain_BW1 = _pad_columns(chain_BG, plan.width - 1, -1)
        return Drafted(proposal, chain_BW1, draft_probs, num_drafted)

    def score(self, drafted: Drafted) -> Scored:
        """Scores the pending token and the chain in one target call; a drafter's hidden
        come out of this same forward."""
        ctx, plan = self.ctx, self.ctx.plan
        tokens_BW = ctx.pending_then(jnp.maximum(drafted.tokens, 0))
        target, cache, positions_BW = ctx.decoder.target, ctx.state.target_cache, ctx.positions_BK
        if plan.narrows:
            width_index = jnp.max(jnp.where(~ctx.state.done, drafted.num_drafted, 0))
            return Scored(
                *_score_drafted(target, plan.drafter, tokens_BW, positions_BW, cache, width_index)
            )
        return Scored(
            *_score_fixed(target, plan.drafter, tokens_BW, positions_BW, cache, plan.gamma + 1)
        )

    def verify(self, drafted: Drafted, scored: Scored) -> Verified:
        """The verifier's block; q is padded with zeros to the W - 1 columns of the chain
        (no draft there)."""
        ctx = self.ctx
        # Position i's penalties count the prefix and drafts 0..i-1 (`specjax.sampling.penalties`);
        # its constraint mask is the automaton's state after them (`specjax.sampling.constraints`).
        scored_sampling = ctx.along(drafted.tokens)
        target_probs = probs_from_logits(scored.logits, scored_sampling)
        draft_probs = drafted.probs
        if draft_probs is not None:
            draft_probs = _pad_columns(draft_probs, ctx.plan.width - 1, 0.0)
        block_BW, num_accepted = ctx.decoder.verifier.verify(
            ctx.keys_BK, drafted.tokens, draft_probs, target_probs
        )
        return Verified(
            block=block_BW,
            num_accepted=num_accepted,
            num_drafted=drafted.num_drafted,
            probs=target_probs,
            usable=_usable(scored.logits, scored_sampling),
            logits=scored.logits,
        )

    def models(self, drafted: Drafted, scored: Scored, verified: Verified) -> StepModels:
        """The models as the step left them."""
        del verified  # a chain's slots already hold its positions
        return StepModels(
            drafter=self.ctx.plan.drafter,
            drafter_state=drafted.proposal.state,
            target_cache=scored.target_cache,
            hidden=scored.hidden,
        )


@dataclasses.dataclass(frozen=True)
class TreeStep:
    """A step that drafts the drafter's tree, scores all N + 1 nodes in one target call,
    and verifies it.

    Every node's p and the target's samples are computed only on the D + 1 nodes of
    the path (all W columns at a fixed forward width: `specjax.verification.tree.tree_verify`'s
    ``every_node``). After the exact walk the accepted path is moved to consecutive
    slots, and the path's probabilities and hidden are what the commit reads.
    """

    ctx: StepContext

    def propose(self) -> Drafted:
        """The node tokens ``int32[B, N]``, after a trace-time check of the shapes."""
        ctx, drafter = self.ctx, self.ctx.decoder.drafter
        tree, b = drafter.tree, ctx.batch
        # A tree drafter is given no history.
        proposal = ctx.propose(drafter, tree.depth, RowSampling.of(ctx.state.sampling))
        node_tokens = proposal.tokens
        if tuple(node_tokens.shape) != (b, tree.num_nodes) or proposal.probs is not None:
            raise ValueError(
                f"a tree drafter's propose must return tokens [B, N] = [{b}, {tree.num_nodes}] "
                f"and probs=None; got tokens{list(node_tokens.shape)}, probs "
                f"{None if proposal.probs is None else list(proposal.probs.shape)}"
            )
        num_drafted = jnp.full((b,), tree.depth, jnp.int32)
        return Drafted(proposal, node_tokens.astype(jnp.int32), None, num_drafted)

    def score(self, drafted: Drafted) -> Scored:
        """Scores the root (the pending token) and every node in one target call.

        The root is at slot ``last`` and node j at slot ``last + j``, each at position
        ``last + depth``, attending to its ancestors only. At a fixed forward width W the
        nodes are followed by ``W - N - 1`` padding columns at later slots and positions,
        each seeing only itself (and no node sees them: their slots follow the tree's).
        """
        ctx, tree, width = self.ctx, self.ctx.decoder.drafter.tree, self.ctx.plan.width
        last, n1 = ctx.last_B, tree.num_nodes + 1
        tokens_BW = _pad_columns(ctx.pending_then(drafted.tokens), width, 0)
        visible = np.eye(width, dtype=bool)
        visible[:n1, :n1] = tree.ancestors
        depth_W = np.concatenate([tree.depths, tree.depth + np.arange(1, width - n1 + 1)])
        slots_BW = last[:, None] + jnp.arange(width)[None]
        mask = TreeMask(start=last, slots=slots_BW, visible=jnp.asarray(visible))
        positions_BW = last[:, None] + jnp.asarray(depth_W)[None]
        logits_BWV, target_cache, hidden = score(
            ctx.decoder.target,
            tokens_BW,
            positions_BW,
            ctx.state.target_cache,
            ctx.decoder.drafter.target_layers,
            tree=mask,
        )
        if ctx.plan.fixed:  # as in `_score_fixed`
            logits_BWV, hidden = jax.lax.optimization_barrier((logits_BWV, hidden))
        return Scored(logits_BWV, target_cache, hidden)

    def verify(self, drafted: Drafted, scored: Scored) -> Verified:
        """The exact walk of the tree (`specjax.verification.tree.tree_verify`)."""
        ctx, tree, fixed = self.ctx, self.ctx.decoder.drafter.tree, self.ctx.plan.fixed
        logits_BWV = scored.logits
        block_BD1, num_accepted, path_BD, probs_BD1V = tree_verification.tree_verify(
            ctx.keys_BK,
            drafted.tokens,
            logits_BWV if fixed else logits_BWV[:, : tree.num_nodes + 1],
            tree,
            ctx.sampling,
            every_node=fixed,
        )
        path_logits = _along_path(logits_BWV, path_BD)
        return Verified(
            block=block_BD1,
            num_accepted=num_accepted,
            num_drafted=drafted.num_drafted,
            probs=probs_BD1V,
            usable=_usable(path_logits, ctx.along(block_BD1[:, : tree.depth])),
            logits=path_logits,
            path=path_BD,
        )

    def models(self, drafted: Drafted, scored: Scored, verified: Verified) -> StepModels:
        """The models in the chain layout: the accepted path moved to consecutive slots
        (the target's cache, the drafter's state), the hidden states those along it."""
        drafter, last, hidden = self.ctx.decoder.drafter, self.ctx.last_B, scored.hidden
        if hidden is not None:
            positions_BD1 = last[:, None] + jnp.arange(verified.block.shape[1])[None]
            states = _along_path(hidden.states, verified.path)
            hidden = hidden.replace(states=states, positions=positions_BD1)
        return StepModels(
            drafter=drafter,
            drafter_state=drafter.keep_path(drafted.proposal.state, last, verified.path),
            target_cache=scored.target_cache.compact_path(last, verified.path),
            hidden=hidden,
        )


def _along_path(x_BN1, path_BD) -> jax.Array:
    """``x`` ``[B, N+1, ...]`` at the nodes that decide each emitted position: ``[B, D+1, ...]``."""
    nodes_BD1 = tree_verification.path_nodes_with_root(path_BD)
    index = nodes_BD1.reshape(*nodes_BD1.shape, *([1] * (x_BN1.ndim - 2)))
    return jnp.take_along_axis(x_BN1, index, axis=1)
