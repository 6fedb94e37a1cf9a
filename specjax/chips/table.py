"""The chips `specjax.chips` compiles for, and the figures its predictions read.

Each `Chip` names a slice a user can rent (``v5e-1`` is Colab's TPU), how jax builds
its devices without the hardware (a TPU topology from libtpu, or a GPU target
description), and per chip: the HBM a program may use, the HBM bandwidth and the peak
dense FLOP/s, each from the vendor's published specifications (``source``). A step's
predicted time is the larger of its bytes over the bandwidth and its flops over the
peak (`specjax.chips.predict`).

Examples:
    >>> from specjax.chips.table import chip
    >>> c = chip("v5e-1")
    >>> c.devices, c.hbm_bytes // 2**30
    (1, 16)
    >>> sorted(CHIPS)[:3]
    ['h100', 'h200', 'v4-8']
"""

from __future__ import annotations

import dataclasses

__all__ = ["CHIPS", "Chip", "chip"]

GB = 10**9
GiB = 2**30
TERA = 10**12


@dataclasses.dataclass(frozen=True)
class Chip:
    """One rentable slice: its devices, and the figures of one of its chips.

    Attributes:
        name: what ``specjax compile --chip`` takes (``"v5e-1"``).
        platform: ``"tpu"`` or ``"cuda"``.
        topology: the TPU topology name (``"v5e:2x2"``), or the GPU one (``"1x1x1"``).
        chips_per_host: ``(x, y, z)`` chips per host of a TPU slice.
        chip_config: libtpu's chip configuration (``"megacore"`` joins a v4 chip's
            two cores into one device, as jax does on a v4 VM).
        devices: jax devices of the slice (one per chip).
        hosts: hosts (processes) of the slice.
        hbm_bytes: HBM of one chip.
        hbm_bandwidth: bytes per second one chip reads from its HBM.
        peak_flops: dense bfloat16 FLOP/s of one chip.
        peak_int8_ops: dense int8 op/s of one chip.
        gpu_spec: for a GPU, the device description XLA compiles against
            (``GpuTargetConfigProto`` text, written from the vendor's figures).
        source: where the figures come from.
    """

    name: str
    platform: str
    topology: str
    devices: int
    hosts: int
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    peak_int8_ops: float
    source: str
    chips_per_host: tuple[int, int, int] = (1, 1, 1)
    chip_config: str = "default"
    gpu_spec: str = ""

    @property
    def kind(self) -> str:
        """``"TPU"`` or ``"GPU"``, for messages."""
        return "TPU" if self.platform == "tpu" else "GPU"


def _gpu_spec(
    name: str, memory: int, bandwidth: float, *, cores=132, l2=50 * 2**20, clock_ghz=1.98
) -> str:
    """A ``GpuTargetConfigProto`` for an sm_90 GPU from its published figures.

    The defaults are those of the GH100 die of the H100 and H200 SXM: 132 SMs, 50 MiB
    of L2 and a 1.98 GHz boost clock.
    """
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {cores}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(bandwidth)}
  l2_cache_size: {l2}
  clock_rate_ghz: {clock_ghz}
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 1 }}
device_description_str: "{name}"
"""


# Per chip of each family: HBM bytes, HBM bytes per second, dense bf16 FLOP/s and
# dense int8 op/s, as the page of _SOURCES says them.
_FIGURES = {
    "v5e": (16 * GiB, 819 * GB, 197 * TERA, 394 * TERA),
    "v6e": (32 * GiB, 1640 * GB, 918 * TERA, 1836 * TERA),
    "v5p": (95 * GiB, 2765 * GB, 459 * TERA, 918 * TERA),
    "v4": (32 * GiB, 1200 * GB, 275 * TERA, 275 * TERA),
    "h100": (80 * GiB, 3.35 * TERA, 989 * TERA, 1979 * TERA),
    "h200": (141 * GB, 4.8 * TERA, 989 * TERA, 1979 * TERA),
}
# What each family's page says, after its address (_page).
_SOURCES = {
    "v5e": "per chip: 16 GiB HBM2 at 819 GB/s, 197 TFLOP/s bf16, 394 TOP/s int8",
    "v6e": "per chip: 32 GiB HBM at 1640 GB/s, 918 TFLOP/s bf16, 1836 TOP/s int8",
    "v5p": "per chip: 95 GiB HBM2e at 2765 GB/s, 459 TFLOP/s bf16, 918 TOP/s int8",
    "v4": "per chip: 32 GiB HBM2 at 1200 GB/s, 275 TFLOP/s bf16 and int8",
    "h100": "H100 SXM: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s bf16 and 1979 TOP/s int8 dense",
    "h200": "H200 SXM: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s bf16 and 1979 TOP/s int8 dense",
}


def _page(family: str) -> str:
    if family.startswith("h"):
        return f"https://www.nvidia.com/en-us/data-center/{family}/"
    return f"https://cloud.google.com/tpu/docs/{family}"


_FIELDS = ("hbm_bytes", "hbm_bandwidth", "peak_flops", "peak_int8_ops")
_V5E, _V6E, _V5P, _V4, _H100, _H200 = (
    dict(zip(_FIELDS, figures, strict=True), source=f"{_page(family)} ({_SOURCES[family]})")
    for family, figures in _FIGURES.items()
)
_H100_SPEC = _gpu_spec("NVIDIA H100 80GB HBM3", 80 * GiB, _H100["hbm_bandwidth"])
_H200_SPEC = _gpu_spec("NVIDIA H200", 141 * GB, _H200["hbm_bandwidth"])
_HOST_2X2 = dict(chips_per_host=(2, 2, 1))
_HOST_2X4 = dict(chips_per_host=(2, 4, 1))

CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip("v5e-1", "tpu", "v5e:1x1", 1, 1, **_V5E),
        Chip("v5e-4", "tpu", "v5e:2x2", 4, 1, **_HOST_2X2, **_V5E),
        Chip("v5e-8", "tpu", "v5e:2x4", 8, 1, **_HOST_2X4, **_V5E),
        Chip("v5e-256", "tpu", "v5e:16x16", 256, 64, **_HOST_2X2, **_V5E),
        Chip("v6e-1", "tpu", "v6e:1x1", 1, 1, **_V6E),
        Chip("v6e-4", "tpu", "v6e:2x2", 4, 1, **_HOST_2X2, **_V6E),
        Chip("v6e-8", "tpu", "v6e:2x4", 8, 1, **_HOST_2X4, **_V6E),
        # v5p-N and v4-N count TensorCores: N / 2 chips.
        Chip("v5p-8", "tpu", "v5p:2x2x1", 4, 1, **_HOST_2X2, **_V5P),
        Chip("v4-8", "tpu", "v4:2x2x1", 4, 1, chip_config="megacore", **_HOST_2X2, **_V4),
        Chip("h100", "cuda", "1x1x1", 1, 1, gpu_spec=_H100_SPEC, **_H100),
        Chip("h200", "cuda", "1x1x1", 1, 1, gpu_spec=_H200_SPEC, **_H200),
    )
}


def chip(name: str | Chip) -> Chip:
    """The `Chip` called ``name`` (a `Chip` is returned as it is).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    if isinstance(name, Chip):
        return name
    try:
        return CHIPS[name]
    except (KeyError, TypeError):
        raise ValueError(f"chip must be one of {', '.join(CHIPS)}, got {name!r}") from None
