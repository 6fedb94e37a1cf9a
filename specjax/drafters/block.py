"""A DFlash-style block drafter: one non-causal forward drafts a whole block.

The drafter reads the target instead of imitating it from tokens alone. Its input
is the block ``[pending token, MASK × γ]`` at positions ``L-1 .. L-1+γ`` (``L`` the
row's length), the pending token embedded with the *target's* embedding and MASK a
learned vector. Every draft layer attends, bidirectionally inside the block, to the
block and to the committed context, whose keys and values are projected from the
target's own hidden states:

    fused_t = RMSNorm(W · concat(h_l(t) for l in target_layers))      # [E]
    layer j: keys/values of position t < L-1 = k_proj_j(fused_t), v_proj_j(fused_t)

Queries come only from the block. Block position k (k ≥ 1) is read out through the
draft's final norm and the target's LM head (shared, not copied) and proposes the
token at position ``L-1+k``. One forward drafts all γ tokens.

The context keys/values are the drafter's only state: a `KVCache` holding, per draft
layer, the projections of the committed tokens' features. The decoder hands over the
features of each verify forward (`specjax.drafters.TargetFeatures`); the drafter
writes all γ+1 of them and sets its length to ``L - 1``, so features of rejected
drafts sit beyond the length, are never read, and are overwritten next step: rolling
back is a change of lengths, as for every cache here. The pending token never has
features yet (the target has not scored it), which is why a block sees context
strictly before its anchor, in training as in decoding.

Two drafting modes (both exact; the verifier gets the q the tokens came from):

* ``"argmax"`` (default): the per-position argmax, verified with a one-hot q. The
  positions' distributions are marginals (position 3 does not see position 2's
  choice); sampling them independently gives incoherent blocks (DFlash measured
  2.96 → 1.16 tokens per step), while the argmax block is coherent.
* ``"sample"``: each position sampled from its processed marginal with its own
  position key, verified against that marginal.

Training (`anchored_block_loss`, used by `specjax.training.train_block_drafter`) follows
DFlash's anchored blocks: random anchors per sequence, each block sees only the
context strictly before its anchor, block position k predicts the token at
anchor + k, and the cross-entropy of position k is weighted by ``exp(-(k-1)/w)``.
Block lengths are also drawn at random up to the trained block size, so that one
drafter serves every γ up to it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.drafters import weights
from specjax.drafters.base import Proposal, TargetFeatures, draw_draft
from specjax.drafters.features import MODES, FeatureDrafter, layers_config
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.models.llama import MLP, Dense, RMSNorm, apply_rope, rope_inv_freq
from specjax.models.matmul import einsum_f32
from specjax.penalties import after_token
from specjax.sampling import probs_from_logits, sample
from specjax.tree import child_tokens

__all__ = [
    "MODES",
    "BlockDrafter",
    "anchored_block_loss",
    "load_block_drafter",
    "save_block_drafter",
]

FORMAT = "specjax-block-drafter"
CONFIG_FILE = "block_drafter.json"


# ----------------------------------------------------------------------------
# The network (NNX modules, used functionally through split params).


class BlockAttention(nnx.Module):
    """Attention whose queries come from the block and whose keys also include the context."""

    def __init__(self, config: ModelConfig, dtype, rngs):
        c = config
        d = c.head_dim
        self.config = c
        self.q_proj = Dense(c.hidden_size, c.num_heads * d, c.attention_bias, dtype, rngs)
        self.k_proj = Dense(c.hidden_size, c.num_kv_heads * d, c.attention_bias, dtype, rngs)
        self.v_proj = Dense(c.hidden_size, c.num_kv_heads * d, c.attention_bias, dtype, rngs)
        self.o_proj = Dense(c.num_heads * d, c.hidden_size, c.o_proj_bias, dtype, rngs)
        if c.qk_norm:
            self.q_norm = RMSNorm(d, c.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(d, c.rms_norm_eps, dtype)

    def keys_values(self, x_BTE, positions_BT, inv_freq):
        """Rotated keys and values ``[B, T, K, D]`` of ``x`` (context features or block)."""
        c = self.config
        b, t, _ = x_BTE.shape
        k = self.k_proj(x_BTE).reshape(b, t, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x_BTE).reshape(b, t, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k, positions_BT, inv_freq), v

    def __call__(self, x_BQE, positions_BQ, ctx_k_BKDS, ctx_v_BKSD, ctx_visible, block_visible,
                 inv_freq):  # fmt: skip
        """Block queries attend to the visible context slots and the visible block keys.

        Args:
            x_BQE: the block's (normalised) hidden states.
            positions_BQ: their absolute positions.
            ctx_k_BKDS, ctx_v_BKSD: context keys/values in the cache layout.
            ctx_visible: bool, broadcastable to ``[B, Q, S]``.
            block_visible: bool, broadcastable to ``[B, Q, Q]``.
        """
        c = self.config
        b, q_len, _ = x_BQE.shape
        kh, d = c.num_kv_heads, c.head_dim
        g = c.num_heads // kh
        q = self.q_proj(x_BQE).reshape(b, q_len, c.num_heads, d)
        if c.qk_norm:
            q = self.q_norm(q)
        q = apply_rope(q, positions_BQ, inv_freq).reshape(b, q_len, kh, g, d)
        k_blk, v_blk = self.keys_values(x_BQE, positions_BQ, inv_freq)
        s_ctx = einsum_f32("bqkgd,bkds->bkgqs", q, ctx_k_BKDS)
        s_blk = einsum_f32("bqkgd,bpkd->bkgqp", q, k_blk)
        scores = jnp.concatenate([s_ctx, s_blk], axis=-1) / math.sqrt(d)
        s = ctx_k_BKDS.shape[-1]
        visible = jnp.concatenate(
            [
                jnp.broadcast_to(ctx_visible, (b, q_len, s)),
                jnp.broadcast_to(block_visible, (b, q_len, q_len)),
            ],
            axis=-1,
        )
        # Every query sees at least itself (block_visible holds the diagonal), so the
        # finite minimum only ever meets masked slots.
        scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(x_BQE.dtype)
        out = jnp.einsum("bkgqs,bksd->bqkgd", weights[..., :s], ctx_v_BKSD)
        out += jnp.einsum("bkgqp,bpkd->bqkgd", weights[..., s:], v_blk)
        return self.o_proj(out.reshape(b, q_len, c.num_heads * d))


class BlockLayer(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, rngs):
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = BlockAttention(config, dtype, rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype, rngs)

    def __call__(self, x, positions, ctx_k, ctx_v, ctx_visible, block_visible, inv_freq):
        x = x + self.self_attn(
            self.input_layernorm(x), positions, ctx_k, ctx_v, ctx_visible, block_visible, inv_freq
        )
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockDraftNet(nnx.Module):
    """The drafter's own weights: feature fusion, a mask vector, the layers, a final norm."""

    def __init__(self, config: ModelConfig, num_features: int, *, dtype=jnp.float32, rngs):
        e = config.hidden_size
        self.config = config
        self.fc = Dense(num_features * e, e, False, dtype, rngs)
        self.hidden_norm = RMSNorm(e, config.rms_norm_eps, dtype)
        self.mask_embedding = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (e,), dtype))
        self.layers = nnx.List([BlockLayer(config, dtype, rngs) for _ in range(config.num_layers)])
        self.norm = RMSNorm(e, config.rms_norm_eps, dtype)

    def context_keys_values(self, features_BTF, positions_BT):
        """Per draft layer, context keys and values ``[B, T, K, D]`` of target features."""
        fused = self.hidden_norm(self.fc(features_BTF))
        inv_freq = rope_inv_freq(self.config)
        return [layer.self_attn.keys_values(fused, positions_BT, inv_freq) for layer in self.layers]

    def block_input(self, first_BE, block_len: int):
        """``[first, MASK × (block_len - 1)]`` as ``[B, block_len, E]``."""
        b, e = first_BE.shape
        mask = jnp.broadcast_to(
            self.mask_embedding[...].astype(first_BE.dtype), (b, block_len - 1, e)
        )
        return jnp.concatenate([first_BE[:, None], mask], axis=1)

    def __call__(self, x_BQE, positions_BQ, ctx_k_LBKDS, ctx_v_LBKSD, ctx_visible, block_visible):
        """Final-normed hidden states ``[B, Q, E]`` of the block queries."""
        inv_freq = rope_inv_freq(self.config)
        for i, layer in enumerate(self.layers):
            x_BQE = layer(
                x_BQE, positions_BQ, ctx_k_LBKDS[i], ctx_v_LBKSD[i], ctx_visible, block_visible,
                inv_freq,
            )  # fmt: skip
        return self.norm(x_BQE)


