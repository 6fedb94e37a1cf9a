"""Timing a decoding step's parts on this machine, for the choice of γ.

`probe` times the parts alone, each its own small program: the target's forward at
every width ``1..γ + 1`` and the drafter's proposal at every γ (seconds). `measure`
times whole decode loops (a minute and more on a CPU), plain at every width and
speculative at every γ, and reads the acceptance by position off the largest γ's run;
it serves the drafters `probe` cannot time alone. Both wait for every output
(`specjax.core.timing`) and keep each part's fastest time: what the machine adds,
another process's work, only slows a run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.timing import time_call, time_interleaved
from specjax.decoding.api import init, run
from specjax.decoding.checks import pad_prompts
from specjax.decoding.output import result
from specjax.models.forward import score
from specjax.sampling import SamplingConfig
from specjax.tuning.choice import StepCosts

__all__ = ["measure", "probe"]


def measure(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    repeats: int = 3,
    log=None,
) -> tuple[StepCosts, tuple[float, ...], tuple[float, ...]]:
    """Times the decode loop on this machine: ``(StepCosts, acceptance, judged)``, the
    acceptance by position and the drafts judged at each.

    Plain decoding at each width W in ``1..γ + 1`` gives the target's forward cost at
    W (one forward a step); speculative decoding, greedy, at each γ' in ``1..γ`` and
    width γ' + 1 gives a step's cost, and the step less the target's forward is the
    proposal's. Only the loop is timed (`specjax.decoding.run` over a prefilled
    state), so the prompt's prefill does not count as step time. Each program runs once
    to compile, then ``repeats`` times; the fastest run counts (what the machine
    adds, another process's work, only slows a run). The acceptance is read off the γ
    run.

    Args:
        target: the target model.
        drafter: a drafter with ``num_draft`` = γ, the largest γ to measure.
        prompts: token-id prompts, their number the batch size the costs are for.
        max_new_tokens: tokens per timed run.
        repeats: timed runs per program.
        log: optional ``log(str)`` for progress, one line a program.
    """
    greedy = SamplingConfig.greedy()
    max_gamma = drafter.num_draft
    if max_gamma < 1:
        raise ValueError(f"drafter.num_draft must be >= 1 to measure, got {max_gamma}")

    def loop_s(drafter_or_none, width: int):
        """The fastest of ``repeats`` loops: (seconds a step, the last final state)."""
        fresh_state = functools.partial(
            init,
            None,
            target,
            prompts,
            drafter=drafter_or_none,
            max_new_tokens=max_new_tokens,
            sampling=greedy,
            forward_width=width,
        )
        best, state = float("inf"), None
        for i in range(repeats + 1):  # the first compiles
            decoder, state = jax.block_until_ready(fresh_state())
            seconds, state = time_call(run, decoder, state)
            if i:
                best = min(best, seconds)
        calls = max(int(jax.device_get(state.step)), 1)
        return best / calls, result(decoder, state)

    target_s = []
    for width in range(1, max_gamma + 2):
        seconds, _ = loop_s(None, width)
        target_s.append(seconds)
        if log:
            log(f"plain, forward width {width}: {1e3 * seconds:.2f} ms a step")
    draft_s, acceptance, judged = [], (), ()
    for gamma in range(1, max_gamma + 1):
        seconds, out = loop_s(drafter.with_draft(gamma), gamma + 1)
        draft_s.append(max(seconds - target_s[gamma], 0.0))
        if gamma == max_gamma:
            stats = jax.device_get(out.stats)
            acceptance = tuple(float(a) for a in np.asarray(stats.acceptance_by_position))
            judged = tuple(float(n) for n in np.asarray(stats.position_reached))
        if log:
            log(f"gamma {gamma}: {1e3 * seconds:.2f} ms a step, drafts {1e3 * draft_s[-1]:.2f} ms")
    return StepCosts(tuple(target_s), tuple(draft_s)), acceptance, judged


def probe(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    repeats: int = 5,
    log=None,
) -> StepCosts | None:
    """Times a step's parts alone on this machine, in seconds: a target forward at every
    width ``1..γ + 1`` and the drafter's proposal at every γ, each its own small program.

    Much cheaper than `measure`: no decode loop is compiled, only forwards and
    proposals (a few seconds for the bundled pair on a 2-core CPU, where `measure`
    takes a minute and more). The loop's own work per step (sampling, verification,
    bookkeeping) is not in it; it is the same at every γ to first order, so the choice
    between γ barely moves. A drafter that reads the target's hidden states (or
    anything `init` cannot build alone) is not probed: ``None``, then `measure`.

    Args:
        target: the target model.
        drafter: a chain drafter; its ``num_draft`` is the largest γ probed.
        prompts: the run's prompts: their number is the batch, the longest sets the
            cache's fill.
        repeats: timed calls of each program after its first; the fastest counts.
        log: optional ``log(str)``, one line per program.
    """
    if drafter.target_layers:
        return None
    max_gamma = drafter.num_draft
    members = getattr(drafter, "members", None)
    if members:  # a chain: its dearest member, the one that drafts where the others cannot
        drafter = members[-1].with_draft(max_gamma)
    prompts_BP, lengths_B = pad_prompts(prompts)
    b, p = prompts_BP.shape
    cache_len = p + 2 * max_gamma + 8
    seq_BS = jnp.pad(prompts_BP, ((0, 0), (0, cache_len - p)))
    cache = target.init_cache(b, cache_len).rollback(lengths_B - 1)
    forward = jax.jit(lambda m, t, pos, c: score(m, t, pos, c)[0])
    calls = []  # (label, function, arguments), each compiled below, timed in turn
    for width in range(1, max_gamma + 2):
        positions_BW = (lengths_B - 1)[:, None] + jnp.arange(width)[None]
        tokens_BW = jnp.take_along_axis(seq_BS, positions_BW, axis=1)
        calls.append(
            (f"target forward {width} wide", forward, (target, tokens_BW, positions_BW, cache))
        )
    try:
        state = drafter.init(seq_BS, lengths_B, cache_len)
    except Exception:  # noqa: BLE001 - a drafter that needs more than the prompts
        return None
    greedy = SamplingConfig.greedy()
    keys = jax.random.split(jax.random.key(0), b * max_gamma).reshape(b, max_gamma)
    propose = jax.jit(lambda d, k, st, s, n: d.propose(k, st, s, n, greedy).tokens)
    for gamma in range(1, max_gamma + 1):
        one = drafter.with_draft(gamma)
        calls.append(
            (f"gamma {gamma}: drafts", propose, (one, keys[:, :gamma], state, seq_BS, lengths_B))
        )
    # What calling a program with these arguments costs on the host, whatever it does (a
    # model's hundreds of leaves): the loop pays it once per call, not per step.
    calls.append(("dispatch, target", jax.jit(lambda m, t, pos, c: t[0, 0]), calls[0][2]))
    calls.append(("dispatch, drafter", jax.jit(lambda d, k, st, s, n: s[0, 0]), calls[-2][2]))
    # In turn, round after round, after one untimed (compiling) call each: a slow spell
    # of a shared machine slows every part alike, and the fastest of each part's calls
    # is kept.
    seconds, _ = time_interleaved(
        [functools.partial(fn, *args) for _, fn, args in calls], repeats, warmup=1
    )
    best = [min(s) for s in seconds]
    if log:
        for (label, _, _), seconds in zip(calls, best, strict=True):
            log(f"{label}: {1e3 * seconds:.2f} ms (host's share of a call subtracted below)")
    *best, target_host, draft_host = best
    target_s = [max(t - target_host, 1e-6) for t in best[: max_gamma + 1]]
    draft_s = [max(d - draft_host, 1e-6) for d in best[max_gamma + 1 :]]
    return StepCosts(tuple(target_s), tuple(draft_s))
