"""`GenerationOptions`: every setting of `specjax.Sampler` and ``specjax generate``, once.

Each field is declared here with its type, default and meaning (its ``help``, which is
also the help of the ``specjax generate`` flag of the same name: ``forward_width`` is
``--forward-width``). `GenerationOptions.resolve` turns the options into what the
decoders need, against the loaded target: the drafter at its γ or tree, the
precisions, the widths, the EOS ids and the constraint, every setting checked where it
is given.

Examples:
    >>> from specjax.text.options import GenerationOptions
    >>> options = GenerationOptions(gamma=3, max_new_tokens=16)
    >>> options.replace(gamma="auto").gamma
    'auto'
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specjax.core.validation import check_float, check_int
from specjax.decoding.state import VERIFICATIONS
from specjax.sampling import SamplingConfig
from specjax.text.defaults import DEFAULTS

__all__ = ["GenerationOptions", "Resolved", "check_sampling", "parse_gamma", "schema_text"]

QUANT_MODES = ("int8", "int8-weights")
"""`specjax.models.quant`'s modes (checked against it in `GenerationOptions.resolve`)."""


def parse_gamma(value: str) -> int | str:
    """``--gamma``: a whole number, or ``auto``."""
    import argparse

    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number or 'auto', got {value!r}"
        ) from None


def _option(default, help: str, **flag):
    """A field with its meaning (``help``) and how ``specjax generate`` spells it."""
    return dataclasses.field(default=default, metadata=dict(flag, help=help))


