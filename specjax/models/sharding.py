"""Sharded decoding on a device mesh, with XLA SPMD doing the partitioning.

specjax does not ship a parallel engine of its own. It places the arrays and
states where they should live, and XLA's SPMD partitioner (GSPMD) inserts the
collectives. The plain and speculative decoders run unchanged: a
:class:`ShardedModel` follows the same model contract as :class:`~specjax.Model`.

The mesh has two axes, named ``("data", "model")`` unless you say otherwise:

* **data**: the batch. Every KV cache (target and draft) is split by rows.
* **model**: tensor parallelism in the Megatron layout. Attention heads, the
  MLP hidden width and the vocabulary are split: q/k/v and gate/up are split
  by columns, o/down by rows, the embedding and LM head by vocabulary. The KV
  cache is split by kv heads. Norms and other small vectors are replicated.

Example::

    mesh = specjax.models.sharding.make_mesh(data=4, model=2)
    target = specjax.models.sharding.shard_model(target, mesh)
    draft = specjax.models.sharding.shard_model(draft, mesh, tensor_parallel=False)
    prompts = specjax.models.sharding.shard_prompts(prompts_BP, mesh)
    out = specjax.speculative_generate(key, target, specjax.DraftModel(draft, 4), prompts, ...)

Dimensions that do not divide the mesh are handled by the ``indivisible``
argument. ``"raise"`` is the default: it raises a ``ValueError`` that names
every such dimension, for example ``num_kv_heads=4 is not divisible by mesh axis 'model'
of size 8``. ``"replicate"`` keeps that one tensor whole on every device of the
axis and splits everything that does divide. Grouped-query models often have
fewer kv heads than the model axis has devices; there the k/v projections and
the cache's head axis are replicated. :attr:`ShardedModel.replicated` lists
what fell back. A batch that does not divide the data axis is handled the same
way: it raises, or with ``"replicate"`` that cache is not split by rows.

Multi-host (TPU pods, multi-node GPU): call ``jax.distributed.initialize()``
first in every process, then build the mesh over ``jax.devices()``, the global
device list. Everything here works on global arrays. See
``scripts/examples/multihost.py``. A single host needs none of this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import numpy as np
from flax import struct
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.models.attention import split_cache_writes
from specjax.models.cache import KVCache
from specjax.models.contract import ModelOutput, checked_output

DEFAULT_AXIS_NAMES = ("data", "model")

# Parameter-path rules: (regex on "a/b/c" paths, logical name of each array
# axis). A logical name is one of LOGICAL_DIMS and goes to the model axis;
# None means that axis is not split. A path no rule matches is replicated.
# Weights are [out, in] (specjax.models.layers.Dense), the embedding [V, E].
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"(^|/)q_proj/weight$", ("heads", None)),
    (r"(^|/)q_proj/bias$", ("heads",)),
    (r"(^|/)[kv]_proj/weight$", ("kv_heads", None)),
    (r"(^|/)[kv]_proj/bias$", ("kv_heads",)),
    (r"(^|/)o_proj/weight$", (None, "heads")),
    (r"(^|/)(gate|up)_proj/weight$", ("mlp", None)),
    (r"(^|/)(gate|up)_proj/bias$", ("mlp",)),
    (r"(^|/)down_proj/weight$", (None, "mlp")),
    (r"(^|/)embed_tokens/embedding$", ("vocab", None)),  # tied or not
    (r"(^|/)lm_head/weight$", ("vocab", None)),
)

# Logical dimension -> the ModelConfig field whose size must divide the model
# axis. Checking the head count, not the flat H*D width, keeps a head whole on
# one device.
LOGICAL_DIMS = {
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "mlp": "intermediate_size",
    "vocab": "vocab_size",
}

_INDIVISIBLE = ("raise", "replicate")


def make_mesh(
    data: int = -1,
    model: int = 1,
    *,
    axis_names: tuple[str, str] = DEFAULT_AXIS_NAMES,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A 2-D ``(data, model)`` mesh whose axes are partitioned automatically by XLA.

    Args:
        data: size of the data axis; -1 uses every device the model axis leaves.
        model: size of the model (tensor-parallel) axis.
        axis_names: names of the two axes.
        devices: devices to use; default ``jax.devices()`` (all processes' devices
            after ``jax.distributed.initialize()``).

    Raises:
        ValueError: if the sizes do not fit the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if model < 1 or n % model:
        raise ValueError(f"model axis size {model} does not divide the {n} devices")
    if data == -1:
        data = n // model
    if data < 1 or data * model > n:
        raise ValueError(f"mesh ({data}, {model}) needs {data * model} devices, only {n} exist")
    return jax.make_mesh(
        (data, model), tuple(axis_names), axis_types=(AxisType.Auto,) * 2, devices=devices
    )


def _auto_mesh(mesh: Mesh) -> Mesh:
    # The decoders rely on sharding propagation (XLA SPMD). On a mesh of
    # Explicit axes (jax.make_mesh's default) every sharded contraction would
    # need an out_sharding, so the same devices are re-wrapped as Auto axes.
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)


def _check_axis(mesh: Mesh, name: str | None, role: str):
    if name is not None and name not in mesh.axis_names:
        raise ValueError(f"{role} axis {name!r} is not an axis of the mesh {mesh.axis_names}")


def _path_str(path) -> str:
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            if key.name != "value":  # nnx.Variable's own leaf
                parts.append(key.name)
        else:
            parts.append(str(key))
    return "/".join(parts)


def _fits(size: int, mesh: Mesh, axis: str | None) -> bool:
    return axis is None or size % mesh.shape[axis] == 0


def _indivisible_msg(problems: dict[tuple[str, int], str], mesh: Mesh, axis: str) -> str:
    """``problems``: ``{(dimension name, size): what it splits}``."""
    lines = [
        f"{name}={size} is not divisible by mesh axis {axis!r} of size {mesh.shape[axis]} ({what})"
        for (name, size), what in problems.items()
    ]
    return (
        "; ".join(lines) + f". Use a mesh whose {axis!r} axis divides it, or "
        "indivisible='replicate' to keep such tensors unsplit."
    )


def _match_rule(name: str, rules) -> tuple[str | None, ...] | None:
    for pattern, logical in rules:
        if re.search(pattern, name):
            return tuple(logical)
    return None


def param_partition_specs(
    params,
    mesh: Mesh,
    *,
    config=None,
    model_axis: str | None = "model",
    rules=PARAM_RULES,
    indivisible: str = "raise",
):
    """The ``PartitionSpec`` of every parameter, by path rules.

    Args:
        params: a parameter pytree (e.g. ``Model.params``, an ``nnx.State``);
            paths are joined with ``/`` (``layers/0/self_attn/q_proj/weight``).
        mesh: the device mesh.
        config: optional object with the fields of :data:`LOGICAL_DIMS`
            (a :class:`~specjax.ModelConfig`); divisibility is checked on those
            counts (heads, not H*D). Without it, on the tensor's own axis size.
        model_axis: the mesh axis for tensor parallelism; ``None`` replicates
            every parameter.
        rules: ``(regex, logical axes)`` pairs; the first matching rule wins.
        indivisible: ``"raise"`` or ``"replicate"`` (see the module docstring).

    Returns:
        ``(specs, replicated)``: a pytree of ``PartitionSpec`` shaped like
        ``params`` (for an ``nnx.State``, each ``Variable`` holds its spec), and
        the paths that fell back to replication.

    Raises:
        ValueError: naming every dimension that does not divide ``model_axis``
            (with ``indivisible="raise"``).
    """
    if indivisible not in _INDIVISIBLE:
        raise ValueError(f"indivisible must be one of {_INDIVISIBLE}, got {indivisible!r}")
    _check_axis(mesh, model_axis, "model")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    specs, replicated = [], []
    problems: dict[tuple[str, int], str] = {}  # (dimension, size) -> first parameter
    for path, leaf in leaves:
        name = _path_str(path)
        logical = _match_rule(name, rules) if model_axis is not None else None
        if logical is None:
            specs.append(P())
            continue
        if name.startswith("layers/") and len(logical) + 1 == np.ndim(leaf):
            logical = (None, *logical)  # a scanned model's stacked [L, ...] layer axis
        if len(logical) != np.ndim(leaf):
            raise ValueError(
                f"a rule names {len(logical)} axes but parameter {name!r} has shape "
                f"{np.shape(leaf)}"
            )
        axes = []
        for i, dim in enumerate(logical):
            if dim is None:
                axes.append(None)
                continue
            field = LOGICAL_DIMS.get(dim, dim)
            size = getattr(config, field, None)
            if size is None:
                field, size = f"{name} axis {i}", np.shape(leaf)[i]
            if _fits(size, mesh, model_axis) and _fits(np.shape(leaf)[i], mesh, model_axis):
                axes.append(model_axis)
            else:
                problems.setdefault((field, size), f"parameter {name}")
                replicated.append(name)
                axes.append(None)
        specs.append(P(*axes))
    if problems and indivisible == "raise":
        raise ValueError(_indivisible_msg(problems, mesh, model_axis))
    return jax.tree_util.tree_unflatten(treedef, specs), tuple(replicated)


def _place(x, sharding: NamedSharding):
    """Puts one array onto ``sharding``; across processes through a host copy.

    A ``jax.ShapeDtypeStruct`` (a model with no weights, compiled for devices that are
    not here: `specjax.chips`) gets the sharding as its own."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)  # local, or a reshard of a global array
    # Every process holds the same full value (loaded from the same checkpoint
    # or given the same seed); each one builds only its own shards.
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


