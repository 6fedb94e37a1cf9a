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
hidden states of each verify forward (`specjax.models.forward.TargetHidden`); the drafter
writes all γ+1 of them and sets its length to ``L - 1``, so features of rejected
drafts sit beyond the length, are never read, and are overwritten next step: rolling
back is a change of lengths, as for every cache here. The pending token never has
features yet (the target has not scored it), which is why a block sees context
strictly before its anchor, in training as in decoding.

Two drafting modes (both exact; the verifier gets the q the tokens came from; at
temperature 0 they draft the same tokens):

* ``"sample"`` (`DEFAULT_MODE`, also ``specjax generate``'s): each position sampled from
  its processed marginal with its own position key, verified against that marginal.
  Above temperature 0 an argmax draft x is accepted with probability ``p(x)`` only,
  which a flat target makes small; a sampled one with ``min(1, p(x) / q(x))``.
* ``"argmax"``: the per-position argmax, verified with a one-hot q. The positions'
  distributions are marginals (position 3 does not see position 2's choice), so
  sampled blocks can be incoherent (DFlash measured 2.96 → 1.16 tokens per step for
  its drafter), while the argmax block is coherent.

It is trained with DFlash's anchored blocks (`specjax.training.block`); its weights
are saved and loaded by `specjax.io.drafter_weights`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.drafters.base import Proposal, draw_draft
from specjax.drafters.features import MODES, FeatureDrafter, layers_config
from specjax.models.attention import Attention, Keys, cache_layout, rope_inv_freq, write_kv
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.models.forward import TargetHidden
from specjax.models.layers import MLP, Dense, RMSNorm
from specjax.sampling import probs_from_logits, sample
from specjax.sampling.penalties import after_token
from specjax.sampling.settings import histories_of
from specjax.verification.tree import child_tokens

__all__ = ["DEFAULT_MODE", "MODES", "BlockDrafter", "BlockDraftNet"]

DEFAULT_MODE = "sample"
"""The drafting mode of a `BlockDrafter` built without one, and of ``specjax generate``
and `specjax.Sampler` (`specjax.text.defaults.DEFAULTS`)."""


# ----------------------------------------------------------------------------
# The network (NNX modules, used functionally through split params).


class BlockLayer(nnx.Module):
    """A Llama layer whose block queries attend to the context and to the whole block."""

    def __init__(self, config: ModelConfig, dtype, rngs):
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, dtype, rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype, rngs)

    def __call__(self, x, positions, context: Keys, block_visible, inv_freq):
        """The layer's output ``[B, Q, E]`` for the block ``x`` at ``positions``.

        Args:
            x: the block's hidden states ``[B, Q, E]``.
            positions: their absolute positions ``int32[B, Q]``.
            context: the context keys and values (cache layout) and which slots each
                block query sees.
            block_visible: bool broadcastable to ``[B, Q, Q]``: the block keys each
                query sees (at least itself).
            inv_freq: the RoPE frequencies.
        """
        q, k, v = self.self_attn.heads(self.input_layernorm(x), positions, inv_freq)
        block = Keys(*cache_layout(k, v), block_visible)
        x = x + self.self_attn.over(q, [context, block])
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
        """Final-normed hidden states ``[B, Q, E]`` of the block queries.

        Layer l attends to the context ``ctx_k_LBKDS[l]``, ``ctx_v_LBKSD[l]`` (the cache
        layout) where ``ctx_visible`` (broadcastable to ``[B, Q, S]``) and to the block
        keys where ``block_visible`` (broadcastable to ``[B, Q, Q]``).
        """
        inv_freq = rope_inv_freq(self.config)
        for i, layer in enumerate(self.layers):
            context = Keys(ctx_k_LBKDS[i], ctx_v_LBKSD[i], ctx_visible)
            x_BQE = layer(x_BQE, positions_BQ, context, block_visible, inv_freq)
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
            provide ``embed`` and ``head`` (see docs/models.md, "Bring your own model").
        graphdef: static NNX graph of `BlockDraftNet`.
        params: the drafter's own weights (``nnx.State``).
        config: static `ModelConfig` of the draft layers.
        target_layers: static target layer indices whose outputs are fused.
        block_size: the largest block (γ + 1) it was trained for.
        num_draft: γ (static), at most ``block_size - 1``.
        mode: ``"sample"`` (`DEFAULT_MODE`) or ``"argmax"`` (one-hot q) (static).
    """

    mode: str = struct.field(pytree_node=False, default=DEFAULT_MODE)
    num_draft: int = struct.field(pytree_node=False, default=7)
    block_size: int = struct.field(pytree_node=False, default=8)
    net_type = BlockDraftNet
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
        mode: str = DEFAULT_MODE,
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
            mode: ``"sample"`` (`DEFAULT_MODE`) or ``"argmax"``.
        """
        from specjax.core.validation import as_prng_key, check_int

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
            target,
            key,
            config,
            target_layers,
            block_size=block_size,
            num_draft=num_draft,
            mode=mode,
        )

    def check_num_draft(self) -> None:
        if not 1 <= self.num_draft <= self.block_size - 1:
            raise ValueError(
                f"num_draft (γ) must be in [1, block_size - 1] = [1, {self.block_size - 1}] "
                f"for this drafter (trained for blocks of {self.block_size}), got {self.num_draft}"
            )

    def _write_context(self, cache: KVCache, hidden: TargetHidden, seq_lengths_B) -> KVCache:
        """Projects ``hidden`` into every layer's context slots; length = ``L - 1``."""
        kv = self.net.context_keys_values(hidden.states, hidden.positions)
        k, v = cache.k, cache.v
        for layer, (k_BTKD, v_BTKD) in enumerate(kv):
            # Features past the cache's end are not written (`write_kv`).
            k, v = write_kv(k, v, layer, hidden.positions, k_BTKD, v_BTKD)
        return KVCache(k=k, v=v, lengths=jnp.asarray(seq_lengths_B, jnp.int32) - 1)

    def init(self, prompts_BS, seq_lengths_B, cache_len, hidden: TargetHidden = None):
        cache = self.init_cache(prompts_BS.shape[0], cache_len)
        return self._write_context(cache, hidden, seq_lengths_B)

    def update(self, state: KVCache, seq_lengths_B, hidden: TargetHidden = None):
        return self._write_context(state, hidden, seq_lengths_B)

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
            tokens = jnp.concatenate(
                [
                    child_tokens(logits_BGV[:, d : d + 1], self.tree, d, sampling.vocab_limit)
                    for d in range(self.tree.depth)
                ],
                axis=1,
            )
            return Proposal(tokens=tokens, probs=None, state=state)
        if histories_of(sampling):  # penalties, a constraint, a user's: per position
            return self._in_order(keys_BG, logits_BGV, state, sampling)
        if self.mode == "argmax":
            tokens, _ = draw_draft(None, logits_BGV, sampling, argmax=True)
            return Proposal(tokens=tokens, probs=None, state=state)
        probs = probs_from_logits(logits_BGV, sampling)
        tokens = jnp.stack(
            [sample(keys_BG[:, i], probs[:, i]) for i in range(self.num_draft)], axis=1
        )
        return Proposal(tokens=tokens, probs=probs, state=state)

    def _in_order(self, keys_BG, logits_BGV, state, sampling) -> Proposal:
        """Drafts under the rows' histories (`specjax.sampling.history`: penalties, a
        constraint, a user's), one position after another.

        The block's logits do not depend on its drafts, but a history's mask at position
        i does (the counts or automaton state after drafts 0..i-1), so the drafts are
        drawn in order, each from its position's logits under its own history. Any q is
        exact; this one is the q the target's p is compared with at that position (and
        wastes no draft on a token outside a constraint's language).
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
