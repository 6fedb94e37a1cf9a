"""What a compiled program reads and computes, from its optimized HLO text.

XLA's own ``cost_analysis()`` is not enough to predict a decode step on a chip: it
counts a ``while`` loop's body once whatever its trip count (a draft model's γ - 1
steps are one), counts on-chip memory (a TPU's VMEM) as if it were HBM, is absent for
GPUs, and its ``optimal_seconds`` can be negative. `program_cost` walks the program
itself:

* **HBM bytes**: each instruction's operands and results that live in the device's
  main memory (a TPU layout's ``S(n)`` memory spaces are on-chip and not counted),
  with what XLA reads and writes in place counted as such: a fusion that only
  slices an operand reads the slices, an in-place ``dynamic-update-slice`` or
  ``scatter`` writes the update, an asynchronous copy into on-chip memory reads its
  source once;
* **flops**: ``2 · M · N · K`` of every dot (inside fusions too), the rest being
  small next to them in a decoder;
* loops multiplied by XLA's ``known_trip_count``, and a ``conditional`` costed as
  its dearest branch (the step's refill of a finished row, when it runs);
* the instructions that cost most, each with the jax operation that made it
  (``op_name``), so that a step reading more than it must names its culprit.

`host_transfers` lists what in a program's loops talks to the host (callbacks,
infeed/outfeed, send/recv, host memory), which a decode loop must not do.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from specjax.chips.hlo import program_cost
    >>> x = jnp.ones((64, 32), jnp.float32)
    >>> text = jax.jit(lambda a: a @ a.T).lower(x).compile().as_text()
    >>> cost = program_cost(text)
    >>> cost.flops  # 2 * 64 * 64 * 32
    262144.0
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict

__all__ = ["OpCost", "ProgramCost", "host_transfers", "loop_cost", "program_cost"]

_ITEM_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# Costless: they name, regroup or reinterpret buffers that exist already.
_FREE = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "opt-barrier",
        "partition-id",
        "replica-id",
        "iota",
        "add-dependency",
        "domain",
    }
)
_SLICING = frozenset({"dynamic-slice", "slice", "gather"})
# Written in place into their first operand: the operand index of what they write.
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}
_HOST_OPS = frozenset({"infeed", "outfeed", "send", "recv", "send-done", "recv-done"})
_HOST_TARGETS = re.compile(r"callback|host|MoveTo", re.IGNORECASE)
_HOST_MEMORY_SPACE = "5"


@dataclasses.dataclass(frozen=True)
class _Instr:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    args: str
    attrs: str
    is_root: bool

    def attr(self, key: str) -> str | None:
        match = re.search(rf"\b{key}=%?([\w.\-]+)", self.attrs)
        return match.group(1) if match else None

    @property
    def op_name(self) -> str:
        match = re.search(r'op_name="([^"]*)"', self.attrs)
        return match.group(1) if match else ""


@dataclasses.dataclass(frozen=True)
class OpCost:
    """One instruction's share of a program's cost (already times its loops' trips).

    Attributes:
        hbm_bytes: bytes it moves to or from HBM.
        flops: floating-point (or integer multiply-add) operations of its dots.
        instruction: its HLO name (``fusion.12``).
        opcode: its HLO opcode.
        shape: its result's HLO type.
        op_name: the jax operation that made it (``jit(f)/.../dot_general``).
        trips: how many times it runs per program run.
    """

    hbm_bytes: float
    flops: float
    instruction: str
    opcode: str
    shape: str
    op_name: str
    trips: int

    def describe(self) -> str:
        """One line: bytes, trips, the instruction and the jax operation."""
        trips = f" x{self.trips}" if self.trips != 1 else ""
        where = f" ({self.op_name})" if self.op_name else ""
        return (
            f"{self.hbm_bytes / 1e6:.1f} MB{trips}: {self.opcode} {self.instruction} "
            f"{self.shape[:80]}{where}"
        )


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """A compiled program's predicted cost on its device, per run.

    Attributes:
        hbm_bytes: bytes moved to or from HBM.
        flops: operations of its dots.
        ops: every costed instruction, dearest first.
    """

    hbm_bytes: float
    flops: float
    ops: tuple[OpCost, ...]

    def top(self, n: int = 5) -> tuple[OpCost, ...]:
        """The ``n`` instructions that move the most bytes."""
        return self.ops[:n]


def _array_bytes(shape: str, *, hbm_only: bool = True) -> float:
    """Bytes of every array in an HLO type; by default only those in main memory."""
    total = 0.0
    for dtype, dims, layout in _ARRAY.findall(shape):
        space = _MEMORY_SPACE.search(layout or "")
        if hbm_only and space and space.group(1) != "0":
            continue
        n = math.prod(int(d) for d in dims.split(",") if d)
        total += _ITEM_BYTES.get(dtype, 4) * n
    return total


def _dims(shape: str) -> list[int]:
    match = _ARRAY.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def _split_shape(text: str) -> tuple[str, str]:
    """``(type, rest)`` of ``TYPE opcode(...)...``; a tuple type is balanced."""
    if text.startswith("("):
        depth = 0
        for i, c in enumerate(text):
            depth += c == "("
            depth -= c == ")"
            if depth == 0:
                return text[: i + 1], text[i + 1 :].lstrip()
    head, _, rest = text.partition(" ")
    return head, rest


def _parse_instruction(line: str) -> _Instr | None:
    text = line.strip()
    is_root = text.startswith("ROOT ")
    if is_root:
        text = text[5:]
    if not text.startswith("%") or " = " not in text:
        return None
    name, text = text.split(" = ", 1)
    shape, text = _split_shape(text)
    match = re.match(r"([\w\-]+)\(", text)
    if not match:
        return None
    opcode = match.group(1)
    depth, end = 0, len(text)
    for i in range(len(opcode), len(text)):
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            end = i
            break
    args = text[len(opcode) + 1 : end]
    operands = tuple(token.split()[-1].lstrip("%") for token in args.split(",") if "%" in token)
    return _Instr(name.lstrip("%"), shape, opcode, operands, args, text[end + 1 :], is_root)


def _parse(text: str) -> tuple[dict[str, list[_Instr]], str]:
    """``({computation: instructions}, entry computation)`` of an HLO module's text."""
    computations: dict[str, list[_Instr]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if line and not line[0].isspace():
            match = re.match(r"(ENTRY )?%?([\w.\-]+) ", line)
            current = None
            if match and line.rstrip().endswith("{"):
                current = match.group(2)
                computations[current] = []
                entry = current if match.group(1) else entry
            continue
        if current is not None:
            instr = _parse_instruction(line)
            if instr is not None:
                computations[current].append(instr)
    if not entry:
        raise ValueError("not an HLO module's text: no ENTRY computation")
    return computations, entry


def _trip_count(instr: _Instr) -> int:
    match = re.search(r'"known_trip_count":\{"n":"(\d+)"', instr.attrs)
    return int(match.group(1)) if match else 1


def _branches(instr: _Instr) -> list[str]:
    match = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
    if match:
        return [b.strip().lstrip("%") for b in match.group(1).split(",")]
    return [b for b in (instr.attr("true_computation"), instr.attr("false_computation")) if b]


class _Walker:
    def __init__(self, text: str):
        self.computations, self.entry = _parse(text)
        self.shapes = {
            name: {i.name: i.shape for i in instrs} for name, instrs in self.computations.items()
        }

    def operand_bytes(self, computation: str, operand: str) -> float:
        return _array_bytes(self.shapes[computation].get(operand, ""))

    def dot_flops(self, computation: str, instr: _Instr) -> float:
        out = math.prod(_dims(instr.shape))
        if instr.opcode == "dot":
            lhs = _dims(self.shapes[computation].get(instr.operands[0], ""))
            match = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instr.attrs)
            axes = [int(a) for a in match.group(1).split(",") if a] if match else []
        else:  # a library gemm (custom-call): its dimensions are in its backend config
            lhs = _dims(self.shapes[computation].get(instr.operands[0], ""))
            match = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instr.attrs)
            axes = [int(json.loads(a)) for a in match.group(1).split(",") if a] if match else []
        k = math.prod(lhs[a] for a in axes if a < len(lhs))
        return 2.0 * out * k

    def fusion_flops(self, computation: str) -> float:
        total = 0.0
        for instr in self.computations.get(computation, ()):
            if instr.opcode == "dot":
                total += self.dot_flops(computation, instr)
            elif instr.opcode == "fusion":
                total += self.fusion_flops(instr.attr("calls") or "")
        return total

    def fusion_bytes(self, computation: str, instr: _Instr) -> float:
        """A fusion's HBM traffic: what it reads of each operand and what it writes."""
        body_name = instr.attr("calls") or ""
        body = self.computations.get(body_name, [])
        by_name = {i.name: i for i in body}
        users = defaultdict(list)
        for i in body:
            for operand in i.operands:
                users[operand].append(i)
        params = {i.name: int(i.args) for i in body if i.opcode == "parameter"}
        root = next((i for i in body if i.is_root), None)
        updates = []
        if root is not None and root.opcode in _IN_PLACE:
            updates = [root]
        elif root is not None and root.opcode == "tuple":
            tuple_parts = (by_name.get(o, root) for o in root.operands)
            updates = [part for part in tuple_parts if part.opcode in _IN_PLACE]
        in_place = {u.operands[0] for u in updates}
        read = 0.0
        for name, index in params.items():
            if name in in_place or index >= len(instr.operands):
                continue
            outer = self.operand_bytes(computation, instr.operands[index])
            if outer:
                read += min(outer, self.read_of(body_name, name, users))
        write = _array_bytes(instr.shape)
        for update in updates:
            whole = _array_bytes(update.shape, hbm_only=False)
            new = update.operands[_IN_PLACE[update.opcode]]
            part = _array_bytes(by_name[new].shape if new in by_name else "", hbm_only=False)
            write -= min(write, whole - part)
        return read + write

    def read_of(self, computation: str, value: str, users=None, depth: int = 0) -> float:
        """Bytes a fusion's computation reads of ``value``: its slices where every use
        slices it (through bitcasts and nested fusions), else all of it."""
        if users is None:
            users = defaultdict(list)
            for i in self.computations.get(computation, ()):
                for operand in i.operands:
                    users[operand].append(i)
        whole = _array_bytes(self.shapes[computation].get(value, ""), hbm_only=False)
        uses = users.get(value, [])
        roots = [i for i in self.computations.get(computation, ()) if i.is_root]
        leaves = any(
            r.name == value or (r.opcode in ("tuple", "bitcast") and value in r.operands)
            for r in roots
        )
        if depth > 8 or leaves:
            return whole  # it leaves the computation whole (or the walk is too deep)
        if not uses:
            return 0.0
        total = 0.0
        for use in uses:
            if use.opcode in _SLICING and use.operands[0] == value:
                total += _array_bytes(use.shape, hbm_only=False)
            elif use.opcode == "bitcast":
                total += self.read_of(computation, use.name, users, depth + 1)
            elif use.opcode == "fusion" and use.attr("calls") in self.computations:
                inner = use.attr("calls")
                index = use.operands.index(value)
                params = {
                    int(i.args): i.name for i in self.computations[inner] if i.opcode == "parameter"
                }
                param = params.get(index)
                total += whole if param is None else self.read_of(inner, param, None, depth + 1)
            else:
                return whole
        return min(total, whole)

    def instr_bytes(self, computation: str, instr: _Instr) -> float:
        op = instr.opcode
        if op == "fusion":
            return self.fusion_bytes(computation, instr)
        if op == "copy-start":  # an asynchronous copy between memories: source to target
            return self.operand_bytes(computation, instr.operands[0]) + _array_bytes(
                _split_shape(instr.shape[1:])[0]
            )
        if op == "slice-start":  # reads one slice of its source
            inner = instr.shape[1:-1]
            source, rest = _split_shape(inner)
            target = _split_shape(rest.lstrip(", "))[0]
            moved = _array_bytes(target, hbm_only=False)
            return moved * (bool(_array_bytes(source)) + bool(_array_bytes(target)))
        if op in _IN_PLACE:  # updates its operand in place: reads and writes the update
            return 2 * self.operand_bytes(computation, instr.operands[_IN_PLACE[op]])
        if op in _SLICING:
            return 2 * _array_bytes(instr.shape)
        operands = sum(self.operand_bytes(computation, o) for o in instr.operands)
        return _array_bytes(instr.shape) + operands

    def walk(self, computation: str, trips: int, rows: list[OpCost]) -> tuple[float, float]:
        hbm, flops = 0.0, 0.0
        for instr in self.computations.get(computation, ()):
            op = instr.opcode
            if op in _FREE or op.endswith("-done"):
                continue
            if op == "while":
                b, f = self.walk(instr.attr("body") or "", trips * _trip_count(instr), rows)
                hbm, flops = hbm + b, flops + f
                continue
            if op == "conditional":
                costs = []
                for branch in _branches(instr):
                    branch_rows: list[OpCost] = []
                    costs.append((*self.walk(branch, trips, branch_rows), branch_rows))
                if costs:
                    b, f, branch_rows = max(costs, key=lambda c: (c[0], c[1]))
                    rows.extend(branch_rows)
                    hbm, flops = hbm + b, flops + f
                continue
            if op == "call" or op == "async-start":
                called = instr.attr("to_apply") or instr.attr("calls")
                if called in self.computations:
                    b, f = self.walk(called, trips, rows)
                    hbm, flops = hbm + b, flops + f
                    continue
            b = self.instr_bytes(computation, instr) * trips
            f = 0.0
            if op == "dot" or (op == "custom-call" and "gemm" in instr.attrs.lower()):
                f = self.dot_flops(computation, instr) * trips
            elif op == "fusion":
                f = self.fusion_flops(instr.attr("calls") or "") * trips
            rows.append(OpCost(b, f, instr.name, op, instr.shape, instr.op_name, trips))
            hbm, flops = hbm + b, flops + f
        return hbm, flops


