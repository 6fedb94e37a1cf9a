"""Tuning: choosing γ from step costs measured on this machine and the acceptance the
decoding loop sees.

Which γ (drafts per step) is fastest depends on the machine (what a W-wide target
forward costs against a one-wide one differs between CPUs, accelerators and
precisions) and on the prompts (how often drafts are accepted), so it is measured
rather than assumed. Tuning sits above `specjax.decoding`: it times the decoders and
their parts, and the decoders know nothing of it.

* `~specjax.tuning.choice`: the math. A step's cost at each γ (`StepCosts`), the
  tokens it is expected to emit (`expected_tokens`), and `choose`, the γ with the most
  expected tokens per second, γ = 0 (plain decoding) included; speculation must beat
  plain decoding by `MIN_GAIN`, so a choice is never expected to be slower than plain.
* `~specjax.tuning.cache`: the ids of the machine, the models and the pair, and
  `CostCache`, the measured costs on disk in ``<cache>/tuning/``.
* `~specjax.tuning.measure`: timing the step's parts (`probe`: forwards per width and
  proposals per γ, alone) or whole decode loops (`measure`).
* `~specjax.tuning.session`: `tune`, ``gamma="auto"`` (the default of
  `specjax.Sampler` and ``specjax generate``): the cached costs, or a timing stored for
  next time, and the choice; the `Tuned` it returns learns each run's acceptance.

The output does not depend on the choice's being right: whatever γ is chosen,
decoding at the chosen forward width is exact (`specjax.decoding.numerics`).

Examples:
    >>> from specjax.tuning import StepCosts, choose
    >>> costs = StepCosts(target_s=(0.010, 0.011, 0.012), draft_s=(0.001, 0.002))
    >>> choose(costs, acceptance=(0.8, 0.7)).gamma
    2
"""

import sys
import types
import warnings

import specjax.decoding
from specjax.tuning.cache import CostCache as CostCache
from specjax.tuning.cache import machine_id as machine_id
from specjax.tuning.cache import model_id as model_id
from specjax.tuning.cache import pair_id as pair_id
from specjax.tuning.choice import MIN_GAIN as MIN_GAIN
from specjax.tuning.choice import Choice as Choice
from specjax.tuning.choice import StepCosts as StepCosts
from specjax.tuning.choice import choose as choose
from specjax.tuning.choice import expected_tokens as expected_tokens
from specjax.tuning.measure import measure as measure
from specjax.tuning.measure import probe as probe
from specjax.tuning.session import DECAY as DECAY
from specjax.tuning.session import PRIOR_ACCEPTANCE as PRIOR_ACCEPTANCE
from specjax.tuning.session import TUNE_TOKENS as TUNE_TOKENS
from specjax.tuning.session import Tuned as Tuned
from specjax.tuning.session import tune as tune

__all__ = [
    "DECAY",
    "MIN_GAIN",
    "PRIOR_ACCEPTANCE",
    "TUNE_TOKENS",
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
    "probe",
    "tune",
]


class _DeprecatedPath(types.ModuleType):
    """``specjax.decoding.cost_model``, this package's deprecated path: every name read
    through it warns and is this package's."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__all__":  # the import system's probes
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        warnings.warn(
            "specjax.decoding.cost_model is deprecated; use specjax.tuning",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[__name__], name)


# Registered from here, not in `specjax.decoding`: decoding imports nothing above it.
# ``import specjax`` imports this package, so the old path resolves for every import.
_OLD_PATH = "specjax.decoding.cost_model"
if _OLD_PATH not in sys.modules:
    sys.modules[_OLD_PATH] = _DeprecatedPath(_OLD_PATH, _DeprecatedPath.__doc__)
    specjax.decoding.cost_model = sys.modules[_OLD_PATH]
