"""An EAGLE-3-style draft head: one decoder layer that drafts over its own output features.

The head reads three of the target's hidden states (a low, a middle and a high layer,
`target_layers`) and reuses the target's embedding and LM head (shared, never copied).
It is an autoregressive LM over *token positions* whose input at position ``j`` also
carries a feature of position ``j - 1``:

    u_t  = fc(concat(h_l(t) for l in target_layers))                 # [E], Linear(3E -> E)
    x_j  = input_proj(concat(embed_norm(e(x_j)), feature_norm(f_j)))  # Linear(2E -> E)
    g_j  = DecoderLayer(x_j)      (causal attention over the head's own KV cache)
    q(x_{j+1} | ...) = softmax(target.head(norm(g_j)))

The feature ``f_j`` at position ``j`` is ``u_{j-1}``, the fused target feature of the
previous position (zero at ``j = 0``), while those are known; drafting further, it is
the head's own output ``g_{j-1}`` ("drafts over its own output features"). So with a row
of ``L`` tokens (the pending token ``x_{L-1}`` not yet scored by the target, features
committed for positions ``<= L-2``):

* head position ``L-1`` takes ``(u_{L-2}, x_{L-1})`` and its output predicts draft 1
  (position ``L``);
* head position ``L-1+i`` (i >= 1) takes ``(g_{L-2+i}, d_i)`` and predicts draft ``i+1``.

γ drafts cost γ head steps. The layer's input is Linear(2E -> E) of the two normed
halves followed by an ordinary pre-norm Llama layer, rather than EAGLE-3's q/k/v
projections of width 2E: the same information, and a standard layer after it.

**State** (`EagleState`): the head's `KVCache` (one layer; slot == position, as every
cache here: slot ``j`` holds the keys/values of the input at position ``j``), plus the
fused features the decoder handed over that are not yet in the cache. ``update`` gets
the verify forward's features but not the token buffer, and position ``j``'s input
needs token ``x_j``, so ``update`` only stores them (``fused [B, W, E]`` with the head
position ``slots [B, W]`` = feature position + 1 each feeds) and ``propose`` first runs
the head over those positions (pairing each with its token from ``seq_BS``), which also
gives draft 1. Columns at positions ``>= L`` are stale (features of rejected drafts)
and are never written. Invariant: before ``propose``, cache slots ``< L - 1`` hold the
committed inputs and the stored columns cover position ``L - 1``; slots ``>= L`` may
hold anything (rejected drafts' entries), and every query reads only slots at or
before its own position, which are rewritten first. Rolling back is free.

It is trained with EAGLE-3's training-time test (`specjax.training.eagle`); its weights
are saved and loaded by `specjax.io.drafter_weights`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.drafters.base import Proposal, draw_draft
from specjax.drafters.features import MODES, FeatureDrafter, layers_config
from specjax.models.attention import (
    Keys,
    attend,
    rope_inv_freq,
    split_heads,
    visible_slots,
    write_kv,
)
from specjax.models.cache import KVCache, TreeMask
from specjax.models.config import ModelConfig
from specjax.models.forward import TargetHidden
from specjax.models.layers import MLP, Dense, RMSNorm
from specjax.sampling.penalties import after_token
from specjax.verification.tree import expand_top_k

__all__ = ["MODES", "EagleDrafter", "EagleHead", "EagleState", "shift"]


# ----------------------------------------------------------------------------
# The network (an NNX module, used functionally through split params).


class EagleHead(nnx.Module):
    """The head's own weights: feature fusion, input projection, one layer, a final norm."""

    def __init__(self, config: ModelConfig, num_features: int, *, dtype=jnp.float32, rngs):
        c = config
        e, d = c.hidden_size, c.head_dim
        self.config = c
        self.fc = Dense(num_features * e, e, False, dtype, rngs)
        self.embed_norm = RMSNorm(e, c.rms_norm_eps, dtype)
        self.feature_norm = RMSNorm(e, c.rms_norm_eps, dtype)
        self.input_proj = Dense(2 * e, e, False, dtype, rngs)
        self.input_layernorm = RMSNorm(e, c.rms_norm_eps, dtype)
        self.q_proj = Dense(e, c.num_heads * d, False, dtype, rngs)
        self.k_proj = Dense(e, c.num_kv_heads * d, False, dtype, rngs)
        self.v_proj = Dense(e, c.num_kv_heads * d, False, dtype, rngs)
        self.o_proj = Dense(c.num_heads * d, e, False, dtype, rngs)
        self.post_attention_layernorm = RMSNorm(e, c.rms_norm_eps, dtype)
        self.mlp = MLP(c, dtype, rngs)
        self.norm = RMSNorm(e, c.rms_norm_eps, dtype)

    def layer_input(self, emb_BQE, feature_BQE):
        """The layer's input ``[B, Q, E]`` from token embeddings and features."""
        both = jnp.concatenate([self.embed_norm(emb_BQE), self.feature_norm(feature_BQE)], -1)
        return self.input_proj(both)

    def qkv(self, x_BQE, positions_BQ):
        """Rotated queries ``[B, Q, H, D]``, keys and values ``[B, Q, K, D]``."""
        inv_freq, d = rope_inv_freq(self.config), self.config.head_dim
        h = self.input_layernorm(x_BQE)
        return (
            split_heads(self.q_proj(h), positions_BQ, inv_freq, d),
            split_heads(self.k_proj(h), positions_BQ, inv_freq, d),
            split_heads(self.v_proj(h), positions_BQ, inv_freq, d, rotate=False),
        )

    def finish(self, x_BQE, q_BQHD, keys):
        """The layer's output (the head's output feature ``g``, before the final norm)
        for queries ``q`` of ``x`` attending to the `~specjax.models.attention.Keys`
        sets ``keys``."""
        x = x_BQE + self.o_proj(attend(q_BQHD, keys, self.config))
        return x + self.mlp(self.post_attention_layernorm(x))