def program_cost(hlo_text: str) -> ProgramCost:
    """The HBM bytes and dot flops of one run of a compiled program.

    Args:
        hlo_text: ``compiled.as_text()`` of a jax ``Compiled`` (optimized HLO).

    Returns:
        The `ProgramCost`, its instructions dearest first.
    """
    walker = _Walker(hlo_text)
    rows: list[OpCost] = []
    hbm, flops = walker.walk(walker.entry, 1, rows)
    ops = tuple(sorted(rows, key=lambda r: (-r.hbm_bytes, -r.flops, r.instruction)))
    return ProgramCost(hbm_bytes=hbm, flops=flops, ops=ops)


def loop_cost(hlo_text: str) -> ProgramCost:
    """The cost of one trip of the program's dearest top-level ``while`` loop.

    What a step costs inside the decode loop, where XLA lays the loop-carried state
    out for the body: a step compiled on its own would also pay, at its entry and
    exit, conversions between the caller's layouts and the body's.

    Raises:
        ValueError: the program has no top-level ``while`` loop.
    """
    walker = _Walker(hlo_text)
    best = None
    for instr in walker.computations[walker.entry]:
        if instr.opcode != "while":
            continue
        rows: list[OpCost] = []
        hbm, flops = walker.walk(instr.attr("body") or "", 1, rows)
        if best is None or hbm > best.hbm_bytes:
            ops = tuple(sorted(rows, key=lambda r: (-r.hbm_bytes, -r.flops, r.instruction)))
            best = ProgramCost(hbm_bytes=hbm, flops=flops, ops=ops)
    if best is None:
        raise ValueError("the program has no top-level while loop")
    return best