# ----------------------------------------------------------------------------
# The drafter.


@struct.dataclass
class BlockDrafter(FeatureDrafter):
    """Drafts γ tokens per step in one forward conditioned on the target's hidden states.

    See the module docstring for the architecture. The target is a pytree field: its
    embedding and LM head are used, never copied, and its hidden states arrive from
    the decoder's own target forwards (no second target forward). The fields it shares
    with `specjax.EagleDrafter` are `~specjax.drafters.features.FeatureDrafter`'s.

    Attributes:
        target: the target model; it must return ``feature_layers=`` features and
            provide ``embed`` and ``head`` (see the README's "Bring your own model").
        graphdef: static NNX graph of `BlockDraftNet`.
        params: the drafter's own weights (``nnx.State``).
        config: static `ModelConfig` of the draft layers.
        target_layers: static target layer indices whose outputs are fused.
        block_size: the largest block (γ + 1) it was trained for.
        num_draft: γ (static), at most ``block_size - 1``.
        mode: ``"argmax"`` (default, one-hot q) or ``"sample"`` (static).
    """

    num_draft: int = struct.field(pytree_node=False, default=7)
    block_size: int = struct.field(pytree_node=False, default=8)
    net_type = BlockDraftNet
    file_format = FORMAT
    config_file = CONFIG_FILE
    noun = "block drafter"

    @classmethod
    def random(
        cls,
        target,
        *,
        key: jax.Array,
        num_draft: int,
        num_layers: int = 1,
        num_features: int = 3,
        target_layers: tuple[int, ...] | None = None,
        intermediate_size: int | None = None,
        block_size: int | None = None,
        mode: str = "argmax",
    ) -> BlockDrafter:
        """A drafter with random weights for any target (for tests, or to train).

        Args:
            target: the target model.
            key: PRNG key of the initialisation.
            num_draft: γ.
            num_layers: draft layers (1 to 5 in DFlash's configurations).
            num_features: how many target layers to fuse when ``target_layers`` is
                not given (`~specjax.drafters.features.default_target_layers`).
            target_layers: explicit target layer indices.
            intermediate_size: the draft MLP width (default: the target's).
            block_size: the largest block to train for (default ``num_draft + 1``).
            mode: ``"argmax"`` or ``"sample"``.
        """
        from specjax.validation import as_prng_key, check_int

        key = as_prng_key("key", key)
        num_draft = check_int("num_draft", num_draft, lo=1)
        num_layers = check_int("num_layers", num_layers, lo=1)
        target_layers = cls.random_layers(target, target_layers, num_features)
        if block_size is None:
            block_size = num_draft + 1
        block_size = check_int("block_size", block_size, lo=2)
        config = layers_config(
            target, num_layers, intermediate_size, qk_norm=bool(target.config.qk_norm)
        )
        return cls.build(
            target, key, config, target_layers, block_size=block_size, num_draft=num_draft,
            mode=mode,
        )  # fmt: skip

    def check_num_draft(self) -> None:
        if not 1 <= self.num_draft <= self.block_size - 1:
            raise ValueError(
                f"num_draft (γ) must be in [1, block_size - 1] = [1, {self.block_size - 1}] "
                f"for this drafter (trained for blocks of {self.block_size}), got {self.num_draft}"
            )

    def file_fields(self) -> dict:
        return {"block_size": self.block_size}

    @classmethod
    def fields_from_file(cls, meta: dict) -> dict:
        return {"block_size": int(meta["block_size"])}

    @classmethod
    def train_config_type(cls) -> type:
        # Imported here: training (optax's schedules, tqdm) stays out of `import specjax`.
        from specjax.training.config import BlockTrainConfig

        return BlockTrainConfig

    def loss(self, params, tokens_BT, key, config) -> tuple[jax.Array, dict]:
        """DFlash's anchored blocks (`anchored_block_loss`) with a `BlockTrainConfig`.

        ``config.num_anchors`` random anchors per sequence, each block seeing only the
        target features strictly before its anchor, block position k predicting the
        token at anchor + k with weight ``exp(-(k-1)/config.decay)``. Metrics:
        ``loss``, ``accuracy`` and ``tau`` (greedy accepted length + 1 on full blocks).
        """
        return anchored_block_loss(
            params, self, tokens_BT, key, num_anchors=config.num_anchors, decay=config.decay
        )

    def _write_context(self, cache: KVCache, features: TargetFeatures, seq_lengths_B) -> KVCache:
        """Projects ``features`` into every layer's context slots; length = ``L - 1``."""
        kv = self.net.context_keys_values(features.hidden, features.positions)
        rows = jnp.arange(cache.batch_size)[:, None]
        pos = features.positions
        k, v = cache.k, cache.v
        for layer, (k_BTKD, v_BTKD) in enumerate(kv):
            # Indexing puts the broadcast [B, T] dims first: [B, T, K, D]. mode="drop":
            # features past the cache's end are not written (never clamped onto a slot).
            k = k.at[layer, rows, :, :, pos].set(k_BTKD.astype(k.dtype), mode="drop")
            v = v.at[layer, rows, :, pos].set(v_BTKD.astype(v.dtype), mode="drop")
        return KVCache(k=k, v=v, lengths=jnp.asarray(seq_lengths_B, jnp.int32) - 1)

    def init(self, prompts_BS, seq_lengths_B, cache_len, features: TargetFeatures = None):
        cache = self.init_cache(prompts_BS.shape[0], cache_len)
        return self._write_context(cache, features, seq_lengths_B)

    def update(self, state: KVCache, seq_lengths_B, features: TargetFeatures = None):
        return self._write_context(state, features, seq_lengths_B)

    def block_logits(self, state: KVCache, seq_BS, seq_lengths_B) -> jax.Array:
        """Logits ``float32[B, γ, V]`` of block positions 1..γ (the drafted positions)."""
        b, s = seq_BS.shape
        g1 = self.num_draft + 1
        last = seq_lengths_B - 1
        positions_BG1 = last[:, None] + jnp.arange(g1)[None]
        pending = seq_BS[jnp.arange(b), last]
        net = self.net
        x = net.block_input(self.target.embed(pending[:, None])[:, 0], g1)
        ctx_visible = jnp.arange(state.max_len)[None, None] < state.lengths[:, None, None]
        hidden = net(x, positions_BG1, state.k, state.v, ctx_visible, jnp.ones((1, g1, g1), bool))
        return self.target.head(hidden[:, 1:])

    def propose(self, keys_BG, state: KVCache, seq_BS, seq_lengths_B, sampling) -> Proposal:
        if self.num_draft == 0:
            # A step that drafts nothing (adaptive γ): its context still arrives in update.
            return Proposal(
                tokens=jnp.zeros((seq_BS.shape[0], 0), jnp.int32), probs=None, state=state
            )
        logits_BGV = self.block_logits(state, seq_BS, seq_lengths_B)
        if self.tree is not None:
            # DDTree's expansion: every node at depth d takes the top-k of block position
            # d, which does not depend on the path (one drafter forward for the tree).
            tokens = jnp.concatenate([
                child_tokens(logits_BGV[:, d : d + 1], self.tree, d, sampling.vocab_limit)
                for d in range(self.tree.depth)
            ], axis=1)  # fmt: skip
            return Proposal(tokens=tokens, probs=None, state=state)
        if sampling.automaton is not None:
            return self._constrained(keys_BG, logits_BGV, state, sampling)
        if self.mode == "argmax":
            tokens, _ = draw_draft(None, logits_BGV, sampling, argmax=True)
            return Proposal(tokens=tokens, probs=None, state=state)
        probs = probs_from_logits(logits_BGV, sampling)
        tokens = jnp.stack(
            [sample(keys_BG[:, i], probs[:, i]) for i in range(self.num_draft)], axis=1
        )
        return Proposal(tokens=tokens, probs=probs, state=state)

    def _constrained(self, keys_BG, logits_BGV, state, sampling) -> Proposal:
        """Drafts under a constraint (`specjax.constraints`), one position after another.

        The block's logits do not depend on its drafts, but the constraint's mask at
        position i does (the automaton state after drafts 0..i-1), so the drafts are
        drawn in order, each from its position's logits masked with its own state. Any
        q is exact; this one wastes no draft on a token outside the language.
        """
        tokens, probs = [], []
        for i in range(self.num_draft):
            token, q = draw_draft(
                keys_BG[:, i], logits_BGV[:, i], sampling, argmax=self.mode == "argmax"
            )
            tokens.append(token)
            if q is not None:
                probs.append(q)
            sampling = after_token(sampling, token)
        tokens = jnp.stack(tokens, axis=1).astype(jnp.int32)
        return Proposal(
            tokens=tokens, probs=jnp.stack(probs, axis=1) if probs else None, state=state
        )


