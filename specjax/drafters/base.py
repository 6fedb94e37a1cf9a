"""The drafter contract: who proposes the γ tokens the target verifies.

A drafter is a small frozen pytree (``flax.struct.dataclass``) with pure functions
that the decoder calls inside its ``lax.while_loop``; only ``propose`` must be
written, and ``init`` and ``update`` default to a stateless drafter's:

* ``init(prompts_BS, seq_lengths_B, cache_len, hidden) -> state`` once, after the
  prompt;
* ``propose(keys_BG, state, seq_BS, seq_lengths_B, sampling) -> Proposal`` each step;
* ``update(state, seq_lengths_B, hidden) -> state`` after verification, with each
  row's new length (this is where a draft model rolls its KV cache back);
* for a `TreeDrafter` proposing a tree, ``keep_path(state, start_B, path_BD) -> state``
  between the two, with the accepted path (optional: the default keeps nothing).

``seq_BS`` is the decoder's token buffer: slot ``s`` of row ``b`` holds the
token at position ``s``; only ``s < seq_lengths_B[b]`` is valid. The last valid
token of each row has not been fed to any model yet.

``keys_BG`` holds one PRNG key per row and drafted position: draft ``i`` of row
``b`` (position ``seq_lengths_B[b] + i``) must be drawn with ``keys_BG[b, i]``,
e.g. ``specjax.sampling.sample(keys_BG[:, i], q_BV)``, and with nothing else. The
decoder derives them from the position (`specjax.sampling.noise`), so drafts are
reproducible per row; in coupled verification they are the very keys the target
samples that position with, which is what makes a good drafter's tokens match. A
deterministic drafter ignores them.

``sampling`` is a `specjax.sampling.RowSampling`: the user's `specjax.SamplingConfig`
with one value per row in each setting (``[B]``), plus the rows' histories at the
committed prefix (``histories``: the penalties' counts, a constraint's states, a
user's; `specjax.sampling.history`; a tree drafter is given none). A
drafter that samples passes it as it is to `specjax.sampling.probs_from_logits` (or
`draw_draft`), so that its q is processed like the target's p, and one that draws its
drafts one by one advances it between drafts with
`specjax.sampling.penalties.after_token`. Called outside the decoders, ``propose``
may be given a plain `specjax.SamplingConfig`: every helper here treats it as having
no history.

The static shape parameters (``num_draft`` = γ) are non-pytree fields, so they
are part of the compiled program; everything else is an array leaf.

Drafters that read the target (`specjax.BlockDrafter`, `specjax.EagleDrafter`; their
shared base is `specjax.drafters.features.FeatureDrafter`) name the target layers they
need in a static tuple ``target_layers``. The decoder then asks the target for those
layers' hidden states inside the forwards it runs anyway (prefill and verify, through
the model contract's ``feature_layers=``) and hands them over as a
`~specjax.models.forward.TargetHidden`:

* ``init``'s ``hidden`` is the prompt's;
* ``update``'s are those of the γ+1 tokens the verify forward scored. Those at
  positions ``< seq_lengths_B - 1`` are committed; the rest (rejected drafts) are
  stale and must never be read.

No drafter ever runs a second target forward. Drafters with an empty
``target_layers`` (the default) get ``hidden=None``.

**Trees.** A `TreeDrafter` can also propose a static tree of drafts
(`specjax.verification.tree.Tree`, set by ``with_tree``), which the decoder verifies
exactly; its docstring has the contract.

The contract is inference only: how a drafter with weights of its own is trained
is `specjax.training`'s (`specjax.training.objectives`), and how it is saved and loaded
is `specjax.io.drafter_weights`'.

Writing another drafter (e.g. Medusa-style heads on the target's hidden states)
means writing one such dataclass and, to reach it by name, one line in
`specjax.drafters.registry`; see docs/drafters.md, "Writing a drafter".
"""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.forward import TargetHidden
from specjax.sampling import (
    SamplingConfig,
    greedy_rows,
    greedy_tokens,
    mask_vocab,
    probs_from_logits,
    sample,
)
from specjax.sampling.penalties import constrain
from specjax.verification.tree import Tree


