"""The decoder of every supported family (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3).

The families differ only in switches of :class:`ModelConfig`: biases, q/k norms,
per-layer sliding windows and RoPE bases, and Gemma's block layout ((1 + w)
norms, a norm after attention and around the MLP, scaled embeddings, GeGLU,
soft-capped attention scores and logits).

The modules are ordinary NNX modules, but the library only ever uses them
functionally, through `~specjax.models.model.Model` (the split ``(graphdef,
params)`` as a pytree); the KV cache goes in and comes out of every call.

Attention is `specjax.models.attention` (shared with the drafters' layers); norms,
linear maps and the MLP are `specjax.models.layers`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.attention import Attention, rope_inv_freq, softcap
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.models.contract import ModelOutput
from specjax.models.layers import MLP, Dense, config_norm
from specjax.models.matmul import matmul


class DecoderLayer(nnx.Module):
    """A pre-norm block; Gemma also normalises each sub-block's output.

    Llama: ``x + attn(norm(x))``, then ``x + mlp(post_attention_layernorm(x))``.
    Gemma: ``x + post_attention_layernorm(attn(input_layernorm(x)))``, then
    ``x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))``. The
    names are Hugging Face's, which means different things in the two layouts.
    """

    def __init__(self, config: ModelConfig, dtype, rngs):
        e = config.hidden_size
        self.is_gemma = config.is_gemma
        self.input_layernorm = config_norm(config, e, dtype)
        self.self_attn = Attention(config, dtype, rngs)
        self.post_attention_layernorm = config_norm(config, e, dtype)
        if config.is_gemma:
            self.pre_feedforward_layernorm = config_norm(config, e, dtype)
            self.post_feedforward_layernorm = config_norm(config, e, dtype)
        self.mlp = MLP(config, dtype, rngs)

    def __call__(self, x, positions, k_cache, v_cache, layer, inv_freq, window, tree=None):
        attn, k_cache, v_cache = self.self_attn(
            self.input_layernorm(x), positions, k_cache, v_cache, layer, inv_freq, window, tree
        )
        if self.is_gemma:
            x = x + self.post_attention_layernorm(attn)
            x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        else:
            x = x + attn
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_cache, v_cache


class TiedEmbedding(nnx.Module):
    """The token embedding of a model whose LM head reuses it (``tie_word_embeddings``).

    The table ``embedding`` is ``[V, E]``, like ``nnx.Embed``'s and Hugging
    Face's: the lookup takes rows and the head contracts on E. Not
    ``nnx.Embed.attend``'s ``hidden @ table.T``, which made XLA:CPU copy
    (transpose) the whole table on every call; contracting both operands' last
    axis needs no copy (``tests/test_models.py`` checks the compiled decode loop)
    and is the cheaper head for T > 1 tokens.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dtype, rngs: nnx.Rngs | None, table=None):
        if table is not None:  # given rows (`HeadSubset`), not drawn ones
            self.embedding = nnx.Param(jnp.asarray(table, dtype))
            return
        init = nnx.initializers.normal(0.02)
        # Drawn [E, V] and transposed, as `Dense` draws its weights [in, out].
        self.embedding = nnx.Param(init(rngs.params(), (hidden_size, vocab_size), dtype).T)

    def __call__(self, tokens_BT):
        """Embeddings ``[B, T, E]`` of ``tokens``."""
        return jnp.take(self.embedding[...], tokens_BT, axis=0)

    def attend(self, hidden_BTE):
        """Logits ``[B, T, V]`` of hidden states."""
        return matmul(hidden_BTE, self.embedding[...])


class HeadSubset(nnx.Module):
    """An LM head that scores only ``ids``: the rows of the head for them, ``[K, E]``.

    Every other id gets logit ``-inf``, so a model with this head samples from (and
    its argmax picks among) ``ids`` alone; its probabilities are still over all V
    ids. See :meth:`Model.with_head_ids`.
    """

    def __init__(self, table_KE: jax.Array, ids_K: jax.Array):
        # A TiedEmbedding of K rows: `specjax.models.quant.quantize` swaps it like the
        # model's own head.
        k, e = table_KE.shape
        self.rows = TiedEmbedding(k, e, table_KE.dtype, None, table=table_KE)
        self.ids = nnx.Variable(jnp.asarray(ids_K, jnp.int32))

    def __call__(self, hidden_BTE, vocab_size: int):
        """Logits ``float32[B, T, V]``: the head's at ``ids``, ``-inf`` elsewhere."""
        logits_BTK = self.rows.attend(hidden_BTE).astype(jnp.float32)
        full = jnp.full((*logits_BTK.shape[:-1], vocab_size), -jnp.inf, jnp.float32)
        return full.at[..., self.ids[...]].set(logits_BTK, unique_indices=True)