@dataclasses.dataclass(frozen=True, eq=False)
class GenerationOptions:
    """How text is generated: the drafter, γ, precisions, budget, sampling, stops.

    Every field's meaning is its ``help`` below (the ``specjax generate`` flag of the same
    name shows it too); ``None`` leaves a setting to its default, or to a named pair's
    preset (`with_preset`). Build one from keywords, change it with `replace`, and
    resolve it against the loaded target with `resolve`.
    """

    drafter: Any = _option(
        DEFAULTS.drafter,
        "who drafts: the block drafter (reads the target's hidden states), the bundled "
        "EAGLE-style head (eagle: reads them too, drafts step by step), the draft "
        "model, prompt lookup (n-gram copy), suffix (the longest suffix match in the "
        "prompt, the output and --corpus), none (plain decoding), a chain suffix,DRAFTER, "
        "or the path of a block drafter folder (the same as --drafter block "
        "--block-drafter PATH); in Python also a specjax.drafters.Drafter or None; default "
        f"{DEFAULTS.drafter}: for the bundled pair the draft model "
        f"({DEFAULTS.bundled_drafter}); with --model, the draft model of --draft, else the "
        "block drafter of --block-drafter, else prompt lookup",
        metavar="{auto,block,eagle,model,lookup,suffix,none,PATH}",
    )
    gamma: int | str = _option(
        "auto",
        "tokens drafted per target call (γ; 0 decodes plainly). auto: the γ from 0 "
        f"(plain decoding) up to the drafter's own ({DEFAULTS.gamma}, or a block drafter's "
        "trained γ) with the most expected tokens per second, from step costs measured on "
        "this machine once (cached; the first run shows the measuring) and recent runs' "
        "acceptance; another machine may choose another γ (pass a number for output that "
        "is the same everywhere); --verbose says why. A tree (--tree) and --drafter none "
        "have no γ to choose",
        type=parse_gamma,
        metavar="{N,auto}",
    )
    tree: Any = _option(
        None,
        "draft a tree instead of a chain: K1 children at the root, K2 under each of "
        "those, ... (e.g. 3,2,2,1; a specjax.verification.tree.Tree or a tuple in Python; "
        "--drafter block, eagle or model); its depth is γ",
        metavar="K1,K2,...",
    )
    forward_width: int | None = _option(
        None,
        "every target forward scores exactly N tokens (speculative decoding's verify "
        "is padded to N, plain decoding's step too), so that speculative output equals "
        "plain output at width N token for token in any precision; default: the verify's "
        "width (gamma + 1, or a tree's nodes + 1), 1 with --drafter none",
        type=int,
        metavar="N",
    )
    verification: str | None = _option(
        DEFAULTS.verification,
        "block: the chain judged as a whole, the most accepted drafts on average; "
        "rejection: speculative rejection sampling, draft by draft; coupled: the drafts "
        "share the target's noise, and the output equals plain decoding's for the same "
        "--seed at any temperature (default: block for a chain, rejection for --tree)",
        choices=["block", "rejection", "coupled"],
    )
    draft_confidence: float | None = _option(
        None,
        "a row stops drafting after its first draft the drafter gives a probability "
        "below X (0..1; its softmax when it drafts the argmax; default: none, every row "
        "drafts gamma); the draft model then skips the forwards no row needs. Exact; pays "
        "where draft forwards are costly and often wrong (0.5 on the Qwen2.5-Coder pair's "
        "chat; BENCHMARKS.md)",
        type=float,
        metavar="X",
    )
    quantize: str | None = _option(
        None,
        "run the target (and the draft model) with int8 weights (default: none, the "
        "checkpoint's precision, or a named pair's preset): int8 also quantizes "
        "each token's activations (int8 x int8 dots, the fastest on a CPU at batch 1), "
        "int8-weights keeps float32 products (specjax.models.quant); either way the "
        "speculative output equals the quantized model's plain output at the same "
        "--forward-width",
        choices=list(QUANT_MODES),
    )
    draft_quantize: str | None = _option(
        None,
        "the draft model's own --quantize, or none to keep its precision (default: the "
        "same as --quantize); --draft-quantize int8 is the fastest exact setting measured "
        "on a CPU",
        choices=[*QUANT_MODES, "none"],
    )
    draft_head: int | None = _option(
        None,
        "the draft model's LM head scores only N ids, its tokenizer's added tokens "
        "and then the lowest ids (specjax.sampling.vocab.frequent_ids); exact whatever N, "
        "cheaper drafts, lower acceptance when the next token is outside them (default: "
        "none, every id)",
        type=int,
        metavar="N",
    )
    block_mode: str = _option(
        DEFAULTS.draft_mode,
        "block drafter: argmax drafts with a one-hot q, or sampled drafts with their "
        "true q (the same drafts at temperature 0)",
        choices=["argmax", "sample"],
    )
    ngram: int = _option(
        DEFAULTS.ngram, "longest n-gram matched by --drafter lookup", type=int, metavar="N"
    )
    corpus: Any = _option(
        None,
        "with --drafter suffix: a file or folder of text or code to draft from too, "
        "besides the prompt and the output so far (tokenised once and cached; a list of "
        "strings in Python)",
        metavar="PATH",
    )
    max_new_tokens: int = _option(
        DEFAULTS.max_new_tokens, "tokens to generate (EOS included)", type=int, metavar="N"
    )
    sampling: SamplingConfig | None = _option(
        None,
        "a specjax.SamplingConfig (default greedy); on the command line its fields are "
        "the flags --temperature, --top-k, --top-p, --min-p and the penalties",
    )
    seed: int = _option(
        DEFAULTS.seed,
        "PRNG seed of sampled rows: the key jax.random.key(seed), the key argument of "
        "specjax.generate (whose per-row seeds stay the row indices); same seed, same "
        "output; greedy rows do not depend on it",
        type=int,
        metavar="N",
    )
    stop: tuple[str, ...] | None = _option(
        None,
        "end a sample when its text contains TEXT (repeatable; kept in the output)",
        action="append",
        metavar="TEXT",
    )
    regex: str | None = _option(
        None,
        "constrain the output to the regular expression PATTERN (matched whole)",
        metavar="PATTERN",
        group="constraint",
    )
    json_schema: Any = _option(
        None,
        "constrain the output to JSON documents valid under the schema in FILE (in "
        "Python also a dict or its JSON text); not with --regex",
        metavar="FILE",
        group="constraint",
    )
    eos_id: Any = _option(
        "auto",
        "the ids that end a row: auto (default) the tokenizer's and the model config's "
        "EOS ids (with --chat, also the end of the turn); an id or ids; () or --no-eos: "
        "never stop early",
        flag="--no-eos",
        action="store_const",
        const=(),
    )

    def replace(self, **changes) -> GenerationOptions:
        """A copy with ``changes`` (field names; unknown names are refused)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {_names()}")
        return dataclasses.replace(self, **changes)

    def with_preset(self, preset) -> GenerationOptions:
        """These options with a `specjax.io.presets.Preset`'s settings where none is set:
        its drafter for ``drafter="auto"``, its precisions and draft confidence."""
        if preset is None:
            return self
        changes = {}
        if self.drafter == "auto" and preset.drafter != "model":
            changes["drafter"] = preset.drafter
        if self.quantize is None and preset.quantize is not None:
            changes["quantize"] = preset.quantize
        if self.draft_quantize is None and (preset.draft_quantize or self.quantize is None):
            # The preset's draft precision, or its float32 ("none") beside its quantize.
            changes["draft_quantize"] = preset.draft_quantize or "none"
        if self.draft_confidence is None and preset.draft_confidence is not None:
            changes["draft_confidence"] = preset.draft_confidence
        return self.replace(**changes)

    def preset_changes(self, preset) -> list[str]:
        """What `with_preset` sets, as ``name=value`` items for a message."""
        new = self.with_preset(preset)
        return [
            f"{f.name}={getattr(new, f.name)}"
            for f in dataclasses.fields(self)
            if f.name != "drafter" or self.drafter == "auto"
            if getattr(new, f.name) != getattr(self, f.name)
        ]

    # ------------------------------------------------------------------------
    # Resolution against the loaded models.

    def resolve(self, target, tokenizer, *, chat_template=None) -> Resolved:
        """What the decoders need for ``target``, every setting checked.

        Args:
            target: the loaded target model.
            tokenizer: its tokenizer (for the EOS ids, the corpus and the constraint).
            chat_template: for a chat, the template whose end-of-turn ids end a row.

        Returns:
            a `Resolved`: the (quantized) target, the drafter at its γ or tree (None:
            plain decoding), whether γ is chosen on the machine (``auto``), and the
            decoders' keyword arguments.

        Raises:
            ValueError, TypeError: a bad setting, or one that does not fit the drafter;
                the message names the option and the fix.
        """
        from specjax.drafters.base import Drafter, lookahead
        from specjax.text.drafting import drafter_named, with_corpus, with_draft_settings

        o = self
        for name in ("max_new_tokens", "ngram"):
            _at_least(name, getattr(o, name), 1)
        seed = check_int("seed", o.seed, lo=0, hi=2**32 - 1)
        gamma = o.gamma
        if isinstance(gamma, str) and gamma != "auto":
            raise ValueError(f"gamma must be >= 0 (0 decodes plainly) or 'auto', got {gamma!r}")
        if gamma != "auto":
            gamma = _at_least("gamma", gamma, 0, plain=True)
        if o.verification not in (None, *VERIFICATIONS):
            raise ValueError(
                f"verification must be one of {VERIFICATIONS} or None, got {o.verification!r}"
            )
        for name, allowed in (
            ("quantize", QUANT_MODES),
            ("draft_quantize", (*QUANT_MODES, "none")),
        ):
            if getattr(o, name) not in (None, *allowed):
                raise ValueError(
                    f"{name} must be one of {allowed} or None, got {getattr(o, name)!r}"
                )
        if o.draft_confidence is not None:
            value = check_float("draft_confidence", o.draft_confidence)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"draft_confidence must be in [0, 1], got {value}")
        sampling = check_sampling(o.sampling)
        drafter = o.drafter
        if gamma == 0:  # γ = 0 is plain decoding, what auto may choose too
            if o.tree is not None:
                raise ValueError(f"gamma=0 decodes plainly: drop tree={o.tree}")
            drafter = None
        if isinstance(drafter, str):
            drafter = drafter_named(drafter, target, bundled=False, options=o)
        if drafter is not None and not isinstance(drafter, Drafter):
            hint = (
                "; wrap a draft model as specjax.DraftModel(draft)"
                if hasattr(drafter, "config") and hasattr(drafter, "vocab_size")
                else ""
            )
            raise TypeError(
                f"drafter must be a specjax.drafters.Drafter, None or 'auto', got "
                f"{type(drafter).__name__}{hint}"
            )
        target, drafter = with_draft_settings(target, drafter, o)
        drafter, documents = with_corpus(drafter, o.corpus, tokenizer)
        if o.tree is not None:
            drafter, gamma = _with_tree(drafter, o.tree, gamma, o.drafter)
        if gamma not in ("auto", 0) and drafter is not None:
            drafter = drafter.with_draft(gamma)
        # auto chooses a chain's γ; a tree drafts its shape and plain decoding nothing.
        auto = gamma == "auto" and drafter is not None and getattr(drafter, "tree", None) is None
        width = o.forward_width
        if width is not None:
            width = _at_least("forward_width", width, 1)
            verify = 1 if drafter is None else lookahead(drafter)
            if width < verify and not auto:
                drafts = f"tree={o.tree}" if o.tree is not None else f"gamma={verify - 1}"
                raise ValueError(
                    f"forward_width={width} is narrower than one verify forward ({verify} "
                    f"tokens with {drafts}: the drafts and the target's own token); use "
                    f"forward_width={verify} or more"
                )
        if o.draft_confidence is not None and not (
            drafter is not None and drafter.stops_early and o.tree is None
        ):
            raise ValueError(
                "draft_confidence shortens the draft model's chain of drafts: it needs "
                "drafter=model (with a draft) and no tree"
            )
        if drafter is not None:
            from specjax.sampling.vocab import resolve_vocab_limit

            resolve_vocab_limit(sampling, target, drafter)  # e.g. a padded family's draft
        eos = _eos_ids(o.eos_id, target, tokenizer, chat_template)
        kw = dict(sampling=sampling, eos_id=list(eos) or None, forward_width=width)
        if drafter is not None:
            kw["verification"] = o.verification
            if o.draft_confidence is not None:
                kw["draft_confidence"] = o.draft_confidence
        return Resolved(target, drafter, auto, eos, seed, documents, decode_kwargs=kw)

    def constraint(self, tokenizer, vocab_size: int, regex=None, json_schema=None):
        """The `specjax.Constraint` of ``regex`` or ``json_schema`` (default these
        options'); ``None`` without either."""
        from specjax.sampling.constraints import Constraint

        regex = self.regex if regex is None else regex
        schema = self.json_schema if json_schema is None else json_schema
        if regex is not None and schema is not None:
            raise ValueError("give regex= or json_schema=, not both")
        if regex is not None:
            return Constraint.regex(regex, tokenizer, vocab_size)
        if schema is None:
            return None
        return Constraint.json_schema(schema_text(schema), tokenizer, vocab_size)


@dataclasses.dataclass(frozen=True, eq=False)
class Resolved:
    """`GenerationOptions` resolved against a target.

    Attributes:
        target: the target at the precision asked for.
        drafter: the drafter at its γ or tree; ``None``: plain decoding.
        auto: γ is chosen on this machine per batch size (`specjax.tuning`).
        eos_id: the ids that end a row (``()``: none).
        seed: the PRNG seed of sampled rows.
        documents: what a suffix drafter drafts from besides each row's own text.
        decode_kwargs: ``sampling``, ``eos_id``, ``forward_width`` and, with a drafter,
            ``verification`` and ``draft_confidence``, for `specjax.speculative_generate`.
    """

    target: Any
    drafter: Any
    auto: bool
    eos_id: tuple[int, ...]
    seed: int
    documents: list
    decode_kwargs: dict


def schema_text(schema) -> str:
    """A JSON schema's text: ``schema`` is a dict, JSON text, or the path of a file."""
    if isinstance(schema, Mapping):
        return json.dumps(schema, sort_keys=True)
    if isinstance(schema, Path) or (
        isinstance(schema, str) and not schema.lstrip().startswith(("{", "["))
    ):
        try:
            return Path(schema).read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"json_schema: cannot read {schema}: {e.strerror}") from None
    if not isinstance(schema, str):
        raise TypeError(
            f"json_schema must be a dict, JSON text or a file path, got {type(schema).__name__}"
        )
    return schema


