"""Choosing γ from step costs measured on this machine and the acceptance the loop sees.

A speculative step with γ drafts costs one proposal of γ drafts and one target forward
``W = γ + 1`` tokens wide, and emits on average

    E(γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} α_i

tokens, where ``α_i`` is the probability that draft ``i`` is accepted given that the
drafts before it were. Plain decoding (γ = 0) costs one forward one token wide per
token. Which γ is fastest therefore depends on the machine (what a W-wide forward
costs against a one-wide one differs between CPUs and precisions) and on the prompt
(the α_i), so it is measured rather than assumed:

* `measure` times the decoders themselves on this machine: plain decoding at every
  width W from 1 to γ_max + 1 (the target's forward cost at W) and speculative
  decoding at every γ (the step cost, less the target's forward at γ + 1, is the
  proposal's cost), and reads the acceptance by position off the largest γ's run
  (``GenerationStats.acceptance_by_position``), with how many drafts it judged there;
* `choose` picks the γ that maximises expected tokens per second, γ = 0 (plain
  decoding) included, and says why; speculation must beat plain decoding by
  ``min_gain`` to be chosen, so a choice is never expected to be slower than plain;
* `CostCache` keeps measured costs in ``<cache>/tuning/``, keyed by the machine, the
  backend, the jax and specjax versions, the models (configuration, precision,
  parameter shapes) and the batch, so that later runs choose for free and a change of any of those
  measures again;
* `tune` puts them together for ``gamma="auto"``, the default of `specjax.Sampler` and
  ``specjax generate``: the cached costs, or a measurement stored for next time, and
  the choice; `Tuned.learn` pools each run's acceptance into the stored one, weighted
  by the drafts each run judged (older runs' weight halves at every run), so that
  one short run cannot swing the next choice.

The output does not depend on the choice's being right: whatever γ is chosen,
decoding at the chosen forward width is exact (`specjax.decoding.numerics`).

Examples:
    >>> from specjax.decoding.cost_model import StepCosts, choose
    >>> costs = StepCosts(target_s=(0.010, 0.011, 0.012), draft_s=(0.001, 0.002))
    >>> choose(costs, acceptance=(0.8, 0.7)).gamma
    2
    >>> choose(StepCosts((0.010, 0.020, 0.030), (0.001, 0.002)), (0.8, 0.7)).gamma
    0
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Choice",
    "CostCache",
    "StepCosts",
    "Tuned",
    "choose",
    "expected_tokens",
    "machine_id",
    "measure",
    "model_id",
    "pair_id",
    "tune",
]

# A stored acceptance's weight (drafts judged) is multiplied by this at each run that
# `Tuned.learn` pools in: the estimate follows what this machine's users decode lately
# (about the last two runs' drafts), while one run moves it only by its share.
DECAY = 0.5

# Speculation is chosen only where it is expected to beat plain decoding by this much:
# the costs are medians of a few runs, and a choice within noise of plain gains
# nothing while it risks a loss.
MIN_GAIN = 1.05


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Measured seconds of one decoding step's parts, at one batch size.

    Attributes:
        target_s: ``target_s[w - 1]``: one target forward ``w`` tokens wide (with the
            loop's own work per step), for ``w`` in ``1..len(target_s)``.
        draft_s: ``draft_s[g - 1]``: one proposal of ``g`` drafts, for ``g`` in
            ``1..len(draft_s)``; ``len(draft_s) + 1 <= len(target_s)``.
    """

    target_s: tuple[float, ...]
    draft_s: tuple[float, ...]

    def __post_init__(self):
        if not self.target_s or any(not (t > 0) for t in self.target_s):
            raise ValueError(f"target_s must be positive seconds, got {self.target_s}")
        if any(not (d >= 0) for d in self.draft_s):
            raise ValueError(f"draft_s must be non-negative seconds, got {self.draft_s}")
        if len(self.draft_s) + 1 > len(self.target_s):
            raise ValueError(
                f"draft_s covers γ up to {len(self.draft_s)}, which needs target_s up to "
                f"width {len(self.draft_s) + 1}; target_s has {len(self.target_s)}"
            )

    @property
    def max_gamma(self) -> int:
        """The largest γ these costs cover."""
        return len(self.draft_s)

    def step_s(self, gamma: int) -> float:
        """Seconds of one step with ``gamma`` drafts (γ = 0: a plain one-wide step)."""
        return self.target_s[gamma] + (self.draft_s[gamma - 1] if gamma else 0.0)

    def to_json(self) -> dict:
        """``{"target_s": [...], "draft_s": [...]}``, as `CostCache` stores it."""
        return {"target_s": list(self.target_s), "draft_s": list(self.draft_s)}

    @classmethod
    def from_json(cls, data: dict) -> StepCosts:
        """The costs `to_json` wrote."""
        return cls(tuple(map(float, data["target_s"])), tuple(map(float, data["draft_s"])))


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `choose` picked, and the numbers it picked it from.

    Attributes:
        gamma: drafts per step; 0 decodes plainly.
        forward_width: W = γ + 1, every target forward's width for the run.
        tokens_per_step: E(γ), expected tokens one step emits.
        expected_speedup: expected tokens per second over plain decoding's.
        speedups: the expected speedup of every γ from 0 to the largest measured.
        reason: one line for users: why this γ.
        acceptance: the α_i by draft position it chose from.
    """

    gamma: int
    forward_width: int
    tokens_per_step: float
    expected_speedup: float
    speedups: tuple[float, ...]
    reason: str
    acceptance: tuple[float, ...]


def expected_tokens(acceptance: Sequence[float], gamma: int) -> float:
    """E(γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} α_i: tokens one step emits on average.

    Args:
        acceptance: α_1, α_2, ...: draft i's acceptance given drafts 1..i-1 were
            accepted, each in [0, 1]; positions past its end count as 0.
        gamma: drafts per step, >= 0.
    """
    total, reach = 1.0, 1.0
    for i in range(gamma):
        reach *= acceptance[i] if i < len(acceptance) else 0.0
        total += reach
    return total


def choose(
    costs: StepCosts,
    acceptance: Sequence[float],
    min_gain: float = MIN_GAIN,
    *,
    forward_width: int | None = None,
) -> Choice:
    """The γ in ``0..costs.max_gamma`` with the most expected tokens per second.

    Args:
        costs: measured step costs (`measure`, or a `CostCache` hit).
        acceptance: α_i by draft position (``GenerationStats.acceptance_by_position``).
        min_gain: a γ > 0 is chosen only if its expected speedup over plain decoding
            is at least this; otherwise γ = 0.
        forward_width: a width W the run is held to (every target forward W wide, so
            that the output equals plain decoding's at W): then γ is at most W - 1 and
            every γ, 0 included, pays a W-wide forward. Default: each γ at γ + 1, and
            γ = 0 at width 1. Speedups are always over plain decoding at width 1.

    Returns:
        The `Choice`, with every γ's expected speedup and the reason in words.

    Raises:
        ValueError: acceptance outside [0, 1], or a ``forward_width`` wider than the
            costs measured.
    """
    alpha = [float(a) for a in acceptance]
    if any(not (0.0 <= a <= 1.0) for a in alpha):
        raise ValueError(f"acceptance must hold probabilities in [0, 1], got {alpha}")
    if forward_width is not None and not 1 <= forward_width <= len(costs.target_s):
        raise ValueError(
            f"forward_width={forward_width}: the costs cover widths 1..{len(costs.target_s)}"
        )
    plain_rate = 1.0 / costs.step_s(0)

    def step_s(g: int) -> float:
        if forward_width is None:
            return costs.step_s(g)
        return costs.target_s[forward_width - 1] + (costs.draft_s[g - 1] if g else 0.0)

    top = costs.max_gamma if forward_width is None else min(costs.max_gamma, forward_width - 1)
    speedups = tuple(expected_tokens(alpha, g) / step_s(g) / plain_rate for g in range(top + 1))
    best = 0
    if top:
        spec = max(range(1, len(speedups)), key=lambda g: (speedups[g], -g))
        if speedups[spec] >= min_gain:
            best = spec
    if best:
        reason = (
            f"gamma {best}: {expected_tokens(alpha, best):.2f} tokens a step expected for "
            f"{step_s(best) / costs.step_s(0):.2f}x a plain step's time, "
            f"{speedups[best]:.2f}x plain"
        )
    elif top:
        width_cost = costs.target_s[spec] / costs.target_s[0]
        reason = (
            f"plain decoding: the best speculation, gamma {spec}, is expected at "
            f"{speedups[spec]:.2f}x plain, under the {min_gain:.2f}x it must reach (a "
            f"{spec + 1}-wide target forward costs {width_cost:.2f}x a one-wide one here, "
            f"and {expected_tokens(alpha, spec):.2f} tokens a step are expected)"
        )
    else:
        reason = "plain decoding: no drafts were measured"
    return Choice(
        gamma=best,
        forward_width=best + 1 if forward_width is None else forward_width,
        tokens_per_step=expected_tokens(alpha, best),
        expected_speedup=speedups[best],
        speedups=speedups,
        reason=reason,
        acceptance=tuple(alpha),
    )


def _specjax_version() -> str:
    """The installed specjax's version (read from its metadata: the decoding layer does
    not import the package above it), or ``"unknown"`` when running from a source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specjax")
    except PackageNotFoundError:
        return "unknown"


