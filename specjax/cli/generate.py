"""``specjax generate``: complete a prompt (or a --chat message), streamed and timed."""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

from specjax.cli.common import UserError, check_flag, load_folder
from specjax.text.defaults import DEFAULTS, auto_drafter

GREEN, RESET = "\033[32m", "\033[0m"

COMPARE_REPEATS = 5
"""Timed runs of each decoder with ``--compare`` and no ``--repeats``."""


def _constraint(args, tokenizer, vocab_size: int):
    """The `specjax.Constraint` of ``--regex`` or ``--json-schema``, errors named by flag."""
    import specjax

    flag = "--regex" if args.regex is not None else "--json-schema"
    try:
        if args.regex is not None:
            return specjax.Constraint.regex(args.regex, tokenizer, vocab_size)
        try:
            with open(args.json_schema, encoding="utf-8") as f:
                schema = f.read()
        except OSError as e:
            raise UserError(
                f"--json-schema: cannot read {args.json_schema}: {e.strerror}"
            ) from None
        return specjax.Constraint.json_schema(schema, tokenizer, vocab_size)
    except (TypeError, ValueError) as e:
        raise UserError(f"{flag}: {e}") from None


def _load_models(args):
    """``(target, drafter, tokenizer)``: the drafter of --drafter at its own γ (None: none)."""
    import specjax
    from specjax.io.pretrained import default_pair

    chain_first = _split_chain(args)
    if args.model:
        target = load_folder(args.model, "--model", args.gguf_file)
        draft = load_folder(args.draft, "--draft") if args.draft else None
    else:
        if args.draft:
            raise UserError(
                "--draft needs --model (the bundled draft only fits the bundled target)"
            )
        try:
            target, draft, _ = default_pair()
        except (FileNotFoundError, ValueError, OSError) as e:
            raise UserError(f"cannot load the bundled pair: {e}") from None
    _resolve_drafter_path(args)
    if args.drafter == "auto":
        # As `specjax.Sampler.from_pretrained` resolves it (`specjax.text.defaults`).
        args.drafter = auto_drafter(
            bundled=not args.model, draft=bool(args.draft), block_drafter=bool(args.block_drafter)
        )
    if args.drafter == "model" and draft is None:
        raise UserError("--drafter model needs --draft PATH when --model is given")
    if args.drafter == "block" and args.model and not args.block_drafter:
        raise UserError(
            "--drafter block needs --block-drafter PATH when --model is given (the bundled "
            "block drafter only fits the bundled target)"
        )
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise UserError(f"{args.model} has no tokenizer.json; specjax generate needs one")
    target, draft = _quantized(args, target, draft)
    if args.drafter == "model":
        # A smaller draft of a padded family is fine when the two share their ids.
        draft = specjax.DraftModel(draft)
        try:
            specjax.sampling.vocab.check_drafter_vocab(target, draft)
        except ValueError as e:
            raise UserError(f"--draft {args.draft}: {e}") from None
    if args.drafter == "block":
        draft = _load_block_drafter(args, target)
    if args.drafter == "eagle" and args.model:
        raise UserError("--drafter eagle: the bundled EAGLE head only fits the bundled target")
    if args.drafter not in ("model", "block"):
        draft = _named_drafter(args, target)
    if chain_first is not None:
        draft = _chain(args, chain_first, target, draft, tokenizer)
    elif args.corpus is not None:
        draft = _with_corpus(args, draft, tokenizer)
    del specjax
    return target, draft, tokenizer


def _split_chain(args) -> str | None:
    """``--drafter suffix,model``: the chain's first member (``args.drafter`` becomes the
    last, loaded as usual), or None for one drafter."""
    if "," not in args.drafter:
        return None
    first, _, last = args.drafter.partition(",")
    if first != "suffix" or last in ("", "auto", "none", "suffix") or "," in last:
        raise UserError(
            f"--drafter {args.drafter}: a chain is suffix,DRAFTER (e.g. suffix,model): the "
            "suffix drafter where it has a match, the other drafter elsewhere"
        )
    args.drafter = last
    return first


def _chain(args, first: str, target, last, tokenizer):
    """The `ChainDrafter` of ``first`` (with ``--corpus``) and the loaded ``last``."""
    from specjax.drafters.chain import ChainDrafter

    if last is None:
        raise UserError(f"--drafter {first},{args.drafter}: the chain needs its second drafter")
    ahead = _with_corpus(args, _named_drafter_of(first, args, target), tokenizer)
    try:
        return ChainDrafter.of(ahead, last)
    except ValueError as e:
        raise UserError(f"--drafter {first},{args.drafter}: {e}") from None


