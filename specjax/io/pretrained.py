"""The bundled default target/draft pair (a code-completion pair trained on the stdlib)."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import jax.numpy as jnp

DEFAULT_PAIR_DIR = "default"


def default_pair_path() -> Path:
    """Folder holding the bundled ``target/`` and ``draft/`` Hugging Face folders."""
    return Path(str(importlib.resources.files("specjax") / "assets" / DEFAULT_PAIR_DIR))


@functools.lru_cache(maxsize=2)
def default_pair(dtype=jnp.float32):
    """Loads the bundled pair, offline.

    The weights are stored in bfloat16 and cast to ``dtype`` (float32 by
    default: bf16 matmuls are slow on CPUs). See docs/training.md, "The bundled pair",
    for how the pair was trained and how well it does.

    Returns:
        ``(target, draft, tokenizer)``: two :class:`specjax.Model` sharing one
        vocabulary, and their ``tokenizers.Tokenizer``.

    Raises:
        FileNotFoundError: the package was installed without its assets.
    """
    from specjax.io.hf import load_pretrained

    root = default_pair_path()
    for name in ("target", "draft"):
        if not (root / name / "config.json").is_file():
            raise FileNotFoundError(
                f"bundled model {name!r} is missing from {root}; reinstall specjax "
                "or pass --model/--draft folders"
            )
    target = load_pretrained(root / "target", dtype=dtype)
    draft = load_pretrained(root / "draft", dtype=dtype)
    return target, draft, target.tokenizer


def default_drafter(kind: str = "block", *, num_draft: int | None = None, dtype=jnp.float32):
    """A ready `~specjax.drafters.Drafter` for the target of `default_pair`, offline.

    Args:
        kind: a name in `specjax.drafters.registry`: ``"block"`` (the bundled
            `~specjax.BlockDrafter`, trained on the target's hidden states; BENCHMARKS.md
            compares it with the others), ``"eagle"`` (the bundled EAGLE-3-style head,
            `~specjax.EagleDrafter`, trained by ``scripts/training/train_eagle.py``), ``"model"``
            (the bundled draft LM in a `~specjax.DraftModel`) or ``"lookup"``
            (`~specjax.PromptLookup`, no weights).
        num_draft: γ; default 4, or for ``"block"`` its saved γ, 2 (it was trained for
            blocks of up to 8, so γ ≤ 7); for ``"eagle"``
            its saved γ (any γ works; it was trained for chains of its saved γ).
        dtype: the weights' dtype, as for `default_pair`.

    Returns:
        the drafter, to pass with ``default_pair()[0]`` to `specjax.speculative_generate`.

    Examples:
        >>> import jax, specjax
        >>> target, _, tokenizer = specjax.default_pair()
        >>> drafter = specjax.io.pretrained.default_drafter("block")
        >>> ids = tokenizer.encode("def add(a, b):").ids
        >>> out = specjax.speculative_generate(jax.random.key(0), target, drafter, [ids],
        ...                                    max_new_tokens=16,
        ...                                    sampling=specjax.SamplingConfig.greedy())
        >>> out.tokens.shape
        (1, 16)
    """
    from specjax.core.validation import check_int
    from specjax.drafters import registry
    from specjax.io import drafter_weights

    if kind not in registry.names():
        raise ValueError(f"kind must be one of {registry.names()}, got {kind!r}")
    if num_draft is not None:
        num_draft = check_int("num_draft", num_draft, lo=1)
    target, _, _ = default_pair(dtype)
    entry = registry.get(kind)
    if not entry.has_weights:
        return entry.cls(num_draft=num_draft or 4)
    path = default_pair_path() / entry.asset
    try:
        return drafter_weights.load(entry.cls, path, target, num_draft=num_draft)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"the bundled {entry.cls.noun} is missing from {path}; reinstall specjax"
        ) from e


SMOLLM2_DRAFTER_DIR = "smollm2"


def smollm2_drafter_path() -> Path:
    """Folder of the bundled `~specjax.BlockDrafter` trained for SmolLM2-135M-Instruct."""
    return Path(str(importlib.resources.files("specjax") / "assets" / SMOLLM2_DRAFTER_DIR))


def smollm2_drafter(target, *, num_draft: int | None = None, mode: str | None = None):
    """The bundled block drafter trained for SmolLM2-135M-Instruct, bound to ``target``.

    It was trained by ``scripts/training/train_block_drafter.py`` (the command is in
    BENCHMARKS.md) on the target's own chat answers and the stdlib corpus; it reads
    the target's hidden states, so ``target`` must be SmolLM2-135M(-Instruct), e.g.
    ``specjax.load_pretrained(specjax.io.fetch.smollm2_gguf())``.

    Args:
        target: the loaded SmolLM2 target.
        num_draft: γ; default its saved γ.
        mode: ``"argmax"`` or ``"sample"`` drafts (default: as saved).

    Returns:
        the drafter, to pass with ``target`` to `specjax.speculative_generate`.

    Raises:
        FileNotFoundError: the package was installed without its assets.
        ValueError: ``target`` is not shaped like SmolLM2-135M.
    """
    from specjax.drafters.block import BlockDrafter
    from specjax.io import drafter_weights

    path = smollm2_drafter_path()
    try:
        return drafter_weights.load(BlockDrafter, path, target, num_draft=num_draft, mode=mode)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"the SmolLM2 block drafter is missing from {path}") from e
