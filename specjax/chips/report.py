"""What `specjax.chips.compile_for_chip` found: a `ChipReport`, as JSON and as text.

The JSON keys are stable (``specjax compile --json``): ``chip``, ``devices``, ``fits``,
``hbm_bytes`` and ``peak_bytes`` (per device), ``step_seconds`` and ``step_bytes``
(objects keyed by γ as a string, ``"0"`` = plain decoding), ``min_step_bytes`` (the
weights and caches a step must read, keyed the same way), ``acceptance``,
``predicted_speedup`` (keyed by γ) and ``gamma``, with more beside them.
"""

from __future__ import annotations

import dataclasses

from specjax.chips.table import Chip

__all__ = ["ChipReport", "StepPrediction"]


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    """One decode step's predicted cost on one device of the chip.

    Attributes:
        gamma: drafts per step (0: plain decoding).
        width: the target forward's width.
        hbm_bytes: HBM traffic of one step (`specjax.chips.hlo`).
        flops: its products' operations, per device.
        seconds: the larger of ``hbm_bytes`` over the chip's bandwidth and ``flops``
            over its peak.
        bound: ``"memory"`` or ``"compute"``: which of the two it is.
        xla_seconds: XLA's own estimate (TPU, where positive), or None.
        min_bytes: what the step must read at least: the weights and the caches.
        top_ops: the instructions that read the most, one line each.
    """

    gamma: int
    width: int
    hbm_bytes: float
    flops: float
    seconds: float
    bound: str
    xla_seconds: float | None
    min_bytes: int
    top_ops: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ChipReport:
    """A decoder compiled ahead of time for a chip: does it fit, what a step costs,
    and what speculation is predicted to gain there.

    Attributes:
        chip: the `Chip`.
        mesh: ``(data, model)`` axes over the chip's devices, or None for one device.
        fits: every program compiled within the chip's memory.
        peak_bytes: the most any of the decode's programs holds at once, per device.
        usable_bytes: what a program may use per device (the compiler's limit on a
            TPU; on a GPU jax's default share, 75%, of its memory).
        message: why it does not fit and what to change, or "".
        programs: each compiled program's `~specjax.chips.programs.Analysis` as JSON.
        steps: `StepPrediction` per γ (0 = plain decoding at width 1).
        plain_widths: plain steps at each forward width W (what a target forward costs
            W wide, which splits a speculative step into target and drafts).
        acceptance: α_i by draft position the speedups are predicted at, or ().
        acceptance_source: where ``acceptance`` came from.
        predicted_speedup: expected tokens per second over plain decoding, per γ.
        gamma: the γ a run would use: given, or what ``gamma="auto"`` would choose.
        reason: why that γ, in words.
        host_transfers: host transfers found inside the decode loop (none expected).
        compile_seconds: time spent compiling (0 for analyses read from the cache).
        settings: the models and options compiled, for the record.
    """

    chip: Chip
    mesh: tuple[int, int] | None
    fits: bool
    peak_bytes: int
    usable_bytes: int
    message: str
    programs: dict
    steps: dict[int, StepPrediction]
    plain_widths: dict[int, StepPrediction]
    acceptance: tuple[float, ...]
    acceptance_source: str
    predicted_speedup: dict[int, float]
    gamma: int | None
    reason: str
    host_transfers: tuple[str, ...]
    compile_seconds: float
    settings: dict

    def to_json(self) -> dict:
        """The report as plain JSON values, with the stable keys of the module doc."""
        steps = self.steps
        return {
            "chip": self.chip.name,
            "devices": self.chip.devices,
            "mesh": list(self.mesh) if self.mesh else None,
            "fits": self.fits,
            "message": self.message,
            "hbm_bytes": self.chip.hbm_bytes,
            "usable_bytes": self.usable_bytes,
            "peak_bytes": self.peak_bytes,
            "step_seconds": {str(g): s.seconds for g, s in steps.items()},
            "step_bytes": {str(g): s.hbm_bytes for g, s in steps.items()},
            "step_flops": {str(g): s.flops for g, s in steps.items()},
            "step_bound": {str(g): s.bound for g, s in steps.items()},
            "xla_step_seconds": {
                str(g): s.xla_seconds for g, s in steps.items() if s.xla_seconds is not None
            },
            "min_step_bytes": {str(g): s.min_bytes for g, s in steps.items()},
            "target_step_seconds_by_width": {
                str(w): s.seconds for w, s in self.plain_widths.items()
            },
            "acceptance": list(self.acceptance),
            "acceptance_source": self.acceptance_source,
            "predicted_speedup": {str(g): v for g, v in self.predicted_speedup.items()},
            "gamma": self.gamma,
            "reason": self.reason,
            "top_ops": {str(g): list(s.top_ops) for g, s in steps.items()},
            "host_transfers": list(self.host_transfers),
            "bandwidth_bytes_per_s": self.chip.hbm_bandwidth,
            "peak_flops": self.chip.peak_flops,
            "chip_figures_source": self.chip.source,
            "compile_seconds": self.compile_seconds,
            "programs": self.programs,
            "settings": self.settings,
        }

    def lines(self) -> list[str]:
        """The report for people, one line each."""
        c, gib = self.chip, 2**30
        mesh = f", mesh data x model = {self.mesh[0]} x {self.mesh[1]}" if self.mesh else ""
        out = [f"{c.name}: {c.devices} {c.kind} chip(s){mesh}, {c.hbm_bytes / gib:.1f} GiB each"]
        if not self.fits:
            return [*out, f"does not fit: {self.message}"]
        out.append(
            f"fits: {self.peak_bytes / gib:.2f} GiB at the peak per device, of "
            f"{self.usable_bytes / gib:.2f} GiB usable"
        )
        out.append("predicted per step from the compiled programs' bytes and flops (not measured):")
        for g, s in self.steps.items():
            xla = f", XLA {1e3 * s.xla_seconds:.3f} ms" if s.xla_seconds is not None else ""
            speed = self.predicted_speedup.get(g)
            speed = f", {speed:.2f}x plain" if speed is not None else ""
            name = "plain    " if g == 0 else f"gamma {g}  "
            out.append(
                f"  {name}{1e3 * s.seconds:8.3f} ms  {s.hbm_bytes / 1e9:7.3f} GB read "
                f"(at least {s.min_bytes / 1e9:.3f}), {s.flops / 1e9:.1f} GFLOP, "
                f"{s.bound}-bound{xla}{speed}"
            )
        if self.acceptance:
            alpha = ", ".join(f"{a:.2f}" for a in self.acceptance)
            out.append(f"acceptance by position: {alpha} ({self.acceptance_source})")
        else:
            out.append(f"no predicted speedup: {self.acceptance_source}")
        if self.gamma is not None:
            out.append(f"chosen: {self.reason}" if self.reason else f"gamma {self.gamma}")
        if self.host_transfers:
            out.append(f"host transfers inside the loop: {'; '.join(self.host_transfers)}")
        return out
