"""`DraftModel`: a smaller LM drafting autoregressively with its own KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.drafters.base import Proposal, TreeDrafter, draw_draft, own_probability
from specjax.models.cache import KVCache, TreeMask
from specjax.models.forward import cache_bytes, prefill, score
from specjax.sampling import RowSampling
from specjax.sampling.penalties import after_token
from specjax.verification.tree import Tree, expand_top_k


@struct.dataclass
class DraftModel(TreeDrafter):
    """A smaller LM that drafts γ tokens autoregressively with its own KV cache.

    The draft samples from ``probs_from_logits(draft_logits, sampling)``, the
    same transforms the target's distribution gets (``vocab_limit`` included), and
    returns those full probabilities so rejection sampling sees the q it actually
    sampled from.

    The draft may have a smaller vocabulary than the target (a padded family, see
    `specjax.sampling.vocab`): its ``[B, γ, V_d]`` q is zero-padded by the decoder.

    With ``greedy_draft=True`` it proposes its argmax instead (below the row's
    ``vocab_limit``) and returns no q: the verifier then treats q as the one-hot of
    each draft, which is exact (a draft ``x`` is accepted with probability
    ``p(x)``), needs no ``[B, γ, V]`` buffer, and can accept more than the true q
    when the draft ranks well but is underconfident; against a flat target it accepts
    less (BENCHMARKS.md, "Offline throughput", measures both).

    With the decoders' ``draft_confidence`` τ a row stops drafting after its first
    draft whose own probability is below τ (``q(x)``; the draft model's softmax where
    q is one-hot: greedy rows, ``greedy_draft``), and a forward no row needs is
    skipped. It pays where drafts past the first unconfident one are mostly rejected
    and each draft step costs a sizeable part of the target's, and changes little where
    the draft is mostly right (BENCHMARKS.md, "Which speculative configuration is
    fastest", has the Qwen2.5-Coder pair with and without it).

    Attributes:
        model: the draft model (any object following the model contract).
        num_draft: γ, tokens proposed per step (static).
        greedy_draft: propose the draft's argmax with one-hot q (static).
        stop_below: τ, from the decoders' ``draft_confidence`` (`with_confidence`;
            ``None``: every row drafts γ).
        catch_up: static: the cache may lack any number of committed tokens (it sat
            out steps another drafter served, `specjax.drafters.chain`); they are fed
            in forwards of ``catch_up`` tokens before drafting. 0: it lacks at most
            two, as when it drafts every step.
    """

    model: object
    num_draft: int = struct.field(pytree_node=False, default=4)
    greedy_draft: bool = struct.field(pytree_node=False, default=False)
    tree: Tree | None = struct.field(pytree_node=False, default=None)
    stop_below: jax.Array | None = None
    catch_up: int = struct.field(pytree_node=False, default=0)
    stops_early = True
    noun = "draft model"

    def with_confidence(self, threshold: jax.Array) -> DraftModel:
        """The draft model stopping each row at its first draft whose q is below τ."""
        return self.replace(stop_below=threshold)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def _readable(self, tokens):
        # The decoders refuse concrete limits and prompts that would show the draft an
        # id >= its V; a traced vocab_limit cannot be checked, and an out-of-range id
        # would embed as NaN (jnp.take's fill) and poison its cache. Any input keeps the
        # output exact (the verifier only needs the q the drafts came from).
        return jnp.minimum(tokens, self.model.vocab_size - 1)

    def init(self, prompts_BS, seq_lengths_B, cache_len, hidden=None):
        del hidden  # reads no target layers
        cache, _ = prefill(self.model, self._readable(prompts_BS), seq_lengths_B, cache_len)
        return cache

    def own_models(self) -> dict[str, object]:
        return {"drafter.model": self.model}

    def state_bytes(self, batch_size: int, cache_len: int) -> int:
        return cache_bytes(self.model, batch_size, cache_len)

    def propose(self, keys_BG, state: KVCache, seq_BS, seq_lengths_B, sampling):
        if self.tree is not None:
            return self._propose_tree(state, seq_BS, seq_lengths_B, sampling)
        b = seq_BS.shape[0]
        last = seq_lengths_B - 1
        # After a step where every draft was accepted the draft cache lacks the last
        # draft token (at last - 1) as well as the newest.
        if self.catch_up:
            state = self._catch_up(state, seq_BS, last)
        logits_BV, cache = self._feed_missing(state, seq_BS, last, (1, 2))
        if self.num_draft == 0:
            # A step that drafts nothing (adaptive γ): the two newest tokens are still
            # fed, so that the cache never lacks more than the newest one.
            return Proposal(tokens=jnp.zeros((b, 0), jnp.int32), probs=None, state=cache)

        def draw(keys_B, logits_BV, settings):
            # The penalties and the constraint of draft i read the prefix and drafts
            # 0..i-1, as the target's at that position do (`specjax.sampling.penalties`).
            return draw_draft(keys_B, logits_BV, settings, argmax=self.greedy_draft)

        stops = self.stop_below is not None

        def confident(logits_BV, token_B, probs_BV):
            if not stops:
                return jnp.ones((b,), bool)
            return own_probability(logits_BV, token_B, probs_BV, sampling) >= self.stop_below

        sampling = RowSampling.of(sampling)  # a user's SamplingConfig: no history
        token, probs = draw(keys_BG[:, 0], logits_BV, sampling)
        # Only the histories the transforms read are carried (the settings are constants).
        histories = sampling.histories
        # A row proposes up to and including its first draft below τ: whether draft i
        # is proposed depends only on the drafts before it (exact, see
        # `speculative_generate`'s draft_confidence).
        going_B = confident(logits_BV, token, probs)
        num_drafted_B = jnp.ones((b,), jnp.int32)

        def step(carry, keys_B):
            token_B, position_B, cache, histories, going_B, num_drafted_B = carry
            settings = after_token(sampling.replace(histories=histories), token_B)

            def forward(cache):
                logits, cache, _ = score(self.model, token_B[:, None], position_B[:, None], cache)
                return logits[:, 0].astype(jnp.float32), cache

            def skip(cache):
                # No row proposes this draft: it is never verified, so any token will
                # do, and the cache keeps only what rows proposed.
                logits_shape = jax.eval_shape(forward, cache)[0]
                return jnp.zeros(logits_shape.shape, jnp.float32), cache

            if stops:
                logits_BV, cache = jax.lax.cond(jnp.any(going_B), forward, skip, cache)
            else:
                logits_BV, cache = forward(cache)
            next_token, probs = draw(keys_B, logits_BV, settings)
            num_drafted_B = num_drafted_B + going_B.astype(num_drafted_B.dtype)
            going_B = going_B & confident(logits_BV, next_token, probs)
            carry = (next_token, position_B + 1, cache, settings.histories, going_B, num_drafted_B)
            return carry, (next_token, probs)

        # Unrolled: γ is small and static, and the inner while loop's carry
        # copies cost ~10% of a proposal on CPU (0.37 -> 0.335 ms, bundled draft, γ=4).
        carry = (token, last + 1, cache, histories, going_B, num_drafted_B)
        (_, _, cache, _, _, num_drafted_B), (tokens_rest, probs_rest) = jax.lax.scan(
            step, carry, jnp.moveaxis(keys_BG[:, 1:], 1, 0), unroll=True
        )
        tokens = jnp.concatenate([token[:, None], jnp.moveaxis(tokens_rest, 0, 1)], axis=1)
        num_drafted = num_drafted_B if stops else None
        if self.greedy_draft:
            return Proposal(tokens=tokens, probs=None, state=cache, num_drafted=num_drafted)
        probs = jnp.concatenate([probs[:, None], jnp.moveaxis(probs_rest, 0, 1)], axis=1)
        return Proposal(tokens=tokens, probs=probs, state=cache, num_drafted=num_drafted)

    def _feed_missing(self, cache: KVCache, seq_BS, last_B, widths):
        """Feeds every row the tokens its cache lacks, up to its newest (at ``last_B``).

        One forward of the narrowest of the static ``widths`` that covers every row,
        picked on device (`lax.switch`); a row that lacks fewer is fed its last
        ``width`` tokens, rewriting identical entries. So one row that lacks two
        tokens sends the batch through a two-token forward, which on a CPU costs
        somewhat more than a one-token one (`specjax.models.matmul`; BENCHMARKS.md, "What
        bounds the speedup on a CPU") and on an accelerator about the same.

        Returns:
            ``(logits float32[B, V] at each row's newest token, cache)``.
        """
        b, s = seq_BS.shape
        rows = jnp.arange(b)

        def feed(width):
            def run(cache):
                # Near the start, positions past `last` feed stale tokens into slots
                # the drafts overwrite (or past the cache's end, dropped); no committed
                # query sees them.
                first_B = jnp.maximum(jnp.minimum(cache.lengths, last_B + 1 - width), 0)
                positions_BW = first_B[:, None] + jnp.arange(width)[None]
                tokens_BW = self._readable(seq_BS[rows[:, None], jnp.minimum(positions_BW, s - 1)])
                logits_BWV, cache, _ = score(self.model, tokens_BW, positions_BW, cache)
                return logits_BWV[rows, last_B - first_B].astype(jnp.float32), cache

            return run

        missing = jnp.max(last_B + 1 - cache.lengths)
        index = jnp.minimum(jnp.sum(jnp.asarray(widths) < missing), len(widths) - 1)
        return jax.lax.switch(index, [feed(w) for w in widths], cache)

    def _catch_up(self, cache: KVCache, seq_BS, last_B) -> KVCache:
        """Feeds, ``catch_up`` tokens a forward, what the cache lacks beyond the newest two.

        A row that lacks fewer rides along, rewriting its newest entries with the same
        tokens (`_feed_missing`'s rule); the loop stops when no row lacks more than two.
        """
        width = self.catch_up
        b, s = seq_BS.shape
        rows = jnp.arange(b)

        def lacking(cache):
            return jnp.max(last_B + 1 - cache.lengths) > 2

        def feed(cache):
            first_B = jnp.maximum(jnp.minimum(cache.lengths, last_B - 1 - width), 0)
            positions_BW = first_B[:, None] + jnp.arange(width)[None]
            tokens_BW = self._readable(seq_BS[rows[:, None], jnp.minimum(positions_BW, s - 1)])
            _, cache, _ = score(self.model, tokens_BW, positions_BW, cache)
            # Only up to the row's second newest: the usual feed takes it from there.
            return cache.rollback(jnp.minimum(cache.lengths, jnp.maximum(last_B - 1, 0)))

        return jax.lax.while_loop(lacking, feed, cache)

    def _propose_tree(self, state: KVCache, seq_BS, seq_lengths_B, sampling) -> Proposal:
        """Expands the top-k of each node, one draft forward per level.

        Tree nodes are written at tree slots (node j at ``last + j``) past the pending
        token; after verification `keep_path` moves the accepted ones to their
        positions, so the cache then lacks at most two committed tokens: the pending
        one, and the accepted leaf (leaves are never scored). A step first feeds what
        the cache lacks, then the levels, each attending to its ancestors. A cache
        that lacks more (a caller that did not call `keep_path`) is fed its last
        D + 1 tokens instead, which is right for any cache but costs a wider forward.
        """
        tree = self.tree
        last = seq_lengths_B - 1
        # After `keep_path` the cache lacks the newest token and at most an accepted
        # leaf; depth + 1 covers any cache.
        root_BV, cache = self._feed_missing(
            state, seq_BS, last, tuple(sorted({1, 2, tree.depth + 1}))
        )
        visible = jnp.asarray(tree.ancestors)

        def score_level(depth, tokens_Bn, cache):
            first, stop = tree.level(depth)
            mask = TreeMask(
                start=last,
                slots=last[:, None] + jnp.arange(first, stop)[None],
                visible=visible[first:stop],
            )
            positions_Bn = jnp.broadcast_to(last[:, None] + depth, tokens_Bn.shape)
            logits, cache, _ = score(
                self.model, self._readable(tokens_Bn), positions_Bn, cache, tree=mask
            )
            return logits, cache

        tokens, cache = expand_top_k(
            tree, root_BV[:, None], sampling.vocab_limit, score_level, cache
        )
        return Proposal(tokens=tokens, probs=None, state=cache.rollback(last + 1))

    def keep_path(self, state: KVCache, start_B, path_BD):
        # Node j was written at slot start + j for every node but the leaves: moved to
        # their positions, the accepted nodes above the leaves are what feeding them
        # one by one would have written (the same tokens, positions and ancestors).
        if not callable(getattr(state, "compact_path", None)):
            return state  # a model whose cache cannot move entries: fed again next step
        depth = path_BD.shape[1]
        return state.compact_path(start_B, path_BD).rollback(start_B + depth)

    def update(self, state: KVCache, seq_lengths_B, hidden=None):
        del hidden
        # A chain step's cache holds every accepted draft; after a tree step
        # `keep_path` left the accepted path above the leaves. The row's newest token
        # (and an accepted leaf) are fed next step.
        return state.rollback(jnp.minimum(state.lengths, seq_lengths_B - 1))
