"""The decoding configuration chosen for a named target/draft pair.

For a pair `specjax.fetch` knows by name, a `Preset` holds the settings it decodes with
by default: the precisions and the draft confidence. γ is not among them: which γ pays
depends on the machine (what a wide target forward costs there) and on the prompts, so
``gamma="auto"`` chooses it from costs measured on the machine that runs it
(`specjax.tuning`). Every setting is exact: the speculative output equals
plain decoding's at its forward width, token for token (`specjax.decoding.numerics`).
``specjax generate --model NAME --draft NAME`` and `specjax.Sampler.from_pretrained`
apply it when nothing sets those, whether the pair is given by name or as the paths of
the same files (`identify`), and say which preset applied; `load_pair` loads a pair with it.

Examples:
    >>> import specjax
    >>> preset = specjax.io.presets.find("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    >>> preset.quantize
    'int8'
"""

from __future__ import annotations

import dataclasses

__all__ = ["PRESETS", "Preset", "find", "identify", "load_pair"]


@dataclasses.dataclass(frozen=True)
class Preset:
    """Decoding settings for one named pair.

    Attributes:
        target: the target's name (`specjax.io.fetch.names`).
        draft: the draft model's name.
        quantize: the target's `specjax.models.quant` mode, or None (float32).
        draft_quantize: the draft model's mode, or None (float32).
        draft_confidence: τ (``speculative_generate``'s ``draft_confidence``), or None.
        measured: where the measurement that chose it is written up.
        drafter: the drafter ``--drafter auto`` decodes the pair with: ``"model"`` (the
            draft model) or a chain (``"suffix,model"``).
    """

    target: str
    draft: str
    quantize: str | None
    draft_quantize: str | None
    draft_confidence: float | None
    measured: str
    drafter: str = "model"

    def describe(self) -> str:
        """One line for users: what was chosen, and where it was measured."""
        tau = "" if self.draft_confidence is None else f", draft confidence {self.draft_confidence}"
        drafter = "" if self.drafter == "model" else f", drafter {self.drafter}"
        return (
            f"target {self.quantize or 'float32'}, draft {self.draft_quantize or 'float32'}"
            f"{tau}{drafter} ({self.measured})"
        )


PRESETS = (
    Preset(
        target="qwen2.5-coder-1.5b",
        draft="qwen2.5-coder-0.5b",
        quantize="int8",
        draft_quantize="int8",
        draft_confidence=None,
        measured="the fastest precisions of scripts/benchmarks/bench_real_pair.py's sweep "
        "(BENCHMARKS.md)",
    ),
)


def identify(model) -> str | None:
    """The `specjax.io.fetch` name of ``model``: the name itself, or the path of the file
    that name fetches (matched by file name, wherever the file lies); None otherwise.

    Examples:
        >>> from specjax.io.presets import identify
        >>> identify("./models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")
        'qwen2.5-coder-1.5b'
    """
    from pathlib import PurePath

    from specjax.io import fetch

    text = str(model)
    if text in fetch.names():
        return text
    file_name = PurePath(text).name.lower()
    return next(
        (n for n in fetch.names() if PurePath(fetch.remote(n).file).name.lower() == file_name),
        None,
    )


def find(target, draft) -> Preset | None:
    """The preset of the pair ``target`` and ``draft``, each a name or the path of the file
    that name fetches (`identify`), or None."""
    pair = (identify(target), identify(draft))
    return next((p for p in PRESETS if (p.target, p.draft) == pair), None)


def load_pair(target: str, draft: str):
    """Fetches (once), loads and configures a named pair as its preset says.

    Args:
        target: the target's name, e.g. ``"qwen2.5-coder-1.5b"``.
        draft: the draft model's name, e.g. ``"qwen2.5-coder-0.5b"``.

    Returns:
        ``(target_model, drafter, preset)``; the drafter drafts up to its default γ.
        Choose γ for this machine with `specjax.tuning.tune`, then decode
        with ``speculative_generate(key, target_model, drafter.with_draft(t.gamma),
        prompts, forward_width=t.forward_width,
        draft_confidence=preset.draft_confidence)`` (``generate`` where ``t.gamma`` is
        0).

    Raises:
        ValueError: no preset for that pair (the message lists the presets).
    """
    from specjax.drafters import DraftModel
    from specjax.io.fetch import fetch
    from specjax.io.hf import load_pretrained

    preset = find(target, draft)
    if preset is None:
        known = ", ".join(f"{p.target} + {p.draft}" for p in PRESETS)
        raise ValueError(f"no preset for target {target!r} and draft {draft!r}; known: {known}")
    # Quantized as they are read: the float32 models are never held whole.
    target_model = load_pretrained(fetch(target), quantize=preset.quantize)
    draft_model = load_pretrained(fetch(draft), quantize=preset.draft_quantize)
    return target_model, DraftModel(draft_model), preset
