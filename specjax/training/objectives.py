"""Which objective trains which drafter: the one place training knows drafters by type.

A drafter with weights of its own is trained on its frozen target's features with its
`Objective`: the `TrainConfig` subclass that holds its settings and the loss. A new
trainable drafter adds one line to `OBJECTIVES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specjax.drafters.block import BlockDrafter
from specjax.drafters.eagle import EagleDrafter
from specjax.training.block import block_objective
from specjax.training.config import BlockTrainConfig, EagleTrainConfig, TrainConfig
from specjax.training.eagle import eagle_objective

__all__ = ["OBJECTIVES", "Objective", "objective_of"]


@dataclasses.dataclass(frozen=True)
class Objective:
    """How one drafter class is trained.

    Attributes:
        config_type: the `TrainConfig` subclass a run of it takes.
        loss: ``loss(params, drafter, tokens_BT, key, config) -> (loss, metrics)``: a
            float32 scalar and a dict of float32 scalars holding at least ``loss``, with
            ``drafter.target`` frozen; ``key`` is for the objective's own draws.
    """

    config_type: type[TrainConfig]
    loss: Callable


OBJECTIVES: dict[type, Objective] = {
    BlockDrafter: Objective(BlockTrainConfig, block_objective),
    EagleDrafter: Objective(EagleTrainConfig, eagle_objective),
}


def objective_of(model) -> Objective | None:
    """The `Objective` of a trainable drafter (or of a subclass of one), else ``None``."""
    return next((OBJECTIVES[c] for c in type(model).__mro__ if c in OBJECTIVES), None)
