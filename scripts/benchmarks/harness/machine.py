"""What machine a benchmark ran on, for its report."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess

import jax


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
    """The CPU, core count, load, JAX platform and library versions (torch included)."""
    import torch
    import transformers

    return {
        "cpu": cpu_name("unknown"),
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": jax.devices()[0].platform,
        "jax": jax.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
