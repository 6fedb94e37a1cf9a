"""The decoder of every supported family (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3).

The families differ only in switches of :class:`ModelConfig`: biases, q/k norms,
per-layer sliding windows and RoPE bases, and Gemma's block layout ((1 + w)
norms, a norm after attention and around the MLP, scaled embeddings, GeGLU,
soft-capped attention scores and logits).

The modules are ordinary NNX modules, but the library only ever uses them
functionally: :class:`Model` holds the split ``(graphdef, params)`` and its
``__call__`` merges them inside whatever ``jax.jit`` the caller uses. The KV
cache is never module state; it goes in and comes out explicitly, in the
`~specjax.models.contract.ModelOutput` every call returns.

Attention is `specjax.models.attention` (shared with the drafters' layers); norms,
linear maps and the MLP are `specjax.models.layers`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.attention import Attention, rope_inv_freq, softcap
from specjax.models.cache import KVCache, TreeMask
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
        self.layers = _stack(layers) if config.scan_layers else nnx.List(layers)
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


def _stack(layers: list[nnx.Module]) -> nnx.Module:
    """One module of ``layers[0]``'s structure whose parameters are stacked ``[L, ...]``."""
    graphdef, _ = nnx.split(layers[0])
    states = [nnx.split(layer)[1] for layer in layers]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def _unstack(stacked: nnx.Module, num_layers: int) -> nnx.List:
    graphdef, state = nnx.split(stacked)
    return nnx.List(
        [nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state)) for i in range(num_layers)]
    )


class _TokenizerKey:
    """A tokenizer as static pytree metadata, equal to another iff their JSON is equal.

    ``tokenizers.Tokenizer`` hashes by identity, so as plain static metadata it would
    make every load of the same checkpoint a new jit signature, and a new compile. The
    content digest is computed once, when the `Model` is built.
    """

    __slots__ = ("digest", "tokenizer")

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        if tokenizer is None:
            self.digest = None
        elif hasattr(tokenizer, "to_str"):
            self.digest = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        else:  # some other tokenizer object: fall back to identity
            self.digest = id(tokenizer)

    def __eq__(self, other):
        return isinstance(other, _TokenizerKey) and self.digest == other.digest

    def __hash__(self):
        return hash(self.digest)


