"""The decoders' memory check sizes the decode state from shapes, every feature's included.

`specjax.decoding.build.state_bytes` runs ``jax.eval_shape`` over the state before its
prefill (each feature's ``init`` and ``empty_output`` with the token buffers, settings
and prompt queue) and adds the target's cache and the drafter's ``state_bytes``. The
estimate once listed the built-in buffers by hand, so a feature written in a user's
file was never counted. Here a user's feature raises it by exactly its buffer's bytes,
and the estimate equals the bytes of the state `specjax.decoding.init` really builds,
summed from its leaves.
"""

import jax
import jax.numpy as jnp
import pytest
from flax import struct

import specjax
from specjax.decoding.features import RowFeature
from specjax.testing import tiny_model

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
CACHE_LEN = 64
NUM_SLOTS = 2  # fewer slots than prompts: the per-slot and per-prompt sizes differ


@struct.dataclass
class Buffer(RowFeature):
    """A user's feature holding a per-slot float32 buffer ``[B, S, width]``."""

    width: int = struct.field(pytree_node=False, default=1000)
    name = "buffer"

    def init(self, decoder, prompts_M, cache_len):
        return jnp.zeros((prompts_M.shape[0], cache_len, self.width), jnp.float32)


class _Checked(Exception):
    """Stops a decoder right after its memory check, before anything compiles."""


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


def _estimate(monkeypatch, target, **kwargs) -> int:
    """The bytes `specjax.generate`'s memory check is asked about for this call."""
    asked = []

    def record(name, nbytes, what):
        asked.append(nbytes)
        raise _Checked

    monkeypatch.setattr(specjax.decoding.checks, "check_fits_memory", record)
    with pytest.raises(_Checked):
        specjax.generate(None, target, PROMPTS, max_new_tokens=4, cache_len=CACHE_LEN, **kwargs)
    return asked[0]


def test_a_users_feature_raises_the_estimate_by_exactly_its_bytes(target, monkeypatch):
    without = _estimate(monkeypatch, target, num_slots=NUM_SLOTS)
    with_buffer = _estimate(monkeypatch, target, num_slots=NUM_SLOTS, features=[Buffer()])
    assert with_buffer - without == NUM_SLOTS * CACHE_LEN * 1000 * 4  # float32


def test_a_users_feature_too_big_for_the_device_is_refused_before_compiling(target):
    """4 PiB of feature state: refused by the memory check, naming ``cache_len``."""
    huge = Buffer(width=2**43)
    with pytest.raises(ValueError, match=r"^cache_len asks for caches of 64 slots for 2 rows"):
        specjax.generate(
            None,
            target,
            PROMPTS,
            max_new_tokens=4,
            cache_len=CACHE_LEN,
            num_slots=NUM_SLOTS,
            features=[huge],
        )


def _real_bytes(state) -> int:
    """Bytes of an initialised state's buffers (the `Decoder`'s models are not in it)."""
    return sum(leaf.nbytes for leaf in jax.tree.leaves(state))


def _options(case: str) -> dict:
    if case == "refills-top-logprobs":
        return dict(num_slots=NUM_SLOTS, top_logprobs=3)
    if case == "penalties":
        return dict(sampling=specjax.SamplingConfig(temperature=1.0, repetition_penalty=1.2))
    if case == "draft-model":
        return dict(drafter=specjax.DraftModel(tiny_model(seed=1, num_layers=1), num_draft=3))
    return {}


@pytest.mark.first_case_fast
@pytest.mark.parametrize("case", ["plain", "refills-top-logprobs", "penalties", "draft-model"])
def test_the_estimate_is_the_initialised_states_bytes(target, case, monkeypatch):
    asked = []

    def record(name, nbytes, what):
        asked.append(nbytes)

    monkeypatch.setattr(specjax.decoding.checks, "check_fits_memory", record)
    _, state = specjax.decoding.init(
        jax.random.key(0), target, PROMPTS, max_new_tokens=4, cache_len=CACHE_LEN, **_options(case)
    )
    assert asked == [_real_bytes(state)]