def machine_id() -> dict:
    """What makes step costs differ between machines: CPU model, cores, backend, jax."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    devices = jax.devices()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "device": devices[0].device_kind if devices else "",
        "jax": jax.__version__,
    }


def model_id(model) -> str:
    """A fingerprint of a model (or drafter): its class, configuration, precision and
    every parameter's shape and dtype. Changing any of them measures again."""
    leaves = jax.tree_util.tree_flatten_with_path(model)[0]
    parts = [
        type(model).__qualname__,
        repr(getattr(model, "config", None)),
        str(getattr(model, "quantization", None)),
        *(
            f"{jax.tree_util.keystr(path)}:{getattr(x, 'shape', ())}:"
            f"{getattr(x, 'dtype', type(x).__name__)}"
            for path, x in leaves
        ),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def pair_id(target, drafter) -> str:
    """What the acceptance depends on: the target's and the drafter's architectures and
    the drafter's kind, not their precision, batch or machine. A chip's predictions
    (`specjax.chips`) read the acceptance this machine's runs learnt for the same pair."""
    draft_model = getattr(drafter, "model", None)
    parts = [
        repr(dataclasses.replace(target.config, scan_layers=False))
        if dataclasses.is_dataclass(getattr(target, "config", None))
        else type(target).__qualname__,
        type(drafter).__qualname__,
        repr(getattr(draft_model, "config", None)),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class CostCache:
    """Measured `StepCosts` on disk, one JSON file per key, in ``<cache>/tuning/``.

    Args:
        root: the folder; default ``$SPECJAX_TUNING_CACHE``, else ``<specjax
            cache>/tuning`` (`specjax.core.paths`), beside the compiled programs.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        from specjax.core.paths import cache_root

        if root is None:
            env = os.environ.get("SPECJAX_TUNING_CACHE")
            root = env if env else cache_root() / "tuning"
        self.root = Path(root)

    @staticmethod
    def key(**parts) -> str:
        """The key of a measurement: ``machine_id()`` plus the given parts (models'
        `model_id`, batch, the largest γ, ...)."""
        # specjax's version too: a new release may change what a step costs.
        blob = json.dumps(
            {"machine": machine_id(), "specjax": _specjax_version(), **parts},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def path(self, key: str) -> Path:
        """The file of ``key``'s entry."""
        return self.root / f"{key}.json"

    def load(self, key: str) -> tuple[StepCosts, tuple[float, ...], tuple[float, ...]] | None:
        """``(costs, acceptance, judged)`` stored under ``key``, or None (missing or
        unreadable); ``judged``: the drafts behind each position's acceptance."""
        try:
            data = json.loads(self.path(key).read_text())
            acceptance = tuple(map(float, data["acceptance"]))
            judged = tuple(map(float, data["judged"]))
            if len(judged) != len(acceptance):
                return None
            return StepCosts.from_json(data["costs"]), acceptance, judged
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(
        self,
        key: str,
        costs: StepCosts,
        acceptance: Sequence[float],
        judged: Sequence[float] | None = None,
        pair: str | None = None,
    ) -> Path:
        """Writes atomically: a reader sees the old entry or the new one, never a part.

        ``judged`` (default: one each) weighs each position's acceptance; ``pair``
        (`pair_id`) lets `learnt_acceptance` find it for the same models elsewhere."""
        self.root.mkdir(parents=True, exist_ok=True)
        judged = [1.0] * len(acceptance) if judged is None else [float(n) for n in judged]
        if len(judged) != len(acceptance):
            raise ValueError(f"judged has {len(judged)} positions, acceptance {len(acceptance)}")
        data = {
            "machine": machine_id(),
            "costs": costs.to_json(),
            "acceptance": list(acceptance),
            "judged": judged,
        }
        if pair is not None:
            data["pair"] = pair
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.path(key))
        return self.path(key)

    def learnt_acceptance(self, pair: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """``(acceptance, judged)`` learnt for the pair ``pair`` (`pair_id`) at any
        precision and batch on this machine: the entry that judged the most drafts,
        or None where no run decoded that pair."""
        best = None
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else ():
            try:
                data = json.loads(path.read_text())
                if data.get("pair") != pair:
                    continue
                acceptance = tuple(map(float, data["acceptance"]))
                judged = tuple(map(float, data["judged"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if acceptance and (best is None or sum(judged) > sum(best[1])):
                best = (acceptance, judged)
        return best


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
    import time

    from specjax.decoding.api import init, run
    from specjax.decoding.output import result
    from specjax.sampling import SamplingConfig

    greedy = SamplingConfig.greedy()
    max_gamma = drafter.num_draft
    if max_gamma < 1:
        raise ValueError(f"drafter.num_draft must be >= 1 to measure, got {max_gamma}")

    def loop_s(drafter_or_none, width: int):
        """The fastest of ``repeats`` loops: (seconds a step, the last final state)."""
        best, state = float("inf"), None
        for i in range(repeats + 1):  # the first compiles
            decoder, state = jax.block_until_ready(
                init(
                    None, target, prompts, drafter=drafter_or_none,
                    max_new_tokens=max_new_tokens, sampling=greedy, forward_width=width,
                )
            )  # fmt: skip
            start = time.perf_counter()
            state = jax.block_until_ready(run(decoder, state))
            if i:
                best = min(best, time.perf_counter() - start)
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
    from specjax.core.timing import time_runs
    from specjax.decoding.checks import pad_prompts
    from specjax.models.forward import score
    from specjax.sampling import SamplingConfig

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
    for _, fn, args in calls:  # compile, and one untimed call each
        jax.block_until_ready(fn(*args))
    # In turn, round after round: a slow spell of a shared machine slows every part alike,
    # and the fastest of each part's calls is kept.
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, (_, fn, args) in enumerate(calls):
            best[i] = min(best[i], time_runs(fn, *args, repeats=1)[0][0])
    if log:
        for (label, _, _), seconds in zip(calls, best, strict=True):
            log(f"{label}: {1e3 * seconds:.2f} ms (host's share of a call subtracted below)")
    *best, target_host, draft_host = best
    target_s = [max(t - target_host, 1e-6) for t in best[: max_gamma + 1]]
    draft_s = [max(d - draft_host, 1e-6) for d in best[max_gamma + 1 :]]
    return StepCosts(tuple(target_s), tuple(draft_s))


# Tokens per timed run when `tune` measures: enough steps for a stable median, few
# enough that the first ``gamma="auto"`` call stays short on a large target.
TUNE_TOKENS = 16


@dataclasses.dataclass
class Tuned:
    """``gamma="auto"``'s choice for one target, drafter and batch size, the numbers it
    came from, and where they are kept (`tune` makes it).

    Attributes:
        choice: the `Choice` (γ, width, expected speedup, reason).
        costs: the measured `StepCosts`.
        acceptance: α_i by draft position: the choice's, then pooled with every run
            `learn` is given (the next choice's).
        judged: the drafts behind each α_i (their weight when a run is pooled in).
        cache: the `CostCache` holding them.
        key: their key in ``cache``.
        measured: True where this call measured the costs (a cache miss).
        held_width: the forward width the run is held to (`choose`), or ``None``.
    """

    choice: Choice
    costs: StepCosts
    acceptance: tuple[float, ...]
    judged: tuple[float, ...]
    cache: CostCache
    key: str
    measured: bool = False
    held_width: int | None = None
    pair: str | None = None

    @property
    def gamma(self) -> int:
        """The chosen γ (0: plain decoding)."""
        return self.choice.gamma

    @property
    def forward_width(self) -> int:
        """The chosen width of every target forward of the run."""
        return self.choice.forward_width

    def describe(self) -> dict:
        """The choice and its numbers, as plain JSON values."""
        return {
            "gamma": self.choice.gamma,
            "forward_width": self.choice.forward_width,
            "reason": self.choice.reason,
            "expected_speedup": self.choice.expected_speedup,
            "expected_speedup_by_gamma": list(self.choice.speedups),
            "target_forward_seconds_by_width": list(self.costs.target_s),
            "draft_seconds_by_gamma": list(self.costs.draft_s),
            "acceptance_by_position": list(self.choice.acceptance),
            "learnt_acceptance_by_position": list(self.acceptance),
            "drafts_judged_by_position": list(self.judged),
            "measured_now": self.measured,
            "cache": str(self.cache.path(self.key)),
        }

    def review(self, stats) -> dict:
        """The cost model's account of a finished run (``GenerationStats``).

        Every γ's expected speedup from the measured step costs and the acceptance the
        run achieved, at the positions it judged (the others keep the choice's). Beside
        the achieved speedup it says whether the choice was right for this run, and
        whether any γ could have reached a given speedup on this machine.

        Returns:
            ``{"acceptance_by_position", "expected_speedup_by_gamma",
            "expected_speedup"}`` (the last for the chosen γ), plain JSON values.
        """
        reached = np.asarray(stats.position_reached)
        achieved = np.asarray(stats.acceptance_by_position, np.float64)
        alpha = [
            float(achieved[i]) if i < len(reached) and reached[i] > 0 else float(chosen)
            for i, chosen in enumerate(self.choice.acceptance)
        ]
        speedups = choose(self.costs, alpha, 1.0, forward_width=self.held_width).speedups
        return {
            "acceptance_by_position": alpha,
            "expected_speedup_by_gamma": list(speedups),
            "expected_speedup": speedups[self.gamma],
        }

    def learn(self, stats) -> None:
        """Pools the acceptance a run measured (``GenerationStats``) into the stored one,
        for the next choice: at each position the run judged, the stored α_i with its
        weight times `DECAY` and the run's accepted drafts over its judged ones. The
        costs stay as measured. Runs on the host, after the decode."""
        reached = np.asarray(stats.position_reached, np.float64)
        accepted = np.asarray(stats.position_accepted, np.float64)
        alpha, judged = list(self.acceptance), list(self.judged)
        for i in range(min(len(alpha), len(reached))):
            if reached[i] > 0:
                weight = judged[i] * DECAY
                alpha[i] = float((alpha[i] * weight + accepted[i]) / (weight + reached[i]))
                judged[i] = float(weight + reached[i])
        self.acceptance, self.judged = tuple(alpha), tuple(judged)
        self.cache.store(self.key, self.costs, alpha, judged, pair=self.pair)

    def rechoose(self) -> Choice:
        """Chooses again from the costs and the pooled acceptance (`learn`): a
        `specjax.Sampler` does after each run, so its γ follows what it decodes."""
        self.choice = choose(self.costs, self.acceptance, forward_width=self.held_width)
        return self.choice


def tune(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    forward_width: int | None = None,
    cache: CostCache | None = None,
    log=None,
    method: str = "probe",
) -> Tuned:
    """Chooses γ for ``target`` and ``drafter`` on this machine: from the cache, or
    timed once and stored.

    ``method="probe"`` (default) times the step's parts alone (`probe`: seconds, not a
    minute), with the acceptance this machine's runs of the pair learnt (any precision
    or batch, `CostCache.learnt_acceptance`), else `PRIOR_ACCEPTANCE` until a run
    reports its own (`Tuned.learn`). ``"measure"``, or a drafter `probe` cannot time
    alone, times whole decode loops (`measure`).

    Args:
        target: the target model.
        drafter: a chain drafter; its ``num_draft`` is the largest γ considered.
        prompts: token-id prompts of the run; their number is the batch size the
            costs are for (a miss measures on them).
        forward_width: the width the run is held to, if any (`choose`); one wider than
            every γ measured costs each γ at its own width.
        cache: where costs are kept; default `CostCache()`.
        log: optional ``log(str)``: what is measured and why, one line each.

    Returns:
        The `Tuned` choice. Decode with ``drafter.with_draft(t.gamma)`` at width
        ``t.forward_width``, or plainly (`specjax.generate`) where ``t.gamma == 0``.
    """
    cache = CostCache() if cache is None else cache
    key = cache.key(
        target=model_id(target), drafter=model_id(drafter), batch=len(prompts),
        max_gamma=drafter.num_draft,
    )  # fmt: skip
    hit = cache.load(key)
    measured = hit is None
    pair = pair_id(target, drafter)
    if measured:
        gamma = drafter.num_draft
        costs = None
        if method == "probe":
            if log:
                log(
                    f"timing the target's forward at widths 1..{gamma + 1} and the drafts at "
                    f"gamma 1..{gamma} on this machine, once (kept in {cache.root})"
                )
            costs = probe(target, drafter, prompts, log=log)
        if costs is not None:
            hit = (costs, *_starting_acceptance(cache, pair, gamma))
        else:
            if log:
                log(
                    f"timing plain decoding at widths 1..{gamma + 1} and speculation at "
                    f"gamma 1..{gamma} on this machine, once (kept in {cache.root})"
                )
            hit = measure(target, drafter, prompts, max_new_tokens=TUNE_TOKENS, repeats=2, log=log)
        cache.store(key, *hit, pair=pair)
    if forward_width is not None and forward_width > drafter.num_draft + 1:
        forward_width = None  # wider than any γ measured: each γ costed at its own width
    choice = choose(*hit[:2], forward_width=forward_width)
    if choice.gamma == 0 and drafter.num_draft and not any(hit[2]):
        # No run of this pair has reported its acceptance yet (a prior stands in), and
        # plain decoding would never report one: draft once, the γ best at the prior.
        explore = choose(*hit[:2], min_gain=0.0, forward_width=forward_width)
        reason = f"{explore.reason} (this pair's first run here drafts, to learn its acceptance)"
        choice = dataclasses.replace(explore, reason=reason)
    return Tuned(
        choice,
        *hit,
        cache=cache,
        key=key,
        measured=measured,
        held_width=forward_width,
        pair=pair,
    )


# The acceptance by position assumed before any run of a pair on this machine reported
# its own (`tune` with a probe): a middling drafter's. It weighs nothing against a run's
# (judged 0), so the first run replaces it.
PRIOR_ACCEPTANCE = 0.7


def _starting_acceptance(cache: CostCache, pair: str, gamma: int):
    """``(acceptance, judged)`` for ``gamma`` positions: learnt for the pair, else the prior."""
    learnt = cache.learnt_acceptance(pair)
    alpha, judged = learnt if learnt is not None else ((), ())
    alpha = tuple(alpha[:gamma]) + (PRIOR_ACCEPTANCE,) * max(0, gamma - len(alpha))
    judged = tuple(judged[:gamma]) + (0.0,) * max(0, gamma - len(judged))
    return alpha, judged