# ----------------------------------------------------------------------------
# Training objective.


def anchored_block_loss(
    params,
    drafter: BlockDrafter,
    tokens_BT: jax.Array,
    key: jax.Array,
    *,
    num_anchors: int,
    decay: float,
) -> tuple[jax.Array, dict]:
    """DFlash's anchored-block cross-entropy on ``tokens``, with the target frozen.

    The target scores the sequences once (no cache) and its ``target_layers``
    features are computed inside the same call; gradients reach only ``params``.

    Args:
        params: the drafter's weights (differentiated).
        drafter: the drafter (its target and static structure are used).
        tokens_BT: ``int32[B, T]`` training sequences.
        key: PRNG key for the anchors and block lengths.
        num_anchors: A anchors per sequence.
        decay: w in the weight ``exp(-(k-1)/w)`` of block position k.

    Returns:
        ``(loss, metrics)``; metrics hold ``loss``, ``accuracy`` (top-1 over
        weighted positions) and ``tau``: the mean accepted-prefix length + 1 a
        greedy verifier would get from the full-length blocks.
    """
    target = drafter.target
    b, t = tokens_BT.shape
    g1 = drafter.block_size
    positions_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    _, _, features = target(tokens_BT, positions_BT, None, feature_layers=drafter.target_layers)
    features = jax.lax.stop_gradient(features)
    net = nnx.merge(drafter.graphdef, params)
    kv = net.context_keys_values(features, positions_BT)
    ctx_k = jnp.stack([k.transpose(0, 2, 3, 1) for k, _ in kv])  # [L, B, K, D, T]
    ctx_v = jnp.stack([v.transpose(0, 2, 1, 3) for _, v in kv])  # [L, B, K, T, D]

    anchor_key, length_key, full_key = jax.random.split(key, 3)
    anchors_BA = jax.random.randint(anchor_key, (b, num_anchors), 0, t - 1)
    # Half the blocks full length, half of a random length in [2, g1]: one drafter then
    # serves every γ < g1 without ever having seen a shorter block.
    random_len = jax.random.randint(length_key, (b, num_anchors), 2, g1 + 1)
    full = jax.random.bernoulli(full_key, 0.5, (b, num_anchors))
    block_len_BA = jnp.where(full, g1, random_len)

    k_idx = jnp.arange(g1)
    positions_BAG = anchors_BA[..., None] + k_idx[None, None]
    first = jax.lax.stop_gradient(target.embed(jnp.take_along_axis(tokens_BT, anchors_BA, 1)))
    x = jax.vmap(net.block_input, in_axes=(1, None), out_axes=1)(first, g1)  # [B, A, G1, E]
    q = num_anchors * g1
    x = x.reshape(b, q, -1)
    positions_BQ = positions_BAG.reshape(b, q)
    anchor_of_q = jnp.repeat(anchors_BA, g1, axis=1)
    ctx_visible = jnp.arange(t)[None, None] < anchor_of_q[..., None]  # strictly before
    block_of_q = jnp.repeat(jnp.arange(num_anchors), g1)
    k_of_q = jnp.tile(k_idx, num_anchors)
    len_of_q = jnp.repeat(block_len_BA, g1, axis=1)
    block_visible = (block_of_q[:, None] == block_of_q[None])[None] & (
        k_of_q[None, None, :] < len_of_q[:, :, None]
    )
    block_visible |= jnp.eye(q, dtype=bool)[None]
    hidden = net(x, positions_BQ, ctx_k, ctx_v, ctx_visible, block_visible)
    logits = target.head(hidden).reshape(b, num_anchors, g1, -1)

    label_pos = jnp.minimum(positions_BAG, t - 1)
    labels = jnp.take_along_axis(tokens_BT, label_pos.reshape(b, -1), 1).reshape(label_pos.shape)
    k_BAG = k_idx[None, None]
    valid = (k_BAG >= 1) & (positions_BAG < t) & (k_BAG < block_len_BA[..., None])
    weight = jnp.where(valid, jnp.exp(-(k_BAG - 1.0) / decay), 0.0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    loss = jnp.sum(weight * nll) / jnp.maximum(jnp.sum(weight), 1e-9)

    correct = jnp.argmax(logits, -1) == labels
    accuracy = jnp.sum(weight * correct) / jnp.maximum(jnp.sum(weight), 1e-9)
    in_range = (k_BAG >= 1) & (positions_BAG < t)
    full_blocks = jnp.all(in_range | (k_BAG == 0), axis=-1) & (block_len_BA == g1)
    run = jnp.cumprod(jnp.where(k_BAG >= 1, correct, True), axis=-1)[..., 1:]
    tau = jnp.sum(jnp.where(full_blocks, run.sum(-1) + 1.0, 0.0)) / jnp.maximum(
        jnp.sum(full_blocks), 1
    )
    return loss, {"loss": loss, "accuracy": accuracy, "tau": tau}


# ----------------------------------------------------------------------------
# Saving and loading (`specjax.drafters.weights`: safetensors + JSON; never pickle).


def save_block_drafter(
    drafter: BlockDrafter, path, *, overwrite: bool = False, dtype=None, keep=()
) -> Path:
    """Writes the drafter's own weights (not the target's) atomically to ``path``.

    The folder holds ``block_drafter.json`` and ``model.safetensors`` (in ``dtype``,
    default the weights' own; loading casts to the target's dtype). A non-empty
    folder that is not a block drafter is refused unless ``overwrite``; entries named
    in ``keep`` (e.g. a training run's checkpoint folder) are carried over.
    """
    return weights.save(drafter, path, overwrite=overwrite, dtype=dtype, keep=keep)


def load_block_drafter(
    path: str | os.PathLike, target, *, num_draft: int | None = None, mode: str | None = None
) -> BlockDrafter:
    """Loads a drafter written by `save_block_drafter` for ``target``.

    Files from before the ``[out, in]`` weight layout (``...['kernel']``
    ``[in, out]``) are converted as they are read (`upgrade_legacy_layout`).

    Raises:
        FileNotFoundError: ``path`` holds no block drafter.
        ValueError: it was built for a target of another shape.
    """
    return weights.load(BlockDrafter, path, target, num_draft=num_draft, mode=mode)
