"""Models and drafters by path or name, for `specjax.Sampler.from_pretrained` and the CLI.

Errors are ``ValueError`` (or ``FileNotFoundError``) naming the argument that was given,
so the command line can report them under its own flag names.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp

__all__ = ["load_model", "load_pair", "model_path"]


def model_path(path, argname: str, gguf_file: str | None = None) -> Path:
    """``path`` if it is a model folder or a GGUF file; else the file of the model *named*
    ``path`` (`specjax.io.fetch.names`), fetched on first use; else, for a Hugging Face
    Hub id (``owner/name``), its files downloaded from the Hub (`specjax.io.hub`), or its
    GGUF file ``gguf_file``.

    Raises:
        ValueError: naming ``argname``: no such folder or file, no such name and no such
            Hub model, or a fetch or download that failed (with why).
    """
    from specjax.io import fetch, hub

    p = Path(path)
    if gguf_file is not None and not hub.is_hub_id(path):
        raise ValueError(f"{argname} {path}: gguf_file names a file of a Hub model (owner/name)")
    if p.is_dir() or (p.suffix.lower() == ".gguf" and p.is_file()):
        return p
    if str(path) in fetch.names():
        try:
            return fetch.fetch(str(path))
        except fetch.FetchError as e:
            raise ValueError(f"{argname} {path}: {e}") from None
    if hub.is_hub_id(path):
        try:
            return hub.download(str(path), gguf_file=gguf_file)
        except hub.HubError as e:
            raise ValueError(f"{argname} {e}") from None
    raise ValueError(
        f"{argname} {path}: no such directory or .gguf file, no model of that name "
        f"(known: {', '.join(fetch.names())}), and not a Hugging Face Hub id (owner/name)"
    )


def load_model(path, argname: str, dtype=None, gguf_file: str | None = None, quantize=None):
    """The `specjax.Model` at ``path`` (a Hugging Face folder, a GGUF file, a model name or
    a Hub id, see `model_path`), in ``dtype`` (default float32), quantized as it is read
    where ``quantize`` names a `specjax.models.quant` mode (a GGUF file's converted
    weights are then kept quantized).

    Raises:
        ValueError: naming ``argname``, for a path that holds no loadable model.
    """
    from specjax.io.hf import load_pretrained

    path = model_path(path, argname, gguf_file)
    try:
        return load_pretrained(path, jnp.float32 if dtype is None else dtype, quantize=quantize)
    except (FileNotFoundError, ValueError, OSError, KeyError) as e:
        raise ValueError(f"{argname} {path}: {e}") from None


def load_pair(
    path, draft, options, *, block_drafter=None, dtype=None, preset=True, gguf_file=None, log
):
    """``(target, options, preset)`` of `specjax.Sampler.from_pretrained`: the target
    loaded, the options with a named pair's preset applied (said on ``log``) and their
    drafter built (a `specjax.drafters.Drafter`, or None), and the preset or None.

    Raises:
        ValueError: naming the argument: a path that holds no model, a drafter that
            needs what was not given.
    """
    from specjax.io.presets import find
    from specjax.io.pretrained import default_pair
    from specjax.text.drafting import drafter_named

    if path is None:
        if draft is not None:
            raise ValueError(
                "draft needs path: the bundled draft only fits the bundled target; "
                "pass path= (the target) with draft="
            )
        target, draft_model, _ = default_pair() if dtype is None else default_pair(dtype)
    named = options.drafter if isinstance(options.drafter, str) else None
    chosen = None
    # A chain (suffix,model) keeps the pair's precisions for its draft model.
    if preset and path is not None and draft is not None and named is not None:
        chosen = find(str(path), str(draft)) if named.split(",")[-1] in ("auto", "model") else None
    if path is not None:
        settings = options.with_preset(chosen) if chosen is not None else options
        target_mode, draft_mode = _load_precisions(settings, named, block_drafter)
        target = load_model(path, "path", dtype, gguf_file, quantize=target_mode)
        draft_model = None
        if draft is not None:
            draft_model = load_model(draft, "draft", dtype, quantize=draft_mode)
    if chosen is not None:
        changes = options.preset_changes(chosen)
        options = options.with_preset(chosen)
        if changes:
            log(
                f"{path} with {draft}: this pair's preset (specjax.io.presets), "
                f"{chosen.target} + {chosen.draft}: {' '.join(changes)} "
                f"({chosen.measured}); settings given override each"
            )
    if named is not None and options.gamma != 0:
        options = options.replace(
            drafter=drafter_named(
                options.drafter,
                target,
                bundled=path is None,
                options=options,
                draft=draft_model,
                block_drafter=block_drafter,
                loaded=True,
            )
        )
    return target, options, chosen


def _load_precisions(options, named, block_drafter) -> tuple[str | None, str | None]:
    """The quantization the target and the draft model are loaded in: the options'
    own, so that a quantized run never holds (or caches) float32 weights. Block and
    EAGLE drafters are built from the float target and a ``draft_head`` from the float
    draft, so those load in float and are quantized afterwards, as before."""
    last = (named or "auto").rpartition(",")[2]
    if block_drafter is not None or last not in ("auto", "model", "lookup", "suffix", "none"):
        return None, None
    mode = options.quantize if options.draft_quantize is None else options.draft_quantize
    if mode == "none" or options.draft_head is not None:
        mode = None
    return options.quantize, mode