@struct.dataclass
class ShardedModel:
    """A model whose params and KV caches live sharded on a mesh.

    It follows the model contract (``init_cache``, ``__call__``,
    ``vocab_size``), so ``generate``, ``speculative_generate`` and
    ``DraftModel`` use it unchanged. The params are already placed; every
    cache it creates or returns carries a ``with_sharding_constraint`` (batch
    on ``data_axis``, kv heads on ``model_axis``), so caches built inside the
    decoders' jit are sharded too. Build it with :func:`shard_model`.

    Attributes:
        model: the wrapped model, params already placed on the mesh.
        mesh: the device mesh (static).
        data_axis: mesh axis of the batch (static); ``None``: not split.
        model_axis: mesh axis of the kv heads in the cache (static); ``None``:
            the cache's heads are replicated.
        indivisible: ``"raise"`` or ``"replicate"``, for a cache batch that does
            not divide the data axis (static).
        replicated: parameter paths that fell back to replication, plus
            ``"kv_cache"`` when the cache's kv heads did (static).
    """

    model: object
    mesh: Mesh = struct.field(pytree_node=False)
    data_axis: str | None = struct.field(pytree_node=False, default="data")
    model_axis: str | None = struct.field(pytree_node=False, default="model")
    indivisible: str = struct.field(pytree_node=False, default="raise")
    replicated: tuple[str, ...] = struct.field(pytree_node=False, default=())

    @property
    def supports_tree(self) -> bool:
        """Whether the wrapped model takes ``tree=`` (the tree-drafter extension)."""
        return bool(getattr(self.model, "supports_tree", False))

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def config(self):
        return getattr(self.model, "config", None)

    @property
    def tokenizer(self):
        return getattr(self.model, "tokenizer", None)

    @property
    def params(self):
        return self.model.params

    @property
    def dtype(self):
        return self.model.dtype

    def cache_spec(self, batch_size: int, num_kv_heads: int) -> P:
        """``PartitionSpec`` of a cache's keys ``[L, B, K, D, S]`` / values ``[L, B, K, S, D]``."""
        data = self.data_axis
        if batch_size == 1:
            # One row cannot be split: replicated (a refill prefills one row at a time).
            data = None
        elif not _fits(batch_size, self.mesh, data):
            if self.indivisible == "raise":
                raise ValueError(
                    _indivisible_msg({("batch_size", batch_size): "KV cache rows"}, self.mesh, data)
                )
            data = None
        heads = self.model_axis if _fits(num_kv_heads, self.mesh, self.model_axis) else None
        return P(None, data, heads, None, None)

    def constrain_cache(self, cache: KVCache) -> KVCache:
        """Applies the cache sharding (inside jit a constraint, outside a placement)."""
        if not isinstance(cache, KVCache):
            raise TypeError(
                f"ShardedModel knows the layout of specjax.KVCache only, got {type(cache).__name__}"
            )
        spec = self.cache_spec(cache.k.shape[1], cache.k.shape[2])
        kv = NamedSharding(self.mesh, spec)
        rows = NamedSharding(self.mesh, P(spec[1]))
        wsc = jax.lax.with_sharding_constraint
        return cache.replace(
            k=wsc(cache.k, kv), v=wsc(cache.v, kv), lengths=wsc(cache.lengths, rows)
        )

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        """An empty cache, sharded by :meth:`cache_spec`."""
        args = (batch_size, max_len) if dtype is None else (batch_size, max_len, dtype)
        return self.constrain_cache(self.model.init_cache(*args))

    def __call__(self, tokens_BT, positions_BT, cache: KVCache, **kwargs) -> ModelOutput:
        """The wrapped model's forward; the returned cache keeps its sharding."""
        spec = self.cache_spec(cache.k.shape[1], cache.k.shape[2])
        with split_cache_writes(self.mesh, spec):
            out = checked_output(self.model(tokens_BT, positions_BT, cache, **kwargs))
        return out.replace(cache=self.constrain_cache(out.cache))