class Transformer(nnx.Module):
    """The decoder as an NNX module. Use it through :class:`Model`."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        if config.tie_word_embeddings:
            self.embed_tokens = TiedEmbedding(config.vocab_size, config.hidden_size, dtype, rngs)
        else:
            self.embed_tokens = nnx.Embed(
                config.vocab_size,
                config.hidden_size,
                dtype=dtype,
                param_dtype=dtype,
                embedding_init=nnx.initializers.normal(0.02),
                rngs=rngs,
            )
        layers = [DecoderLayer(config, dtype, rngs) for _ in range(config.num_layers)]
        # Scanned: one layer whose parameters are stacked along a leading [L] axis
        # (drawn layer by layer, so both layouts of one seed hold the same weights).
        self.layers = stack_layers(layers) if config.scan_layers else nnx.List(layers)
        self.norm = config_norm(config, config.hidden_size, dtype)
        if not config.tie_word_embeddings:
            self.lm_head = Dense(config.hidden_size, config.vocab_size, False, dtype, rngs)

    def head(self, hidden_BTE):
        """Logits ``float32[B, T, V]`` of (already normalised) hidden states."""
        subset = getattr(self, "head_subset", None)  # set by Model.with_head_ids
        if subset is not None:
            return subset(hidden_BTE, self.config.vocab_size)
        if self.config.tie_word_embeddings:
            logits = self.embed_tokens.attend(hidden_BTE)
        else:
            logits = self.lm_head(hidden_BTE)
        return softcap(logits.astype(jnp.float32), self.config.final_logit_softcapping)

    def embed(self, tokens_BT):
        """What the first layer reads: ``[B, T, E]`` embeddings (Gemma: times sqrt(E))."""
        x = self.embed_tokens(tokens_BT)
        if self.config.is_gemma:
            # In the parameter dtype, as Hugging Face rounds it (bf16 sqrt(E) != sqrt(E)).
            x = x * jnp.asarray(math.sqrt(self.config.hidden_size), x.dtype)
        return x

    def __call__(
        self, tokens_BT, positions_BT, cache: KVCache | None, feature_layers=(), tree=None
    ):
        x = self.embed(tokens_BT)
        k, v = (None, None) if cache is None else (cache.k, cache.v)
        run = self._scanned_layers if self.config.scan_layers else self._layer_loop
        x, k, v, features_NBTE = run(x, positions_BT, k, v, feature_layers, tree)
        hidden = self.norm(x)
        new_cache = None
        if cache is not None:
            last_BT = positions_BT if tree is None else tree.slots
            new_cache = KVCache(k=k, v=v, lengths=last_BT[:, -1].astype(jnp.int32) + 1)
        # In the order asked for, not layer order: the drafter's fusion matrix expects it.
        features_BTF = jnp.concatenate(list(features_NBTE), axis=-1) if feature_layers else None
        return ModelOutput(
            logits=self.head(hidden), cache=new_cache, features=features_BTF, hidden=hidden
        )

    def _layer_inputs(self):
        """Each layer's RoPE frequencies and sliding window (``None``: full attention)."""
        windows = self.config.layer_windows
        freqs = {False: rope_inv_freq(self.config), True: rope_inv_freq(self.config, local=True)}
        return [freqs[w is not None] for w in windows], windows

    def _layer_loop(self, x, positions_BT, k, v, feature_layers, tree):
        """The layers unrolled: XLA compiles each one (compile time grows with depth)."""
        inv_freqs, windows = self._layer_inputs()
        collected = {}
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, positions_BT, k, v, i, inv_freqs[i], windows[i], tree)
            collected[i] = x
        return x, k, v, [collected[i] for i in feature_layers]

    def _scanned_layers(self, x, positions_BT, k, v, feature_layers, tree):
        """The layers as one ``lax.scan`` over stacked parameters: compiled once.

        The per-layer differences (RoPE frequencies, sliding window) become
        scanned inputs. The cache is carried whole and written at the traced
        layer index, so it is updated in place, as in the loop; the requested
        feature layers are kept in a small ``[n, B, T, E]`` carry.
        """
        inv_freqs, windows = self._layer_inputs()
        sliding = any(w is not None for w in windows)
        # A full-attention layer of a model with sliding ones gets a window no
        # position reaches (positions are int32 and < 2**30 here).
        window_L = jnp.array([w or 2**30 for w in windows], jnp.int32) if sliding else None
        graphdef, stacked = nnx.split(self.layers)
        wanted = jnp.array(feature_layers, jnp.int32)
        features = jnp.zeros((len(feature_layers), *x.shape), x.dtype)

        def body(carry, inputs):
            x, k, v, features = carry
            params, i, inv_freq, window = inputs
            x, k, v = nnx.merge(graphdef, params)(x, positions_BT, k, v, i, inv_freq, window, tree)
            features = jnp.where((wanted == i)[:, None, None, None], x[None], features)
            return (x, k, v, features), None

        inputs = (stacked, jnp.arange(len(windows)), jnp.stack(inv_freqs), window_L)
        (x, k, v, features), _ = jax.lax.scan(body, (x, k, v, features), inputs)
        return x, k, v, features


def stack_layers(layers: list[nnx.Module]) -> nnx.Module:
    """One module of ``layers[0]``'s structure whose parameters are stacked ``[L, ...]``."""
    graphdef, _ = nnx.split(layers[0])
    states = [nnx.split(layer)[1] for layer in layers]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def unstack_layers(stacked: nnx.Module, num_layers: int) -> nnx.List:
    """The ``num_layers`` modules of a `stack_layers` result, each its own parameters."""
    graphdef, state = nnx.split(stacked)
    return nnx.List(
        [nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state)) for i in range(num_layers)]
    )