@struct.dataclass
class Proposal:
    """What a drafter proposes for one decode step.

    Attributes:
        tokens: ``int32[B, γ]`` drafted tokens, each in ``[0, V)``.
        probs: ``float32[B, γ, V]`` the processed draft distributions the
            tokens were sampled from, or ``None`` for a deterministic drafter
            (q is then the one-hot of ``tokens``; no one-hots are materialised).
            A drafter whose ``vocab_size`` V_d is smaller than the target's returns
            ``[B, γ, V_d]``; the decoder zero-pads it (`specjax.sampling.vocab`).
        state: the drafter's new state.
        num_drafted: ``int32[B]`` how many leading drafts each row proposes, from a
            drafter that stops early (`Drafter.stops_early`) or drafts fewer by its
            own rule (`Drafter.drafts_fewer`); the rest of ``tokens`` is never
            verified. ``None``: all γ.
    """

    tokens: jax.Array
    probs: jax.Array | None
    state: object
    num_drafted: jax.Array | None = None


class Drafter(abc.ABC):
    """Interface of a drafter. Subclasses are frozen ``flax.struct`` dataclasses.

    Only `propose` must be written: the other members have defaults that fit a
    stateless drafter of any vocabulary (`init` returns ``()``, `update` keeps the
    state, `vocab_size` is ``None``), and a drafter with a state or weights overrides
    them. Every member the decoders, the memory check, the CLI and the benchmarks use
    is declared here, with one signature for every drafter.

    Attributes:
        num_draft: γ, tokens proposed per step (static).
        target_layers: static tuple of target layer indices whose hidden states the
            drafter reads (`~specjax.models.forward.TargetHidden`); empty for drafters
            that do not.
        tree: ``None``: the drafter proposes a chain of ``num_draft`` drafts (a
            `TreeDrafter` may propose a static `Tree` instead).
    """

    num_draft: int
    target_layers: tuple[int, ...] = ()
    tree: Tree | None = None
    #: Whether it is the null drafter (`NoDraft`), the only one the decoders let
    #: draft nothing (γ = 0): with it, speculative decoding is plain decoding.
    null_drafter: bool = False
    #: Whether `propose` stops a row's drafting itself under the decoders'
    #: ``draft_confidence`` τ (given to `with_confidence`) and reports
    #: it in `Proposal.num_drafted`, skipping forwards no row needs. Otherwise the
    #: decoder cuts the chain from the returned q after the drafter ran all γ.
    stops_early: bool = False
    #: Whether `propose` may draft fewer than γ for a row by its own rule (a match too
    #: short to trust: `specjax.drafters.suffix.SuffixDrafter`), always reported in
    #: `Proposal.num_drafted`; the verify forward then scores only the longest chain
    #: (unless a forward width is fixed).
    drafts_fewer: bool = False
    #: What errors call it ("block drafter").
    noun: str = "drafter"

    def with_confidence(self, threshold: jax.Array) -> Drafter:
        """The drafter the decoders run under ``draft_confidence`` τ (``float32[]``).

        A drafter that stops its rows itself (`stops_early`) takes τ here; any other
        is returned as it is, and the decoder cuts its chain from the returned q.
        """
        return self

    def with_draft(self, num_draft: int | None = None, mode: str | None = None) -> Drafter:
        """The same drafter with another γ and/or drafting mode (no new weights).

        The default knows no modes; drafters with some (`specjax.BlockDrafter`'s
        ``"argmax"`` and ``"sample"``) override it.

        Raises:
            ValueError: ``mode`` is given, or the new γ is refused by `check`.
        """
        if mode is not None:
            raise ValueError(f"{type(self).__name__} has no drafting modes, got mode={mode!r}")
        out = self if num_draft is None else self.replace(num_draft=num_draft)
        out.check()
        return out

    @property
    def vocab_size(self) -> int | None:
        """V of the drafter (at most the target's), or ``None`` (default) for any
        vocabulary: a drafter that copies ids it is given."""
        return None

    def init(
        self,
        prompts_BS: jax.Array,
        seq_lengths_B: jax.Array,
        cache_len: int,
        hidden: TargetHidden | None = None,
    ):
        """Builds the drafter's state after the prompt (e.g. prefills its cache).

        The default is a stateless drafter's: an empty state, ``()``.

        Args:
            prompts_BS: ``int32[B, S]`` right-padded prompts.
            seq_lengths_B: ``int32[B]`` their lengths.
            cache_len: the decoder's cache slots per row.
            hidden: the prompt's `~specjax.models.forward.TargetHidden` of
                ``target_layers``; ``None`` for a drafter that reads none.
        """
        del prompts_BS, seq_lengths_B, cache_len, hidden
        return ()

    @abc.abstractmethod
    def propose(
        self,
        keys_BG: jax.Array,
        state,
        seq_BS: jax.Array,
        seq_lengths_B: jax.Array,
        sampling: SamplingConfig,
    ) -> Proposal:
        """Proposes ``num_draft`` tokens per row continuing ``seq_BS[b, :seq_lengths_B[b]]``.

        Args:
            keys_BG: PRNG keys ``[B, γ]``; draft ``i`` of row ``b`` is drawn with
                ``keys_BG[b, i]`` only.
            state: the drafter's state.
            seq_BS: ``int32[B, S]`` the token buffer (slot == position).
            seq_lengths_B: ``int32[B]`` valid tokens per row.
            sampling: the rows' settings and history (`specjax.sampling.RowSampling`),
                each setting ``[B]``.

        Returns:
            a `Proposal` with ``tokens int32[B, γ]``.
        """

    def update(self, state, seq_lengths_B: jax.Array, hidden: TargetHidden | None = None):
        """Returns the state after verification left each row ``seq_lengths_B`` long.

        ``hidden`` is the verify forward's `~specjax.models.forward.TargetHidden` of
        ``target_layers`` (``None`` for a drafter that reads none). The default keeps the
        state as it is (a stateless drafter's).
        """
        del seq_lengths_B, hidden
        return state

    def check(self) -> None:
        """Raises ValueError/TypeError if the drafter's own settings are inconsistent.

        The decoders call it before anything compiles (after `with_tree` too). The
        default checks nothing; drafters with settings that can disagree (a block
        shorter than γ, a mode they lack) override it.
        """
        return None

    def own_models(self) -> dict[str, object]:
        """The models the drafter runs under the model contract, by the name errors use.

        The decoders check each like the target (vocabulary, tree support). The
        default is none; `specjax.DraftModel` returns ``{"drafter.model": model}``.
        """
        return {}

    def state_bytes(self, batch_size: int, cache_len: int) -> int:
        """Bytes of the drafter's state for ``batch_size`` rows of ``cache_len`` slots.

        The decoders add it to the target's cache in their memory check, before
        anything compiles. The default, 0, fits drafters whose state is a few
        per-row scalars; a drafter with a cache overrides it (see
        `specjax.models.forward.cache_bytes`).
        """
        del batch_size, cache_len
        return 0