def _with_corpus(args, drafter, tokenizer):
    """The suffix drafter of ``--drafter suffix`` over the files of ``--corpus``."""
    from specjax.drafters.suffix import SuffixDrafter
    from specjax.text.corpus import load_corpus

    if args.corpus is None:
        return drafter
    if not isinstance(drafter, SuffixDrafter):
        raise UserError("--corpus is what a suffix drafter drafts from: add --drafter suffix")
    try:
        return drafter.with_documents(load_corpus(args.corpus, tokenizer))
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"--corpus: {e}") from None


def _quantized(args, target, draft):
    """``(target, draft model)`` with ``--draft-head``, ``--quantize`` and
    ``--draft-quantize`` applied."""
    from specjax.models.quant import quantize

    draft_mode = args.quantize if args.draft_quantize is None else args.draft_quantize
    if args.draft_quantize is not None and not (args.drafter == "model" and draft is not None):
        raise UserError("--draft-quantize needs a draft model (--drafter model --draft PATH)")
    if args.draft_head is not None:
        if not (args.drafter == "model" and draft is not None):
            raise UserError("--draft-head needs a draft model (--drafter model --draft PATH)")
        from specjax.sampling.vocab import frequent_ids

        if not 1 <= args.draft_head <= draft.vocab_size:
            raise UserError(
                f"--draft-head must be in [1, {draft.vocab_size}] (the draft's vocabulary), "
                f"got {args.draft_head}"
            )
        draft = draft.with_head_ids(frequent_ids(draft, args.draft_head))
    if args.quantize:
        target = quantize(target, args.quantize)
    if draft is not None and draft_mode not in (None, "none") and args.drafter == "model":
        draft = quantize(draft, draft_mode)
    return target, draft


def _named_drafter(args, target):
    """The eagle head, prompt lookup, none, or any other drafter of
    `specjax.drafters.registry`, built as `specjax.Sampler.from_pretrained` builds it."""
    return _named_drafter_of(args.drafter, args, target)


def _named_drafter_of(name: str, args, target):
    from specjax.text.loading import build_drafter

    try:
        return build_drafter(name, target, bundled=not args.model, ngram=args.ngram)
    except ValueError as e:
        raise UserError(f"--drafter {name}: {e}") from None


def _drafter_names() -> tuple[str, ...]:
    """``--drafter``'s names: auto, every drafter of `specjax.drafters.registry`, none."""
    from specjax.drafters import registry

    return ("auto", *registry.names(), "none")


def _parse_tree(args):
    """``--tree 3,2,2,1`` as a `Tree` (None without it), refused for drafters without trees."""
    if args.tree is None:
        return None
    from specjax.drafters import registry
    from specjax.drafters.base import TreeDrafter
    from specjax.verification.tree import Tree

    try:
        tree = Tree.parse(args.tree)
    except ValueError as e:
        raise UserError(str(e)) from None
    trees = [n for n in registry.names() if issubclass(registry.get(n).cls, TreeDrafter)]
    if args.drafter in _drafter_names() and args.drafter not in ("auto", *trees):
        raise UserError(f"--tree needs a drafter that proposes trees ({', '.join(trees[:-1])} or "
                        f"{trees[-1]}), not --drafter {args.drafter}")  # fmt: skip
    if args.gamma is not None and args.gamma != tree.depth:
        raise UserError(
            f"--gamma {args.gamma} and --tree {args.tree} disagree: a tree drafts its depth "
            f"({tree.depth}) per step; drop --gamma"
        )
    args.gamma = tree.depth
    return tree


def _resolve_drafter_path(args) -> None:
    """``--drafter PATH`` means ``--drafter block --block-drafter PATH``."""
    if args.drafter in _drafter_names():
        return
    path = Path(args.drafter)
    if not path.is_dir():
        names = ", ".join(_drafter_names())
        raise UserError(
            f"--drafter {args.drafter!r}: neither one of {names} nor a block drafter folder"
        )
    if args.block_drafter and Path(args.block_drafter) != path:
        raise UserError(
            f"--drafter {args.drafter} and --block-drafter {args.block_drafter} name two drafters"
        )
    args.drafter, args.block_drafter = "block", str(path)


