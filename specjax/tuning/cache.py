"""Where measured step costs are kept: the ids of the machine, the models and the pair,
and the on-disk cache.

Costs are keyed by the machine, the backend, the jax and specjax versions, the models
(configuration, precision, parameter shapes) and the batch, so that later runs choose
for free and a change of any of those measures again. The acceptance depends on less:
the pair's architectures (`pair_id`), which `CostCache.learnt_acceptance` reads across
precisions and batches.
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

from specjax.core.paths import cache_root
from specjax.tuning.choice import StepCosts

__all__ = ["CostCache", "machine_id", "model_id", "pair_id"]


def _specjax_version() -> str:
    """The installed specjax's version (read from its metadata: tuning does not import
    the package above it), or ``"unknown"`` when running from a source tree."""
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
