"""Devices of a chip that is not here: jax's compile-only topologies.

A TPU slice comes from libtpu (``pip install "jax[tpu]"``, which runs on any Linux
host: no TPU is needed to compile for one), a GPU from jax's CUDA plugin
(``pip install "jax[cuda12-local]"``) with the chip's device description. Either
way the devices can only compile: programs are lowered and compiled for them,
never run.
"""

from __future__ import annotations

import functools
import os

from specjax.chips.table import Chip

__all__ = ["ChipUnavailable", "devices"]

_INSTALL = {
    "tpu": 'pip install "jax[tpu]=={v}" (libtpu, any Linux host)',
    "cuda": 'pip install "jax[cuda12-local]=={v}" (jax\'s CUDA plugin; no GPU needed)',
}


class ChipUnavailable(RuntimeError):
    """jax cannot build this chip's devices here; the message says what to install."""


@functools.cache
def devices(chip: Chip) -> tuple:
    """The compile-only jax devices of ``chip``, one per chip of the slice.

    Raises:
        ChipUnavailable: libtpu (TPU) or jax's CUDA plugin (GPU) is missing, or
            cannot describe this chip; the message says what to install.
    """
    import jax
    from jax.experimental import topologies

    # libtpu otherwise asks a TPU VM's metadata server for the slice it runs on, and
    # lets one process at a time load it (a lock file): compiling touches no chip, so
    # several processes may compile at once.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    install = _INSTALL[chip.platform].format(v=jax.__version__)
    try:
        if chip.platform == "tpu":
            topology = topologies.get_topology_desc(
                platform="tpu",
                topology_name=chip.topology,
                chip_config_name=chip.chip_config,
                chips_per_host_bounds=chip.chips_per_host,
                num_slices=1,
                wrap=(False, False, False),
            )
        else:
            topology = topologies.get_topology_desc(
                platform="cuda",
                topology_name="",
                target_config=chip.gpu_spec,
                topology=chip.topology,
            )
    except Exception as e:  # jax raises RuntimeError, ValueError or its own errors here
        raise ChipUnavailable(
            f"cannot compile for {chip.name} here: {_first_line(e)}; install {install}"
        ) from None
    found = tuple(topology.devices)
    if len(found) != chip.devices:
        raise ChipUnavailable(
            f"{chip.name}: jax described {len(found)} devices for topology {chip.topology}, "
            f"expected {chip.devices}"
        )
    return found


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