class TreeDrafter(Drafter):
    """A drafter that can also propose a static tree of drafts instead of a chain.

    A subclass declares ``tree`` as a static dataclass field (default ``None``: a
    chain); `with_tree` sets it, and the decoders then verify the tree exactly
    (`specjax.verification.tree`). While it proposes a tree, ``propose`` returns
    ``tokens int32[B, N]``, one per node in the tree's order, with ``probs=None``
    (children are deterministic: the top-k of the node's distribution), ``num_draft``
    is the tree's depth D and ``keys_BG`` is ``[B, D]`` (it may ignore them). A drafter
    that reads the target gets in ``update`` the hidden states of the root and of the
    accepted path, ``[B, D+1, ·]`` at consecutive positions, as for a chain.
    """

    def with_tree(self, tree) -> Drafter:
        """The same drafter proposing ``tree`` (a `Tree`, a branching tuple or "3,2,2,1").

        ``num_draft`` becomes the tree's depth. ``None`` goes back to a chain of
        ``num_draft`` drafts.
        """
        if tree is None:
            return self.replace(tree=None)
        tree = as_tree(tree)
        out = self.replace(tree=tree, num_draft=tree.depth)
        out.check()  # e.g. a BlockDrafter's block is at least the tree's depth
        return out

    def keep_path(self, state, start_B: jax.Array, path_BD: jax.Array):
        """Returns the state after a tree step accepted ``path_BD`` (before `update`).

        Called by the decoders after every tree verification, with the root's slot
        and the accepted path (`specjax.verification.tree.tree_verify`'s ``path_BD``). A drafter
        whose state holds entries for the tree's nodes (a draft model's cache, with
        node j at slot ``start + j``) can keep the accepted ones instead of computing
        them again next step; the default keeps nothing. Whatever it returns, the
        decoders' output is the same: only the drafter's cost depends on it.
        """
        del start_B, path_BD
        return state


