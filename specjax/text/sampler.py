"""`Sampler` and `ChatSampler`: text in, text out, over the functional decoders.

They tokenize, pick the EOS ids, call `specjax.generate` or
`specjax.speculative_generate` (or `specjax.decoding.init` and `specjax.decoding.stream`
when streaming) and detokenize; nothing else. Their defaults are those of
``specjax generate`` (`specjax.text.defaults.DEFAULTS`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping, Sequence

import jax
import numpy as np

from specjax.core.validation import check_float, check_int
from specjax.decoding import api as decoding
from specjax.decoding.state import VERIFICATIONS
from specjax.drafters.base import Drafter, TreeDrafter, lookahead
from specjax.drafters.suffix import SuffixDrafter
from specjax.io.chat import apply_chat_template
from specjax.sampling import SamplingConfig
from specjax.text.corpus import corpus_documents
from specjax.text.defaults import DEFAULTS, auto_drafter
from specjax.text.eos import stop_ids
from specjax.text.loading import build_drafter, load_model
from specjax.text.stream import TextStream

__all__ = ["ChatSampler", "Sampler"]


def _check_sampling(sampling) -> SamplingConfig:
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(
            f"sampling must be a specjax.SamplingConfig, got {type(sampling).__name__} "
            "(e.g. sampling=specjax.SamplingConfig(temperature=0.7))"
        )
    return sampling


def _quantized(target, drafter, quantize: str | None, draft_quantize: str | None):
    """``(target, drafter)`` at the precisions asked for, as ``specjax generate``'s
    ``--quantize`` and ``--draft-quantize`` set them."""
    from specjax.drafters.draft_model import DraftModel
    from specjax.models.quant import MODES
    from specjax.models.quant import quantize as to_precision

    for name, mode, allowed in (
        ("quantize", quantize, MODES),
        ("draft_quantize", draft_quantize, (*MODES, "none")),
    ):
        if mode is not None and mode not in allowed:
            raise ValueError(f"{name} must be one of {allowed} or None, got {mode!r}")
    from specjax.drafters.chain import ChainDrafter

    if isinstance(drafter, ChainDrafter):  # its draft model is the chain's last member
        first, last = drafter.members
        target, last = _quantized(target, last, quantize, draft_quantize)
        return target, drafter.replace(members=(first, last))
    is_draft_model = isinstance(drafter, DraftModel)
    if draft_quantize is not None and not is_draft_model:
        raise ValueError(
            f"draft_quantize={draft_quantize!r} sets a draft model's precision; the drafter is "
            f"{type(drafter).__name__ if drafter is not None else None}: pass "
            "drafter=specjax.DraftModel(draft), or drop draft_quantize"
        )
    draft_mode = quantize if draft_quantize is None else draft_quantize
    if quantize is not None:
        target = to_precision(target, quantize)
    if is_draft_model and draft_mode not in (None, "none"):
        drafter = drafter.replace(model=to_precision(drafter.model, draft_mode))
    return target, drafter


def _with_tree(drafter, tree, gamma):
    """``(drafter, gamma)``: the drafter proposing ``tree``; γ is the tree's depth."""
    if not isinstance(drafter, TreeDrafter):
        name = "None" if drafter is None else type(drafter).__name__
        raise ValueError(
            f"tree={tree!r} needs a drafter that proposes trees (a draft model, block or "
            f"EAGLE drafter), got drafter={name}"
        )
    drafter = drafter.with_tree(tree)
    if gamma != "auto" and gamma != drafter.num_draft:
        raise ValueError(
            f"gamma={gamma!r} and tree={tree!r} disagree: a tree drafts its depth "
            f"({drafter.num_draft}) per step; drop gamma"
        )
    return drafter, "auto"


