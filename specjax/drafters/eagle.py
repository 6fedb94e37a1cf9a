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

**Training** (`eagle_ttt_loss`, used by `specjax.training.train_eagle`) is EAGLE-3's
training-time test: the frozen target scores the sequences once; the head is unrolled
``k`` steps over all positions in parallel. Step 0 is the head fed the fused target
features. Step ``i`` at position ``j`` is what the decoder computes at draft step ``i``
anchored at ``a = j - i``: it is fed ``g`` of step ``i-1`` at ``j-1`` (and the true token
``x_j``), and attends to step 0's keys at positions ``<= a`` plus one key per step
``m = 1..i``, step ``m``'s key at position ``a + m`` (the keys a draft chain wrote).
Step ``i``'s loss is the soft cross-entropy against the target's distribution at ``j``
(which predicts ``x_{j+1}``), averaged over valid positions (``j >= i``) and weighted
``0.8^i``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specjax.drafters import weights
from specjax.drafters.base import Proposal, TargetFeatures, draw_draft
from specjax.drafters.features import MODES, FeatureDrafter, layers_config
from specjax.models.cache import KVCache, TreeMask
from specjax.models.config import ModelConfig
from specjax.models.llama import MLP, Dense, RMSNorm, apply_rope, rope_inv_freq
from specjax.models.matmul import einsum_f32
from specjax.penalties import after_token
from specjax.tree import expand_top_k

__all__ = [
    "MODES",
    "EagleDrafter",
    "EagleState",
    "eagle_ttt_loss",
    "load_eagle_drafter",
    "save_eagle_drafter",
]

FORMAT = "specjax-eagle-drafter"
CONFIG_FILE = "eagle_drafter.json"


# ----------------------------------------------------------------------------
# The network (an NNX module, used functionally through split params).


