"""One program compiled for a chip, and what the compiled program says about itself.

`lower_program` lowers a jax function over abstract arguments (shapes, dtypes and
shardings on the chip's devices: `abstract`) and `compile_all` compiles such
programs for the chip, keeping what a user needs of each (`Analysis`): the bytes per
device (``memory_analysis``), the HBM traffic and its dearest instructions
(`specjax.chips.hlo`), XLA's own time estimate, and any host transfer inside its loops.

A compile for a chip cannot be kept in jax's persistent compilation cache (an
executable for devices that are not here cannot be loaded back), so the analyses are
kept instead, in ``<specjax cache>/chips/``, keyed by the lowered program's text, the
chip and the jax, jaxlib and libtpu versions: a second call for the same program
lowers it (seconds), finds its analysis and compiles nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import jax
import numpy as np

from specjax.chips.flops import dot_flops
from specjax.chips.hlo import host_transfers, loop_cost, program_cost
from specjax.chips.table import Chip
from specjax.core.timing import Stopwatch

__all__ = [
    "Analysis",
    "AnalysisCache",
    "OutOfMemory",
    "Program",
    "abstract",
    "compile_all",
    "lower_program",
]

# Instructions kept in an analysis, dearest first: enough to name what a step reads.
_TOP_OPS = 8
# The version of how a compiled program is read (`specjax.chips.hlo`): part of the
# cache key, so that analyses kept by an older reader are read again.
READER = 2


class OutOfMemory(Exception):
    """The compiler refused a program that does not fit the chip's memory.

    Attributes:
        program: which program (``"init"``, ``"run"``, ``"step gamma=2"``).
        needed_bytes: what the compiler said it needs, or None if it did not say.
        available_bytes: what it said the chip has, or None.
        detail: the compiler's message, first line.
    """

    def __init__(self, program: str, detail: str):
        super().__init__(f"{program}: {detail}")
        self.program, self.detail = program, detail
        sizes = re.findall(r"\(([\d.]+)([KMGT])\)", detail)
        scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        values = [float(n) * scale[u] for n, u in sizes]
        self.needed_bytes = int(values[0]) if len(values) >= 2 else None
        self.available_bytes = int(values[1]) if len(values) >= 2 else None


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What one compiled program says about itself, per device.

    Attributes:
        program: its name.
        argument_bytes: its inputs.
        output_bytes: its outputs.
        alias_bytes: outputs written over donated inputs (not held twice).
        temp_bytes: its scratch buffers.
        peak_bytes: all of them held at once: arguments, outputs not aliased, scratch
            and code.
        hbm_bytes: HBM traffic of one run (`specjax.chips.hlo.program_cost`), or of one
            trip of its loop (`specjax.chips.hlo.loop_cost`).
        top_ops: its dearest instructions, one line each.
        xla_seconds: XLA's own estimate of one run (``cost_analysis``'s
            ``optimal_seconds``; TPUs only), or None where it gives none or a
            negative one.
        host_transfers: host transfers inside its loops (`specjax.chips.hlo`).
        compile_seconds: how long the compile took (0 where the analysis was cached).
        cached: read from the cache instead of compiled.
    """

    program: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    peak_bytes: int
    hbm_bytes: float
    top_ops: tuple[str, ...]
    xla_seconds: float | None
    host_transfers: tuple[str, ...]
    compile_seconds: float
    cached: bool = False

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _versions() -> dict:
    found = {"jax": jax.__version__, "jaxlib": jax.lib.__version__}
    for dist in ("libtpu", "jax-cuda12-plugin", "specjax"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


class AnalysisCache:
    """`Analysis` objects on disk, one JSON file each, keyed by program and chip.

    Args:
        root: the folder; default ``$SPECJAX_CHIP_CACHE``, else ``<specjax
            cache>/chips`` (`specjax.core.paths`); ``"off"`` keeps nothing.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        from specjax.core.paths import cache_root

        if root is None:
            root = os.environ.get("SPECJAX_CHIP_CACHE") or cache_root() / "chips"
        self.root = None if str(root).lower() in ("off", "0", "no", "false") else Path(root)

    @staticmethod
    def key(lowered_text: str, chip: Chip, program: str) -> str:
        parts = {"chip": dataclasses.asdict(chip), "program": program, "reader": READER}
        blob = json.dumps({**parts, **_versions()})
        digest = hashlib.sha256(blob.encode())
        digest.update(lowered_text.encode())
        return digest.hexdigest()[:32]

    def load(self, key: str) -> Analysis | OutOfMemory | None:
        if self.root is None:
            return None
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
            if "out_of_memory" in data:
                return OutOfMemory(data["program"], data["out_of_memory"])
            data["top_ops"] = tuple(data["top_ops"])
            data["host_transfers"] = tuple(data["host_transfers"])
            return dataclasses.replace(Analysis(**data), cached=True, compile_seconds=0.0)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: str, value: Analysis | OutOfMemory) -> None:
        if self.root is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if isinstance(value, OutOfMemory):
            data = {"program": value.program, "out_of_memory": value.detail}
        else:
            data = value.to_json()
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.root / f"{key}.json")


def abstract(tree, sharding):
    """``tree`` with every array leaf a ``jax.ShapeDtypeStruct`` on ``sharding``.

    Leaves that already carry a sharding (a model placed by
    `specjax.models.sharding.shard_model`) keep it; other leaves are left as they are.
    """

    def leaf(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x if x.sharding is not None else _with(x, sharding)
        if isinstance(x, (jax.Array, np.ndarray)):
            return _with(x, sharding)
        return x

    return jax.tree.map(leaf, tree)


def _with(x, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


@dataclasses.dataclass
class Program:
    """A program lowered for a chip, to compile (`compile_all`).

    Attributes:
        name: its name in messages (``"init"``, ``"run"``, ``"step gamma=2"``).
        lowered: the jax ``Lowered`` program.
        key: its key in the `AnalysisCache`.
        found: its cached `Analysis` (or the compiler's refusal), or None.
        flops: its products' operations (`specjax.chips.flops`), where asked for.
        per_trip: its cost is one trip of its top-level loop (`specjax.chips.hlo.loop_cost`).
    """

    name: str
    lowered: object
    key: str
    found: Analysis | OutOfMemory | None
    flops: float = 0.0
    per_trip: bool = False


def lower_program(
    name: str,
    fn: Callable,
    args: tuple,
    *,
    chip: Chip,
    donate_argnums: tuple[int, ...] = (),
    cache: AnalysisCache,
    flops: bool = False,
    per_trip: bool = False,
) -> Program:
    """Lowers ``fn(*args)`` for ``chip`` (args abstract on its devices: `abstract`) and
    looks its analysis up in ``cache``; ``flops``: count its products too; ``per_trip``:
    its HBM traffic is one trip of its top-level loop."""
    traced = jax.jit(fn, donate_argnums=donate_argnums).trace(*args)
    lowered = traced.lower()
    key = AnalysisCache.key(lowered.as_text(), chip, f"{name} per_trip={per_trip}")
    count = dot_flops(traced.jaxpr) if flops else 0.0
    return Program(name, lowered, key, cache.load(key), count, per_trip)


def compile_all(
    programs: list[Program], *, cache: AnalysisCache, workers: int = 1, log=None
) -> dict[str, Analysis | OutOfMemory]:
    """Compiles every program whose analysis is not cached, ``workers`` at a time.

    Returns:
        ``{name: Analysis}``, or the `OutOfMemory` refusal for a program the compiler
        refused for the chip's memory. Any other compile error is raised.
    """
    out = {p.name: p.found for p in programs if p.found is not None}
    todo = [p for p in programs if p.found is None]
    if log and len(out):
        log(f"{len(out)} program(s) analysed before, read from {cache.root}")

    def one(p: Program):
        clock = Stopwatch()
        try:
            compiled = p.lowered.compile()
        except Exception as e:  # XlaRuntimeError: the compiler's own error type
            message = str(e)
            if "RESOURCE_EXHAUSTED" not in message and "out of memory" not in message.lower():
                raise
            return p, OutOfMemory(p.name, _memory_line(message))
        return p, _analyse(p.name, compiled, clock.elapsed(), p.per_trip)

    with _no_persistent_cache():
        if workers > 1 and len(todo) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(workers) as pool:
                results = pool.map(one, todo)
                for p, result in results:
                    out[p.name] = _done(p, result, cache, log)
        else:
            for p in todo:
                out[p.name] = _done(p, one(p)[1], cache, log)
    return out


def _done(p: Program, result, cache: AnalysisCache, log):
    cache.store(p.key, result)
    if log:
        what = "does not fit" if isinstance(result, OutOfMemory) else "compiled"
        seconds = "" if isinstance(result, OutOfMemory) else f" in {result.compile_seconds:.1f} s"
        log(f"{p.name}: {what}{seconds}")
    return result


def _memory_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if "exceeds" in line or "Ran out of memory" in line or "RESOURCE_EXHAUSTED" in line:
            return line[:400]
    return lines[0][:400] if lines else "out of memory"


def _analyse(program: str, compiled, seconds: float, per_trip: bool) -> Analysis:
    memory = compiled.memory_analysis()
    arguments = int(memory.argument_size_in_bytes)
    outputs = int(memory.output_size_in_bytes)
    aliased = int(memory.alias_size_in_bytes)
    temp = int(memory.temp_size_in_bytes)
    code = int(memory.generated_code_size_in_bytes)
    text = compiled.as_text()
    cost = loop_cost(text) if per_trip else program_cost(text)
    xla = compiled.cost_analysis()
    if isinstance(xla, (list, tuple)):  # older jax: one dict per device
        xla = xla[0] if xla else None
    optimal = (xla or {}).get("optimal_seconds")
    return Analysis(
        program=program,
        argument_bytes=arguments,
        output_bytes=outputs,
        alias_bytes=aliased,
        temp_bytes=temp,
        peak_bytes=arguments + outputs - aliased + temp + code,
        hbm_bytes=float(cost.hbm_bytes),
        top_ops=tuple(op.describe() for op in cost.top(_TOP_OPS)),
        xla_seconds=float(optimal) if optimal is not None and optimal > 0 else None,
        host_transfers=tuple(host_transfers(text)),
        compile_seconds=seconds,
    )


class _no_persistent_cache:
    """jax's persistent cache off while compiling for a chip: it would write
    executables that no process here can load back (and warn at every later read)."""

    def __enter__(self):
        self.was = jax.config.jax_enable_compilation_cache
        jax.config.update("jax_enable_compilation_cache", False)

    def __exit__(self, *exc):
        jax.config.update("jax_enable_compilation_cache", self.was)