class StatelessDrafter(Drafter):
    """A drafter without weights or state: any vocabulary, nothing to build or roll back
    (the `Drafter` defaults, named)."""


@struct.dataclass
class NoDraft(StatelessDrafter):
    """The null drafter (γ = 0): with it, speculative decoding *is* plain decoding.

    Each step then scores only the pending token and emits the target's own sample,
    drawn with the same position-keyed noise that speculative decoding uses for its
    bonus tokens. `specjax.generate` runs the one decode loop with this drafter.
    """

    num_draft: int = struct.field(pytree_node=False, default=0)
    null_drafter = True

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        tokens = jnp.zeros((seq_BS.shape[0], 0), jnp.int32)
        return Proposal(tokens=tokens, probs=None, state=state)


def draw_draft(key_B, logits_RxV: jax.Array, sampling, *, argmax: bool):
    """One draft per row from a drafter's logits ``[B, ..., V]``, and the q it came from.

    ``argmax``: the most probable id among those the rows may emit (below the vocabulary
    limit, allowed by a constraint), and ``None`` for q: no probabilities are computed.
    Else a sample of ``probs_from_logits(logits, sampling)`` (which applies the same
    masks and every other setting) and those probabilities. Masking the argmax is not
    needed for exactness (any proposal is verified), only so that no draft is wasted
    on an id the target can never emit.
    """
    if argmax:
        return greedy_tokens(
            constrain(mask_vocab(logits_RxV, sampling.vocab_limit), sampling)
        ), None
    probs = probs_from_logits(logits_RxV, sampling)
    return sample(key_B, probs), probs


def own_probability(logits_BV, token_B, probs_BV, sampling) -> jax.Array:
    """``float32[B]``: how sure a drafter is of each row's draft, for ``draft_confidence``.

    ``q(x)`` where the draft was sampled from q. Where it is an argmax (``probs_BV`` is
    ``None``, or a greedy row, whose q is one-hot) the softmax of the logits at the
    draft instead: a one-hot q says nothing about how sure the drafter is.
    """
    logits_BV = mask_vocab(logits_BV.astype(jnp.float32), sampling.vocab_limit)
    at = token_B[:, None]
    raw_B = jnp.take_along_axis(jax.nn.softmax(logits_BV, axis=-1), at, axis=-1)[:, 0]
    if probs_BV is None:
        return raw_B
    q_B = jnp.take_along_axis(probs_BV, at, axis=-1)[:, 0]
    return jnp.where(greedy_rows(sampling, token_B.shape[0]), raw_B, q_B)


def as_tree(tree) -> Tree:
    """A `Tree` from a `Tree`, a branching sequence like ``(3, 2, 2, 1)``, or ``"3,2,2,1"``."""
    if isinstance(tree, Tree):
        return tree
    if isinstance(tree, str):
        return Tree.parse(tree)
    return Tree.from_branching(tree)


def lookahead(drafter: Drafter) -> int:
    """Columns one verify forward of ``drafter`` scores: γ + 1 (the pending token and γ
    drafts), or N + 1 for a tree; the narrowest fixed forward width it decodes at."""
    tree = getattr(drafter, "tree", None)
    return (tree.num_nodes if tree is not None else drafter.num_draft) + 1