def check_sampling(sampling) -> SamplingConfig:
    """``sampling`` (``None``: greedy), refused unless a `specjax.SamplingConfig`."""
    if sampling is None:
        return SamplingConfig(temperature=DEFAULTS.temperature)
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(
            f"sampling must be a specjax.SamplingConfig, got {type(sampling).__name__} "
            "(e.g. sampling=specjax.SamplingConfig(temperature=0.7))"
        )
    return sampling


def _at_least(name: str, value, lo: int, plain: bool = False) -> int:
    value = check_int(name, value)
    if value < lo:
        why = " (0 decodes plainly) or 'auto'" if plain else ""
        raise ValueError(f"{name} must be >= {lo}{why}, got {value}")
    return value


def _with_tree(drafter, tree, gamma, named):
    """``(drafter, gamma)``: the drafter proposing ``tree``; γ is the tree's depth."""
    from specjax.drafters.base import TreeDrafter

    if not isinstance(drafter, TreeDrafter):
        from specjax.text.drafting import drafter_name

        name = named if isinstance(named, str) else drafter_name(drafter)
        raise ValueError(
            f"tree={tree} needs a drafter that proposes trees (model, block or eagle), "
            f"not drafter={name}"
        )
    try:  # e.g. a tree deeper than a block drafter's block
        drafter = drafter.with_tree(tree)
    except ValueError as e:
        raise ValueError(f"tree={tree}: {e}") from None
    if gamma != "auto" and gamma != drafter.num_draft:
        raise ValueError(
            f"gamma={gamma} and tree={tree} disagree: a tree drafts its depth "
            f"({drafter.num_draft}) per step; drop gamma"
        )
    return drafter, "auto"


