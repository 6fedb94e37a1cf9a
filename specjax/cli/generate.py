"""``specjax generate``: complete a prompt (or a --chat message), streamed and timed.

The flags are the fields of `specjax.GenerationOptions` (`options_of` reads them back)
and the command decodes through `specjax.Sampler` (`Sampler.plan`), so it decodes as
the library does; this module only times the runs and prints them (`specjax.cli.report`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import sys

from specjax.cli.common import UserError, check_flag
from specjax.cli.report import coloured, print_report, summary_of

COMPARE_REPEATS = 5
"""Timed runs of each decoder with ``--compare`` and no ``--repeats``."""

# What `Sampler.from_pretrained`'s errors call the command's model flags.
_LOADING_NAMES = {
    "path ": "--model ",
    "draft ": "--draft ",
    "draft needs path": "--draft needs --model",
}


def _user_error(e: Exception) -> UserError:
    """``e``'s message in the command line's words (`specjax.text.options.as_flags`)."""
    from specjax.text.flags import as_flags

    message = str(e)
    for name, flag in _LOADING_NAMES.items():
        if message.startswith(name):
            message = flag + message[len(name) :]
    # from_pretrained's own arguments, besides the options' (`as_flags`).
    message = re.sub(r"\b(block_drafter|gguf_file)=", lambda m: _flag(m.group(1)) + " ", message)
    return UserError(as_flags(message))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def options_of(args):
    """The `specjax.GenerationOptions` the flags set (sampling flags in ``sampling``)."""
    import specjax
    from specjax.text.options import GenerationOptions

    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(GenerationOptions)
        if f.name != "sampling"
    }
    try:
        sampling = specjax.SamplingConfig(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            # Off by default: no penalty code in the compiled program.
            **{
                name: getattr(args, name)
                for name, off in specjax.sampling.PENALTY_OFF.items()
                if getattr(args, name) != off
            },
        )
        specjax.sampling.check_sampling_config(sampling)
    except (ValueError, TypeError) as e:
        # Named as the flag: SamplingConfig.repetition_penalty is --repetition-penalty.
        flag = lambda m: "--" + m.group(1).replace("_", "-")  # noqa: E731
        raise UserError(re.sub(r"SamplingConfig\.(\w+)", flag, str(e))) from None
    return GenerationOptions(**values, sampling=sampling)


def _check_prompt(args) -> None:
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
    if args.draft and not args.model:
        raise UserError("--draft needs --model (the bundled draft only fits the bundled target)")
    for name in ("batch", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            flag = "--batch-size" if name == "batch" else f"--{name}"
            raise UserError(f"{flag} must be >= 1, got {getattr(args, name)}")


def _log(line: str) -> None:
    from specjax.text.flags import as_flags

    print(f"specjax: {as_flags(line)}", file=sys.stderr)


def _plan(args):
    """``(sampler, plan, prompt text, prompt shown)``: the models loaded as the flags say,
    and the decode of the prompt (or the --chat message), checked."""
    from specjax.core.validation import check_int
    from specjax.text import ChatSampler, Sampler

    # jax.random.key keeps 32 bits without x64: larger seeds collide or overflow.
    check_flag("--seed", check_int, args.seed)
    options = options_of(args)
    chat = {} if args.chat is None else dict(system=args.system)
    try:
        sampler = (ChatSampler if chat else Sampler).from_pretrained(
            args.model,
            args.draft,
            options,
            block_drafter=args.block_drafter,
            gguf_file=args.gguf_file,
            log=_log,
            **chat,
        )
    except FileNotFoundError as e:
        raise UserError(f"cannot load the bundled pair: {e}") from None
    except (ValueError, TypeError) as e:
        if chat and "no chat template" in str(e):
            where = f"--model {args.model}" if args.model else "the bundled model"
            raise UserError(
                f"--chat: {where} has no chat template (chat_template.jinja, or chat_template "
                "in tokenizer_config.json); give a PROMPT to complete instead"
            ) from None
        raise _user_error(e) from None
    try:
        # The model sees the rendered template; only the answer is printed, and a row
        # stops at the end of the assistant's turn.
        text = sampler.render(args.chat) if chat else args.prompt
    except ValueError as e:
        raise UserError(f"--chat: {e}") from None
    try:
        plan = sampler.plan([text] * args.batch)
    except (ValueError, TypeError) as e:
        raise _user_error(e) from None
    if plan.tuned is not None and (args.verbose or plan.tuned.measured):
        _log(f"gamma auto: {plan.tuned.choice.reason}")
    return sampler, plan, text, "" if chat else text


def _decode_open(key, target, drafter, prompts, kw, on_chunk=None):
    """One run through the open loop: init, then one run to the end or chunks streamed.

    Both ways run the same two compiled programs (init and run), so a streamed first
    run also compiles what the timed runs use.
    """
    import jax

    from specjax import decoding

    decoder, state = decoding.init(key, target, prompts, drafter=drafter, **kw)
    if on_chunk is None:
        state = decoding.run(decoder, state)
    else:
        for chunk_state, new in decoding.stream(decoder, state, steps_per_chunk=4):
            on_chunk(decoder, chunk_state, new)
        state = chunk_state
    return jax.block_until_ready(decoding.result(decoder, state))


def _runner(plan):
    """``(run, width)``: ``run(drafter, on_chunk=None, width=None)`` decodes the plan's
    prompts with ``drafter`` (``None``: plainly, at width 1 beside a drafter), and the
    speculative forward width."""
    from specjax.decoding import CACHE_BUCKET
    from specjax.drafters.base import lookahead

    spec = dict(plan.kwargs)
    width = spec["forward_width"] or (1 if plan.drafter is None else lookahead(plan.drafter))
    spec["forward_width"] = width
    # Speculative decoding at a fixed width W equals plain decoding at W token for token
    # (`specjax.decoding.numerics`); plain decoding's fastest is width 1.
    plain = {k: v for k, v in spec.items() if k not in ("verification", "draft_confidence")}
    plain["forward_width"] = 1 if plan.drafter is not None else width
    needed = max(map(len, plan.ids)) + spec["max_new_tokens"] + width
    cache_len = -(-needed // CACHE_BUCKET) * CACHE_BUCKET

    def run(d, on_chunk=None, width=None):
        options = dict(plain if d is None else spec, cache_len=cache_len)
        if width is not None:
            options["forward_width"] = width
        return _decode_open(plan.key, plan.target, d, plan.ids, options, on_chunk)

    return run, width


def cmd_generate(args) -> int:
    import numpy as np

    from specjax.core.timing import time_call, time_interleaved
    from specjax.text.drafting import drafter_name
    from specjax.text.stream import TextStream

    _check_prompt(args)
    sampler, plan, prompt_text, shown_prompt = _plan(args)
    run, width = _runner(plan)
    drafter, stop = plan.drafter, set(sampler.eos_id)
    color = sys.stdout.isatty() and not args.no_color and "NO_COLOR" not in os.environ
    stream = args.batch == 1 and not args.json and not args.no_stream
    repeats = args.repeats
    if repeats is None:
        repeats = COMPARE_REPEATS if args.compare else 0
    if stream:
        # The first run streams row 0 chunk by chunk (no host sync inside a chunk).
        text = TextStream(sampler.tokenizer, stop)
        print(shown_prompt, end="", flush=True)
        prompt_len = len(plan.ids[0])

        def show(decoder, state, new):
            if new[0]:
                end = prompt_len + int(state.num_generated[0])
                from_draft = decoder.feature_state(state, "draft_flags")["from_draft"]
                flags = np.asarray(from_draft[0, end - len(new[0]) : end]).tolist()
                print(coloured(text, new[0], flags, color), end="", flush=True)

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
    timing = (result, seconds, compile_s, repeats, runs, last)
    summary = summary_of(args, run, plan, drafter_name(drafter), sampler.preset, width, timing)
    kind = None if drafter is None else type(drafter).__name__
    texts_of, shown = (sampler.tokenizer, stop), (prompt_text, shown_prompt)
    print_report(args, summary, result, texts_of, shown, kind, color, stream)
    return 0
