"""Benchmarking: the timer shared by the benchmark scripts and ``specjax generate``,
step costs and predicted speedups, and the systems ``scripts/bench_e2e.py`` compares.

Times are wall-clock medians over repeats after a separate first (compiling)
call, with ``block_until_ready`` so asynchronous dispatch is not mistaken for
speed.

One concern per module, each importing only those above it:

* `~specjax.benchmarking.timer`: the one timer (`time_call`, `time_runs`, `time_fn`,
  `time_interleaved`, `Timing`);
* `~specjax.benchmarking.costs`: measured costs of a step's parts (`forward_costs`,
  `draft_cost`, `interleaved_cost`, `peak_matmul_flops`) and the speedup they predict
  (`predicted_speedup`, `speculative_prediction`);
* `~specjax.benchmarking.machine`: what machine a benchmark ran on;
* `~specjax.benchmarking.greedy`: the token-for-token check of greedy outputs;
* `~specjax.benchmarking.pairs`: bench_e2e's models, prompts and log;
* `~specjax.benchmarking.systems`: the systems bench_e2e compares (specjax and
  transformers decoders, one pass of each over a workload);
* `~specjax.benchmarking.targets`: the performance targets and their verdicts;
* `~specjax.benchmarking.e2e`: bench_e2e's measurements, from first pass to rows;
* `~specjax.benchmarking.report` and `~specjax.benchmarking.plots`: its tables and
  figures.

Only the first two are imported here: the others serve ``scripts/bench_e2e.py``,
whose transformers side imports torch when it runs.
"""

from specjax.benchmarking.costs import alpha_from_hist as alpha_from_hist
from specjax.benchmarking.costs import draft_cost as draft_cost
from specjax.benchmarking.costs import expected_tokens_per_step as expected_tokens_per_step
from specjax.benchmarking.costs import forward_costs as forward_costs
from specjax.benchmarking.costs import forward_loop as forward_loop
from specjax.benchmarking.costs import interleaved_cost as interleaved_cost
from specjax.benchmarking.costs import peak_matmul_flops as peak_matmul_flops
from specjax.benchmarking.costs import predicted_speedup as predicted_speedup
from specjax.benchmarking.costs import speculative_prediction as speculative_prediction
from specjax.benchmarking.timer import Timing as Timing
from specjax.benchmarking.timer import time_call as time_call
from specjax.benchmarking.timer import time_fn as time_fn
from specjax.benchmarking.timer import time_interleaved as time_interleaved
from specjax.benchmarking.timer import time_runs as time_runs
