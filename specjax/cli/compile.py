"""``specjax compile``: compile the decoder for a TPU or GPU from this host, and predict.

The models are weightless (`specjax.io.abstract.abstract_pretrained` reads a
checkpoint's configuration only; the bundled pair is small enough to load), the
programs are compiled for the chip's devices (`specjax.chips`), and nothing runs.
"""

from __future__ import annotations

import json
import os
import sys

from specjax.cli.common import UserError, model_path


def _acceptance(text: str | None):
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--acceptance takes probabilities a1,a2,..., got {text!r}") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise UserError(f"--acceptance takes probabilities in [0, 1], got {text!r}")
    return values


def _mesh(text: str | None):
    if text is None:
        return None
    try:
        data, model = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UserError(f"--mesh takes DATAxMODEL (e.g. 1x4), got {text!r}") from None
    return data, model


def _models(args, dtype):
    """``(target, drafter)``: weightless for --model/--draft, the bundled pair loaded."""
    import specjax
    from specjax.io.abstract import abstract_pretrained
    from specjax.io.pretrained import default_pair
    from specjax.models.quant import quantize
    from specjax.text.drafting import build_drafter

    draft_mode = args.quantize if args.draft_quantize is None else args.draft_quantize
    draft_mode = None if draft_mode == "none" else draft_mode
    drafter_name = args.drafter
    if args.model is None:
        if args.draft:
            raise UserError("--draft needs --model (the bundled draft fits the bundled target)")
        target, draft, _ = default_pair(dtype)
        target = quantize(target, args.quantize) if args.quantize else target
        drafter_name = "model" if drafter_name == "auto" else drafter_name
        if drafter_name == "model":
            draft = quantize(draft, draft_mode) if draft_mode else draft
            return target, specjax.DraftModel(draft)
        return target, _named(drafter_name, target, bundled=True, build=build_drafter)

    def weightless(path, flag, mode):
        try:
            return abstract_pretrained(model_path(path, flag), dtype, quantize=mode)
        except (FileNotFoundError, ValueError, OSError) as e:
            raise UserError(f"{flag} {path}: {e}") from None

    target = weightless(args.model, "--model", args.quantize)
    if drafter_name == "auto":
        drafter_name = "model" if args.draft else "lookup"
    if drafter_name == "model":
        if not args.draft:
            raise UserError("--drafter model needs --draft PATH when --model is given")
        return target, specjax.DraftModel(weightless(args.draft, "--draft", draft_mode))
    return target, _named(drafter_name, target, bundled=False, build=build_drafter)


def _named(name, target, *, bundled: bool, build):
    try:
        return build(name, target, bundled=bundled)
    except ValueError as e:
        raise UserError(f"--drafter {name}: {e}") from None


def cmd_compile(args) -> int:
    import jax

    # Compiling for a chip needs no local accelerator, and jax's CUDA plugin describes a
    # GPU only when it is not also asked to run one.
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    import jax.numpy as jnp

    from specjax.chips import CHIPS, ChipUnavailable, compile_for_chip

    if args.chip not in CHIPS:
        raise UserError(f"--chip must be one of {', '.join(CHIPS)}, got {args.chip!r}")
    for flag, value in (("--batch-size", args.batch), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if args.prompt_length < 1:
        raise UserError(f"--prompt-length must be at least 1, got {args.prompt_length}")
    if args.gamma != "auto" and args.gamma < 0:
        raise UserError(f"--gamma must be a whole number >= 0 or auto, got {args.gamma}")
    acceptance, mesh = _acceptance(args.acceptance), _mesh(args.mesh)
    dtype = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.dtype]
    target, drafter = _models(args, dtype)
    if drafter is None and args.gamma not in ("auto", 0):
        raise UserError(f"--gamma {args.gamma} needs a drafter (--drafter none decodes plainly)")
    if drafter is not None and args.gamma not in ("auto", 0):
        drafter = drafter.with_draft(args.gamma)
    elif drafter is not None and args.gamma == 0:
        drafter = None

    def log(line: str) -> None:
        if not args.quiet:
            print(f"specjax: compile: {line}", file=sys.stderr)

    try:
        report = compile_for_chip(
            args.chip,
            target,
            drafter,
            batch_size=args.batch,
            prompt_length=args.prompt_length,
            max_new_tokens=args.max_new_tokens,
            gamma="auto" if args.gamma == "auto" else args.gamma,
            acceptance=acceptance,
            mesh=mesh,
            log=log,
        )
    except ChipUnavailable as e:
        raise UserError(str(e)) from None
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print("\n".join(report.lines()))
    return 0 if report.fits else 3
