"""The `Decoder`: what stays fixed while a batch decodes.

`specjax.decoding.init` checks a call's inputs, builds their `Decoder`
(`specjax.decoding.build`) and returns it with the first `DecodeState`; the open
loop's functions (`specjax.decoding.run`, `result`, `stream`) take both. Its models
and tables are traced and its options static; it is an argument of each jitted
program, never part of the state that the loop carries.
"""

from __future__ import annotations

import jax
from flax import struct

from specjax.decoding.state import DecodeState
from specjax.drafters.base import Drafter, lookahead
from specjax.verification.verifiers import Rejection, Verifier


def step_slots(drafter: Drafter, forward_width: int | None) -> int:
    """Cache slots one decode step may write past a row's length: the forward width W
    when it is fixed (at least the drafter's `~specjax.drafters.lookahead`), else that
    lookahead (γ + 1, or N + 1 for a tree)."""
    return lookahead(drafter) if forward_width is None else forward_width


_MOVED_TO_FUNCTIONS = {
    "run": "specjax.decoding.run(decoder, state, num_steps)",
    "result": "specjax.decoding.result(decoder, state)",
    "stream": "specjax.decoding.stream(decoder, state, steps_per_chunk)",
}


@struct.dataclass(kw_only=True)
class Decoder:
    """What stays fixed while a batch decodes: the models, the options and the features.

    Attributes:
        target: the target model (model contract).
        drafter: the `Drafter`; `~specjax.drafters.NoDraft` for plain decoding.
        features: the per-row `~specjax.decoding.features.RowFeature` parts, in the
            order they run (their tables are traced, their options static).
        eos_ids: ``int32[K]`` ids that end a row (``-1`` pads).
        draft_confidence: ``float32[]`` τ, or ``None``: a row stops proposing after
            its first draft whose own probability is below τ.
        verifier: static: the `~specjax.verification.verifiers.Verifier` of each step's
            chain (`Rejection` or `Coupled`; `Coupled` for plain decoding).
        gamma_table: static ``((max_active_rows, γ), ...)`` pairs, ascending: a step
            with ``a`` active rows drafts the γ of the first pair with
            ``a <= max_active_rows`` (the last pair beyond). Empty: always the
            drafter's γ.
        forward_width: static W: every target forward of the loop scores exactly W
            columns (`specjax.decoding.numerics`), or ``None``: each scores only what
            its step needs (1 for plain decoding, the step's verify width otherwise).
    """

    target: object
    drafter: object
    features: tuple = ()
    eos_ids: jax.Array
    draft_confidence: jax.Array | None = None
    verifier: Verifier = struct.field(pytree_node=False, default=Rejection())
    gamma_table: tuple[tuple[int, int], ...] = struct.field(pytree_node=False, default=())
    forward_width: int | None = struct.field(pytree_node=False, default=None)

    @property
    def step_slots(self) -> int:
        """Cache slots one step may write past a row's length
        (`~specjax.decoding.decoder.step_slots`)."""
        return step_slots(self.drafter, self.forward_width)

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails: the open loop's programs were methods.
        if name in _MOVED_TO_FUNCTIONS:
            raise AttributeError(
                f"Decoder.{name} is a function of the decoder and the state: call "
                f"{_MOVED_TO_FUNCTIONS[name]} instead of decoder.{name}(state, ...)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def feature_state(self, state: DecodeState, name: str):
        """The per-slot state of the feature called ``name`` in ``state``."""
        for feature, feature_state in zip(self.features, state.features, strict=True):
            if feature.name == name:
                return feature_state
        raise KeyError(f"no feature {name!r} in this decoder")