def _load_block_drafter(args, target):
    """The bundled block drafter, or the one of --block-drafter, at --gamma (or its own γ)."""
    from specjax.text.loading import build_drafter

    flag = f"--block-drafter {args.block_drafter}" if args.block_drafter else "--drafter block"
    try:
        return build_drafter(
            "block", target, bundled=not args.model, block_drafter=args.block_drafter,
            gamma=None if args.gamma == "auto" else args.gamma, mode=args.block_mode,
        )  # fmt: skip
    except ValueError as e:
        tree = f" (--tree {args.tree} has depth {args.gamma})" if args.tree else ""
        raise UserError(f"{flag}: {e}{tree}") from None


def _apply_preset(args):
    """For a named pair with a `specjax.io.presets.Preset`, its settings where no flag set
    them; says what it chose on stderr. Returns the preset, or None."""
    from specjax.io.presets import find

    # A chain (suffix,model) keeps the pair's precisions for its draft model.
    if not (args.model and args.draft) or args.drafter.split(",")[-1] not in ("auto", "model"):
        return None
    preset = find(args.model, args.draft)
    if preset is None:
        return None
    chosen = []
    if args.drafter == "auto" and preset.drafter != "model":
        args.drafter = preset.drafter
        chosen.append(f"--drafter {preset.drafter}")
    settings = {
        "quantize": preset.quantize,
        "draft_quantize": preset.draft_quantize,
        "draft_confidence": preset.draft_confidence,
    }
    for flag, value in settings.items():
        if getattr(args, flag) is None and value is not None:
            setattr(args, flag, value)
            chosen.append(f"--{flag.replace('_', '-')} {value}")
    if chosen:
        print(
            f"specjax: {args.model} with {args.draft}: this pair's preset "
            f"(specjax.io.presets): {' '.join(chosen)} ({preset.measured}); flags "
            "override each",
            file=sys.stderr,
        )
    return preset


def _auto_gamma(args, target, drafter, prompts):
    """``--gamma auto``: this machine's step costs (measured once, then cached) and the
    acceptance of recent runs choose γ (`specjax.decoding.cost_model.tune`); progress of a
    measurement on stderr, and the reason with --verbose."""
    from specjax import tuning as cost_model

    log = lambda line: print(f"specjax: gamma auto: {line}", file=sys.stderr)  # noqa: E731
    tuned = cost_model.tune(target, drafter, prompts, forward_width=args.forward_width, log=log)
    if args.verbose or tuned.measured:
        log(tuned.choice.reason)
    return tuned


def _rounded(values) -> list[float]:
    return [round(float(v), 2) for v in values]


def _forward_width(args, verify_width: int) -> int:
    """``--forward-width``, checked against the verify's width; default the verify's."""
    if args.forward_width is None:
        return verify_width
    if args.forward_width < verify_width:
        what = f"--tree {args.tree}" if args.tree else f"--gamma {args.gamma}"
        raise UserError(
            f"--forward-width {args.forward_width} is narrower than one verify forward "
            f"({verify_width} tokens with {what}); use --forward-width {verify_width} or more"
        )
    return args.forward_width


def _chat_prompt(args, target):
    """``(prompt text, ids, end-of-turn ids)`` of --chat (and --system) in the template."""
    from specjax.io.chat import apply_chat_template
    from specjax.text.eos import stop_ids

    if target.chat_template is None:
        where = f"--model {args.model}" if args.model else "the bundled model"
        raise UserError(
            f"--chat: {where} has no chat template (chat_template.jinja, or chat_template "
            "in tokenizer_config.json); give a PROMPT to complete instead"
        )
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.chat})
    try:
        text = apply_chat_template(target, messages)
    except ValueError as e:
        raise UserError(f"--chat: {e}") from None
    ids = target.tokenizer.encode(text, add_special_tokens=False).ids
    return text, ids, stop_ids(target, chat=True)


def _coloured(stream, ids, from_draft, color) -> str:
    """The new text of ``ids`` (`specjax.text.TextStream`), accepted drafts in green."""
    pieces = stream.pieces(ids)
    return "".join(
        f"{GREEN}{piece}{RESET}" if drafted and color and piece else piece
        for piece, drafted in zip(pieces, from_draft, strict=True)
    )


def _decode_open(key, target, drafter, prompts, max_new_tokens, kw, on_chunk=None):
    """One run through the open loop: init, then one run to the end or chunks streamed.

    Both ways run the same two compiled programs (init and run), so a streamed first
    run also compiles what the timed runs use.
    """
    import jax

    from specjax import decoding

    decoder, state = decoding.init(
        key, target, prompts, drafter=drafter, max_new_tokens=max_new_tokens, **kw
    )
    if on_chunk is None:
        state = decoding.run(decoder, state)
    else:
        for chunk_state, new in decoding.stream(decoder, state, steps_per_chunk=4):
            on_chunk(decoder, chunk_state, new)
        state = chunk_state
    return jax.block_until_ready(decoding.result(decoder, state))