@dataclasses.dataclass(frozen=True)
class Model:
    """A decoder LM as a pytree: params are leaves, architecture is static.

    It follows the model contract every part of specjax uses
    (`specjax.models.contract`): ``model(tokens, positions, cache)`` returning a
    `~specjax.models.contract.ModelOutput`, ``init_cache`` and ``vocab_size``, plus the
    feature and tree extensions. Anything with the same members works as a target or
    draft model (see docs/models.md, "Bring your own model").

    Attributes:
        graphdef: static NNX graph definition of :class:`Transformer`.
        params: the ``nnx.State`` of parameters (the only array leaves).
        config: the static :class:`ModelConfig`.
        tokenizer: optional ``tokenizers.Tokenizer``. It is static metadata that
            compares by content, so two loads of one checkpoint share compiled code.
        chat_template: optional Jinja chat template of an instruct checkpoint
            (from ``chat_template.jinja``, ``tokenizer_config.json`` or a GGUF);
            rendered by :func:`specjax.apply_chat_template`.
    """

    graphdef: nnx.GraphDef
    params: nnx.State
    config: ModelConfig
    tokenizer: object = None
    chat_template: str | None = None

    # The contract's optional extension for tree drafters: ``__call__`` takes ``tree=``.
    supports_tree = True

    def __post_init__(self):
        object.__setattr__(self, "_tokenizer_key", _TokenizerKey(self.tokenizer))

    def replace(self, **changes) -> Model:
        """A copy with ``changes`` applied (like ``flax.struct`` dataclasses)."""
        return dataclasses.replace(self, **changes)

    def _flatten(self):
        children = ((jax.tree_util.GetAttrKey("params"), self.params),)
        return children, (self.graphdef, self.config, self._tokenizer_key, self.chat_template)

    @classmethod
    def _unflatten(cls, aux, children):
        # Not through __init__: that would hash the tokenizer again on every unflatten.
        graphdef, config, tokenizer_key, chat_template = aux
        model = object.__new__(cls)
        for name, value in (
            ("graphdef", graphdef),
            ("params", children[0]),
            ("config", config),
            ("tokenizer", tokenizer_key.tokenizer),
            ("_tokenizer_key", tokenizer_key),
            ("chat_template", chat_template),
        ):
            object.__setattr__(model, name, value)
        return model

    @classmethod
    def random(cls, config: ModelConfig, *, seed: int = 0, dtype=jnp.float32) -> Model:
        """A randomly initialised model (normal(0.02) weights, unit norms)."""
        module = Transformer(config, dtype=dtype, rngs=nnx.Rngs(seed))
        graphdef, params = nnx.split(module)
        return cls(graphdef=graphdef, params=params, config=config)

    def with_scan_layers(self, scan_layers: bool = True) -> Model:
        """The same model with its layers run as a ``lax.scan`` (or unrolled).

        Scanned, the parameters of the layers are stacked along a leading
        ``[L]`` axis and XLA compiles one layer, so compile time does not grow
        with depth; unrolled, each layer is its own parameters and program.
        Both compute the same logits; Hugging Face export unstacks.
        """
        if scan_layers == self.config.scan_layers:
            return self
        module = nnx.merge(self.graphdef, self.params)
        n = self.config.num_layers
        module.layers = _stack(list(module.layers)) if scan_layers else _unstack(module.layers, n)
        module.config = dataclasses.replace(self.config, scan_layers=scan_layers)
        graphdef, params = nnx.split(module)
        return self.replace(graphdef=graphdef, params=params, config=module.config)

    def with_head_ids(self, ids) -> Model:
        """This model with an LM head that scores only ``ids``; every other id gets
        logit ``-inf``.

        For a draft model: the head of a small model of a large vocabulary is much of
        its cost (Qwen2.5-Coder-0.5B's tied 151,936 × 896 head is a quarter of its
        weights), and most of those ids are rarely the next token. A drafter that
        samples from, or takes the argmax among, the ids it keeps still proposes
        from the q it computes, so the decoders' output is exactly the target's
        whatever ``ids`` are (`specjax.sampling.vocab.frequent_ids` picks them); only the
        acceptance depends on them. The input embedding keeps every row.

        Args:
            ids: the ids to score, a sequence or ``int[K]`` array of distinct ids in
                ``[0, V)``.

        Returns:
            The model with the new head (``vocab_size`` unchanged: logits stay
            ``[B, T, V]``).

        Raises:
            ValueError: ``ids`` empty, repeated or out of range, or the model is
                quantized (restrict the float model, then quantize).
        """
        ids_K = np.asarray(ids)
        v = self.config.vocab_size
        if ids_K.ndim != 1 or ids_K.size == 0 or not np.issubdtype(ids_K.dtype, np.integer):
            raise ValueError(f"ids must be a non-empty 1-D list of ints, got shape {ids_K.shape}")
        if ids_K.min() < 0 or ids_K.max() >= v or np.unique(ids_K).size != ids_K.size:
            raise ValueError(
                f"ids must be distinct ids in [0, {v}) (vocab_size), got "
                f"min {ids_K.min()}, max {ids_K.max()}, "
                f"{ids_K.size - np.unique(ids_K).size} repeated"
            )
        if self.quantization is not None:
            raise ValueError(
                "with_head_ids on a quantized model: restrict the float model, then quantize it"
            )
        module = nnx.merge(self.graphdef, self.params)
        if getattr(module, "head_subset", None) is not None:
            del module.head_subset  # restricting again starts from the whole head
        table = (
            module.embed_tokens.embedding[...]
            if self.config.tie_word_embeddings
            else module.lm_head.weight[...]
        )
        ids_K = np.sort(ids_K)
        module.head_subset = HeadSubset(table[jnp.asarray(ids_K)], ids_K)
        graphdef, params = nnx.split(module)
        return self.replace(graphdef=graphdef, params=params)

    @property
    def head_ids(self) -> np.ndarray | None:
        """The ids the LM head scores (:meth:`with_head_ids`), or None for all."""
        module = nnx.merge(self.graphdef, self.params)
        subset = getattr(module, "head_subset", None)
        return None if subset is None else np.asarray(subset.ids[...])

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def dtype(self):
        """The compute dtype: that of the floating parameters; float32 for a quantized
        model (its scales, norms and activations' arithmetic)."""
        if self.quantization is not None:
            return jnp.dtype(jnp.float32)
        leaves = jax.tree.leaves(self.params)
        return next(
            (x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)), leaves[0].dtype
        )

    @property
    def quantization(self) -> str | None:
        """``None`` for float weights, else the mode of `specjax.models.quant.quantize`."""
        if all(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(self.params)):
            return None
        module = nnx.merge(self.graphdef, self.params)
        return next(
            (sub.quantization for _, sub in nnx.iter_graph(module) if hasattr(sub, "quantization")),
            None,
        )

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        """An empty cache of ``max_len`` slots for ``batch_size`` rows."""
        c = self.config
        return KVCache.zeros(
            c.num_layers, batch_size, max_len, c.num_kv_heads, c.head_dim, dtype or self.dtype
        )

    def __call__(
        self,
        tokens_BT,
        positions_BT,
        cache: KVCache | None,
        *,
        feature_layers: tuple[int, ...] = (),
        tree: TreeMask | None = None,
    ) -> ModelOutput:
        """Scores ``tokens`` at ``positions`` against ``cache``.

        Args:
            tokens_BT: ``int32[B, T]`` token ids.
            positions_BT: ``int32[B, T]`` absolute positions; also the cache slots
                written. Normally ``cache.lengths[:, None] + arange(T)``.
            cache: the :class:`KVCache` holding everything before ``positions``,
                or ``None`` to score ``tokens`` on their own without a cache
                (training: no scatter into a cache, and ``None`` comes back).
            feature_layers: static tuple of decoder-layer indices ``l`` (0-based);
                when non-empty the output's ``features [B, T, n·E]`` are the
                outputs (residual stream) of those layers concatenated in the
                order given, collected inside the same forward. Drafters that read
                the target (`specjax.BlockDrafter`) ask for them.
            tree: a `~specjax.models.cache.TreeMask` for a tree of drafts: token t
                is written to slot ``tree.slots[:, t]`` (not its position) and sees
                the slots before ``tree.start`` plus the tree-region slots that
                ``tree.visible[t]`` marks (its ancestors). ``None``: slot ==
                position, causal.

        Returns:
            A `~specjax.models.contract.ModelOutput`: ``logits float32[B, T, V]``, the
            new ``cache`` (``lengths == positions[:, -1] + 1``, ``tree.slots[:, -1] +
            1`` with a tree), ``features`` (``None`` without ``feature_layers``) and
            the final normalised ``hidden`` states ``[B, T, E]``.
        """
        if tree is not None and cache is None:
            raise ValueError("tree= needs a cache: tree nodes are written to cache slots")
        feature_layers = tuple(int(i) for i in feature_layers)
        bad = [i for i in feature_layers if not 0 <= i < self.config.num_layers]
        if bad:
            raise ValueError(
                f"feature_layers {feature_layers} must be layer indices in "
                f"[0, {self.config.num_layers}) of this {self.config.num_layers}-layer model"
            )
        module = nnx.merge(self.graphdef, self.params)
        return module(tokens_BT, positions_BT, cache, feature_layers, tree)

    @property
    def hidden_size(self) -> int:
        """E, the width of the residual stream (of every feature layer)."""
        return self.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def embed(self, tokens_BT) -> jax.Array:
        """The input embeddings ``[B, T, E]`` of ``tokens`` (no layer runs)."""
        return nnx.merge(self.graphdef, self.params).embed(tokens_BT)

    def head(self, hidden_BTE) -> jax.Array:
        """The LM head: logits ``float32[B, T, V]`` of normalised hidden states."""
        return nnx.merge(self.graphdef, self.params).head(hidden_BTE)


jax.tree_util.register_pytree_with_keys(Model, Model._flatten, Model._unflatten)
