"""A checkpoint's model without its weights: the architecture, and a shape for each weight.

Compiling for a chip that is not here (`specjax.chips`) needs every parameter's shape
and dtype, never its values: `abstract_pretrained` reads a checkpoint's configuration
only (``config.json``, or a GGUF file's header) and builds the same `specjax.Model`
that `specjax.load_pretrained` would, with ``jax.ShapeDtypeStruct`` leaves. It takes
a second and no memory, where loading a 1.5B model reads gigabytes.

Examples:
    >>> import jax.numpy as jnp, specjax
    >>> from specjax.io.abstract import abstract_pretrained
    >>> from specjax.io.pretrained import default_pair_path
    >>> model = abstract_pretrained(default_pair_path() / "target", jnp.bfloat16)
    >>> model.params["embed_tokens"]["embedding"].value
    ShapeDtypeStruct(shape=(4096, 384), dtype=bfloat16)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.io.folder import read_json
from specjax.io.hf import _check_float_dtype, _gguf_file
from specjax.io.hf_config import config_from_hf
from specjax.io.tensors import _abstract_model
from specjax.models.model import Model
from specjax.models.quant import quantize as quantize_model

__all__ = ["abstract_pretrained"]


def abstract_pretrained(
    path: str | os.PathLike,
    dtype=jnp.bfloat16,
    *,
    quantize: str | None = None,
    scan_layers: bool = False,
) -> Model:
    """The `specjax.Model` of a checkpoint, with shapes where its weights would be.

    Args:
        path: a Hugging Face folder (``config.json``) or a GGUF file (or a folder
            holding one), as `specjax.load_pretrained` takes.
        dtype: the parameters' floating dtype (bfloat16 by default: what a chip runs).
        quantize: a `specjax.models.quant` mode (``"int8"``), or None.
        scan_layers: the layers as one ``lax.scan`` over stacked parameters.

    Returns:
        The weightless `Model` (no tokenizer): arrays are ``jax.ShapeDtypeStruct``.

    Raises:
        FileNotFoundError: no ``config.json`` or GGUF file at ``path``.
        ValueError: a configuration specjax cannot load, or an unknown ``quantize``.
    """
    _check_float_dtype(dtype)
    folder = Path(path)
    gguf_file = _gguf_file(folder)
    if gguf_file is not None:
        from specjax.io.gguf import gguf_hf_config

        hf = gguf_hf_config(gguf_file)
    elif (folder / "config.json").is_file():
        hf = read_json(folder / "config.json")
    else:
        raise FileNotFoundError(f"{folder} has no config.json and no GGUF file")
    config = dataclasses.replace(config_from_hf(hf), scan_layers=False)

    def build() -> Model:
        graphdef, params = _abstract_model(config, dtype)
        params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params)
        model = Model(graphdef=graphdef, params=params, config=config)
        model = model.with_scan_layers(scan_layers)
        return model if quantize is None else quantize_model(model, quantize)

    return jax.eval_shape(build)
