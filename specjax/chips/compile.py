"""Compiling the decoder for a chip that is not here, and what it predicts there.

`compile_for_chip` builds the decoder exactly as `specjax.decoding.init` would (the
same checks, the same programs), over weightless models (``jax.ShapeDtypeStruct``
leaves: `specjax.io.abstract_pretrained` reads a checkpoint's configuration only),
places it on the chip's devices (one chip, or specjax's own sharding rules over a
``(data, model)`` mesh of the slice, `specjax.models.sharding`) and compiles for it:

* one decode step for every γ from 0 (plain) to the largest, and plain steps at every
  forward width, each its own program (`specjax.decoding.loop.step`); a step's
  predicted time is the larger of its HBM bytes over the chip's bandwidth and its
  flops over the chip's peak (`specjax.chips.table`);
* the programs a run executes, prefill (``init``) and the decode loop (``run``) at
  the γ the run would use, whose memory says whether the decode fits.

The predicted speedup of each γ is `specjax.tuning.choose` on the
predicted step costs and the acceptance measured for the pair, which belongs to
the models and prompts, not to the chip: the tuning cache's, learnt by runs of the
same pair on this machine, or given.

Collectives between chips are not counted, so a multi-chip prediction is the
bandwidth bound of one chip's share.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from functools import partial

import jax

from specjax.chips.fit import advice, too_big, usable_bytes
from specjax.chips.placement import Placement
from specjax.chips.programs import (
    Analysis,
    AnalysisCache,
    OutOfMemory,
    compile_all,
    lower_program,
)
from specjax.chips.report import ChipReport, StepPrediction
from specjax.chips.table import Chip
from specjax.chips.table import chip as chip_named
from specjax.core.timing import Stopwatch
from specjax.decoding.build import DecodeOptions
from specjax.decoding.checks import prepare
from specjax.decoding.loop import run_loop, step
from specjax.decoding.refill import init_state
from specjax.drafters.base import NoDraft
from specjax.models.sharding import ShardedModel
from specjax.tuning import CostCache, StepCosts, choose, pair_id

__all__ = [
    "DEFAULT_MAX_GAMMA",
    "DecoderPrograms",
    "compile_decoder",
    "compile_for_chip",
]

DEFAULT_MAX_GAMMA = 4
"""The largest γ whose step ``gamma="auto"`` costs, as `specjax generate` drafts."""


def compile_for_chip(
    chip: str | Chip,
    target,
    drafter=None,
    *,
    batch_size: int = 1,
    prompt_length: int = 128,
    max_new_tokens: int = 256,
    gamma: int | str = "auto",
    acceptance: Sequence[float] | None = None,
    mesh: tuple[int, int] | None = None,
    cache: AnalysisCache | None = None,
    tuning_cache: CostCache | None = None,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
    **options,
) -> ChipReport:
    """Compiles the decoder of ``target`` and ``drafter`` ahead of time for ``chip``.

    Nothing runs: the programs are compiled for the chip's devices (libtpu or jax's
    CUDA plugin describe them, `specjax.chips.devices`), so this works on any host.

    Args:
        chip: a name of `specjax.chips.CHIPS` (``"v5e-1"``, Colab's TPU) or a `Chip`.
        target: the target model: a `specjax.Model`, loaded or weightless
            (`specjax.io.abstract_pretrained`); its parameters' dtype is the one
            compiled (bfloat16 is what a chip runs).
        drafter: a chain `specjax.drafters.Drafter`, or None for plain decoding.
        batch_size: rows decoded at once.
        prompt_length: tokens per prompt; with ``max_new_tokens`` it sets the cache.
        max_new_tokens: tokens generated per row.
        gamma: the γ a run uses, or ``"auto"``: the one `choose` picks from
            the predicted costs. Step costs are predicted for every γ from 0 to this
            one (auto: to ``drafter.num_draft``, default `DEFAULT_MAX_GAMMA`).
        acceptance: α_i by draft position to predict the speedups at; default the
            acceptance this machine's runs learnt for the same pair (the tuning
            cache), else no speedup is predicted.
        mesh: ``(data, model)`` axes over the chip's devices; default ``(1, devices)``
            (tensor parallel over every chip, the draft model replicated) for a
            slice of several chips, none for one chip.
        cache: where program analyses are kept (`specjax.chips.programs.AnalysisCache`).
        tuning_cache: where to read learnt acceptance (`CostCache`).
        workers: programs compiled at once (default: the host's cores, at most 4).
        log: optional ``log(str)``: progress, one line per program compiled.
        **options: any other option of `specjax.speculative_generate` (``sampling``,
            ``stop``, ``constraint``, ``num_slots``, ``eos_id``, ``verification``,
            ``draft_confidence``, ...), checked as it checks them.

    Returns:
        The `ChipReport`: whether it fits, the predicted step costs, the speedups.

    Raises:
        ValueError: an unknown chip, bad options (named as the decoders name them).
        specjax.chips.devices.ChipUnavailable: jax cannot describe the chip here (the
            message says what to install).

    Examples:
        >>> import specjax
        >>> from specjax.chips import compile_for_chip
        >>> target, draft, _ = specjax.default_pair()
        >>> report = compile_for_chip(  # doctest: +SKIP
        ...     "v5e-1", target, specjax.DraftModel(draft), acceptance=[0.8, 0.7, 0.6, 0.5]
        ... )
        >>> report.fits, report.gamma  # doctest: +SKIP
        (True, 4)
    """
    clock = Stopwatch()
    chip = chip_named(chip)
    for name in ("forward_width", "gamma_by_active_rows", "max_new_tokens"):
        if name in options:
            raise TypeError(f"compile_for_chip takes no {name}= option")
    unknown = set(options) - {f.name for f in dataclasses.fields(DecodeOptions)}
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(sorted(unknown))}: compile_for_chip takes "
            "speculative_generate's options"
        )
    drafter = NoDraft() if drafter is None else drafter
    if drafter.tree is not None:
        raise ValueError(
            "compile_for_chip predicts chains of drafts; compile a tree drafter's decoder "
            "with specjax.chips.compile.compile_decoder"
        )
    if gamma == "auto":
        top = drafter.num_draft if drafter.num_draft else 0
        top = top if not isinstance(drafter, NoDraft) else 0
    else:
        top = int(gamma)
        if top < 0 or (top > 0 and isinstance(drafter, NoDraft)):
            raise ValueError(f"gamma={gamma}: plain decoding (no drafter) has gamma 0")
    cache = AnalysisCache() if cache is None else cache
    workers = workers or min(4, os.cpu_count() or 1)
    say = log or (lambda line: None)

    placement = Placement.of(chip, target, drafter, mesh, batch_size)
    target, drafter = placement.target, placement.drafter
    key = jax.random.key(0) if options.get("sampling") is not None else None
    prompts = [[1] * prompt_length] * batch_size
    call = dict(options, max_new_tokens=max_new_tokens)

    def decoder_of(drafter_g, width):
        opts = DecodeOptions(**call, forward_width=width)
        return prepare(key, target, drafter_g, prompts, opts, host_memory=False)

    # One step per γ, and plain steps at every width (a target forward W wide).
    setups = {("plain", w): decoder_of(NoDraft(), None if w == 1 else w) for w in range(1, top + 2)}
    for g in range(1, top + 1):
        setups[("gamma", g)] = decoder_of(drafter.with_draft(g), None)
    programs, flops, sizes = [], {}, {}
    for (kind, n), p in setups.items():
        name = f"step plain width={n}" if kind == "plain" else f"step gamma={n}"
        args = placement.step_args(p)
        program = lower_program(
            name,
            _looped_step,
            args,
            chip=chip,
            donate_argnums=(1,),
            cache=cache,
            flops=True,
            per_trip=True,
        )
        programs.append(program)
        flops[(kind, n)] = program.flops / placement.devices
        sizes[(kind, n)] = placement.min_bytes(args)
    say(f"compiling {len(programs)} step programs for {chip.name} ({workers} at a time)")
    # The plain step first: where it does not fit, no other program does.
    analyses = compile_all(programs[:1], cache=cache, log=log)
    if not isinstance(analyses[programs[0].name], OutOfMemory):
        analyses |= compile_all(programs[1:], cache=cache, workers=workers, log=log)
    settings = _settings(target, drafter, batch_size, prompt_length, max_new_tokens, options)
    refused = next((a for a in analyses.values() if isinstance(a, OutOfMemory)), None)
    if refused is not None:
        return too_big(chip, placement, refused, analyses, settings, clock, setups)

    def predicted(kind, n, analysis: Analysis) -> StepPrediction:
        peak = chip.peak_int8_ops if _quantization(target) == "int8" else chip.peak_flops
        memory_s = analysis.hbm_bytes / chip.hbm_bandwidth
        compute_s = flops[(kind, n)] / peak
        return StepPrediction(
            gamma=0 if kind == "plain" else n,
            width=n if kind == "plain" else n + 1,
            hbm_bytes=analysis.hbm_bytes,
            flops=flops[(kind, n)],
            seconds=max(memory_s, compute_s),
            bound="memory" if memory_s >= compute_s else "compute",
            xla_seconds=analysis.xla_seconds,
            min_bytes=sizes[(kind, n)],
            top_ops=analysis.top_ops,
        )

    by_name = dict(zip(setups, (analyses[p.name] for p in programs), strict=True))
    plain = {n: predicted(k, n, a) for (k, n), a in by_name.items() if k == "plain"}
    steps = {0: plain[1]} | {n: predicted(k, n, a) for (k, n), a in by_name.items() if k != "plain"}

    alpha, source = _acceptance(acceptance, target, drafter, top, tuning_cache)
    speedups, chosen, reason = {}, (0 if gamma == "auto" and not top else gamma), ""
    if top and alpha:
        costs = StepCosts(
            tuple(plain[w].seconds for w in range(1, top + 2)),
            tuple(max(steps[g].seconds - plain[g + 1].seconds, 0.0) for g in range(1, top + 1)),
        )
        choice = choose(costs, alpha)
        speedups = dict(enumerate(choice.speedups))
        chosen = choice.gamma if gamma == "auto" else int(gamma)
        reason = choice.reason if gamma == "auto" else f"given (auto would choose {choice.gamma})"
    elif gamma == "auto" and top:
        chosen, reason = top, "the largest gamma: no acceptance to choose from"
    else:
        reason = "plain decoding" if not chosen else "given"

    run_setup = setups[("plain", 1)] if not chosen else setups[("gamma", int(chosen))]
    say(f"compiling prefill and the decode loop at gamma {chosen}")
    init_args, run_args = placement.run_args(run_setup)
    run_programs = [
        lower_program(
            "init",
            partial(init_state, cache_len=run_setup.cache_len, num_slots=run_setup.num_slots),
            init_args,
            chip=chip,
            cache=cache,
        ),
        lower_program("run", run_loop, run_args, chip=chip, donate_argnums=(1,), cache=cache),
    ]
    analyses |= compile_all(run_programs, cache=cache, workers=workers, log=log)
    refused = next((a for a in analyses.values() if isinstance(a, OutOfMemory)), None)
    if refused is not None:
        return too_big(chip, placement, refused, analyses, settings, clock, setups)
    usable = usable_bytes(chip, analyses)
    peak = max(a.peak_bytes for a in analyses.values())
    fits = peak <= usable
    message = "" if fits else advice(chip, placement, setups, peak, usable)
    return ChipReport(
        chip=chip,
        mesh=placement.mesh_shape,
        fits=fits,
        peak_bytes=peak,
        usable_bytes=usable,
        message=message,
        programs={name: a.to_json() for name, a in analyses.items()},
        steps=steps,
        plain_widths=plain,
        acceptance=alpha,
        acceptance_source=source,
        predicted_speedup=speedups,
        gamma=chosen,
        reason=reason,
        host_transfers=analyses["run"].host_transfers,
        compile_seconds=sum(a.compile_seconds for a in analyses.values()),
        settings=settings | {"wall_seconds": clock.elapsed()},
    )


def _looped_step(decoder, state, trips):
    """``trips`` decode steps in a loop: one trip is a step as the decode loop runs it.

    Compiled alone, a step would also pay, at its entry and exit, conversions between
    the caller's layouts and those XLA picks for the cache inside a loop (on a TPU the
    whole cache, at every step); inside a loop, as in a decode, it pays them once. The
    trip count is an argument, as the decode loop's is data: a loop of a known small
    count may be unrolled, and then no trip is a step.
    """
    return jax.lax.fori_loop(0, trips, lambda _, s: step(decoder, s), state)


@dataclasses.dataclass(frozen=True)
class DecoderPrograms:
    """What `compile_decoder` compiled.

    Attributes:
        analyses: ``{program: Analysis}``, or the compiler's `OutOfMemory` refusal.
        min_step_bytes: what the plain step must read per device (weights and cache),
            where ``"step"`` was compiled.
        mesh: the ``(data, model)`` axes, or None on one device.
    """

    analyses: dict
    min_step_bytes: int | None
    mesh: tuple[int, int] | None


def compile_decoder(
    chip: str | Chip,
    target,
    drafter=None,
    *,
    batch_size: int = 1,
    num_prompts: int | None = None,
    prompt_length: int = 128,
    max_new_tokens: int = 256,
    mesh: tuple[int, int] | None = None,
    programs: Sequence[str] = ("init", "run"),
    cache: AnalysisCache | None = None,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
    **options,
) -> DecoderPrograms:
    """Compiles a decoder's programs for ``chip``, any drafter (a tree's too), no predictions.

    Args:
        chip: as `compile_for_chip`, and so are ``target``, ``drafter``,
            ``batch_size``, ``prompt_length``, ``max_new_tokens``, ``mesh``, ``cache``,
            ``workers``, ``log`` and ``options``.
        num_prompts: prompts queued (default ``batch_size``); more than ``batch_size``
            (the slots) refills finished slots inside the loop (continuous batching).
        programs: which to compile: ``"init"`` (prefill), ``"run"`` (the decode loop)
            and ``"step"`` (one plain step in a loop, what `compile_for_chip` costs).

    Returns:
        The `DecoderPrograms`.
    """
    chip = chip_named(chip)
    drafter = NoDraft() if drafter is None else drafter
    cache = AnalysisCache() if cache is None else cache
    placement = Placement.of(chip, target, drafter, mesh, batch_size)
    key = jax.random.key(0) if options.get("sampling") is not None else None
    prompts = [[1] * prompt_length] * (num_prompts or batch_size)
    opts = DecodeOptions(**options, max_new_tokens=max_new_tokens, num_slots=batch_size)
    p = prepare(key, placement.target, placement.drafter, prompts, opts, host_memory=False)
    lowered = []
    init_args, run_args = placement.run_args(p)
    if "init" in programs:
        fn = partial(init_state, cache_len=p.cache_len, num_slots=p.num_slots)
        lowered.append(lower_program("init", fn, init_args, chip=chip, cache=cache))
    if "run" in programs:
        lowered.append(
            lower_program("run", run_loop, run_args, chip=chip, donate_argnums=(1,), cache=cache)
        )
    if "step" in programs:
        plain = prepare(key, placement.target, NoDraft(), prompts, opts, host_memory=False)
        args = placement.step_args(plain)
        lowered.append(
            lower_program(
                "step",
                _looped_step,
                args,
                chip=chip,
                donate_argnums=(1,),
                cache=cache,
                per_trip=True,
            )
        )
    workers = workers or min(4, os.cpu_count() or 1)
    return DecoderPrograms(
        analyses=compile_all(lowered, cache=cache, workers=workers, log=log),
        min_step_bytes=placement.min_bytes(args) if "step" in programs else None,
        mesh=placement.mesh_shape,
    )


def _quantization(model) -> str | None:
    inner = model.model if isinstance(model, ShardedModel) else model
    return getattr(inner, "quantization", None)


def _acceptance(given, target, drafter, top: int, tuning_cache):
    if not top:
        return (), "plain decoding drafts nothing"
    if given is not None:
        alpha = tuple(float(a) for a in given)
        if not alpha or any(not 0.0 <= a <= 1.0 for a in alpha):
            raise ValueError(f"acceptance must be probabilities in [0, 1], got {list(given)}")
        return alpha, "given"
    tuning_cache = CostCache() if tuning_cache is None else tuning_cache
    learnt = tuning_cache.learnt_acceptance(pair_id(target, drafter))
    if learnt is None:
        return (), (
            "no acceptance is known for this pair: pass acceptance (--acceptance a1,a2,...), "
            "or decode with the pair once (specjax generate), which the tuning cache learns"
        )
    alpha, judged = learnt
    return alpha, f"learnt by this machine's runs of the pair, {int(sum(judged))} drafts judged"


def _settings(target, drafter, batch, prompt, new, options) -> dict:
    return {
        "target_dtype": str(getattr(target, "dtype", "")),
        "target_quantization": _quantization(target),
        "drafter": type(drafter).__name__,
        "batch_size": batch,
        "prompt_length": prompt,
        "max_new_tokens": new,
        "options": sorted(options),
    }