class Sampler:
    """Completes text with a target model, speculatively when it has a drafter.

    Text goes in and text comes out, for one prompt or a batch; greedy by default, with
    the defaults of ``specjax generate``. Each call decodes with `specjax.generate`
    (no drafter) or `specjax.speculative_generate`, which compile once per batch size
    and prompt-length bucket; for a loop you jit yourself, use those functions.

    Args:
        target: the model that defines the output (`specjax.Model`, or any model
            following the model contract).
        tokenizer: a ``tokenizers.Tokenizer``; default ``target.tokenizer``.
        drafter: a `specjax.drafters.Drafter` sharing the target's ids; ``None`` for
            plain decoding; or ``"auto"`` (default), ``"lookup"`` or ``"none"``: for a
            target other than the bundled one, ``"auto"`` is prompt lookup
            (`specjax.PromptLookup`), as for ``specjax generate --model``. Use
            `from_pretrained` for drafters with weights by name.
        gamma: tokens drafted per target call, or ``"auto"`` (default): for a chain of
            drafts, the γ from 0 (plain decoding) up to the drafter's own with the most
            expected tokens per second on this machine, from step costs measured once
            per target, drafter and batch size (cached, `specjax.decoding.cost_model`)
            and the acceptance of recent runs. The choice is made at a batch size's
            first `sample` and made again after each (`tuned`), from the acceptance the
            runs saw; another machine may choose another γ, and so other sampled
            tokens: pass an int for output that is the same everywhere.
        sampling: the default `specjax.SamplingConfig` of `sample`; default greedy.
        max_new_tokens: the default budget of `sample` (EOS included).
        forward_width: every target forward scores exactly this many tokens, so that
            speculative output equals plain output at the same width token for token
            (`specjax.speculative_generate`); default the verify's width.
        verification: ``None`` (default: ``"block"`` for a chain of drafts, judged as a
            whole, `specjax.verification.block`; ``"rejection"`` for a tree),
            ``"block"``, ``"rejection"`` or ``"coupled"``.
        draft_confidence: optional τ in ``[0, 1]``: a row stops drafting after its
            first draft whose own probability is below τ (exact; pays for costly
            draft models).
        eos_id: the id, or ids, that end a row (as in `specjax.generate`); default
            those of the tokenizer and the model's config (`specjax.text.eos.stop_ids`);
            ``()`` never stops early. ``sampler.eos_id`` holds them as a tuple.
        quantize: the target's precision, a `specjax.models.quant` mode (``"int8"``:
            int8 weights and activations; ``"int8-weights"``); ``None`` keeps it.
        draft_quantize: a `specjax.DraftModel` drafter's precision: a mode, ``"none"``
            (keep it), or ``None`` (default): as ``quantize``.
        tree: draft a tree instead of a chain: a `specjax.verification.tree.Tree`, a
            branching tuple or ``"3,2,1"`` (a drafter that proposes trees; γ is the
            tree's depth).
        seed: the PRNG seed of sampled rows when `sample` gets no ``key``
            (``jax.random.key(seed)``); greedy rows do not depend on it.
        corpus: what a suffix drafter (``drafter="suffix"``) drafts from besides each
            row's own text and this sampler's earlier prompts and outputs: a file or
            folder of text or code (tokenised once, `specjax.text.corpus`), or a list
            of strings.

    Raises:
        TypeError: a target that is a path, a drafter that is not a `Drafter`.
        ValueError: no tokenizer, or a bad setting; the message names the fix.

    Examples:
        >>> import specjax
        >>> target, _, _ = specjax.default_pair()
        >>> sampler = specjax.Sampler(target)  # greedy, prompt lookup drafts
        >>> text = sampler.sample("def add(a, b):", max_new_tokens=8)
        >>> isinstance(text, str)
        True
    """

    def __init__(
        self,
        target,
        *,
        tokenizer=None,
        drafter: Drafter | str | None = DEFAULTS.drafter,
        gamma: int | str = "auto",
        sampling: SamplingConfig | None = None,
        max_new_tokens: int = DEFAULTS.max_new_tokens,
        forward_width: int | None = None,
        verification: str | None = DEFAULTS.verification,
        draft_confidence: float | None = None,
        eos_id: int | Sequence[int] | None = None,
        quantize: str | None = None,
        draft_quantize: str | None = None,
        tree=None,
        seed: int = DEFAULTS.seed,
        corpus=None,
    ):
        cls = type(self).__name__
        if isinstance(target, (str, bytes)) or hasattr(target, "__fspath__"):
            raise TypeError(
                f"{cls}(target) takes a loaded model, got the path {target!r}: use "
                f"{cls}.from_pretrained({str(target)!r})"
            )
        tokenizer = getattr(target, "tokenizer", None) if tokenizer is None else tokenizer
        if tokenizer is None:
            raise ValueError(
                f"{cls} needs a tokenizer: the target has none (specjax.load_pretrained reads "
                "tokenizer.json); pass tokenizer=tokenizers.Tokenizer.from_file(...)"
            )
        if not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode")):
            raise TypeError(
                f"tokenizer must be a tokenizers.Tokenizer (encode and decode), got "
                f"{type(tokenizer).__name__}"
            )
        if isinstance(drafter, str):
            if drafter not in ("auto", "lookup", "suffix", "none"):
                raise ValueError(
                    f"drafter={drafter!r}: {cls}(...) takes a Drafter, None, 'auto', 'lookup', "
                    f"'suffix' or 'none'; for drafters with weights use "
                    f"{cls}.from_pretrained(..., drafter={drafter!r})"
                )
            name = auto_drafter(bundled=False) if drafter == "auto" else drafter
            drafter = build_drafter(name, target, bundled=False)
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
        # Settings are checked here, where they are given, not at the first sample.
        target, drafter = _quantized(target, drafter, quantize, draft_quantize)
        # A suffix drafter drafts from the corpus and from this sampler's earlier
        # prompts and outputs, which `sample` adds as it goes.
        self._documents = corpus_documents(corpus, tokenizer)
        if corpus is not None and not isinstance(drafter, SuffixDrafter):
            raise ValueError(
                "corpus= is what a suffix drafter drafts from: pass drafter='suffix' (or a "
                "specjax.drafters.SuffixDrafter) with it"
            )
        if isinstance(drafter, SuffixDrafter) and self._documents:
            drafter = drafter.with_documents(self._documents)
        if tree is not None:
            drafter, gamma = _with_tree(drafter, tree, gamma)
        self.seed = check_int("seed", seed, lo=0, hi=2**32 - 1)
        if isinstance(gamma, str) and gamma != "auto":
            raise ValueError(f"gamma must be 'auto' or an int >= 1, got {gamma!r}")
        if gamma != "auto":
            gamma = check_int("gamma", gamma, lo=1)
            if drafter is not None:
                drafter = drafter.with_draft(gamma)
        # auto chooses a chain's γ; a tree drafts its shape and plain decoding nothing.
        chain = drafter is not None and getattr(drafter, "tree", None) is None
        self.auto = gamma == "auto" and chain
        if verification not in (None, *VERIFICATIONS):
            raise ValueError(
                f"verification must be one of {VERIFICATIONS} or None, got {verification!r}"
            )
        if forward_width is not None:
            forward_width = check_int("forward_width", forward_width, lo=1)
            verify = 1 if drafter is None else lookahead(drafter)
            if forward_width < verify and not self.auto:
                raise ValueError(
                    f"forward_width={forward_width} is narrower than one verify forward "
                    f"({verify} tokens: gamma {verify - 1} drafts and the target's own "
                    f"token); use forward_width={verify} or more, or a smaller gamma"
                )
        if draft_confidence is not None:
            draft_confidence = check_float("draft_confidence", draft_confidence, lo=0.0, hi=1.0)
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.sampling = (
            SamplingConfig(temperature=DEFAULTS.temperature)
            if sampling is None
            else _check_sampling(sampling)
        )
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, lo=1)
        self.forward_width = forward_width
        self.verification = verification
        self.draft_confidence = draft_confidence
        self.preset = None  # set by from_pretrained for a named pair with a preset
        self.tuned: dict[int, object] = {}  # batch size -> cost_model.Tuned (auto's choice)
        self._constraints: dict[tuple[str, str], object] = {}  # built automata, by source
        if eos_id is None:
            eos_id = self._stop_ids()
        elif isinstance(eos_id, (int, np.integer)):
            eos_id = (eos_id,)
        self.eos_id = tuple(int(i) for i in eos_id)

    def _stop_ids(self) -> tuple[int, ...]:
        return stop_ids(self.target, self.tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        path=None,
        draft=None,
        *,
        drafter: Drafter | str | None = DEFAULTS.drafter,
        block_drafter=None,
        dtype=None,
        preset: bool = True,
        gguf_file: str | None = None,
        **kwargs,
    ):
        """A sampler for the model at ``path``, as ``specjax generate --model --draft`` loads it.

        Args:
            path: a Hugging Face folder, a GGUF file, a model name that specjax
                fetches once (``specjax fetch --list``), or a Hugging Face Hub id
                (``"owner/name"``, downloaded once into the Hub's cache); ``None``
                (default): the bundled code-model pair, offline.
            draft: the draft model for ``drafter="model"``, given the same ways
                (with ``path``; the bundled pair brings its own).
            drafter: a name (``"auto"``, ``"model"``, ``"block"``, ``"eagle"``,
                ``"lookup"``, ``"none"``), a `~specjax.drafters.Drafter`, or ``None``.
                ``"auto"`` (default) picks what ``specjax generate`` picks: for the
                bundled pair the draft model; else the draft
                model if ``draft`` is given, else the block drafter of
                ``block_drafter`` if given, else prompt lookup.
            block_drafter: a block drafter folder for ``path``'s target
                (``specjax train-drafter``).
            dtype: the weights' dtype (default float32).
            gguf_file: for a Hub id whose repository holds GGUF files, the one to load.
            preset: for a target and draft named as a pair of `specjax.io.presets`
                (e.g. ``"qwen2.5-coder-1.5b"`` with ``"qwen2.5-coder-0.5b"``), decode with
                its settings, as ``specjax generate`` does: its quantization and draft
                confidence (``quantize=``, ``draft_quantize=`` and ``draft_confidence=``
                given here win). The preset is kept
                in ``sampler.preset``.
            **kwargs: the other arguments of the constructor (``gamma``,
                ``sampling``, ``max_new_tokens``, ``forward_width``,
                ``verification``, ``draft_confidence``, ``eos_id``).

        Raises:
            ValueError: a path that holds no model, a drafter that needs what was not
                given; the message names the argument.

        Examples:
            >>> import specjax
            >>> sampler = specjax.Sampler.from_pretrained()  # the bundled pair
            >>> type(sampler.drafter).__name__
            'DraftModel'
        """
        from specjax.io.pretrained import default_pair

        if path is None:
            if draft is not None:
                raise ValueError(
                    "draft needs path: the bundled draft only fits the bundled target; "
                    "pass path= (the target) with draft="
                )
            target, draft_model, _ = default_pair() if dtype is None else default_pair(dtype)
        else:
            target = load_model(path, "path", dtype, gguf_file)
            draft_model = load_model(draft, "draft", dtype) if draft is not None else None
        chosen = None
        if preset and path is not None and draft is not None and drafter in ("auto", "model"):
            from specjax.io.presets import find

            chosen = find(str(path), str(draft))
        if chosen is not None:
            if drafter == "auto":
                drafter = chosen.drafter
            # The preset's precisions, where quantize= and draft_quantize= are not given.
            kwargs.setdefault("quantize", chosen.quantize)
            kwargs.setdefault("draft_quantize", chosen.draft_quantize or "none")
            if chosen.draft_confidence is not None:
                kwargs.setdefault("draft_confidence", chosen.draft_confidence)
        if isinstance(drafter, str):
            name = drafter
            if name == "auto":
                name = auto_drafter(
                    bundled=path is None,
                    draft=draft is not None,
                    block_drafter=block_drafter is not None,
                )
            if name == "model" and draft_model is None:
                raise ValueError("drafter='model' needs draft= (a folder, GGUF file or name)")
            drafter = build_drafter(
                name, target, bundled=path is None, draft=draft_model, block_drafter=block_drafter
            )
        sampler = cls(target, drafter=drafter, **kwargs)
        sampler.preset = chosen
        return sampler

    # ------------------------------------------------------------------------
    # Completion.

    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        ids = [self.tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]
        for i, row in enumerate(ids):
            if not row:
                raise ValueError(f"prompt {i} tokenizes to no ids ({prompts[i]!r}); give some text")
        return ids

    def _options(self, max_new_tokens, sampling, key, stop):
        """``(key, keyword arguments of the decoders)``, checked; no ``key``: the
        sampler's ``seed``."""
        sampling = self.sampling if sampling is None else _check_sampling(sampling)
        if key is None:
            key = jax.random.key(self.seed)
        if max_new_tokens is None:
            max_new_tokens = self.max_new_tokens
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, lo=1)
        kw = dict(
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_id=list(self.eos_id) or None,
            stop=stop,
            forward_width=self.forward_width,
        )
        if self.drafter is not None:
            kw["verification"] = self.verification
            if self.draft_confidence is not None:
                kw["draft_confidence"] = self.draft_confidence
        return key, kw

    def _check_context(self, ids: list[list[int]], max_new_tokens: int) -> None:
        """Refuses a budget that, after the longest prompt, runs past the model's context."""
        context = getattr(getattr(self.target, "config", None), "max_position_embeddings", None)
        if not context:
            return
        width = self.forward_width or (1 if self.drafter is None else lookahead(self.drafter))
        longest = max(len(row) for row in ids)
        needed = longest + max_new_tokens + width
        if needed > context:
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: the longest prompt is {longest} tokens and "
                f"one forward is {width} wide, so it needs {needed} positions, more than the "
                f"model's context of {context}; use max_new_tokens={context - longest - width} "
                "or less, or a shorter prompt"
            )

    def _text(self, row: list[int]) -> str:
        stream = TextStream(self.tokenizer)
        if row and row[-1] in self.eos_id:
            row = row[:-1]
        stream.feed(row)
        return stream.text()

    def sample(
        self,
        prompt: str | Sequence[str],
        *,
        max_new_tokens: int | None = None,
        sampling: SamplingConfig | None = None,
        key: jax.Array | None = None,
        stream: bool = False,
        stop: Sequence[str] | None = None,
        regex: str | None = None,
        json_schema: str | Mapping | None = None,
        return_result: bool = False,
    ):
        """Completes ``prompt``: the generated text, without the prompt and the EOS token.

        Args:
            prompt: one string, or a list of strings (a batch, decoded together).
            max_new_tokens: the budget per prompt (EOS included); default the sampler's.
            sampling: a `specjax.SamplingConfig`; default the sampler's (greedy).
            key: a PRNG key (``jax.random.key(n)``) for sampled rows; default
                ``jax.random.key(seed)``, the sampler's ``seed``.
            stream: return an iterator of text pieces as they are generated (one
                prompt only); they join to the text ``stream=False`` returns.
            stop: strings that end a row once its text contains one (kept in the text).
            regex: every row's text matches this regular expression, and the row ends
                where the match is complete (`specjax.Constraint.regex`).
            json_schema: every row's text is a JSON document valid under this schema (a
                dict, or its JSON text; `specjax.Constraint.json_schema`). Not with
                ``regex``.
            return_result: also return the `specjax.GenerationResult` (token ids,
                acceptance statistics); not with ``stream``.

        Returns:
            the text (a ``str`` for a string, a ``list[str]`` for a list), or
            ``(text, result)`` with ``return_result``, or an iterator of ``str`` pieces
            with ``stream``.

        Raises:
            TypeError: a prompt that is not text.
            ValueError: an empty prompt or list, a batch with ``stream``, a budget past
                the model's context, both ``regex`` and ``json_schema``.

        Examples:
            >>> import specjax
            >>> sampler = specjax.Sampler(specjax.default_pair()[0], drafter=None)
            >>> one = sampler.sample("import os", max_new_tokens=4)
            >>> two = sampler.sample(["import os", "def f(x):"], max_new_tokens=4)
            >>> two[0] == one
            True
            >>> "".join(sampler.sample("import os", max_new_tokens=4, stream=True)) == one
            True
        """
        single = isinstance(prompt, str)
        prompts = self._check_prompts(prompt)
        if stream and not single:
            raise ValueError(
                f"stream=True takes one prompt, got a list of {len(prompts)}: stream them "
                "one at a time, or pass stream=False to complete the batch together"
            )
        if stream and return_result:
            raise ValueError("return_result=True needs stream=False")
        ids = self._encode(prompts)
        key, kw = self._options(max_new_tokens, sampling, key, stop)
        if regex is not None or json_schema is not None:
            kw["constraint"] = self._constraint(regex, json_schema)
        self._check_context(ids, kw["max_new_tokens"])
        drafter, kw = self._drafter_for(ids, kw)
        if stream:
            return self._stream(key, ids, drafter, kw)
        if drafter is None:
            result = decoding.generate(key, self.target, ids, **kw)
        else:
            result = decoding.speculative_generate(key, self.target, drafter, ids, **kw)
            if self.auto:  # the next call chooses from what this one saw too
                self.tuned[len(ids)].learn(result.stats)
                self.tuned[len(ids)].rechoose()
        self._remember(ids, result.to_lists())
        texts = [self._text(row) for row in result.to_lists()]
        text = texts[0] if single else texts
        return (text, result) if return_result else text

    def _remember(self, ids: list[list[int]], outputs: list[list[int]]) -> None:
        """Adds a call's prompts and outputs to a suffix drafter's corpus."""
        if not isinstance(self.drafter, SuffixDrafter):
            return
        self._documents += [np.asarray(p + o, np.int32) for p, o in zip(ids, outputs, strict=True)]
        self.drafter = self.drafter.with_documents(self._documents)

    def _constraint(self, regex, json_schema):
        """The `specjax.Constraint` of ``regex`` or ``json_schema``, built once each."""
        import json

        from specjax.sampling.constraints import Constraint

        if regex is not None and json_schema is not None:
            raise ValueError("give regex= or json_schema=, not both")
        if json_schema is not None and not isinstance(json_schema, str):
            json_schema = json.dumps(json_schema, sort_keys=True)
        key = ("regex", regex) if regex is not None else ("json_schema", json_schema)
        if key not in self._constraints:
            build = Constraint.regex if regex is not None else Constraint.json_schema
            self._constraints[key] = build(key[1], self.tokenizer, self.target.vocab_size)
        return self._constraints[key]

    def _drafter_for(self, ids: list[list[int]], kw: dict) -> tuple[Drafter | None, dict]:
        """The drafter (``None``: plain) and decoder options of a batch like ``ids``:
        with ``gamma="auto"``, the γ and width chosen for its batch size (`tuned`)."""
        if not self.auto:
            return self.drafter, kw
        from specjax import tuning as cost_model

        tuned = self.tuned.get(len(ids))
        if tuned is None:
            # Measuring takes a while on a large target: each program it times is shown.
            log = lambda line: print(f"specjax: gamma auto: {line}", file=sys.stderr)  # noqa: E731
            tuned = cost_model.tune(
                self.target, self.drafter, ids, forward_width=self.forward_width, log=log
            )
            self.tuned[len(ids)] = tuned
        kw = dict(kw, forward_width=self.forward_width or tuned.forward_width)
        if tuned.gamma == 0:
            kw.pop("verification", None)
            kw.pop("draft_confidence", None)
            return None, kw
        return self.drafter.with_draft(tuned.gamma), kw

    def _stream(self, key, ids, drafter, kw) -> Iterator[str]:
        """Text pieces of one prompt, chunk by chunk (arguments checked before the first)."""
        decoder, state = decoding.init(key, self.target, ids, drafter=drafter, **kw)
        text = TextStream(self.tokenizer, hide=self.eos_id)

        def pieces():
            generated = []
            for _, new in decoding.stream(decoder, state, steps_per_chunk=DEFAULTS.steps_per_chunk):
                generated += new[0]
                piece = text.feed(new[0])
                if piece:
                    yield piece
            rest = text.flush()
            if rest:
                yield rest
            self._remember(ids, [generated])

        return pieces()

    @staticmethod
    def _check_prompts(prompt) -> list[str]:
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Sequence):
            raise TypeError(
                f"prompt must be a str or a list of str, got {type(prompt).__name__}; "
                "for token ids use specjax.generate or specjax.speculative_generate"
            )
        else:
            prompts = list(prompt)
            if not prompts:
                raise ValueError("prompt is an empty list: give at least one string")
        for i, p in enumerate(prompts):
            where = "prompt" if isinstance(prompt, str) else f"prompt[{i}]"
            if not isinstance(p, str):
                raise TypeError(
                    f"{where} must be a str, got {type(p).__name__}; for token ids use "
                    "specjax.generate or specjax.speculative_generate"
                )
            if not p:
                raise ValueError(f"{where} is empty: give some text to complete")
        return prompts

    def __repr__(self) -> str:
        drafter = "None" if self.drafter is None else type(self.drafter).__name__
        return (
            f"{type(self).__name__}(target={type(self.target).__name__}, drafter={drafter}, "
            f"max_new_tokens={self.max_new_tokens})"
        )