def _attend(q_BQHD, ctx_k_BKDS, ctx_v_BKSD, ctx_visible, extra_k=(), extra_v=()):
    """Attention of queries over context slots and, per query, a few extra keys.

    Args:
        q_BQHD: rotated queries.
        ctx_k_BKDS, ctx_v_BKSD: keys/values in the cache layout.
        ctx_visible: bool broadcastable to ``[B, Q, S]``.
        extra_k, extra_v: lists of ``[B, Q, K, D]``: one more key/value per query each
            (the training-time test's "diagonal" keys of earlier draft steps), always
            visible.

    Returns:
        ``[B, Q, H·D]``.
    """
    b, q_len, h, d = q_BQHD.shape
    kh, s = ctx_k_BKDS.shape[1], ctx_k_BKDS.shape[-1]
    q = q_BQHD.reshape(b, q_len, kh, h // kh, d)
    scores = [einsum_f32("bqkgd,bkds->bkgqs", q, ctx_k_BKDS)]
    scores += [einsum_f32("bqkgd,bqkd->bkgq", q, k)[..., None] for k in extra_k]
    scores = jnp.concatenate(scores, axis=-1) / math.sqrt(d)
    visible = jnp.broadcast_to(ctx_visible, (b, q_len, s))
    visible = jnp.pad(visible, ((0, 0), (0, 0), (0, len(extra_k))), constant_values=True)
    # A finite minimum: a query that sees nothing (only at positions that are dropped
    # or masked out of the loss) gets uniform weights, not NaNs.
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(q_BQHD.dtype)
    out = jnp.einsum("bkgqs,bksd->bqkgd", weights[..., :s], ctx_v_BKSD)
    for m, v in enumerate(extra_v):
        out += jnp.einsum("bkgq,bqkd->bqkgd", weights[..., s + m], v)
    return out.reshape(b, q_len, h * d)


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
        c = self.config
        b, q_len, _ = x_BQE.shape
        inv_freq = rope_inv_freq(c)
        h = self.input_layernorm(x_BQE)
        q = self.q_proj(h).reshape(b, q_len, c.num_heads, c.head_dim)
        k = self.k_proj(h).reshape(b, q_len, c.num_kv_heads, c.head_dim)
        v = self.v_proj(h).reshape(b, q_len, c.num_kv_heads, c.head_dim)
        return apply_rope(q, positions_BQ, inv_freq), apply_rope(k, positions_BQ, inv_freq), v

    def finish(self, x_BQE, attn_BQF):
        """The layer's output (the head's output feature ``g``, before the final norm)."""
        x = x_BQE + self.o_proj(attn_BQF)
        return x + self.mlp(self.post_attention_layernorm(x))


def _shift(x_BT, n: int):
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
    file_format = FORMAT
    config_file = CONFIG_FILE
    noun = "EAGLE drafter"

    @classmethod
    def random(
        cls,
        target,
        *,
        key: jax.Array,
        num_draft: int,
        target_layers: tuple[int, ...] | None = None,
        intermediate_size: int | None = None,
        mode: str = "argmax",
    ) -> EagleDrafter:
        """A head with random weights for any target (for tests, or to train).

        Args:
            target: the target model.
            key: PRNG key of the initialisation.
            num_draft: γ (>= 0).
            target_layers: target layer indices to fuse (default: a low, a middle and a
                high layer, `specjax.drafters.features.default_target_layers`).
            intermediate_size: the head's MLP width (default: the target's).
            mode: ``"argmax"`` or ``"sample"``.

        Raises:
            ValueError: naming the argument, for a negative ``num_draft``, an unknown
                ``mode`` or ``target_layers`` that are empty, repeated or not layers of
                the target.
        """
        from specjax.validation import as_prng_key

        key = as_prng_key("key", key)
        target_layers = cls.random_layers(target, target_layers, 3)
        config = layers_config(target, 1, intermediate_size)
        return cls.build(target, key, config, target_layers, num_draft=num_draft, mode=mode)

    @classmethod
    def train_config_type(cls) -> type:
        # Imported here: training (optax's schedules, tqdm) stays out of `import specjax`.
        from specjax.training.config import EagleTrainConfig

        return EagleTrainConfig

    def loss(self, params, tokens_BT, key, config) -> tuple[jax.Array, dict]:
        """EAGLE-3's training-time test (`eagle_ttt_loss`) with an `EagleTrainConfig`.

        The head is unrolled ``config.ttt_steps`` steps over all positions, step i fed
        its own output features of step i-1 and weighted ``config.step_weight ** i``.
        Metrics (scalars only): ``loss``, ``accuracy`` (step 0's top-1 agreement with
        the target), ``tau`` (teacher-forced greedy tokens per call at γ = ttt_steps)
        and ``loss_step{i}``.
        """
        del key  # the training-time test draws nothing
        loss, metrics = eagle_ttt_loss(
            params, self, tokens_BT, num_steps=config.ttt_steps, step_weight=config.step_weight
        )
        # Scalars only in the step's metrics (the per-step vectors are for evaluation).
        return loss, {
            "loss": loss, "accuracy": metrics["accuracy"][0], "tau": metrics["tau"],
            **{f"loss_step{i}": x for i, x in enumerate(metrics["step_losses"])},
        }  # fmt: skip

    # -- The reusable step: feed (feature, token) pairs at explicit positions. --------

    def step_features(self, cache: KVCache, features_BQE, tokens_BQ, positions_BQ,
                      visible_BQS=None, slots_BQ=None):  # fmt: skip
        """Runs the head layer on Q (feature, token) inputs per row; no logits.

        Each input's keys/values are written into ``cache`` at slot = its position
        (positions ``>= cache.max_len`` are not written), then each query attends to the
        slots at or before its own position, or to ``visible_BQS`` when given (e.g. a
        tree's ancestor mask; the new inputs' own slots must then be visible to them).

        Args:
            cache: the head's cache.
            features_BQE: the feature of each input (``f_j``: a fused target feature
                ``u_{j-1}``, or the head's own output ``g_{j-1}``).
            tokens_BQ: ``int32`` the token at each input's position.
            positions_BQ: ``int32`` absolute positions (also the cache slots written).
            visible_BQS: optional bool ``[B, Q, S]`` visibility of the cache slots.
            slots_BQ: optional ``int32`` cache slots to write instead of the positions
                (tree nodes of one depth share a position); give ``visible_BQS`` too.

        Returns:
            ``(g_BQE, cache)``: the head's output features and the updated cache.
        """
        slots_BQ = positions_BQ if slots_BQ is None else slots_BQ
        net = self.net
        x = net.layer_input(self.target.embed(tokens_BQ), features_BQE.astype(self.target.dtype))
        q, k, v = net.qkv(x, positions_BQ)
        rows = jnp.arange(cache.batch_size)[:, None]
        # mode="drop": an input beyond the cache's end is not written (never clamped).
        ck = cache.k.at[0, rows, :, :, slots_BQ].set(k.astype(cache.k.dtype), mode="drop")
        cv = cache.v.at[0, rows, :, slots_BQ].set(v.astype(cache.v.dtype), mode="drop")
        if visible_BQS is None:
            visible_BQS = jnp.arange(cache.max_len)[None, None] <= positions_BQ[..., None]
        g = net.finish(x, _attend(q, ck[0], cv[0], visible_BQS))
        return g, cache.replace(k=ck, v=cv)

    def step_logits(self, cache: KVCache, features_BQE, tokens_BQ, positions_BQ,
                    visible_BQS=None, slots_BQ=None):  # fmt: skip
        """`step_features` and the target's LM head: ``(logits float32[B, Q, V], g, cache)``.

        The logits at position ``j`` are the draft distribution of the token at ``j + 1``;
        ``g`` is the feature to feed with that token at ``j + 1``.
        """
        g, cache = self.step_features(
            cache, features_BQE, tokens_BQ, positions_BQ, visible_BQS, slots_BQ
        )
        return self.target.head(self.net.norm(g)), g, cache

    # -- The drafter contract. ---------------------------------------------------------

    def init(
        self, prompts_BS, seq_lengths_B, cache_len, features: TargetFeatures = None
    ) -> EagleState:
        b, p = prompts_BS.shape
        lengths = jnp.asarray(seq_lengths_B, jnp.int32)
        fused = self.net.fc(features.hidden)  # [B, P, E] at positions 0..P-1
        # Position j takes u_{j-1} (zero at j = 0). Positions >= L are padding: written
        # (or dropped past the cache) but never read, like any slot >= L.
        positions = features.positions
        _, cache = self.step_features(
            self.init_cache(b, cache_len), _shift(fused, 1), prompts_BS, positions
        )
        # Position L-1 (the pending token) is left to propose, which needs its output.
        rows = jnp.arange(b)
        last = jnp.maximum(lengths - 2, 0)
        first = jnp.where((lengths >= 2)[:, None], fused[rows, last], 0.0)
        w = self.num_draft + 1
        fused_BWE = jnp.zeros((b, w, fused.shape[-1]), fused.dtype).at[:, 0].set(first)
        slots = jnp.full((b, w), -1, jnp.int32).at[:, 0].set(lengths - 1)
        return EagleState(cache=cache.rollback(lengths - 1), fused=fused_BWE, slots=slots)

    def update(
        self, state: EagleState, seq_lengths_B, features: TargetFeatures = None
    ) -> EagleState:
        b, t, _ = features.hidden.shape
        w = state.slots.shape[1]
        if t > w:
            raise ValueError(
                f"features: the verify forward scored {t} positions but this EagleDrafter's "
                f"state holds {w} (γ + 1 of the drafter that ran init): build the state and "
                "decode with one drafter"
            )
        fused = jnp.pad(self.net.fc(features.hidden), ((0, 0), (0, w - t), (0, 0)))
        slots = jnp.pad(features.positions + 1, ((0, 0), (0, w - t)), constant_values=-1)
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
            # Draft i's penalties and constraint read drafts 0..i-1 (`specjax.penalties`).
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
                start=last_B, slots=last_B[:, None] + jnp.arange(first, stop)[None],
                visible=ancestors[first:stop],
            )  # fmt: skip
            committed_B1S, region_BnS = mask.slot_visibility(cache.max_len)
            logits, g, cache = self.step_logits(
                cache, parent_g_BPE[:, local], tokens_Bn,
                jnp.broadcast_to(last_B[:, None] + depth, tokens_Bn.shape),
                committed_B1S | region_BnS, mask.slots,
            )  # fmt: skip
            return logits, (cache, g)

        tokens, (cache, _) = expand_top_k(
            tree, logits_root_BV[:, None], sampling.vocab_limit, score_level,
            (state.cache, g_root_BE[:, None]),
        )  # fmt: skip
        return Proposal(
            tokens=tokens.astype(jnp.int32), probs=None, state=state.replace(cache=cache)
        )


