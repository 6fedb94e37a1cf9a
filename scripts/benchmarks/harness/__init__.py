"""The benchmarks' shared library: what a results file records, how it is written, its
markdown tables, and the progress log.

A plain package beside the benchmark scripts, not part of the installed ``specjax``: a
script run as ``python scripts/benchmarks/NAME.py`` finds it on its own folder's path.
It imports jax only inside `machine_info`, so a coordinator that starts peers in other
processes stays light. Timing is `specjax.core.timing`'s, shared with ``specjax
generate``. The peers run in processes of their own: ``harness/hf_worker.py``
(transformers) and ``harness/llamacpp_worker.py`` (llama.cpp).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout
RESULTS = ROOT / "scripts" / "benchmarks" / "results"  # one folder per benchmark
if str(ROOT) not in sys.path:  # run from a checkout without installing: last, so that an
    sys.path.append(str(ROOT))  # installed specjax or one on PYTHONPATH comes first


def logger(name: str) -> Callable[[str], None]:
    """``log(msg)``: ``[name  12.3 s] msg`` on stderr, the seconds since this call."""
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{name} {time.perf_counter() - start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    return log


def cpu_name() -> str:
    """The CPU's model name: ``lscpu``'s, else `platform.processor`'s."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_info() -> dict:
    """The CPU, cores, load, accelerator, jax's platform and the libraries' versions
    (read from their metadata, not imported; left out where not installed)."""
    import jax

    devices = jax.devices()
    info = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": devices[0].platform,
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    for name in ("jaxlib", "torch", "transformers", "llama_cpp_python"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info[name] = metadata.version(name)
    return info


def commit() -> str:
    """The checkout's commit, marked when tracked files differ from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    found = head.stdout.strip() or "unknown"
    return found + (" (with uncommitted changes)" if changed.stdout.strip() else "")


def run_record(argv: Sequence[str] | None = None) -> dict:
    """``{"date", "commit", "command", "machine"}`` of the running script (``argv``:
    its arguments, default ``sys.argv[1:]``)."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit(),
        "command": " ".join(["python", str(script), *args]),
        "machine": machine_info(),
    }


def write_results(path: Path, results: dict, argv: Sequence[str] | None = None) -> Path:
    """Writes ``results`` as JSON to ``path``, after the run's `run_record` (date, commit,
    command, machine with jax's version); the folder is made where missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**run_record(argv), **results}, indent=1, default=str) + "\n")
    return path


def _cell(value, spec: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def table(rows: Sequence[dict], columns: Sequence[str | tuple[str, str]]) -> str:
    """A markdown table of ``rows``: one column per ``key`` or ``(key, format spec)``,
    headed by the key; None shows as a dash."""
    columns = [(c, "") if isinstance(c, str) else c for c in columns]
    lines = ["| " + " | ".join(k for k, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(k), spec) for k, spec in columns) + " |")
    return "\n".join(lines)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length where one
    is a prefix of the other), or None where they are equal."""
    diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return min(len(a), len(b)) if diff is None and len(a) != len(b) else diff