def shard_model(
    model,
    mesh: Mesh,
    *,
    tensor_parallel: bool = True,
    data_axis: str | None = DEFAULT_AXIS_NAMES[0],
    model_axis: str | None = DEFAULT_AXIS_NAMES[1],
    indivisible: str = "raise",
    rules=PARAM_RULES,
) -> ShardedModel:
    """Places ``model``'s params on ``mesh`` and wraps it as a :class:`ShardedModel`.

    Args:
        model: a :class:`~specjax.Model`, or any model-contract object with a
            ``params`` pytree, ``replace(params=...)`` and a ``KVCache`` cache.
        mesh: a mesh with ``data_axis`` and ``model_axis`` among its axes. Its
            axes are used as ``AxisType.Auto`` (the partitioner propagates
            shardings), whatever type they were created with.
        tensor_parallel: split params over ``model_axis`` by ``rules``. ``False``
            replicates every param (right for a small draft model) while the
            cache's batch is still split over ``data_axis``.
        data_axis: mesh axis for the batch; ``None`` keeps caches unsplit by rows.
        model_axis: mesh axis for heads / MLP width / vocabulary.
        indivisible: ``"raise"`` (default) or ``"replicate"``: what to do with a
            tensor whose dimension does not divide its mesh axis.
        rules: parameter-path rules, default :data:`PARAM_RULES`.

    Raises:
        ValueError: naming the dimension and mesh axis that do not divide (with
            ``indivisible="raise"``), or an unknown axis name.

    Returns:
        A :class:`ShardedModel` with the same outputs as ``model``, up to the
        floating-point reordering of sharded sums.
    """
    if indivisible not in _INDIVISIBLE:
        raise ValueError(f"indivisible must be one of {_INDIVISIBLE}, got {indivisible!r}")
    if isinstance(model, ShardedModel):
        model = model.model
    mesh = _auto_mesh(mesh)
    _check_axis(mesh, data_axis, "data")
    _check_axis(mesh, model_axis, "model")
    tp_axis = model_axis if tensor_parallel else None
    specs, replicated = param_partition_specs(
        model.params,
        mesh,
        config=getattr(model, "config", None),
        model_axis=tp_axis,
        rules=rules,
        indivisible=indivisible,
    )
    config = getattr(model, "config", None)
    kv_heads = getattr(config, "num_kv_heads", None)
    if tp_axis is not None and kv_heads is not None and not _fits(kv_heads, mesh, tp_axis):
        if indivisible == "raise":  # params without a k/v rule, but the cache has heads
            raise ValueError(
                _indivisible_msg({("num_kv_heads", kv_heads): "KV cache heads"}, mesh, tp_axis)
            )
        replicated += ("kv_cache",)
    leaves, treedef = jax.tree.flatten(model.params)
    spec_leaves = treedef.flatten_up_to(specs)
    placed = [_place(x, NamedSharding(mesh, s)) for x, s in zip(leaves, spec_leaves, strict=True)]
    params = jax.tree.unflatten(treedef, placed)
    return ShardedModel(
        model=model.replace(params=params),
        mesh=mesh,
        data_axis=data_axis,
        model_axis=tp_axis,
        indivisible=indivisible,
        replicated=tuple(dict.fromkeys(replicated)),
    )