# ----------------------------------------------------------------------------
# Training objective: the training-time test.


def ttt_step_logits(drafter: EagleDrafter, params, tokens_BT, features_BTF, num_steps: int):
    """The head unrolled ``num_steps`` steps over whole sequences (no cache).

    Args:
        drafter: the drafter (its target and static structure).
        params: the head's weights.
        tokens_BT: ``int32[B, T]`` sequences from position 0.
        features_BTF: the target's ``target_layers`` features of them.
        num_steps: k.

    Returns:
        A list of k ``float32[B, T, V]``: step ``i`` at position ``j`` is the draft
        distribution (logits) of the token at ``j + 1`` that a draft chain anchored at
        ``a = j - i`` computes at its step ``i`` (valid for ``j >= i``), fed the true
        tokens ``x_{a+1..j}``.
    """
    target = drafter.target
    net = nnx.merge(drafter.graphdef, params)
    b, t = tokens_BT.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    emb = target.embed(tokens_BT)
    feature = _shift(net.fc(features_BTF), 1)
    pos = jnp.arange(t)
    keys, values, out = [], [], []
    for i in range(num_steps):
        x = net.layer_input(emb, feature)
        q, k, v = net.qkv(x, positions)
        keys.append(k)
        values.append(v)
        ctx_k, ctx_v = keys[0].transpose(0, 2, 3, 1), values[0].transpose(0, 2, 1, 3)
        # Step 0's keys up to the anchor j - i, then step m's key at a + m (m = 1..i).
        visible = (pos[None, :] <= pos[:, None] - i)[None]
        extra_k = [_shift(keys[m], i - m) for m in range(1, i + 1)]
        extra_v = [_shift(values[m], i - m) for m in range(1, i + 1)]
        g = net.finish(x, _attend(q, ctx_k, ctx_v, visible, extra_k, extra_v))
        out.append(target.head(net.norm(g)))
        feature = _shift(g, 1)  # position j+1 of the next step is fed g_j
    return out