class ChatSampler(Sampler):
    """Chats with an instruct model: each `chat` call is a turn, answered in its template.

    The conversation so far (`turns`) is rendered with the model's chat template
    (`specjax.apply_chat_template`) and the answer stops at the end of the assistant's
    turn (`specjax.io.chat.end_of_turn_ids`) or at EOS. Each turn decodes the whole
    conversation again; keep conversations short, or `reset` between topics.

    Args:
        target: an instruct model with a chat template (``chat_template.jinja``, the
            ``chat_template`` of ``tokenizer_config.json``, or a GGUF's).
        system: a system message put first in every rendering (``None``: none).
        multi_turn: keep earlier turns in the conversation (default); ``False``
            answers every message on its own.
        chat_template: a Jinja template to use instead of the model's.
        **kwargs: the arguments of `Sampler` (``tokenizer``, ``drafter``, ``sampling``,
            ``max_new_tokens``, ...).

    Raises:
        ValueError: the model has no chat template, or a `Sampler` argument is bad.

    Examples:
        >>> import specjax
        >>> from specjax.testing import tiny_model, tiny_tokenizer
        >>> template = (
        ...     "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
        ...     "{% if add_generation_prompt %}w9:{% endif %}"
        ... )
        >>> model = tiny_model().replace(tokenizer=tiny_tokenizer(), chat_template=template)
        >>> chat = specjax.ChatSampler(model, drafter=None, max_new_tokens=4)
        >>> answer = chat.chat("w1 w2")
        >>> [turn["role"] for turn in chat.turns]
        ['user', 'assistant']
    """

    def __init__(
        self,
        target,
        *,
        system: str | None = None,
        multi_turn: bool = True,
        chat_template: str | None = None,
        **kwargs,
    ):
        template = chat_template or getattr(target, "chat_template", None)
        if template is None:
            raise ValueError(
                "ChatSampler needs a chat template and the model has none (it is read "
                "from chat_template.jinja, tokenizer_config.json or a GGUF file): pass "
                "chat_template=, or use specjax.Sampler to complete text"
            )
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a str or None, got {type(system).__name__}")
        self.chat_template, self.system, self.multi_turn = template, system, bool(multi_turn)
        self.turns: list[dict[str, str]] = []
        super().__init__(target, **kwargs)

    def _stop_ids(self) -> tuple[int, ...]:
        return stop_ids(self.target, self.tokenizer, chat=True, chat_template=self.chat_template)

    def _render(self, messages) -> str:
        view = types.SimpleNamespace(
            config=getattr(self.target, "config", None),
            tokenizer=self.tokenizer,
            chat_template=self.chat_template,
        )
        return apply_chat_template(view, messages)

    def chat(
        self,
        message: str,
        *,
        max_new_tokens: int | None = None,
        sampling: SamplingConfig | None = None,
        key: jax.Array | None = None,
        stream: bool = False,
        stop: Sequence[str] | None = None,
        regex: str | None = None,
        json_schema: str | Mapping | None = None,
        return_result: bool = False,
    ):
        """The model's answer to ``message``, added to `turns` with it.

        Args:
            message: the user's turn.
            max_new_tokens, sampling, key, stop, regex, json_schema, return_result: as
                in `Sampler.sample`.
            stream: return an iterator of text pieces; the turn is recorded once it
                has been read to the end.

        Returns:
            the answer (``str``), ``(answer, result)`` with ``return_result``, or an
            iterator of its pieces with ``stream``.

        Raises:
            TypeError, ValueError: a message that is not a non-empty string, a template
                that refuses the conversation.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        if not message.strip():
            raise ValueError("message is empty: give the user's turn")
        history = self.turns if self.multi_turn else []
        user = {"role": "user", "content": message}
        system = [{"role": "system", "content": self.system}] if self.system else []
        prompt = self._render([*system, *history, user])
        answer = self.sample(
            prompt, max_new_tokens=max_new_tokens, sampling=sampling, key=key, stream=stream,
            stop=stop, regex=regex, json_schema=json_schema, return_result=return_result,
        )  # fmt: skip
        if not stream:
            text = answer[0] if return_result else answer
            self._record(user, text)
            return answer

        def pieces():
            parts = []
            for piece in answer:
                parts.append(piece)
                yield piece
            self._record(user, "".join(parts))

        return pieces()

    def _record(self, user, answer: str) -> None:
        if self.multi_turn:
            self.turns += [user, {"role": "assistant", "content": answer}]
        else:
            self.turns = [user, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        """Forgets the conversation (`turns`); the system message stays."""
        self.turns = []