def shift(x_BT, n: int):
    """``x`` moved ``n`` positions later along axis 1, zero-filled at the start."""
    if n == 0:
        return x_BT
    pad = [(0, 0), (n, 0)] + [(0, 0)] * (x_BT.ndim - 2)
    return jnp.pad(x_BT, pad)[:, : x_BT.shape[1]]


# ----------------------------------------------------------------------------
# The drafter.


@struct.dataclass
class EagleState:
    """What an `EagleDrafter` carries between steps.

    Attributes:
        cache: the head's one-layer `KVCache` (``k [1, B, K, D, S]``); slot ``j`` holds
            the input at position ``j``. ``lengths`` counts the slots known to hold
            committed inputs (informative; attention masks by position).
        fused: ``[B, W, E]`` fused target features not yet fed to the head
            (W = γ + 1 of the drafter that built the state).
        slots: ``int32[B, W]`` the head position each column feeds (its feature's
            position + 1); -1 for an empty column. Columns at or beyond the row's
            length are stale.
    """

    cache: KVCache
    fused: jax.Array
    slots: jax.Array


@struct.dataclass
class EagleDrafter(FeatureDrafter):
    """Drafts γ tokens autoregressively with an EAGLE-3-style head on the target's features.

    See the module docstring for the architecture, the offsets and the state. The
    target is a pytree field: its embedding and LM head are used, never copied, and its
    hidden states arrive from the decoder's own forwards (no second target forward).
    The fields it shares with `specjax.BlockDrafter` are
    `~specjax.drafters.features.FeatureDrafter`'s.

    Attributes:
        target: the target model; it must return ``feature_layers=`` features and
            provide ``embed`` and ``head``.
        params: the head's own weights (``nnx.State``).
        graphdef: static NNX graph of `EagleHead`.
        config: static `ModelConfig` of the head layer.
        target_layers: static target layer indices whose outputs are fused.
        num_draft: γ (static), >= 0 (0 drafts nothing: an adaptive-γ step).
        mode: ``"argmax"`` (default; one-hot q) or ``"sample"`` (static).
    """

    net_type = EagleHead
    noun = "EAGLE drafter"

    @classmethod
    def random(
        cls,
        target,
        *,
        num_draft: int,
        key: jax.Array,
        target_layers: tuple[int, ...] | None = None,
        intermediate_size: int | None = None,
        mode: str = "argmax",
    ) -> EagleDrafter:
        """A head with random weights for any target (for tests, or to train).

        Args:
            target: the target model.
            num_draft: γ (>= 0).
            key: PRNG key of the initialisation.
            target_layers: target layer indices to fuse (default: a low, a middle and a
                high layer, `specjax.drafters.features.default_target_layers`).
            intermediate_size: the head's MLP width (default: the target's).
            mode: ``"argmax"`` or ``"sample"``.

        Raises:
            ValueError: naming the argument, for a negative ``num_draft``, an unknown
                ``mode`` or ``target_layers`` that are empty, repeated or not layers of
                the target.
        """
        from specjax.core.validation import as_prng_key

        key = as_prng_key("key", key)
        target_layers = cls.random_layers(target, target_layers, 3)
        config = layers_config(target, 1, intermediate_size)
        return cls.build(target, key, config, target_layers, num_draft=num_draft, mode=mode)

    # -- The reusable step: feed (feature, token) pairs at explicit positions. --------

    def step_features(
        self, cache: KVCache, features_BQE, tokens_BQ, positions_BQ, tree: TreeMask | None = None
    ):
        """Runs the head layer on Q (feature, token) inputs per row; no logits.

        Each input's keys/values are written into ``cache`` at slot = its position
        (positions ``>= cache.max_len`` are not written), then each query attends to the
        slots at or before its own position; with ``tree``, to the tree's slots and
        visibility instead (`~specjax.models.attention.visible_slots`).

        Args:
            cache: the head's cache.
            features_BQE: the feature of each input (``f_j``: a fused target feature
                ``u_{j-1}``, or the head's own output ``g_{j-1}``).
            tokens_BQ: ``int32`` the token at each input's position.
            positions_BQ: ``int32`` absolute positions (also the cache slots written).
            tree: optional `~specjax.models.cache.TreeMask`: the slots written (tree
                nodes of one depth share a position) and each node's ancestors.

        Returns:
            ``(g_BQE, cache)``: the head's output features and the updated cache.
        """
        slots_BQ = positions_BQ if tree is None else tree.slots
        net = self.net
        x = net.layer_input(self.target.embed(tokens_BQ), features_BQE.astype(self.target.dtype))
        q, k, v = net.qkv(x, positions_BQ)
        ck, cv = write_kv(cache.k, cache.v, 0, slots_BQ, k, v)
        visible = visible_slots(jnp.arange(cache.max_len)[None], positions_BQ, tree=tree)
        g = net.finish(x, q, [Keys(ck[0], cv[0], visible)])
        return g, cache.replace(k=ck, v=cv)

    def step_logits(
        self, cache: KVCache, features_BQE, tokens_BQ, positions_BQ, tree: TreeMask | None = None
    ):
        """`step_features` and the target's LM head: ``(logits float32[B, Q, V], g, cache)``.

        The logits at position ``j`` are the draft distribution of the token at ``j + 1``;
        ``g`` is the feature to feed with that token at ``j + 1``.
        """
        g, cache = self.step_features(cache, features_BQE, tokens_BQ, positions_BQ, tree)
        return self.target.head(self.net.norm(g)), g, cache

    # -- The drafter contract. ---------------------------------------------------------

    def init(self, prompts_BS, seq_lengths_B, cache_len, hidden: TargetHidden = None) -> EagleState:
        b, p = prompts_BS.shape
        lengths = jnp.asarray(seq_lengths_B, jnp.int32)
        fused = self.net.fc(hidden.states)  # [B, P, E] at positions 0..P-1
        # Position j takes u_{j-1} (zero at j = 0). Positions >= L are padding: written
        # (or dropped past the cache) but never read, like any slot >= L.
        positions = hidden.positions
        _, cache = self.step_features(
            self.init_cache(b, cache_len), shift(fused, 1), prompts_BS, positions
        )
        # Position L-1 (the pending token) is left to propose, which needs its output.
        rows = jnp.arange(b)
        last = jnp.maximum(lengths - 2, 0)
        first = jnp.where((lengths >= 2)[:, None], fused[rows, last], 0.0)
        w = self.num_draft + 1
        fused_BWE = jnp.zeros((b, w, fused.shape[-1]), fused.dtype).at[:, 0].set(first)
        slots = jnp.full((b, w), -1, jnp.int32).at[:, 0].set(lengths - 1)
        return EagleState(cache=cache.rollback(lengths - 1), fused=fused_BWE, slots=slots)

    def update(self, state: EagleState, seq_lengths_B, hidden: TargetHidden = None) -> EagleState:
        b, t, _ = hidden.states.shape
        w = state.slots.shape[1]
        if t > w:
            raise ValueError(
                f"hidden: the verify forward scored {t} positions but this EagleDrafter's "
                f"state holds {w} (γ + 1 of the drafter that ran init): build the state and "
                "decode with one drafter"
            )
        fused = jnp.pad(self.net.fc(hidden.states), ((0, 0), (0, w - t), (0, 0)))
        slots = jnp.pad(hidden.positions + 1, ((0, 0), (0, w - t)), constant_values=-1)
        # A row that emitted nothing (finished) got no committed feature: its stored
        # columns still cover position L - 1, so it keeps them.
        fresh = slots[:, 0] <= jnp.asarray(seq_lengths_B, jnp.int32) - 1
        return state.replace(
            fused=jnp.where(fresh[:, None, None], fused.astype(state.fused.dtype), state.fused),
            slots=jnp.where(fresh[:, None], slots, state.slots),
        )

    def _draw(self, key_B, logits_BV, sampling):
        """One draft per row and the q it came from (``None``: one-hot, argmax mode)."""
        return draw_draft(key_B, logits_BV, sampling, argmax=self.mode == "argmax")

    def propose(self, keys_BG, state: EagleState, seq_BS, seq_lengths_B, sampling) -> Proposal:
        b, s = seq_BS.shape
        rows = jnp.arange(b)
        lengths = jnp.asarray(seq_lengths_B, jnp.int32)
        cache = state.cache
        # Catch up: feed the stored committed features with their tokens. Stale and
        # empty columns get a position past the cache, so they write nothing.
        valid = (state.slots >= 0) & (state.slots < lengths[:, None])
        tokens = seq_BS[rows[:, None], jnp.clip(state.slots, 0, s - 1)]
        positions = jnp.where(valid, state.slots, cache.max_len)
        g_BWE, cache = self.step_features(cache, state.fused, tokens, positions)
        cache = cache.rollback(lengths)
        state = state.replace(cache=cache)
        if self.num_draft == 0:
            # Nothing drafted (adaptive γ), but the committed inputs are in the cache now.
            return Proposal(tokens=jnp.zeros((b, 0), jnp.int32), probs=None, state=state)
        # The column at position L-1 (there is exactly one) proposes draft 1.
        col = jnp.argmax(state.slots == (lengths - 1)[:, None], axis=1)
        g_BE = g_BWE[rows, col]
        logits_BV = self.target.head(self.net.norm(g_BE[:, None]))[:, 0]
        if self.tree is not None:
            return self._propose_tree(state, g_BE, logits_BV, lengths - 1, sampling)
        token, probs = self._draw(keys_BG[:, 0], logits_BV, sampling)
        tokens_out, probs_out = [token], [probs]
        # γ is small and static: the chain is unrolled.
        for i in range(1, self.num_draft):
            # Draft i's penalties and constraint read drafts 0..i-1 (`specjax.sampling.penalties`).
            sampling = after_token(sampling, token)
            pos = (lengths - 1 + i)[:, None]
            logits, g, cache = self.step_logits(cache, g_BE[:, None], token[:, None], pos)
            g_BE = g[:, 0]
            token, probs = self._draw(keys_BG[:, i], logits[:, 0], sampling)
            tokens_out.append(token)
            probs_out.append(probs)
        # The chain's own entries (slots >= L) go stale with verification; they are kept
        # (no copy of the cache) because no query reads a slot >= L before rewriting it.
        state = state.replace(cache=cache)
        draft_tokens = jnp.stack(tokens_out, axis=1).astype(jnp.int32)
        if probs_out[0] is None:
            return Proposal(tokens=draft_tokens, probs=None, state=state)
        return Proposal(tokens=draft_tokens, probs=jnp.stack(probs_out, axis=1), state=state)

    def _propose_tree(self, state: EagleState, g_root_BE, logits_root_BV, last_B, sampling):
        """Expands the top-k of each node, one head step per level, over its own features.

        Node j is fed at slot ``last + j`` (its position is ``last + depth``) with its
        parent's output feature, and sees the committed slots ``<= last`` (the root
        included) and its own ancestors. Those slots go stale after verification and
        are never read before being rewritten, as in a chain.
        """
        tree = self.tree
        ancestors = jnp.asarray(tree.ancestors)

        def score_level(depth, tokens_Bn, carry):
            cache, parent_g_BPE = carry
            first, stop = tree.level(depth)
            local = tree.parent_of[first:stop] - tree.level(depth - 1)[0]
            mask = TreeMask(
                start=last_B,
                slots=last_B[:, None] + jnp.arange(first, stop)[None],
                visible=ancestors[first:stop],
            )
            logits, g, cache = self.step_logits(
                cache,
                parent_g_BPE[:, local],
                tokens_Bn,
                jnp.broadcast_to(last_B[:, None] + depth, tokens_Bn.shape),
                mask,
            )
            return logits, (cache, g)

        tokens, (cache, _) = expand_top_k(
            tree,
            logits_root_BV[:, None],
            sampling.vocab_limit,
            score_level,
            (state.cache, g_root_BE[:, None]),
        )
        return Proposal(
            tokens=tokens.astype(jnp.int32), probs=None, state=state.replace(cache=cache)
        )