def eagle_ttt_loss(
    params,
    drafter: EagleDrafter,
    tokens_BT: jax.Array,
    *,
    num_steps: int,
    step_weight: float = 0.8,
) -> tuple[jax.Array, dict]:
    """EAGLE-3's training-time-test loss on ``tokens``, with the target frozen.

    The target scores the sequences once (no cache), giving its ``target_layers``
    features and its distribution ``p_j`` (temperature 1) at every position. The head
    is unrolled ``num_steps`` steps (`ttt_step_logits`); step ``i``'s loss is the soft
    cross-entropy ``-Σ_v p_j(v) log q_{i,j}(v)`` averaged over positions ``j >= i``, and

        loss = Σ_i step_weight^i · loss_i / Σ_i step_weight^i.

    The target's weights (embedding and LM head included) are behind a stop-gradient:
    only ``params`` get gradients.

    Args:
        params: the head's weights (differentiated).
        drafter: the drafter (its target and static structure are used).
        tokens_BT: ``int32[B, T]`` training sequences, T > ``num_steps``.
        num_steps: k, steps unrolled (about the γ it will draft).
        step_weight: the per-step decay (EAGLE-3: 0.8).

    Returns:
        ``(loss, metrics)``; metrics hold ``loss``, ``step_losses`` ``[k]``,
        ``accuracy`` ``[k]`` (top-1 agreement with the target's argmax per step) and
        ``tau``: 1 + the mean accepted prefix of greedy k-token chains from every
        anchor, teacher-forced (an estimate of tokens per target call at γ = k).
    """
    b, t = tokens_BT.shape
    if not 1 <= num_steps < t:
        raise ValueError(f"num_steps must be in [1, {t - 1}] for sequences of {t}, got {num_steps}")
    target = drafter.target
    target = target.replace(params=jax.lax.stop_gradient(target.params))
    drafter = drafter.replace(target=target)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits_p, _, features = target(tokens_BT, positions, None, feature_layers=drafter.target_layers)
    logp = jax.nn.log_softmax(logits_p.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    best_p = jnp.argmax(logits_p, axis=-1)
    step_losses, correct = [], []
    for i, logits in enumerate(ttt_step_logits(drafter, params, tokens_BT, features, num_steps)):
        logq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        ce_BT = -jnp.sum(jnp.where(p > 0, p * logq, 0.0), axis=-1)
        step_losses.append(jnp.mean(ce_BT[:, i:]))
        correct.append(jnp.argmax(logits, axis=-1) == best_p)
    weights = step_weight ** np.arange(num_steps)
    step_losses = jnp.stack(step_losses)
    loss = jnp.sum(jnp.asarray(weights, jnp.float32) * step_losses) / float(weights.sum())
    accuracy = jnp.stack([jnp.mean(c[:, i:]) for i, c in enumerate(correct)])
    # Anchor a's chain: step i is at position a + i.
    n = t - num_steps + 1
    run = jnp.cumprod(jnp.stack([c[:, i : i + n] for i, c in enumerate(correct)], 0), axis=0)
    tau = 1.0 + jnp.mean(jnp.sum(run, axis=0))
    return loss, {"loss": loss, "step_losses": step_losses, "accuracy": accuracy, "tau": tau}


# ----------------------------------------------------------------------------
# Saving and loading (`specjax.drafters.weights`: safetensors + JSON; never pickle).


def save_eagle_drafter(
    drafter: EagleDrafter, path, *, overwrite: bool = False, dtype=None, keep=()
) -> Path:
    """Writes the head's own weights (not the target's) atomically to folder ``path``.

    The folder holds ``eagle_drafter.json`` and ``model.safetensors`` (in ``dtype``,
    default the weights' own; loading casts to the target's dtype). A non-empty folder
    holding other files is refused unless ``overwrite``; entries named in ``keep`` are
    carried over.
    """
    return weights.save(drafter, path, overwrite=overwrite, dtype=dtype, keep=keep)


def load_eagle_drafter(
    path: str | os.PathLike, target, *, num_draft: int | None = None, mode: str | None = None
) -> EagleDrafter:
    """Loads a head written by `save_eagle_drafter` for ``target``.

    Raises:
        FileNotFoundError: ``path`` holds no EAGLE drafter.
        ValueError: it was built for a target of another shape, or its files disagree.
    """
    return weights.load(EagleDrafter, path, target, num_draft=num_draft, mode=mode)
