"""`Plan`: one decode of `specjax.Sampler`, checked and ready to run (`Sampler.plan`)."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Plan"]


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """One decode, ready to run: ``decoding.speculative_generate(key, target, drafter,
    ids, **kwargs)`` (`specjax.generate` where ``drafter`` is None).

    Attributes:
        key: the PRNG key.
        target: the target (at the precision asked for).
        ids: the prompts' token ids.
        drafter: the drafter at the γ chosen for this batch; ``None``: plain decoding.
        kwargs: the decoders' keyword arguments (``max_new_tokens``, ``sampling``,
            ``eos_id``, ``stop``, ``constraint``, ``forward_width``, ...).
        tuned: with ``gamma="auto"``, the `specjax.tuning.Tuned` choice.
    """

    key: Any
    target: Any
    ids: list
    drafter: Any
    kwargs: dict
    tuned: Any = None

    def run(self):
        """The `specjax.GenerationResult` of this decode, in one compiled program."""
        from specjax.decoding import api as decoding

        if self.drafter is None:
            return decoding.generate(self.key, self.target, self.ids, **self.kwargs)
        return decoding.speculative_generate(
            self.key, self.target, self.drafter, self.ids, **self.kwargs
        )
