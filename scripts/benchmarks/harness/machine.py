"""What machine, commit and command a benchmark ran on, for its results file.

Every results file under ``scripts/benchmarks/results/`` records `run_record`: the
date, the commit, the command, and `machine_info` (the CPU, the accelerator, jax's
version).
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[3]  # the checkout
RESULTS = ROOT / "scripts" / "benchmarks" / "results"  # one folder per benchmark


def cpu_name(unknown: str = "unknown CPU") -> str:
    """The CPU's model name.

    Args:
        unknown: what to return when neither ``lscpu`` nor `platform.processor`
            names it.

    Returns:
        The first ``Model name:`` of ``lscpu``, else `platform.processor`, else
        ``unknown``.
    """
    # platform.processor() is often just the architecture ("x86_64"): lscpu first.
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or unknown


def machine_info() -> dict:
    """The CPU, core count, load, accelerator, JAX platform and library versions.

    torch's and transformers' versions are read from their installed metadata (not
    imported), and left out where they are not installed.
    """
    devices = jax.devices()
    info = {
        "cpu": cpu_name("unknown"),
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": devices[0].platform,
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    for name in ("jaxlib", "torch", "transformers"):
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


def run_record(argv: list[str] | None = None) -> dict:
    """``{"date", "commit", "command", "machine"}`` of the running script.

    Args:
        argv: the script's arguments (default ``sys.argv[1:]``).
    """
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    args = sys.argv[1:] if argv is None else argv
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit(),
        "command": " ".join(["python", str(script), *args]),
        "machine": machine_info(),
    }