def shard_batch(x, mesh: Mesh, *, data_axis: str = DEFAULT_AXIS_NAMES[0]) -> jax.Array:
    """Places an array whose leading axis is the batch, split over ``data_axis``.

    Works on one host and across processes alike: every process passes the
    same full (global) value and builds only its own shards.

    Raises:
        ValueError: if the batch does not divide the data axis.
    """
    mesh = _auto_mesh(mesh)
    _check_axis(mesh, data_axis, "data")
    host = np.asarray(x)
    if host.ndim < 1 or host.shape[0] % mesh.shape[data_axis]:
        batch = host.shape[0] if host.ndim else "a scalar"
        raise ValueError(
            f"batch_size={batch} is not divisible by mesh axis {data_axis!r} of size "
            f"{mesh.shape[data_axis]}"
        )
    sharding = NamedSharding(mesh, P(data_axis))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard_prompts(prompts, mesh: Mesh, *, data_axis: str = DEFAULT_AXIS_NAMES[0]) -> jax.Array:
    """Equal-length prompts ``int[B, P]`` as an ``int32`` array split by rows over ``data_axis``.

    Ragged prompts are not accepted: a padded array would read as full-length
    rows. Pass a ragged list straight to the decoder instead; the caches of a
    :class:`ShardedModel` split the batch inside the jit all the same.

    Raises:
        ValueError: for ragged prompts or a batch that does not divide the axis.
    """
    if isinstance(prompts, (jax.Array, np.ndarray)):
        host = np.asarray(prompts)
    else:
        rows = [np.asarray(r) for r in prompts]
        if len({r.shape for r in rows}) > 1:
            raise ValueError(
                "shard_prompts needs prompts of equal length; pass ragged prompts to "
                "generate/speculative_generate as a list instead"
            )
        host = np.stack(rows) if rows else np.zeros((0, 0), np.int32)
    if host.ndim != 2 or not np.issubdtype(host.dtype, np.integer):
        raise ValueError(f"prompts must be int[batch, length], got {host.dtype}{list(host.shape)}")
    return shard_batch(host.astype(np.int32), mesh, data_axis=data_axis)


def sharding_summary(model: ShardedModel) -> dict[str, str]:
    """``{param path: str(PartitionSpec)}`` of a sharded model, for printing."""
    leaves = jax.tree_util.tree_flatten_with_path(model.params)[0]
    return {_path_str(p): str(getattr(x.sharding, "spec", x.sharding)) for p, x in leaves}


__all__ = [
    "DEFAULT_AXIS_NAMES",
    "LOGICAL_DIMS",
    "PARAM_RULES",
    "ShardedModel",
    "make_mesh",
    "param_partition_specs",
    "shard_batch",
    "shard_model",
    "shard_prompts",
    "sharding_summary",
]
