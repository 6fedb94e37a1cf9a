"""The one wall-clock timer of specjax: the benchmarks, the scripts, ``specjax
generate``, γ's tuning (`specjax.tuning`), the chips' compile reports and training.

A call's timing (`time_call`, `time_runs`, `time_fn`, `time_interleaved`) waits with
``jax.block_until_ready`` for the outputs of the call it times, so asynchronous
dispatch is not mistaken for speed. Times are reported as medians (or minima) over
repeats after separate first calls: the first call compiles, and on a CPU the second
still pays one-time runtime set-up. A phase of many calls is timed by a `Stopwatch`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import jax


@dataclasses.dataclass
class Timing:
    """``first_s`` includes compilation; ``median_s`` is the steady state."""

    first_s: float
    median_s: float
    times_s: list[float]


class Stopwatch:
    """Wall-clock seconds of a phase that is not one call: a compile, a training run, a
    whole command. It starts when made; what it times is the caller's to wait for.

    Examples:
        >>> clock = Stopwatch()
        >>> clock.elapsed() >= 0.0
        True
    """

    def __init__(self):
        self._start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the stopwatch was made."""
        return time.perf_counter() - self._start


def time_call(fn: Callable, *args) -> tuple[float, object]:
    """Seconds of one ``fn(*args)`` until its outputs are ready, and the outputs."""
    clock = Stopwatch()
    out = jax.block_until_ready(fn(*args))
    return clock.elapsed(), out


def time_runs(fn: Callable, *args, repeats: int, warmup: int = 0) -> tuple[list[float], object]:
    """Seconds of each of ``repeats`` calls ``fn(*args)``, after ``warmup`` untimed ones.

    Args:
        fn: the function to time.
        *args: its arguments, the same for every call.
        repeats: timed calls.
        warmup: untimed calls first (each waited for): compilation, one-time set-up.

    Returns:
        ``(seconds, out)``: one time per timed call, and the outputs of the last call.
    """
    out = None
    for _ in range(warmup):
        out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        seconds, out = time_call(fn, *args)
        times.append(seconds)
    return times, out


def time_fn(fn: Callable, *args, repeats: int = 5) -> tuple[Timing, object]:
    """Times ``fn(*args)``: one compiling call, then ``repeats`` steady calls."""
    first, out = time_call(fn, *args)
    times, out = time_runs(fn, *args, repeats=repeats)
    return Timing(first, statistics.median(times), times), out


def time_interleaved(
    fns: Sequence[Callable[[], object]], repeats: int, *, warmup: int = 0
) -> tuple[list[list[float]], list[object]]:
    """Times each of ``fns`` ``repeats`` times, round robin (a, b, a, b, ...).

    Interleaving spreads slow drifts of the machine (clock, cache, other load) over
    every system alike.

    Args:
        fns: functions of no arguments.
        repeats: timed rounds.
        warmup: untimed calls of each function first, function by function
            (a, a, b, b): compilation, one-time set-up.

    Returns:
        ``(seconds, results)``: one list of seconds per function, and the result of
        each function's last call; the callers report medians or minima.
    """
    seconds, results = [[] for _ in fns], [None] * len(fns)
    for i, fn in enumerate(fns):
        for _ in range(warmup):
            results[i] = jax.block_until_ready(fn())
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            s, results[i] = time_call(fn)
            seconds[i].append(s)
    return seconds, results
