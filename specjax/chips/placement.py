"""The decoder's models and arrays placed on a chip's devices, as shapes only.

`Placement` turns the models into weightless ones (``jax.ShapeDtypeStruct`` leaves) on
the devices jax describes for a chip: one device, or a ``(data, model)`` mesh of a
slice with specjax's sharding rules (`specjax.models.sharding`). It gives the abstract
arguments of the decoder's programs and what a step must read per device.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from specjax.chips.devices import devices
from specjax.chips.programs import abstract
from specjax.chips.table import Chip
from specjax.decoding.refill import init_state
from specjax.models.cache import KVCache
from specjax.models.sharding import ShardedModel, make_mesh, shard_model


@dataclasses.dataclass
class Placement:
    """The models and every other array on the chip's devices."""

    target: object
    drafter: object
    default: object  # the sharding of everything that is not split: one device, or replicated
    mesh_shape: tuple[int, int] | None
    devices: int

    @classmethod
    def of(cls, chip: Chip, target, drafter, mesh, batch_size: int) -> Placement:
        found = devices(chip)
        target = _weightless(target)
        drafter = _weightless(drafter)
        if chip.devices == 1 and mesh is None:
            default = SingleDeviceSharding(found[0])
            return cls(abstract(target, default), abstract(drafter, default), default, None, 1)
        data, model = mesh if mesh is not None else _default_mesh(chip.devices, batch_size, target)
        if data * model != chip.devices:
            raise ValueError(
                f"mesh ({data}, {model}) needs {data * model} devices; {chip.name} has "
                f"{chip.devices}"
            )
        grid = make_mesh(data, model, devices=list(found))
        target = shard_model(target, grid, indivisible="replicate")
        if hasattr(drafter, "model"):
            inner = shard_model(drafter.model, grid, tensor_parallel=False, indivisible="replicate")
            drafter = drafter.replace(model=inner)
        default = NamedSharding(grid, P())
        return cls(target, abstract(drafter, default), default, (data, model), chip.devices)

    def state_of(self, p):
        """The decode state of prepared inputs ``p``, abstract, its caches sharded."""
        state = jax.eval_shape(
            partial(init_state, cache_len=p.cache_len, num_slots=p.num_slots), p.decoder, p.inputs
        )
        state = state.replace(target_cache=self._cache(state.target_cache, self.target))
        draft_model = getattr(self.drafter, "model", None)
        if isinstance(state.drafter_state, KVCache) and draft_model is not None:
            state = state.replace(drafter_state=self._cache(state.drafter_state, draft_model))
        return abstract(state, self.default)

    def _cache(self, cache, model):
        if not isinstance(model, ShardedModel) or not isinstance(cache, KVCache):
            return cache
        spec = model.cache_spec(cache.k.shape[1], cache.k.shape[2])
        kv, rows = NamedSharding(model.mesh, spec), NamedSharding(model.mesh, P(spec[1]))
        return cache.replace(
            k=_on(cache.k, kv), v=_on(cache.v, kv), lengths=_on(cache.lengths, rows)
        )

    def step_args(self, p) -> tuple:
        trips = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.default)
        return abstract(p.decoder, self.default), self.state_of(p), trips

    def run_args(self, p) -> tuple[tuple, tuple]:
        decoder = abstract(p.decoder, self.default)
        steps = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.default)
        return (decoder, abstract(p.inputs, self.default)), (decoder, self.state_of(p), steps)

    def min_bytes(self, step_args) -> int:
        """What a step reads at least, per device: the models' weights (the target's,
        and a drafter's; an untied input embedding only gives rows) and the caches the
        state holds."""
        decoder, state, _ = step_args
        models = device_bytes((decoder.target, decoder.drafter))
        for model in (decoder.target, getattr(decoder.drafter, "model", None)):
            models -= _looked_up_bytes(model)
        return models + device_bytes((state.target_cache, state.drafter_state))


def _looked_up_bytes(model) -> int:
    """Bytes of a model's untied input embedding: a step reads rows of it, not all."""
    config = getattr(model, "config", None)
    params = getattr(model, "params", None)
    if config is None or params is None or getattr(config, "tie_word_embeddings", True):
        return 0
    try:
        return device_bytes(params["embed_tokens"])
    except (KeyError, TypeError):
        return 0


def _default_mesh(devices: int, batch_size: int, target) -> tuple[int, int]:
    """The ``(data, model)`` axes that split the most: the widest model axis that splits
    the KV cache's heads (each chip then holds its heads' cache), the rest over rows
    where the batch divides; else tensor parallel over every chip."""
    heads = getattr(getattr(target, "config", None), "num_kv_heads", 1)
    for model in sorted((m for m in range(1, devices + 1) if devices % m == 0), reverse=True):
        data = devices // model
        if heads % model == 0 and batch_size % data == 0:
            return data, model
    return 1, devices


def _on(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _weightless(tree):
    """``tree`` with its arrays replaced by their shapes (no values are needed)."""

    def leaf(x):
        if isinstance(x, (jax.Array, np.ndarray)) and not jax.dtypes.issubdtype(
            x.dtype, jax.dtypes.prng_key
        ):
            return jax.ShapeDtypeStruct(x.shape, x.dtype)
        return x

    return jax.tree.map(leaf, tree)


def device_bytes(tree) -> int:
    total = 0
    for x in jax.tree.leaves(tree):
        if not hasattr(x, "dtype") or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            continue
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return int(total)
