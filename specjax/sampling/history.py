"""`RowHistory`: what a row's tokens so far do to its next distribution.

A decoder feature that changes the distributions (`specjax.decoding.features`) hands
the models one `RowHistory` per step: the penalties' token counts
(`specjax.sampling.penalties.TokenCounts`), a constraint's automaton states
(`specjax.sampling.constraints.AutomatonCursor`), or a user's. The decoders put them in
`~specjax.sampling.RowSampling.histories`, and every function that turns logits into a
distribution applies each one's `mask` after the vocabulary limit, the forbidden ids
and the logit bias, and before the temperature and the filters: the target's p, a
drafter's q, and the argmax of a greedy drafter alike.

A history is at the committed prefix (``[B]`` rows) or, after `along`, at each of a
step's scored positions (``[B, G+1]``): position i is after the committed tokens and
the step's drafts ``0..i-1``, which is what makes the target's p there the one plain
decoding would use. A drafter that draws its drafts one by one calls `advance`
between them (`specjax.sampling.penalties.after_token`), so that its i-th q reads its
own drafts ``0..i-1`` too.
"""

from __future__ import annotations

from typing import ClassVar

import jax


class RowHistory:
    """Rows' history as one feature sees it. Subclass it as a ``flax.struct`` dataclass.

    The defaults suit a history that does not depend on the tokens (a fixed mask): a
    history that reads them overrides `advance`, `along` and, for trees, `along_tree`.

    Example (a history that forbids fixed ids; a decoder feature hands it on from its
    ``history`` hook, and ``tests/test_features.py`` has one that is its own history)::

        @struct.dataclass
        class NoIds(RowHistory):
            ids: jax.Array  # int32[K], in every row

            def mask(self, logits_RxV, config):
                return logits_RxV.at[..., self.ids].set(-jnp.inf)
    """

    #: The mask only sets logits to ``-inf`` (a constraint), so that a greedy drafter's
    #: argmax and the decoder's check for a usable distribution apply it; a history
    #: that shifts logits (penalties) sets this to False.
    masks_only: ClassVar[bool] = True

    def mask(self, logits_RxV: jax.Array, config) -> jax.Array:
        """The float32 logits ``[B, ..., V_l]`` transformed by this history.

        Args:
            logits_RxV: logits after the vocabulary limit, forbidden ids and logit bias;
                the history's leading axes (``[B]`` or ``[B, T]``) broadcast against
                theirs. ``V_l`` may be a smaller drafter's vocabulary, whose ids are the
                target's first ``V_l``.
            config: the rows' `~specjax.sampling.SamplingConfig` (settings a history
                may read, e.g. the penalties' strengths).
        """
        return logits_RxV

    def advance(self, tokens_B: jax.Array) -> RowHistory:
        """The history after each row's next token ``tokens_B`` (``int32[B]``)."""
        return self

    def along(self, drafts_BG: jax.Array) -> RowHistory:
        """The history at a step's ``G + 1`` scored positions (``[B, G+1]``), position i
        after the committed tokens and drafts ``0..i-1`` of ``drafts_BG``; a draft of
        ``-1`` was not proposed (its positions are never used)."""
        return self

    def along_tree(self, node_tokens_BN: jax.Array, parents: tuple[int, ...], width: int):
        """The history at a tree's root and nodes, then padding, ``[B, width]``: node j
        after the committed tokens and the path from the root to j, j included
        (``parents`` as in `specjax.verification.tree.Tree`); the padding columns after
        the N + 1 nodes are never read."""
        return self
