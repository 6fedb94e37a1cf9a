"""The drafter a `specjax.text.options.GenerationOptions` names, with its settings applied.

`drafter_named` turns a name (``"auto"``, ``"model"``, ``"suffix,model"``, a block
drafter folder, ...) into a `specjax.drafters.Drafter`; `with_draft_settings` applies the
precisions and the draft model's head; `with_corpus` gives a suffix drafter its corpus.
Errors are ``ValueError`` naming the option (``drafter=...``), which the command line
reads as its flags (`specjax.text.options.as_flags`).
"""

from __future__ import annotations

from pathlib import Path

from specjax.text.defaults import DEFAULTS, auto_drafter

__all__ = [
    "build_drafter",
    "drafter_name",
    "drafter_names",
    "drafter_named",
    "with_corpus",
    "with_draft_settings",
]

WITHOUT_WEIGHTS = ("auto", "lookup", "suffix", "none")
"""The names a `specjax.Sampler` built from a loaded target takes (no weights to load)."""


def drafter_names() -> tuple[str, ...]:
    """The drafter names: auto, every drafter of `specjax.drafters.registry`, none."""
    from specjax.drafters import registry

    return ("auto", *registry.names(), "none")


def drafter_named(
    name: str, target, *, bundled: bool, options, draft=None, block_drafter=None, loaded=False
):
    """The drafter ``name`` stands for, at its own γ (``None``: plain decoding).

    Args:
        name: a drafter name, a chain ``suffix,DRAFTER``, or a block drafter folder.
        target: the loaded target.
        bundled: ``target`` is the bundled target (its bundled drafters fit it).
        options: the `GenerationOptions` (``block_mode``, ``ngram``).
        draft: the draft model of ``"model"``.
        block_drafter: a block drafter folder for ``"block"``.
        loaded: the caller loads weights by name (`specjax.Sampler.from_pretrained`,
            ``specjax generate``); otherwise only the names without weights are taken.

    Raises:
        ValueError: an unknown name, or a drafter that needs what was not given.
    """
    if not loaded and name not in WITHOUT_WEIGHTS:
        raise ValueError(
            f"drafter={name!r}: specjax.Sampler(...) takes a Drafter, None, 'auto', 'lookup', "
            f"'suffix' or 'none'; for drafters with weights use "
            f"specjax.Sampler.from_pretrained(..., drafter={name!r})"
        )
    names = drafter_names()
    first, chain, last = name.rpartition(",")
    if chain and (first != "suffix" or last in ("", "auto", "none", "suffix") or "," in first):
        raise ValueError(
            f"drafter={name}: a chain is suffix,DRAFTER (e.g. suffix,model): the suffix "
            "drafter where it has a match, the other drafter elsewhere"
        )
    if last not in names:
        path = Path(last)
        if not path.is_dir():
            raise ValueError(
                f"drafter={last}: neither one of {', '.join(names)} nor a block drafter folder"
            )
        if block_drafter is not None and Path(block_drafter) != path:
            raise ValueError(f"drafter={last} and block_drafter={block_drafter} name two drafters")
        last, block_drafter = "block", str(path)
    if last == "auto":
        last = auto_drafter(
            bundled=bundled, draft=draft is not None, block_drafter=block_drafter is not None
        )
    if last == "model" and draft is None:
        raise ValueError(
            "drafter=model needs a draft model: pass draft= (a folder, GGUF file or name)"
        )
    if last == "block" and not bundled and block_drafter is None:
        raise ValueError(
            "drafter=block needs block_drafter=PATH (a block drafter folder) with a target "
            "of your own (the bundled block drafter only fits the bundled target)"
        )
    if last == "eagle" and not bundled:
        raise ValueError("drafter=eagle: the bundled EAGLE head only fits the bundled target")
    kw = dict(
        bundled=bundled,
        draft=draft,
        block_drafter=block_drafter,
        mode=options.block_mode,
        ngram=options.ngram,
    )
    try:
        return build_drafter(f"{first},{last}" if chain else last, target, **kw)
    except ValueError as e:
        where = (
            f"block_drafter={block_drafter}"
            if last == "block" and block_drafter
            else f"drafter={name}"
        )
        raise ValueError(f"{where}: {e}") from None


