"""`Sampler`: text in, text out, over the functional decoders.

It tokenizes, resolves its `specjax.text.options.GenerationOptions` against the target,
calls `specjax.generate` or `specjax.speculative_generate` (or `specjax.decoding.init`
and `specjax.decoding.stream` when streaming) and detokenizes; nothing else.
``specjax generate`` decodes through it too (`Sampler.plan`), so both decode alike.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping, Sequence

import jax
import numpy as np

from specjax.core.validation import check_int
from specjax.decoding import api as decoding
from specjax.drafters.base import lookahead
from specjax.drafters.suffix import SuffixDrafter
from specjax.text.defaults import DEFAULTS
from specjax.text.options import GenerationOptions, check_sampling
from specjax.text.plan import Plan
from specjax.text.stream import TextStream

__all__ = ["Sampler"]


def _stderr(line: str) -> None:
    print(f"specjax: {line}", file=sys.stderr)


def _options_of(options: GenerationOptions | None, settings: dict) -> GenerationOptions:
    if options is None:
        return GenerationOptions().replace(**settings)
    if not isinstance(options, GenerationOptions):
        raise TypeError(
            "options must be a specjax.GenerationOptions, got "
            f"{type(options).__name__} (or pass the settings as keywords)"
        )
    return options.replace(**settings)


class Sampler:
    """Completes text with a target model, speculatively when it has a drafter.

    Text goes in and text comes out, for one prompt or a batch; greedy by default, with
    the defaults of ``specjax generate``. Each call decodes with `specjax.generate`
    (no drafter) or `specjax.speculative_generate`, which compile once per batch size
    and prompt-length bucket; for a loop you jit yourself, use those functions.

    Args:
        target: the model that defines the output (`specjax.Model`, or any model
            following the model contract).
        options: a `specjax.GenerationOptions` (default: its defaults).
        tokenizer: a ``tokenizers.Tokenizer``; default ``target.tokenizer``.
        log: where progress lines go (the preset applied, gamma auto's measuring);
            default stderr.
        **settings: fields of `specjax.GenerationOptions` (``drafter``, ``gamma``,
            ``sampling``, ``max_new_tokens``, ``forward_width``, ``verification``,
            ``draft_confidence``, ``eos_id``, ``quantize``, ``draft_quantize``,
            ``tree``, ``seed``, ``corpus``, ...), which replace those of ``options``.
            A loaded target takes the drafters without weights by name (``"auto"``:
            prompt lookup, ``"lookup"``, ``"suffix"``, ``"none"``) or a
            `specjax.drafters.Drafter`; `from_pretrained` loads the others.

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
        options: GenerationOptions | None = None,
        *,
        tokenizer=None,
        log=_stderr,
        **settings,
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
        self.options = _options_of(options, settings)
        self.log = log
        # Settings are checked here, where they are given, not at the first sample.
        resolved = self.options.resolve(target, tokenizer, chat_template=self._chat_template())
        self.target, self.tokenizer, self.drafter = resolved.target, tokenizer, resolved.drafter
        self.auto, self.eos_id, self.seed = resolved.auto, resolved.eos_id, resolved.seed
        self._kwargs = resolved.decode_kwargs
        # A suffix drafter drafts from the corpus and from this sampler's earlier
        # prompts and outputs, which `sample` adds as it goes.
        self._documents = resolved.documents
        self.preset = None  # set by from_pretrained for a named pair with a preset
        self.tuned: dict[int, object] = {}  # batch size -> tuning.Tuned (auto's choice)
        self._constraints: dict[tuple[str, str], object] = {}  # built automata, by source

    def _chat_template(self) -> str | None:
        """The template whose end-of-turn ids end a row (a `ChatSampler`'s)."""
        return None

    sampling = property(lambda self: self._kwargs["sampling"], doc="The default sampling.")
    max_new_tokens = property(lambda self: self.options.max_new_tokens, doc="The default budget.")
    forward_width = property(lambda self: self.options.forward_width, doc="The fixed width.")
    verification = property(lambda self: self.options.verification, doc="The verification.")
    draft_confidence = property(lambda self: self.options.draft_confidence, doc="τ, or None.")

    @classmethod
    def from_pretrained(
        cls,
        path=None,
        draft=None,
        options: GenerationOptions | None = None,
        *,
        block_drafter=None,
        dtype=None,
        preset: bool = True,
        gguf_file: str | None = None,
        log=_stderr,
        **settings,
    ):
        """A sampler for the model at ``path``, as ``specjax generate --model --draft`` loads it.

        Args:
            path: a Hugging Face folder, a GGUF file, a model name that specjax
                fetches once (``specjax fetch --list``), or a Hugging Face Hub id
                (``"owner/name"``, downloaded once into the Hub's cache); ``None``
                (default): the bundled code-model pair, offline.
            draft: the draft model for ``drafter="model"``, given the same ways
                (with ``path``; the bundled pair brings its own).
            options: a `specjax.GenerationOptions`; ``**settings`` replace its fields.
                Its ``drafter`` may name any drafter here (``"auto"``, ``"model"``,
                ``"block"``, ``"eagle"``, ``"lookup"``, ``"suffix"``, ``"suffix,model"``,
                ``"none"``, a block drafter folder): ``"auto"`` (default) picks what
                ``specjax generate`` picks: for the bundled pair the draft model; else
                the draft model if ``draft`` is given, else the block drafter of
                ``block_drafter`` if given, else prompt lookup.
            block_drafter: a block drafter folder for ``path``'s target
                (``specjax train-drafter``).
            dtype: the weights' dtype (default float32).
            preset: for a target and draft that are a pair of `specjax.io.presets`
                (by name, or the same files by path), decode with its settings where
                none is given (`GenerationOptions.with_preset`), and say so on ``log``;
                the preset is kept in ``sampler.preset``.
            gguf_file: for a Hub id whose repository holds GGUF files, the one to load.
            log: where progress lines go; default stderr.
            **settings: fields of `specjax.GenerationOptions`, and the constructor's
                other keywords (``tokenizer``; a `ChatSampler`'s ``system``, ...).

        Raises:
            ValueError: a path that holds no model, a drafter that needs what was not
                given; the message names the argument.

        Examples:
            >>> import specjax
            >>> sampler = specjax.Sampler.from_pretrained()  # the bundled pair
            >>> type(sampler.drafter).__name__
            'DraftModel'
        """
        from specjax.text.loading import load_pair

        fields = {f.name for f in dataclasses.fields(GenerationOptions)}
        extra = {k: settings.pop(k) for k in list(settings) if k not in fields}
        options = _options_of(options, settings)
        target, options, chosen = load_pair(
            path,
            draft,
            options,
            block_drafter=block_drafter,
            dtype=dtype,
            preset=preset,
            gguf_file=gguf_file,
            log=log,
        )
        sampler = cls(target, options, log=log, **extra)
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

    def plan(
        self,
        prompts: Sequence[str],
        *,
        max_new_tokens: int | None = None,
        sampling=None,
        key: jax.Array | None = None,
        stop: Sequence[str] | None = None,
        regex: str | None = None,
        json_schema: str | Mapping | None = None,
    ) -> Plan:
        """The decode of ``prompts`` (a list of strings), checked and ready to run.

        With ``gamma="auto"``, the first plan of a batch size measures this machine's
        step costs (`specjax.tuning.tune`) and later ones read the choice.
        The arguments are those of `sample`; ``None`` takes the options'.
        """
        prompts = self._check_prompts(list(prompts) if not isinstance(prompts, str) else prompts)
        ids = self._encode(prompts)
        sampling = self.sampling if sampling is None else check_sampling(sampling)
        key = jax.random.key(self.seed) if key is None else key
        budget = self.options.max_new_tokens if max_new_tokens is None else max_new_tokens
        kw = dict(self._kwargs, sampling=sampling)
        kw["max_new_tokens"] = check_int("max_new_tokens", budget, lo=1)
        stop = self.options.stop if stop is None else stop
        if stop:
            from specjax.sampling.stops import StopStrings

            try:
                kw["stop"] = StopStrings.build(
                    stop, self.tokenizer, self.target.vocab_size, len(ids)
                )
            except (TypeError, ValueError) as e:
                raise type(e)(f"stop: {e}") from None
        constraint = self._constraint(regex, json_schema)
        if constraint is not None:
            kw["constraint"] = constraint
        self._check_context(ids, kw["max_new_tokens"])
        return self._drafter_for(key, ids, kw)

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
        sampling=None,
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
            max_new_tokens: the budget per prompt (EOS included); default the options'.
            sampling: a `specjax.SamplingConfig`; default the options' (greedy).
            key: a PRNG key (``jax.random.key(n)``) for sampled rows; default
                ``jax.random.key(seed)``, the options' ``seed``.
            stream: return an iterator of text pieces as they are generated (one
                prompt only); they join to the text ``stream=False`` returns.
            stop: strings that end a row once its text contains one (kept in the text).
            regex: every row's text matches this regular expression, and the row ends
                where the match is complete (`specjax.Constraint.regex`).
            json_schema: every row's text is a JSON document valid under this schema (a
                dict, its JSON text, or the path of a file holding it;
                `specjax.Constraint.json_schema`). Not with ``regex``.
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
        plan = self.plan(
            prompts,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            key=key,
            stop=stop,
            regex=regex,
            json_schema=json_schema,
        )
        if stream:
            return self._stream(plan)
        result = plan.run()
        self.learn(plan, result)
        texts = [self._text(row) for row in result.to_lists()]
        text = texts[0] if single else texts
        return (text, result) if return_result else text

    def learn(self, plan: Plan, result) -> None:
        """Takes in a decode of ``plan``: a suffix drafter's corpus grows by its prompts and
        outputs, and gamma auto's next choice reads its acceptance."""
        if plan.tuned is not None and plan.drafter is not None:
            plan.tuned.learn(result.stats)
            plan.tuned.rechoose()
        self._remember(plan.ids, result.to_lists())

    def _remember(self, ids: list[list[int]], outputs: list[list[int]]) -> None:
        """Adds a call's prompts and outputs to a suffix drafter's corpus."""
        if not isinstance(self.drafter, SuffixDrafter):
            return
        self._documents += [np.asarray(p + o, np.int32) for p, o in zip(ids, outputs, strict=True)]
        self.drafter = self.drafter.with_documents(self._documents)

    def _constraint(self, regex, json_schema):
        """The `specjax.Constraint` of ``regex`` or ``json_schema`` (default the
        options'), built once each; ``None`` without either."""
        regex = self.options.regex if regex is None else regex
        schema = self.options.json_schema if json_schema is None else json_schema
        if regex is None and schema is None:
            return None
        if regex is not None and schema is not None:
            raise ValueError("give regex= or json_schema=, not both")
        name = "regex" if regex is not None else "json_schema"
        source = regex if regex is not None else schema
        key = (name, repr(sorted(source.items())) if isinstance(source, Mapping) else str(source))
        if key not in self._constraints:
            try:
                self._constraints[key] = self.options.constraint(
                    self.tokenizer, self.target.vocab_size, regex=regex, json_schema=schema
                )
            except (TypeError, ValueError) as e:
                raise type(e)(f"{name}: {e}" if not str(e).startswith(name) else str(e)) from None
        return self._constraints[key]

    def _drafter_for(self, key, ids: list[list[int]], kw: dict) -> Plan:
        """The plan of a batch like ``ids``: with ``gamma="auto"``, the γ and width
        chosen for its batch size (`tuned`)."""
        if not self.auto:
            return Plan(key, self.target, ids, self.drafter, kw)
        from specjax import tuning

        tuned = self.tuned.get(len(ids))
        if tuned is None:
            # Measuring takes a while on a large target: each program it times is shown.
            tuned = tuning.tune(
                self.target,
                self.drafter,
                ids,
                forward_width=self.forward_width,
                log=lambda line: self.log(f"gamma auto: {line}"),
            )
            self.tuned[len(ids)] = tuned
        kw["forward_width"] = self.forward_width or tuned.forward_width
        if tuned.gamma == 0:
            kw.pop("verification", None)
            kw.pop("draft_confidence", None)
            return Plan(key, self.target, ids, None, kw, tuned)
        return Plan(key, self.target, ids, self.drafter.with_draft(tuned.gamma), kw, tuned)

    def _stream(self, plan: Plan) -> Iterator[str]:
        """Text pieces of one prompt, chunk by chunk (arguments checked before the first)."""
        decoder, state = decoding.init(
            plan.key, plan.target, plan.ids, drafter=plan.drafter, **plan.kwargs
        )
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
            self._remember(plan.ids, [generated])

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
