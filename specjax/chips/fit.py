"""Whether a decoder fits a chip's memory, and what to change where it does not."""

from __future__ import annotations

from specjax.chips.placement import Placement, device_bytes
from specjax.chips.programs import Analysis, OutOfMemory
from specjax.chips.report import ChipReport
from specjax.chips.table import CHIPS, Chip

# jax on a GPU takes this share of its memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION).
_GPU_MEMORY_SHARE = 0.75


def usable_bytes(chip: Chip, analyses: dict) -> int:
    """The bytes per device a decode may use: a GPU's default share for jax, a TPU's all."""
    if chip.platform == "cuda":
        return int(chip.hbm_bytes * _GPU_MEMORY_SHARE)
    return chip.hbm_bytes


def advice(chip: Chip, placement: Placement, setups, needed: int, usable: int | None) -> str:
    """One message: what the decode needs per device, what the chip has, what to change."""
    gib = 2**30
    p = setups[max(setups, key=lambda k: (k[0] == "gamma", k[1]))]
    decoder, state, _ = placement.step_args(p)
    weights = device_bytes((decoder.target, decoder.drafter))
    caches = device_bytes((state.target_cache, state.drafter_state))
    have = f"{usable / gib:.2f} GiB" if usable else f"{chip.hbm_bytes / gib:.0f} GiB"
    more = _more_chips(chip)
    rows, slots = p.num_slots, p.cache_len
    changes = ["a smaller --batch-size", "a shorter context (--prompt-length, --max-new-tokens)"]
    if weights >= caches:  # int8 weights keep float32 caches: only the weights shrink
        changes.insert(0, "int8 weights (--quantize int8 halves bfloat16 weights)")
    return (
        f"needs {needed / gib:.2f} GiB per device (weights {weights / gib:.2f} GiB, caches "
        f"{caches / gib:.2f} GiB for {rows} row(s) of {slots} tokens); {chip.name} has {have} "
        f"per device. Change one of: {', '.join(changes)}{more}"
    )


def _more_chips(chip: Chip) -> str:
    family = chip.name.split("-")[0]
    larger = [
        c.name for c in CHIPS.values() if c.name.startswith(family) and c.devices > chip.devices
    ]
    return f", or more chips (--chip {larger[0]})" if larger else ""


def too_big(chip, placement, refused: OutOfMemory, analyses, settings, clock, setups):
    """The `ChipReport` of a decoder the compiler refused for want of memory."""
    needed = refused.needed_bytes or 0
    message = advice(chip, placement, setups, needed, refused.available_bytes)
    message += f". The compiler: {refused.detail}"
    return ChipReport(
        chip=chip,
        mesh=placement.mesh_shape,
        fits=False,
        peak_bytes=needed,
        usable_bytes=refused.available_bytes or chip.hbm_bytes,
        message=message,
        programs={n: a.to_json() for n, a in analyses.items() if isinstance(a, Analysis)},
        steps={},
        plain_widths={},
        acceptance=(),
        acceptance_source="",
        predicted_speedup={},
        gamma=None,
        reason="",
        host_transfers=(),
        compile_seconds=sum(
            a.compile_seconds for a in analyses.values() if isinstance(a, Analysis)
        ),
        settings=settings | {"wall_seconds": clock.elapsed()},
    )
