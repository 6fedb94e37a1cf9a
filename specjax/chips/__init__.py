"""Compiling for chips that are not here: TPUs and GPUs, from any host.

`compile_for_chip` compiles the decoder ahead of time for a named chip (`CHIPS`:
``v5e-1`` is Colab's TPU) and reports what a user needs before renting it: whether it
fits the chip's memory, what one decode step reads and costs for every γ, and the
speedup speculation is predicted to give there (``specjax compile`` on the command
line). The predictions come from the compiled programs' bytes and flops and the
chip's published bandwidth and peak; they are not measurements.

* `~specjax.chips.table`: the chips and their figures, with sources;
* `~specjax.chips.devices`: jax's compile-only devices of a chip (libtpu, or jax's
  CUDA plugin);
* `~specjax.chips.hlo`: what a compiled program reads from HBM, and its host
  transfers; `~specjax.chips.flops`: its products' flops;
* `~specjax.chips.programs`: lowering, compiling and the analyses kept on disk;
* `~specjax.chips.compile`: the decoder's programs for a chip, and the predictions;
* `~specjax.chips.report`: the `ChipReport`, as JSON and text.
"""

from specjax.chips.compile import compile_for_chip as compile_for_chip
from specjax.chips.devices import ChipUnavailable as ChipUnavailable
from specjax.chips.report import ChipReport as ChipReport
from specjax.chips.report import StepPrediction as StepPrediction
from specjax.chips.table import CHIPS as CHIPS
from specjax.chips.table import Chip as Chip

__all__ = [
    "CHIPS",
    "Chip",
    "ChipReport",
    "ChipUnavailable",
    "StepPrediction",
    "compile_for_chip",
]
