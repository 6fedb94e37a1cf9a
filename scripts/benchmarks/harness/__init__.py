"""The benchmarks' harness: step costs and predicted speedups, and the systems
``scripts/benchmarks/bench_e2e.py`` compares.

A plain package beside the benchmark scripts, not part of the installed ``specjax``:
a script run as ``python scripts/benchmarks/NAME.py`` finds it on its own folder's
path, and ``tests/test_bench_smoke.py`` puts that folder on ``sys.path``.

Times are wall-clock medians over repeats after a separate first (compiling)
call, with ``block_until_ready`` so asynchronous dispatch is not mistaken for
speed; the timer itself is `specjax.core.timing`, shared with ``specjax generate``.

One concern per module, each importing only those above it:

* `harness.costs`: measured costs of a step's parts (`forward_costs`, `draft_cost`,
  `interleaved_cost`, `peak_matmul_flops`) and the speedup they predict
  (`predicted_speedup`, `speculative_prediction`);
* `harness.machine`: what machine, commit and command a benchmark ran on (`run_record`,
  which every results file records), and where results go (`RESULTS`);
* `harness.greedy`: the token-for-token check of greedy outputs;
* `harness.pairs`: bench_e2e's models, prompts and log;
* `harness.systems`: the systems bench_e2e compares (specjax and transformers
  decoders, one pass of each over a workload); transformers runs in a process of its
  own, `harness/hf_worker.py`, which imports neither jax nor this package;
* `harness.targets`: the performance targets and their verdicts;
* `harness.e2e`: bench_e2e's measurements, from first pass to rows;
* `harness.report` and `harness.plots`: its tables and figures.

Only the costs are imported here: the others serve ``bench_e2e.py``,
whose transformers side imports torch when it runs.
"""

from .costs import alpha_from_hist as alpha_from_hist
from .costs import draft_cost as draft_cost
from .costs import expected_tokens_per_step as expected_tokens_per_step
from .costs import forward_costs as forward_costs
from .costs import forward_loop as forward_loop
from .costs import interleaved_cost as interleaved_cost
from .costs import peak_matmul_flops as peak_matmul_flops
from .costs import predicted_speedup as predicted_speedup
from .costs import speculative_prediction as speculative_prediction