def cmd_generate(args) -> int:
    import jax
    import numpy as np

    import specjax
    from specjax.core.timing import time_call, time_interleaved
    from specjax.decoding import CACHE_BUCKET
    from specjax.text.eos import stop_ids as text_stop_ids
    from specjax.text.stream import TextStream

    if args.chat is not None:
        if args.prompt is not None:
            raise UserError("--chat takes the message itself: give --chat or a PROMPT, not both")
        if not args.chat.strip():
            raise UserError("the --chat message is empty")
    elif args.system is not None:
        raise UserError("--system needs --chat (it is the system message of the chat)")
    elif args.prompt is None:
        raise UserError("give a PROMPT to complete, or --chat MESSAGE")
    elif not args.prompt.strip():
        raise UserError("the prompt is empty")
    # --gamma auto (the default) chooses a chain's γ; a tree drafts its depth and plain
    # decoding nothing, so there it has nothing to choose.
    if isinstance(args.gamma, int) and args.gamma < 0:
        raise UserError(f"--gamma must be >= 0 (0 decodes plainly) or auto, got {args.gamma}")
    if args.gamma == 0:  # γ = 0 is plain decoding, what auto may choose too
        if args.tree is not None:
            raise UserError(f"--gamma 0 decodes plainly: drop --tree {args.tree}")
        args.drafter, args.gamma = "none", None
    if args.gamma == "auto" and (args.drafter == "none" or args.tree is not None):
        args.gamma = None
    auto = args.gamma == "auto"
    for name in ("max_new_tokens", "gamma", "batch", "ngram", "repeats", "forward_width"):
        if name == "gamma" and auto:
            continue
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from specjax.core.validation import check_int

    # jax.random.key keeps 32 bits without x64: larger seeds collide or overflow.
    check_flag("--seed", check_int, args.seed)
    try:
        sampling = specjax.SamplingConfig(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            # Off by default: no penalty code in the compiled program.
            **{
                name: getattr(args, name)
                for name, off in specjax.sampling.PENALTY_OFF.items()
                if getattr(args, name) != off
            },
        )  # fmt: skip
        specjax.sampling.check_sampling_config(sampling)
    except (ValueError, TypeError) as e:
        # Named as the flag: SamplingConfig.repetition_penalty is --repetition-penalty.
        flag = lambda m: "--" + m.group(1).replace("_", "-")  # noqa: E731
        raise UserError(re.sub(r"SamplingConfig\.(\w+)", flag, str(e))) from None

    tree = _parse_tree(args)
    preset = _apply_preset(args)
    if args.draft_confidence is not None and not 0.0 <= args.draft_confidence <= 1.0:
        raise UserError(f"--draft-confidence must be in [0, 1], got {args.draft_confidence}")
    if auto:  # the drafter's own γ is the largest measured
        args.gamma = None
    target, draft, tokenizer = _load_models(args)
    if args.gamma is None:  # the drafter's own: a block drafter's trained γ, else 4
        args.gamma = draft.num_draft if draft is not None else DEFAULTS.gamma
    if args.chat is not None:
        # The model sees the rendered template; only the answer is printed, and a
        # row stops at the end of the assistant's turn.
        prompt_text, ids, stop_ids = _chat_prompt(args, target)
        shown_prompt = ""
    else:
        prompt_text = shown_prompt = args.prompt
        ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
        stop_ids = text_stop_ids(target, tokenizer)
    context = target.config.max_position_embeddings
    verify_width = (tree.num_nodes if tree is not None else args.gamma) + 1
    if args.drafter == "none":
        verify_width = 1
    width = _forward_width(args, verify_width)
    needed = len(ids) + args.max_new_tokens + width
    if needed > context:
        drafts = f"--tree {args.tree}" if tree is not None else f"--gamma {args.gamma}"
        raise UserError(
            f"the prompt is {len(ids)} tokens; with --max-new-tokens {args.max_new_tokens} "
            f"and {drafts} (forward width {width}) it needs {needed} positions, more than "
            f"the model's context of {context}"
        )
    prompts = [ids] * args.batch
    stop = set() if args.no_eos else set(stop_ids)
    eos = sorted(stop) or None
    key = jax.random.key(args.seed)
    cache_len = -(-needed // CACHE_BUCKET) * CACHE_BUCKET
    kw = dict(sampling=sampling, eos_id=eos, cache_len=cache_len)
    if args.stop:
        try:
            kw["stop"] = specjax.StopStrings.build(
                args.stop, tokenizer, target.vocab_size, len(prompts)
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"--stop: {e}") from None
    if args.regex is not None or args.json_schema is not None:
        kw["constraint"] = _constraint(args, tokenizer, target.vocab_size)
    drafter = None if args.drafter == "none" else draft.with_draft(args.gamma)
    if tree is not None:
        try:  # e.g. a tree deeper than a block drafter's block
            drafter = drafter.with_tree(tree)
        except ValueError as e:
            raise UserError(f"--tree {args.tree}: {e}") from None
    # Speculative decoding at a fixed width W equals plain decoding at W token for token
    # (`specjax.decoding.numerics`); plain decoding's fastest is width 1.
    spec_kw = dict(kw, forward_width=width, verification=args.verification)
    kw["forward_width"] = 1 if drafter is not None else width
    if args.draft_confidence is not None:
        if drafter is None or not drafter.stops_early or tree is not None:
            raise UserError(
                "--draft-confidence shortens the draft model's chain of drafts: it needs "
                "--drafter model (or --draft) and no --tree"
            )
        spec_kw["draft_confidence"] = args.draft_confidence
    try:  # e.g. a draft smaller than the target's tokenizer (a padded family)
        specjax.sampling.vocab.resolve_vocab_limit(sampling, target, drafter)
    except ValueError as e:
        raise UserError(str(e)) from None
    choice = None
    if auto:  # after every check (checked up to the largest γ): measuring compiles
        choice = _auto_gamma(args, target, drafter, prompts)
        args.gamma = choice.gamma
        width = args.forward_width or choice.forward_width
        if choice.gamma == 0:
            args.drafter, drafter = "none", None
            kw["forward_width"] = width
        else:
            drafter = drafter.with_draft(choice.gamma)
            spec_kw["forward_width"] = width

    def run(d, on_chunk=None, width=None):
        options = kw if d is None else spec_kw
        if width is not None:
            options = dict(options, forward_width=width)
        return _decode_open(key, target, d, prompts, args.max_new_tokens, options, on_chunk)

    color = sys.stdout.isatty() and not args.no_color and "NO_COLOR" not in os.environ
    hide = stop
    stream = args.batch == 1 and not args.json and not args.no_stream
    repeats = args.repeats
    if repeats is None:
        repeats = COMPARE_REPEATS if args.compare else 0
    if stream:
        # The first run streams row 0 chunk by chunk (no host sync inside a chunk).
        text = TextStream(tokenizer, hide)
        print(shown_prompt, end="", flush=True)

        def show(decoder, state, new):
            if new[0]:
                end = len(ids) + int(state.num_generated[0])
                from_draft = decoder.feature_state(state, "draft_flags")["from_draft"]
                flags = np.asarray(from_draft[0, end - len(new[0]) : end]).tolist()
                print(_coloured(text, new[0], flags, color), end="", flush=True)

        compile_s, first = time_call(run, drafter, show)
        print(flush=True)
    else:
        compile_s, first = time_call(run, drafter)
    if repeats == 0:
        # One run: the generation itself; its time includes compiling.
        runs, last = [[]], [first]
        result, seconds = first, compile_s
    else:
        # The first execution also pays one-time runtime set-up (measured at about 3x a
        # steady run), so the figures shown are medians of later, steady runs of the
        # same programs; with --compare plain decoding is compiled and warmed once too,
        # then the timed runs alternate speculative, plain, speculative, ...
        fns = [lambda: run(drafter)]
        if args.compare:
            run(None)  # compiles and warms plain decoding
            fns.append(lambda: run(None))
        # Round robin (speculative, plain, ...): slow drifts of the machine hit both alike.
        runs, last = time_interleaved(fns, repeats)
        result, seconds = last[0], statistics.median(runs[0])
    review = None
    if choice is not None and args.gamma > 0:
        review = choice.review(result.stats)
        if args.verbose:
            print(
                f"specjax: gamma auto: this run's acceptance by position "
                f"{_rounded(review['acceptance_by_position'])} (chosen with "
                f"{_rounded(choice.choice.acceptance)}): gamma {args.gamma} expected at "
                f"{review['expected_speedup']:.2f}x plain",
                file=sys.stderr,
            )
        choice.learn(result.stats)  # pooled into the acceptance the next choice reads
    rows = result.to_lists()
    from_draft = np.asarray(result.from_draft)
    total = int(np.sum(np.asarray(result.lengths)))
    summary = {
        "drafter": args.drafter,
        "gamma": args.gamma if args.drafter != "none" else 0,
        "forward_width": width,
        "verification": args.verification,
        "preset": None if preset is None else preset.describe(),
        "auto": None if choice is None else dict(choice.describe(), expected_at_this_run=review),
        "tokens": total,
        "seconds": seconds,
        "tokens_per_second": total / seconds,
        "compile_seconds": compile_s,
        "repeats": repeats,
        "speculative_seconds_runs": runs[0],
        "acceptance_rate": float(result.stats.acceptance_rate),
        # α_i per draft position (judged drafts only) and each sample's own rate.
        "acceptance_by_position": np.asarray(result.stats.acceptance_by_position).tolist(),
        "position_reached": np.asarray(result.stats.position_reached).tolist(),
        "row_acceptance_rate": np.asarray(result.stats.row_acceptance_rate).tolist(),
        "tokens_per_target_call": float(result.tokens_per_call),
        "target_calls": int(result.stats.target_calls),
    }
    if args.compare:
        plain, plain_s = last[1], statistics.median(runs[1])
        plain_total = int(np.sum(np.asarray(plain.lengths)))
        summary["plain_seconds"] = plain_s
        summary["plain_seconds_runs"] = runs[1]
        summary["plain_tokens_per_second"] = plain_total / plain_s
        summary["speedup"] = summary["tokens_per_second"] / summary["plain_tokens_per_second"]
        if choice is not None:
            summary["auto"]["achieved_speedup"] = summary["speedup"]
        # Token for token at the same width: greedy rows with any verification, every
        # row with coupled verification. Rejection sampling is exact in distribution only.
        if args.temperature == 0 or args.verification == "coupled":
            same_width = run(None, width=width) if width != 1 else plain
            summary["equals_plain_at_width"] = same_width.to_lists() == rows

    texts = []
    for row in rows:
        shown = row[:-1] if (row and row[-1] in stop) else row
        texts.append(tokenizer.decode(shown, skip_special_tokens=False))
    if args.json:
        summary.update(prompt=prompt_text, completions=texts, token_ids=rows)
        print(json.dumps(summary, indent=2))
        return 0

    if not stream:
        for b, row in enumerate(rows):
            shown = row[:-1] if (row and row[-1] in stop) else row
            if args.batch > 1:
                print(f"--- sample {b}")
            rendered = TextStream(tokenizer)
            body = _coloured(rendered, shown, from_draft[b, : len(shown)].tolist(), color)
            print(shown_prompt + body + rendered.flush())
    if repeats == 0:
        timing = "one run, compile included; --repeats N times steady runs"
    elif repeats == 1:
        timing = f"1 timed run; first run incl. compile {compile_s:.1f} s"
    else:
        timing = (
            f"median of {repeats}{' interleaved' if args.compare else ''} runs; "
            f"first run incl. compile {compile_s:.1f} s"
        )
    who = "plain" if drafter is None else f"{type(drafter).__name__}, gamma {summary['gamma']}"
    if tree is not None and drafter is not None:
        who = f"{type(drafter).__name__}, tree {args.tree}"
    line = (
        f"[{who}] {total} tokens in {seconds:.2f} s = "
        f"{summary['tokens_per_second']:.1f} tokens/s ({timing})"
    )
    cut = [
        b for b, row in enumerate(rows) if len(row) >= args.max_new_tokens and row[-1] not in stop
    ]
    if cut:
        which = "" if args.batch == 1 else f" ({len(cut)} of {args.batch} samples)"
        line += f" | cut at --max-new-tokens {args.max_new_tokens}{which}"
    if drafter is not None:
        line += (
            f" | acceptance {summary['acceptance_rate']:.2f}"
            f" | {summary['tokens_per_target_call']:.2f} tokens/target call"
        )
    if args.compare:
        line += (
            f" | plain (width 1) {summary['plain_tokens_per_second']:.1f} tokens/s"
            f" | speedup {summary['speedup']:.2f}x"
        )
        if "equals_plain_at_width" in summary:
            line += f" | equals plain at width {width}: {summary['equals_plain_at_width']}"
    if color:
        line += f"  ({GREEN}green{RESET} = accepted draft tokens)"
    print(line, file=sys.stderr)
    return 0
