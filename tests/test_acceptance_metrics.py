"""Acceptance per draft position and per row: `GenerationStats.position_*`.

Position i counts a step's i-th draft: proposed (``position_drafted``), judged because
drafts 0..i-1 were accepted (``position_reached``) and accepted
(``position_accepted``). They are checked against the per-step histogram the loop
keeps separately (at a fixed γ, "reached i" is "accepted at least i"), against the
per-prompt totals, and against two drafters whose acceptance is known: the target
drafting for itself (every judged draft accepted) and a draft model that never agrees
with a target (none accepted, nothing past position 0 judged).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import GREEDY

import specjax
from specjax.testing import tiny_model

V = 64
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]  # B = 4 = γ + 1 at γ = 3


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab_size=V)


@jax.tree_util.register_pytree_node_class
class _RolledHead:
    """A model whose logits are its inner model's rolled by one id: its argmax is
    always the inner argmax + 1 (mod V), so it never agrees with the inner model."""

    def __init__(self, inner):
        self.inner = inner

    def tree_flatten(self):
        return (self.inner,), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)

    @property
    def vocab_size(self):
        return self.inner.vocab_size

    @property
    def config(self):
        return self.inner.config

    def init_cache(self, batch_size, max_len):
        return self.inner.init_cache(batch_size, max_len)

    def __call__(self, tokens_BT, positions_BT, cache, **kwargs):
        out = self.inner(tokens_BT, positions_BT, cache, **kwargs)
        return out.replace(logits=jnp.roll(out.logits, 1, axis=-1))


def _from_hist(hist):
    """(drafted, reached, accepted) per position, from a fixed-γ histogram of accepts."""
    hist = np.asarray(hist)
    gamma = len(hist) - 1
    at_least = np.cumsum(hist[::-1])[::-1]  # at_least[k] = steps that accepted >= k
    return np.full(gamma, hist.sum()), at_least[:gamma], at_least[1 : gamma + 1]


def _positions(stats):
    return tuple(
        np.asarray(x)
        for x in (stats.position_drafted, stats.position_reached, stats.position_accepted)
    )


@pytest.mark.parametrize(
    "sampling", [GREEDY, specjax.SamplingConfig(temperature=1.0)], ids=["greedy", "t1"]
)
# Fast tier: greedy (the contract: positions agree with the histogram); T = 1 is slow.
@pytest.mark.first_case_fast
def test_positions_agree_with_the_histogram_and_the_row_totals(target, sampling):
    drafter = specjax.DraftModel(tiny_model(seed=1, vocab_size=V), num_draft=3)
    out = specjax.speculative_generate(
        jax.random.key(0), target, drafter, PROMPTS, max_new_tokens=12, sampling=sampling
    )
    drafted, reached, accepted = _positions(out.stats)
    assert drafted.shape == reached.shape == accepted.shape == (3,)
    for mine, want in zip(
        (drafted, reached, accepted), _from_hist(out.stats.accepted_hist), strict=True
    ):
        np.testing.assert_array_equal(mine, want)
    assert accepted.sum() == np.asarray(out.stats.accepted).sum()
    assert drafted.sum() == np.asarray(out.stats.drafted).sum()
    assert reached[0] == drafted[0] == np.asarray(out.stats.row_target_calls).sum()
    alpha = np.asarray(out.stats.acceptance_by_position)
    np.testing.assert_allclose(alpha, accepted / np.maximum(reached, 1), rtol=1e-6)
    rows = np.asarray(out.stats.row_acceptance_rate)
    assert rows.shape == (len(PROMPTS),)
    np.testing.assert_allclose(
        rows, np.asarray(out.stats.accepted) / np.asarray(out.stats.drafted), rtol=1e-6
    )


@pytest.mark.slow  # one more decode program (about 5 s)
def test_the_target_drafting_for_itself_is_accepted_at_every_position(target):
    out = specjax.speculative_generate(
        jax.random.key(0),
        target,
        specjax.DraftModel(target, num_draft=3),
        PROMPTS,
        max_new_tokens=12,
        sampling=GREEDY,
    )
    drafted, reached, accepted = _positions(out.stats)
    assert drafted[0] > 0
    np.testing.assert_array_equal(reached, drafted)
    np.testing.assert_array_equal(accepted, drafted)
    np.testing.assert_array_equal(np.asarray(out.stats.acceptance_by_position), 1.0)


@pytest.mark.slow  # a plain and a speculative decode of a wrapped model (about 8 s)
def test_a_draft_that_never_agrees_is_judged_only_at_position_0(target):
    """The draft's argmax is the target's argmax + 1 (mod V) at every position."""
    kw = dict(max_new_tokens=12, sampling=GREEDY, forward_width=4)  # one width: γ + 1
    out_plain = specjax.generate(jax.random.key(0), target, PROMPTS, **kw)
    wrong = _RolledHead(target)
    out = specjax.speculative_generate(
        jax.random.key(0), target, specjax.DraftModel(wrong, num_draft=3), PROMPTS, **kw
    )
    assert out.to_lists() == out_plain.to_lists()
    drafted, reached, accepted = _positions(out.stats)
    assert drafted[0] > 0 and reached[0] == drafted[0]
    np.testing.assert_array_equal(reached[1:], 0)
    np.testing.assert_array_equal(accepted, 0)


@pytest.mark.slow  # a tree decode program (about 6 s)
def test_a_tree_counts_its_depths(target):
    drafter = specjax.DraftModel(tiny_model(seed=1, vocab_size=V)).with_tree((2, 2, 1))
    out = specjax.speculative_generate(
        jax.random.key(0), target, drafter, PROMPTS, max_new_tokens=10, sampling=GREEDY
    )
    drafted, reached, accepted = _positions(out.stats)
    assert drafted.shape == (3,)
    for mine, want in zip(
        (drafted, reached, accepted), _from_hist(out.stats.accepted_hist), strict=True
    ):
        np.testing.assert_array_equal(mine, want)


@pytest.mark.slow  # one program per γ of the table (about 12 s)
def test_adaptive_gamma_proposes_fewer_positions_in_its_smaller_steps(target):
    """γ = 1 while 2 to 4 rows are active, γ = 3 for the last row alone."""
    drafter = specjax.DraftModel(target, num_draft=3)
    out = specjax.speculative_generate(
        jax.random.key(0),
        target,
        drafter,
        PROMPTS,
        max_new_tokens=[2, 4, 8, 16],
        sampling=GREEDY,
        gamma_by_active_rows={1: 3, 4: 1},
    )
    drafted, reached, accepted = _positions(out.stats)
    assert drafted[0] > drafted[1] > 0  # the γ = 1 steps proposed position 0 only
    assert drafted[1] == drafted[2]
    np.testing.assert_array_equal(accepted, reached)  # self-drafting: all accepted
    assert drafted.sum() == np.asarray(out.stats.drafted).sum()


def test_plain_decoding_has_no_positions(target):
    out = specjax.generate(jax.random.key(0), target, PROMPTS, max_new_tokens=4)
    for x in (*_positions(out.stats), np.asarray(out.stats.acceptance_by_position)):
        assert x.shape == (0,)
    np.testing.assert_array_equal(np.asarray(out.stats.row_acceptance_rate), 0.0)
