"""`Model`: a decoder as a pytree of its parameters, called functionally.

:class:`Model` holds the split ``(graphdef, params)`` of a
`~specjax.models.llama.Transformer` and its ``__call__`` merges them inside whatever
``jax.jit`` the caller uses. The KV cache is never module state; it goes in and comes
out explicitly, in the `~specjax.models.contract.ModelOutput` every call returns.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.core.deprecation import moved
from specjax.models import llama
from specjax.models.cache import KVCache, TreeMask
from specjax.models.config import ModelConfig
from specjax.models.contract import ModelOutput
from specjax.models.llama import HeadSubset, Transformer, stack_layers, unstack_layers


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
        layers = module.layers
        module.layers = stack_layers(list(layers)) if scan_layers else unstack_layers(layers, n)
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


moved(llama, "Model", Model, "specjax.models.Model (or specjax.Model)")