def host_transfers(hlo_text: str) -> list[str]:
    """The instructions inside the program's loops that exchange data with the host.

    Host callbacks (``jax.debug.print``, ``io_callback``, ``pure_callback``),
    infeed/outfeed, send/recv and buffers in host memory. A decode loop must hold
    none: each would stop the device at every step.

    Returns:
        One line per instruction found (empty when there is none).
    """
    walker = _Walker(hlo_text)
    found: list[str] = []
    seen: set[str] = set()

    def visit(computation: str, in_loop: bool):
        if (computation, in_loop) in seen:
            return
        seen.add((computation, in_loop))
        for instr in walker.computations.get(computation, ()):
            host_space = any(
                (_MEMORY_SPACE.search(layout or "") or [None, "0"])[1] == _HOST_MEMORY_SPACE
                for _, _, layout in _ARRAY.findall(instr.shape)
            )
            target = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
            host_call = instr.opcode == "custom-call" and bool(
                target and _HOST_TARGETS.search(target.group(1))
            )
            if in_loop and (instr.opcode in _HOST_OPS or host_call or host_space):
                found.append(f"{instr.opcode} {instr.name} {instr.shape[:60]} ({instr.op_name})")
            for key in ("body", "condition", "calls", "to_apply"):
                called = instr.attr(key)
                if called in walker.computations:
                    visit(called, in_loop or instr.opcode == "while")
            for branch in _branches(instr) if instr.opcode == "conditional" else ():
                visit(branch, in_loop)

    visit(walker.entry, False)
    return found
