"""A per-row feature defined here, in the test, plugs into both decoders.

`specjax.decoding.features.RowFeature` is the decoder's extension point: each part
below is one class, passed with ``features=``. Each is checked against the decoder's
own built-in behaviour it re-implements, in plain and speculative decoding, with more
prompts than slots (so refills start its rows with ``init``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from support import GREEDY

import specjax
from specjax.decoding.features import RowFeature
from specjax.sampling.history import RowHistory
from specjax.testing import tiny_model

SAMPLED = specjax.SamplingConfig(temperature=1.0)
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12]]


@struct.dataclass
class StopAtToken(RowFeature):
    """Ends a row with the first emitted ``token`` (kept): an EOS id, as a feature."""

    token: int = struct.field(pytree_node=False, default=0)
    name = "stop_at_token"

    def cut(self, state, state_B, block_BG):
        hit_BG = block_BG == self.token
        hit_B = jnp.any(hit_BG, axis=1)
        return jnp.where(hit_B, jnp.argmax(hit_BG, axis=1) + 1, block_BG.shape[1]), hit_B


@struct.dataclass
class ActiveSteps(RowFeature):
    """Counts the steps each prompt was decoding in: a state and an output."""

    name = "active_steps"

    def init(self, decoder, prompts_M, cache_len):
        return jnp.zeros(prompts_M.shape, jnp.int32)

    def commit(self, state, steps_B, emission):
        return steps_B + emission.active.astype(steps_B.dtype)

    def empty_output(self, num_prompts, width):
        return jnp.zeros((num_prompts,), jnp.int32)

    def gather(self, steps_B, slots_M, positions_MS, valid_MS):
        return steps_B[slots_M]

    def result(self, steps_B, out_N):
        return {"active_steps": out_N}


@struct.dataclass
class Forbid(RowFeature, RowHistory):
    """Masks ``ids`` in the drafter's and the target's distributions with its own code:
    the feature is its own (token-independent) history, so it only writes ``mask``."""

    ids: jax.Array
    name = "forbid"

    def history(self, state, state_B):
        return self

    def mask(self, logits_RxV, config):
        hit_V = jnp.isin(jnp.arange(logits_RxV.shape[-1]), self.ids)
        return jnp.where(hit_V, -jnp.inf, logits_RxV)


@pytest.fixture(scope="module")
def models():
    return tiny_model(seed=0), tiny_model(seed=1)


def _decode(models, speculative: bool, **kw):
    target, draft = models
    key = jax.random.key(3)
    common = dict(max_new_tokens=12, num_slots=2, sampling=SAMPLED) | kw
    if speculative:
        drafter = specjax.DraftModel(draft, num_draft=3)
        return specjax.speculative_generate(
            key, target, drafter, PROMPTS, verification="coupled", **common
        )
    return specjax.generate(key, target, PROMPTS, **common)


def _token_of_each_row(models) -> int:
    """An id that plain greedy decoding emits in some rows but not in their first step."""
    out = _decode(models, False, sampling=GREEDY)
    rows = out.to_lists()
    counts = np.bincount(np.concatenate([r[1:] for r in rows]), minlength=64)
    return int(np.argmax(counts))


@pytest.mark.first_case_fast  # speculative: slow tier (two decode loops to compile)
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_a_cut_feature_is_an_eos_id(models, speculative):
    token = _token_of_each_row(models)
    expected = _decode(models, speculative, sampling=GREEDY, eos_id=token)
    got = _decode(models, speculative, sampling=GREEDY, features=[StopAtToken(token=token)])
    assert expected.to_lists() == got.to_lists()
    assert any(len(row) < 12 for row in got.to_lists())  # the cut ended some row
    np.testing.assert_array_equal(expected.stats.row_target_calls, got.stats.row_target_calls)


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_a_feature_with_state_and_output_follows_each_prompt(models, speculative):
    out = _decode(models, speculative, features=[ActiveSteps()])
    assert set(out.extras) == {"active_steps"}
    np.testing.assert_array_equal(out.extras["active_steps"], out.stats.row_target_calls)
    assert out.extras["active_steps"].shape == (len(PROMPTS),)


@pytest.mark.first_case_fast  # speculative: slow tier (two decode loops to compile)
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_a_feature_can_mask_the_distributions(models, speculative):
    """The user's mask equals the built-in ``forbidden_ids`` token for token (sampled,
    coupled, 5 prompts through 2 slots); one id fewer in the mask does not."""
    ids = jnp.asarray(sorted({t for row in _decode(models, False).to_lists() for t in row})[:6])
    expected = _decode(
        models, speculative, sampling=specjax.SamplingConfig(temperature=1.0, forbidden_ids=ids)
    )
    got = _decode(models, speculative, features=[Forbid(ids=ids)])
    assert expected.to_lists() == got.to_lists()
    assert not set(np.asarray(ids).tolist()) & {t for row in got.to_lists() for t in row}
    # Control: the comparison sees a mask that misses one id.
    missing = _decode(models, speculative, features=[Forbid(ids=ids[:-1])])
    assert missing.to_lists() != expected.to_lists()


@pytest.mark.parametrize(
    ("features", "error", "match"),
    [
        (ActiveSteps(), TypeError, "features must be a list"),
        ([object()], TypeError, r"features\[0\] must be a specjax.decoding.features.RowFeature"),
        ([ActiveSteps(), ActiveSteps()], ValueError, r"features\[1\] .* needs a name"),
        ([RowFeature()], ValueError, r"features\[0\] .* needs a name"),
    ],
)
def test_bad_features_are_refused_by_name(models, features, error, match):
    with pytest.raises(error, match=match):
        specjax.generate(jax.random.key(0), models[0], [[1]], max_new_tokens=2, features=features)
