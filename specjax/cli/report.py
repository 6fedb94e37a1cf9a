"""What ``specjax generate`` prints: the ``--json`` report, the text and the summary line."""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np

GREEN, RESET = "\033[32m", "\033[0m"


def coloured(stream, ids, from_draft, color) -> str:
    """The new text of ``ids`` (`specjax.text.TextStream`), accepted drafts in green."""
    pieces = stream.pieces(ids)
    return "".join(
        f"{GREEN}{piece}{RESET}" if drafted and color and piece else piece
        for piece, drafted in zip(pieces, from_draft, strict=True)
    )


def _rounded(values) -> list[float]:
    return [round(float(v), 2) for v in values]


def summary_of(args, run, plan, drafter_name, preset, width, timing) -> dict:
    """The ``--json`` report of a run (without the texts); ``timing`` is
    ``(result, seconds, compile_s, repeats, runs, last)``."""
    result, seconds, compile_s, repeats, runs, last = timing
    choice, gamma = plan.tuned, 0 if plan.drafter is None else plan.drafter.num_draft
    review = None
    if choice is not None and gamma > 0:
        review = choice.review(result.stats)
        if args.verbose:
            print(
                f"specjax: gamma auto: this run's acceptance by position "
                f"{_rounded(review['acceptance_by_position'])} (chosen with "
                f"{_rounded(choice.choice.acceptance)}): gamma {gamma} expected at "
                f"{review['expected_speedup']:.2f}x plain",
                file=sys.stderr,
            )
        choice.learn(result.stats)  # pooled into the acceptance the next choice reads
    total = int(np.sum(np.asarray(result.lengths)))
    summary = {
        "drafter": drafter_name,
        "gamma": gamma,
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
            summary["equals_plain_at_width"] = same_width.to_lists() == result.to_lists()
    return summary


def print_report(args, summary, result, texts_of, shown, kind, color, streamed) -> None:
    """The texts (or ``--json``) on stdout and the summary line on stderr.

    ``texts_of`` is ``(tokenizer, stop ids)``; ``shown`` is ``(prompt text, prompt
    shown)``; ``kind`` the drafter's class name (None: plain).
    """
    from specjax.text.stream import TextStream

    (tokenizer, stop), (prompt_text, shown_prompt) = texts_of, shown
    rows = result.to_lists()
    from_draft = np.asarray(result.from_draft)
    texts = []
    for row in rows:
        shown = row[:-1] if (row and row[-1] in stop) else row
        texts.append(tokenizer.decode(shown, skip_special_tokens=False))
    if args.json:
        summary.update(prompt=prompt_text, completions=texts, token_ids=rows)
        print(json.dumps(summary, indent=2))
        return
    if not streamed:
        for b, row in enumerate(rows):
            shown = row[:-1] if (row and row[-1] in stop) else row
            if args.batch > 1:
                print(f"--- sample {b}")
            rendered = TextStream(tokenizer)
            body = coloured(rendered, shown, from_draft[b, : len(shown)].tolist(), color)
            print(shown_prompt + body + rendered.flush())
    print(summary_line(args, summary, rows, stop, kind, color), file=sys.stderr)


def summary_line(args, summary, rows, stop, kind, color) -> str:
    """``[DraftModel, gamma 4] N tokens in S s = R tokens/s (...) | ...``."""
    repeats, compile_s = summary["repeats"], summary["compile_seconds"]
    if repeats == 0:
        timing = "one run, compile included; --repeats N times steady runs"
    elif repeats == 1:
        timing = f"1 timed run; first run incl. compile {compile_s:.1f} s"
    else:
        timing = (
            f"median of {repeats}{' interleaved' if args.compare else ''} runs; "
            f"first run incl. compile {compile_s:.1f} s"
        )
    who = "plain" if kind is None else f"{kind}, gamma {summary['gamma']}"
    if args.tree is not None and kind is not None:
        who = f"{kind}, tree {args.tree}"
    line = (
        f"[{who}] {summary['tokens']} tokens in {summary['seconds']:.2f} s = "
        f"{summary['tokens_per_second']:.1f} tokens/s ({timing})"
    )
    cut = [
        b for b, row in enumerate(rows) if len(row) >= args.max_new_tokens and row[-1] not in stop
    ]
    if cut:
        which = "" if args.batch == 1 else f" ({len(cut)} of {args.batch} samples)"
        line += f" | cut at --max-new-tokens {args.max_new_tokens}{which}"
    if kind is not None:
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
            width = summary["forward_width"]
            line += f" | equals plain at width {width}: {summary['equals_plain_at_width']}"
    if color:
        line += f"  ({GREEN}green{RESET} = accepted draft tokens)"
    return line
