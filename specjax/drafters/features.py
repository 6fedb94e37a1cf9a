"""`FeatureDrafter`: the shared base of drafters that read the target's hidden states.

`specjax.BlockDrafter` (DFlash-style: one forward drafts a block) and
`specjax.EagleDrafter` (EAGLE-3-style: a head drafting autoregressively over its own
features) differ in their network and how they draft, and share everything else:

* the fields: the target (a pytree field, whose embedding and LM head they use and
  never copy), their own NNX weights (``graphdef`` + ``params``), the static
  `ModelConfig` of their layers, the ``target_layers`` they fuse, γ, the drafting mode
  (``"argmax"`` or ``"sample"``) and an optional tree;
* building random weights for any target (`FeatureDrafter.build`), with the target
  layers chosen by `default_target_layers` and checked by `check_layers`;
* `FeatureDrafter.check` and `FeatureDrafter.with_draft`;
* the draft layers' config (`layers_config`: the target's width, heads and RoPE);
* their cache, whose size the memory check counts (`FeatureDrafter.state_bytes`).

Their weights are saved and loaded by `specjax.io.drafter_weights` and trained by
`specjax.training`.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx, struct

from specjax.drafters.base import TreeDrafter
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.models.forward import cache_bytes
from specjax.verification.tree import Tree

__all__ = ["MODES", "FeatureDrafter", "check_layers", "default_target_layers", "layers_config"]

MODES = ("argmax", "sample")


def default_target_layers(num_target_layers: int, num_features: int) -> tuple[int, ...]:
    """Up to ``num_features`` distinct layers spread evenly from layer 1 to L-3, as DFlash.

    Targets too shallow for that range spread them over all L layers instead (so
    there may be fewer than asked for: at most L).
    """
    lo, hi = 1, num_target_layers - 3
    if hi - lo + 1 < num_features:
        lo, hi = 0, num_target_layers - 1
    n = min(num_features, hi - lo + 1)
    if n == 1:
        return ((lo + hi) // 2,)
    return tuple(int(i) for i in np.round(np.linspace(lo, hi, n)).astype(int))


def check_layers(target_layers, num_target_layers: int) -> tuple[int, ...]:
    """``target_layers`` as a tuple of distinct layer indices of a target this deep.

    Raises:
        TypeError, ValueError: naming ``target_layers``, for something that is not a
            sequence of integers, an index outside ``[0, L-1]``, no index at all or a
            repeated one (it would be fused twice).
    """
    from specjax.core.validation import check_int

    if isinstance(target_layers, (str, bytes)) or not hasattr(target_layers, "__iter__"):
        raise ValueError(f"target_layers must be a tuple of layer indices, got {target_layers!r}")
    layers = tuple(
        check_int("target_layers", i, lo=0, hi=num_target_layers - 1) for i in target_layers
    )
    if not layers:
        raise ValueError("target_layers must name at least one target layer")
    if len(set(layers)) != len(layers):
        raise ValueError(f"target_layers must not repeat a layer, got {layers}")
    return layers


def layers_config(
    target, num_layers: int, intermediate_size: int | None, *, qk_norm: bool = False
) -> ModelConfig:
    """The draft layers' config: the target's width, heads and RoPE, ``num_layers`` deep.

    Llama-style layers without biases; ``intermediate_size`` defaults to the target's.
    """
    c = target.config
    return ModelConfig(
        model_type="llama",
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=intermediate_size or c.intermediate_size,
        num_layers=num_layers,
        num_heads=c.num_heads,
        num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        rope_scaling=c.rope_scaling,
        attention_bias=False,
        o_proj_bias=False,
        qk_norm=qk_norm,
        max_position_embeddings=c.max_position_embeddings,
    )


@struct.dataclass
class FeatureDrafter(TreeDrafter):
    """A drafter with its own NNX weights that reads the target's ``target_layers``.

    Subclasses implement ``init``, ``propose`` and ``update`` and name their network
    and file format in the class attributes below; the rest is shared.

    Attributes:
        target: the target model; it must return ``feature_layers=`` features and
            provide ``embed`` and ``head`` (see docs/models.md, "Bring your own model").
        params: the drafter's own weights (``nnx.State``).
        graphdef: static NNX graph of `net_type`.
        config: static `ModelConfig` of the draft layers.
        target_layers: static target layer indices whose outputs are fused.
        num_draft: γ (static).
        mode: ``"argmax"`` (default, one-hot q) or ``"sample"`` (static).
    """

    target: object
    params: nnx.State
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    config: ModelConfig = struct.field(pytree_node=False)
    target_layers: tuple[int, ...] = struct.field(pytree_node=False)
    num_draft: int = struct.field(pytree_node=False, default=4)
    mode: str = struct.field(pytree_node=False, default="argmax")
    tree: Tree | None = struct.field(pytree_node=False, default=None)

    # A class attribute (not a field) each subclass sets, besides `noun`:
    #: The NNX module of its weights, built as ``net_type(config, num_features, *,
    #: dtype, rngs)``.
    net_type = None

    @classmethod
    def build(
        cls,
        target,
        key: jax.Array,
        config: ModelConfig,
        target_layers: tuple[int, ...],
        **fields,
    ) -> FeatureDrafter:
        """A drafter with random weights (initialised from ``key``), checked.

        ``fields`` are the remaining dataclass fields (``num_draft``, ``mode``, ...).
        """
        net = cls.net_type(
            config, len(target_layers), dtype=target.dtype, rngs=nnx.Rngs(params=key)
        )
        graphdef, params = nnx.split(net)
        return cls.of_weights(target, graphdef, params, config, target_layers, **fields)

    @classmethod
    def of_weights(
        cls,
        target,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        config: ModelConfig,
        target_layers: tuple[int, ...],
        **fields,
    ) -> FeatureDrafter:
        """The drafter of these weights (``graphdef``, ``params``) on ``target``, checked.

        ``fields`` are the remaining dataclass fields (``num_draft``, ``mode``, ...).

        Raises:
            ValueError: γ, the mode or the target layers are invalid (`check`).
        """
        drafter = cls(
            target=target,
            params=params,
            graphdef=graphdef,
            config=config,
            target_layers=target_layers,
            **fields,
        )
        drafter.check()
        return drafter

    @staticmethod
    def random_layers(target, target_layers, num_features: int) -> tuple[int, ...]:
        """``target_layers``, or `default_target_layers` of ``num_features``, checked."""
        from specjax.core.validation import check_int

        if target_layers is None:
            num_features = check_int("num_features", num_features, lo=1)
            target_layers = default_target_layers(target.config.num_layers, num_features)
        return check_layers(target_layers, target.config.num_layers)

    def check(self) -> None:
        """Raises ValueError naming the field if γ, the mode or the target layers are invalid."""
        from specjax.core.validation import check_int

        check_int("num_draft", self.num_draft)  # the type; the range is check_num_draft's
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.tree is not None and self.tree.depth != self.num_draft:
            raise ValueError(
                f"num_draft (γ) must be the tree's depth {self.tree.depth}, got "
                f"{self.num_draft}: use with_tree(tree) to set both"
            )
        self.check_num_draft()
        check_layers(self.target_layers, self.target.config.num_layers)

    def check_num_draft(self) -> None:
        """Raises ValueError if γ is outside the range this drafter drafts (default >= 0)."""
        from specjax.core.validation import check_int

        check_int("num_draft", self.num_draft, lo=0)

    def with_draft(self, num_draft: int | None = None, mode: str | None = None) -> FeatureDrafter:
        """The same drafter with another γ and/or mode (no new weights)."""
        out = self.replace(
            num_draft=self.num_draft if num_draft is None else num_draft,
            mode=self.mode if mode is None else mode,
        )
        out.check()
        return out

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def num_features(self) -> int:
        return len(self.target_layers)

    @property
    def net(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.params)

    def state_bytes(self, batch_size: int, cache_len: int) -> int:
        return cache_bytes(self, batch_size, cache_len)

    def init_cache(self, batch_size: int, cache_len: int) -> KVCache:
        """Zeros for the draft layers' keys and values, in the target's dtype."""
        c = self.config
        return KVCache.zeros(
            c.num_layers, batch_size, cache_len, c.num_kv_heads, c.head_dim, self.target.dtype
        )