def build_drafter(
    name: str,
    target,
    *,
    bundled: bool,
    draft=None,
    block_drafter=None,
    gamma: int | None = None,
    mode: str = DEFAULTS.draft_mode,
    ngram: int = DEFAULTS.ngram,
):
    """The drafter called ``name`` for ``target``, at γ ``gamma`` (default its own).

    Args:
        name: ``"model"`` (``draft`` in a `specjax.DraftModel`), ``"suffix"``, a chain
            ``"suffix,model"`` (`specjax.drafters.ChainDrafter`), ``"block"`` (the
            bundled block drafter, or the folder ``block_drafter``), ``"eagle"`` (the
            bundled EAGLE head), ``"lookup"`` (`specjax.PromptLookup`), ``"none"``
            (returns ``None``: plain decoding), or any other name of
            `specjax.drafters.registry`. Resolve ``"auto"`` first
            (`specjax.text.defaults.auto_drafter`).
        target: the target the drafter serves.
        bundled: ``target`` is the bundled target, which the bundled weights fit.
        draft: the draft `specjax.Model` for ``"model"``.
        block_drafter: a block drafter folder (``specjax train-drafter``).
        gamma: tokens drafted per target call.
        mode: ``"sample"`` or ``"argmax"`` drafts of the block and EAGLE drafters.
        ngram: the longest n-gram prompt lookup matches.

    Raises:
        ValueError: a drafter that needs what was not given (a draft model, a block
            drafter folder), bundled weights for another target, or files that do not
            fit ``target``; the message says what to pass.
    """
    from specjax.drafters import registry
    from specjax.io import drafter_weights
    from specjax.io.pretrained import default_pair_path
    from specjax.sampling.vocab import check_drafter_vocab

    if name == "none":
        return None
    if "," in name:  # a chain: "suffix,model"
        from specjax.drafters.chain import ChainDrafter

        first, _, last = name.partition(",")
        kw = dict(bundled=bundled, draft=draft, block_drafter=block_drafter, mode=mode, ngram=ngram)
        chain = ChainDrafter.of(
            build_drafter(first, target, **kw), build_drafter(last, target, **kw)
        )
        return chain if gamma is None else chain.with_draft(gamma)
    if name == "lookup":
        drafter = registry.get("lookup").cls(ngram=ngram)
    elif name == "model":
        if draft is None:
            raise ValueError("the drafter 'model' needs a draft model: pass draft=")
        drafter = registry.get("model").cls(draft)
        check_drafter_vocab(target, drafter)  # a smaller draft of a padded family is fine
    elif name == "block" and block_drafter is not None:
        entry = registry.get("block")
        try:
            drafter = drafter_weights.load(entry.cls, block_drafter, target, mode=mode)
        except (FileNotFoundError, OSError, KeyError) as e:
            raise ValueError(f"block drafter {block_drafter}: {e}") from None
    else:
        entry = registry.get(name)
        if not entry.has_weights:
            drafter = entry.cls()
        elif not bundled:
            hint = " (pass a block drafter folder trained for it)" if name == "block" else ""
            raise ValueError(f"the bundled {entry.cls.noun} only fits the bundled target{hint}")
        else:
            path = default_pair_path() / entry.asset
            try:
                drafter = drafter_weights.load(entry.cls, path, target, mode=mode)
            except (FileNotFoundError, OSError, KeyError) as e:
                raise ValueError(f"bundled {entry.cls.noun} {path}: {e}") from None
    return drafter if gamma is None else drafter.with_draft(gamma)


def drafter_name(drafter) -> str:
    """The `specjax.drafters.registry` name of ``drafter`` (a chain's: its second
    member's); ``"none"`` for None."""
    from specjax.drafters import registry
    from specjax.drafters.chain import ChainDrafter

    if drafter is None:
        return "none"
    if isinstance(drafter, ChainDrafter):
        drafter = drafter.members[1]
    names = (n for n in registry.names() if type(drafter) is registry.get(n).cls)
    return next(names, type(drafter).__name__)


def _draft_model(drafter):
    """The `specjax.DraftModel` of ``drafter`` (a chain's last member), or None."""
    from specjax.drafters.chain import ChainDrafter
    from specjax.drafters.draft_model import DraftModel

    if isinstance(drafter, ChainDrafter):
        drafter = drafter.members[1]
    return drafter if isinstance(drafter, DraftModel) else None


def _with_draft_model(drafter, draft_model):
    from specjax.drafters.chain import ChainDrafter

    if isinstance(drafter, ChainDrafter):
        return drafter.replace(members=(drafter.members[0], draft_model))
    return draft_model


def with_draft_settings(target, drafter, options):
    """``(target, drafter)`` with ``draft_head``, ``quantize`` and ``draft_quantize``."""
    from specjax.models.quant import quantize as to_precision

    model = _draft_model(drafter)
    for name in ("draft_head", "draft_quantize"):
        if getattr(options, name) is not None and model is None:
            got = type(drafter).__name__ if drafter is not None else None
            raise ValueError(
                f"{name} needs a draft model (drafter=model with a draft), got drafter={got}"
            )
    if options.draft_head is not None:
        from specjax.core.validation import check_int
        from specjax.sampling.vocab import frequent_ids

        size = model.model.vocab_size
        head = check_int("draft_head", options.draft_head)
        if not 1 <= head <= size:
            raise ValueError(
                f"draft_head must be in [1, {size}] (the draft's vocabulary), got {head}"
            )
        model = model.replace(model=model.model.with_head_ids(frequent_ids(model.model, head)))
    # A model loaded quantized (`specjax.load_pretrained(..., quantize=)`) is kept as is.
    if options.quantize is not None and target.quantization != options.quantize:
        target = to_precision(target, options.quantize)
    mode = options.quantize if options.draft_quantize is None else options.draft_quantize
    if model is not None and mode not in (None, "none") and model.model.quantization != mode:
        model = model.replace(model=to_precision(model.model, mode))
    if model is not None:
        drafter = _with_draft_model(drafter, model)
    return target, drafter


def with_corpus(drafter, corpus, tokenizer):
    """``(drafter, documents)``: a suffix drafter (alone or first in a chain) drafting
    from ``corpus`` too (`specjax.text.corpus.corpus_documents`)."""
    from specjax.drafters.chain import ChainDrafter
    from specjax.drafters.suffix import SuffixDrafter
    from specjax.text.corpus import corpus_documents

    documents = corpus_documents(corpus, tokenizer)
    chained = isinstance(drafter, ChainDrafter) and isinstance(drafter.members[0], SuffixDrafter)
    if corpus is not None and not (isinstance(drafter, SuffixDrafter) or chained):
        raise ValueError(
            "corpus= is what a suffix drafter drafts from: pass drafter='suffix' (or a "
            "specjax.drafters.SuffixDrafter) with it"
        )
    if documents and chained:
        first, last = drafter.members
        return drafter.replace(members=(first.with_documents(documents), last)), documents
    if documents and isinstance(drafter, SuffixDrafter):
        return drafter.with_documents(documents), documents
    return drafter, documents