def _eos_ids(eos_id, target, tokenizer, chat_template) -> tuple[int, ...]:
    from specjax.text.eos import stop_ids

    if eos_id is None:
        warnings.warn(
            "eos_id=None for the tokenizer's EOS ids is deprecated: use eos_id='auto' (the "
            "default); eos_id=() never stops early",
            DeprecationWarning,
            stacklevel=4,
        )
        eos_id = "auto"
    if isinstance(eos_id, str):
        if eos_id != "auto":
            raise ValueError(f"eos_id must be 'auto', an id or a list of ids, got {eos_id!r}")
        if chat_template is not None:
            return tuple(stop_ids(target, tokenizer, chat=True, chat_template=chat_template))
        return tuple(stop_ids(target, tokenizer))
    if isinstance(eos_id, (int, np.integer)):
        eos_id = (eos_id,)
    return tuple(int(i) for i in eos_id)


def _names() -> str:
    return ", ".join(f.name for f in dataclasses.fields(GenerationOptions))


def _document() -> None:
    """Appends each field's type, default and meaning to the class docstring."""
    lines = ["", "    Attributes:"]
    for f in dataclasses.fields(GenerationOptions):
        lines.append(f"        {f.name} ({f.type}, default {f.default!r}): {f.metadata['help']}.")
    GenerationOptions.__doc__ += "\n".join(lines) + "\n"


_document()
