"""Hugging Face tensor names <-> the parameters of a :class:`~specjax.models.model.Model`.

Shared by both checkpoint formats: the Hugging Face reader (:mod:`specjax.io.hf`)
and the GGUF reader (:mod:`specjax.io.gguf`) hand their tensors to
:func:`model_from_tensors`, so both get the same checks, and the Hugging Face
writer takes them from :func:`host_tensors`.

Parameter names and layouts mirror Hugging Face's, so the mapping is
mechanical and never transposes: NNX path ``layers/3/self_attn/q_proj/weight``
(``[out, in]``, as ``nn.Linear``) is tensor ``model.layers.3.self_attn.q_proj.weight``;
the embedding table ``embed_tokens/embedding`` (``[V, E]``, tied or not) is
``model.embed_tokens.weight``; ``lm_head`` has no ``model.`` prefix. A missing,
extra or mis-shaped tensor is a ``ValueError`` naming it; nothing is skipped
silently.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.llama import Transformer
from specjax.models.model import Model

__all__ = ["LazyTensors", "abstract_quantized", "host_tensors", "model_from_tensors"]

# Buffers some old checkpoints saved although they are derived from the config.
_DERIVED_TENSOR = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def _hf_name(path: tuple) -> str:
    """``('layers', 0, 'mlp', 'up_proj', 'weight')`` -> ``model.layers.0.mlp.up_proj.weight``."""
    *modules, leaf = (str(p) for p in path)
    leaf = "weight" if leaf == "embedding" else leaf
    name = ".".join([*modules, leaf])
    return name if modules[0] == "lm_head" else f"model.{name}"


def _abstract_model(config: ModelConfig, dtype):
    module = nnx.eval_shape(lambda: Transformer(config, dtype=dtype, rngs=nnx.Rngs(0)))
    return nnx.split(module)


def model_from_tensors(
    config: ModelConfig,
    tensors,
    *,
    dtype=jnp.float32,
    tokenizer=None,
    chat_template: str | None = None,
    quantize: str | None = None,
) -> Model:
    """Builds a :class:`Model` from tensors named and laid out as in Hugging Face.

    The one place where a checkpoint becomes parameters: safetensors folders and
    GGUF files (after undoing llama.cpp's conventions) both come through here,
    so both get the same checks.

    Args:
        config: the architecture.
        tensors: mapping of Hugging Face tensor name (``model.layers.0.mlp.up_proj.weight``)
            to a floating numpy array (``nn.Linear`` layout ``[out, in]``). It may
            carry ``shapes`` (name -> shape) so that shapes are checked before any
            tensor is read.
        dtype: parameter dtype the tensors are cast to.
        tokenizer: optional ``tokenizers.Tokenizer`` for ``Model.tokenizer``.
        chat_template: optional Jinja chat template for ``Model.chat_template``.
        quantize: a `specjax.models.quant` mode (``"int8"``, ``"int8-weights"``) to
            quantize the model as it is read, layer by layer: the result is
            ``quantize(model_from_tensors(...), quantize)``, bit for bit, but the float
            weights of only one layer (or of the embedding) are in memory at a time.

    Returns:
        The :class:`Model`.

    Raises:
        ValueError: a missing, unexpected, mis-shaped or non-floating tensor,
            named, with both shapes or its dtype.
    """
    # Tensors are per layer: names and shapes are checked against the unrolled model.
    unrolled = dataclasses.replace(config, scan_layers=False)
    graphdef, abstract = _abstract_model(unrolled, dtype)
    flat = list(nnx.to_flat_state(abstract))
    expected = {_hf_name(p): (p, v) for p, v in flat}
    shapes = getattr(tensors, "shapes", None)
    shape_of = (lambda n: shapes[n]) if shapes is not None else (lambda n: np.shape(tensors[n]))

    missing = [n for n in expected if n not in tensors]
    if missing:
        raise ValueError(f"checkpoint is missing tensor(s) {missing} for {config.model_type}")
    extra = [n for n in tensors if n not in expected and not _DERIVED_TENSOR.match(n)]
    embed = "model.embed_tokens.weight"
    if config.tie_word_embeddings and "lm_head.weight" in extra:
        # Some tied checkpoints store the head too; accept it only if it is the embedding.
        if not np.array_equal(tensors["lm_head.weight"], tensors[embed]):
            raise ValueError("tie_word_embeddings=true but lm_head.weight differs from " + embed)
        extra.remove("lm_head.weight")
    if extra:
        raise ValueError(
            f"checkpoint has unexpected tensor(s) {extra} that a {config.model_type} "
            f"with this config.json does not use"
        )
    for name, (_, var) in expected.items():
        want = tuple(var.get_value().shape)
        found = tuple(shape_of(name))
        if found != want:
            raise ValueError(f"tensor {name} has shape {found}, expected {want} from config.json")

    def read(name: str) -> jax.Array:
        array = tensors[name]
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise ValueError(f"tensor {name} is stored as {array.dtype}, expected a floating dtype")
        return jnp.asarray(array, dtype=dtype)

    if quantize is not None:
        module = _quantized_module(graphdef, expected, read, quantize, config)
        graphdef, params = nnx.split(module)
        model = Model(graphdef, params, unrolled, tokenizer=tokenizer, chat_template=chat_template)
        # Stacked after quantizing: int8 copies, not float ones, are held twice meanwhile.
        return model.with_scan_layers(config.scan_layers)
    if config.scan_layers:
        # Stacked one parameter at a time as it is read: stacking a loaded model would
        # hold every weight twice (14 GB at the peak for a 6 GB model).
        graphdef, abstract = _abstract_model(config, dtype)
        leaves = []
        for p, var in nnx.to_flat_state(abstract):
            if p[0] == "layers":
                layers = range(config.num_layers)
                value = jnp.stack([read(_hf_name(("layers", i, *p[1:]))) for i in layers])
            else:
                value = read(_hf_name(p))
            leaves.append((p, var.replace(value)))
    else:
        leaves = [(p, var.replace(read(name))) for name, (p, var) in expected.items()]
    return Model(
        graphdef=graphdef,
        params=nnx.from_flat_state(leaves),
        config=config,
        tokenizer=tokenizer,
        chat_template=chat_template,
    )


def abstract_quantized(config: ModelConfig, dtype, mode: str) -> Model:
    """What ``model_from_tensors(config, ..., dtype=dtype, quantize=mode)`` builds, with
    ``jax.ShapeDtypeStruct`` leaves: its structure, shapes and dtypes, nothing computed.

    The reader of a quantized model's saved leaves (`specjax.io.converted`) checks them
    against it. The model is unrolled whatever ``config.scan_layers`` says.
    """
    unrolled = dataclasses.replace(config, scan_layers=False)
    graphdef, abstract = _abstract_model(unrolled, dtype)
    expected = {_hf_name(p): (p, v) for p, v in nnx.to_flat_state(abstract)}

    def build():
        zeros = lambda name: jnp.zeros(expected[name][1].get_value().shape, dtype)  # noqa: E731
        module = _quantized_module(graphdef, expected, zeros, mode, unrolled)
        return Model(*nnx.split(module), unrolled)

    return jax.eval_shape(build)


def _quantized_module(graphdef, expected: dict, read, mode: str, config: ModelConfig):
    """The unrolled :class:`Transformer` of ``expected``'s tensors, quantized layer by layer.

    Each layer is read, quantized and its float weights dropped before the next is
    read; the embedding, final norm and LM head come last. Leaves are read in the
    load dtype and widened to float32 as `~specjax.models.quant.quantize` widens them,
    except an untied input embedding, which keeps the load dtype (it is only looked up).
    """
    from specjax.models.quant import MODES, quantize_module

    if mode not in MODES:
        raise ValueError(f"quantize must be one of {MODES} or None, got {mode!r}")
    untied_table = () if config.tie_word_embeddings else ("embed_tokens", "embedding")

    def value(path, var):
        array = read(_hf_name(path))
        return var.replace(array if path == untied_table else array.astype(jnp.float32))

    def filled(prefix: tuple, abstract_state) -> nnx.State:
        return nnx.from_flat_state(
            [(p, value((*prefix, *p), var)) for p, var in nnx.to_flat_state(abstract_state)]
        )

    module = nnx.merge(graphdef, nnx.from_flat_state([v for v in expected.values()]))
    for i in range(config.num_layers):
        layer_graphdef, layer_abstract = nnx.split(module.layers[i])
        layer = nnx.merge(layer_graphdef, filled(("layers", i), layer_abstract))
        quantize_module(layer, mode)
        module.layers[i] = layer
    top_graphdef, top = nnx.split(module)
    leaves = [(p, var if p[0] == "layers" else value(p, var)) for p, var in nnx.to_flat_state(top)]
    module = nnx.merge(top_graphdef, nnx.from_flat_state(leaves))
    quantize_module(module, mode)
    return module


class LazyTensors(Mapping):
    """Hugging Face tensor name -> array, read (or dequantized) only when looked up.

    ``shapes`` (name -> shape) is known up front, so that :func:`model_from_tensors`
    checks every shape before any tensor is read. Safetensors folders and GGUF files
    both hand their tensors over this way.
    """

    def __init__(self, readers: dict[str, Callable[[], np.ndarray]], shapes: dict):
        self._readers = readers
        self.shapes = shapes

    def __getitem__(self, name: str) -> np.ndarray:
        return self._readers[name]()

    def __contains__(self, name) -> bool:
        return name in self._readers

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)


def host_tensors(model: Model) -> dict[str, np.ndarray]:
    """``model``'s parameters as host numpy arrays under their Hugging Face names.

    The inverse of :func:`model_from_tensors`: a scanned model is unstacked first,
    since Hugging Face names each layer's tensors.
    """
    model = model.with_scan_layers(False)  # Hugging Face names each layer's tensors
    tensors = {}
    for p, var in nnx.to_flat_state(model.params):
        tensors[_hf_name(p)] = np.asarray(jax.device_get(var.get_value()))
    return tensors
