"""`specjax.tuning`: choosing γ from measured costs, and caching them.

The chooser is checked on cost tables written here: one where a wide forward costs
what it costs on a CPU whose multi-row kernels are slow (speculation must lose, and
γ = 0 is chosen), one where it is nearly free (the largest γ that pays is chosen).
E(γ) is checked against the outcome distribution summed directly. The cache is reused for the
same machine and models and missed after a change of jax version, model or batch.
Slow: `measure` on tiny models, and speculative decoding at the chosen width (or, where
plain decoding is chosen, at the narrowest drafted one) equals plain decoding there.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from support import RunStats

import specjax
from specjax import tuning
from specjax.testing import tiny_model
from specjax.tuning import CostCache, StepCosts, choose, expected_tokens, model_id
from specjax.tuning import session as tuning_session

# A 2-row forward twice a 1-row one, drafts cheap: speculation cannot pay.
SLOW_WIDE = StepCosts(target_s=(0.10, 0.20, 0.30, 0.40), draft_s=(0.005, 0.010, 0.015))
# Wide forwards nearly free, drafts cheap: every γ pays, the largest most.
FLAT_WIDE = StepCosts(target_s=(0.10, 0.102, 0.104, 0.106), draft_s=(0.005, 0.010, 0.015))


def _expected_by_outcomes(alpha, gamma) -> float:
    """Σ_k (k + 1) P(exactly k drafts accepted): each outcome of a step, summed."""
    total = 0.0
    for k in range(gamma + 1):
        reach = np.prod(alpha[:k]) if k else 1.0
        stop = 1.0 - alpha[k] if k < gamma else 1.0
        total += (k + 1) * reach * stop
    return total


@pytest.mark.parametrize("alpha", [(0.9, 0.8, 0.5), (1.0, 1.0, 1.0), (0.0, 0.7, 0.7), (0.3,)])
def test_expected_tokens_is_the_mean_over_a_steps_outcomes(alpha):
    padded = tuple(alpha) + (0.0,) * (3 - len(alpha))
    for gamma in range(4):
        assert expected_tokens(alpha, gamma) == pytest.approx(
            _expected_by_outcomes(padded, gamma), abs=1e-12
        )


def test_plain_decoding_is_chosen_where_wide_forwards_cost_what_rows_do():
    choice = choose(SLOW_WIDE, acceptance=(0.9, 0.9, 0.9))
    assert (choice.gamma, choice.forward_width) == (0, 1)
    assert choice.expected_speedup == 1.0
    assert all(s < 1.0 for s in choice.speedups[1:]), choice.speedups
    assert choice.reason.startswith("plain decoding") and "2-wide" in choice.reason


def test_the_largest_paying_gamma_is_chosen_where_wide_forwards_are_cheap():
    choice = choose(FLAT_WIDE, acceptance=(0.9, 0.9, 0.9))
    assert (choice.gamma, choice.forward_width) == (3, 4)
    # Worked by hand: E(γ) = 1, 1.9, 2.71, 3.439 tokens for steps of 0.100, 0.107,
    # 0.114 and 0.121 s, over plain's 1 token per 0.100 s.
    by_hand = [1.0, 1.9 / 1.07, 2.71 / 1.14, 3.439 / 1.21]
    np.testing.assert_allclose(choice.speedups, by_hand, rtol=1e-12)
    assert choice.expected_speedup == pytest.approx(3.439 / 1.21)
    assert choice.tokens_per_step == pytest.approx(3.439)


def test_acceptance_that_falls_off_stops_gamma_where_it_stops_paying():
    # The first draft is usually accepted, the second rarely: γ = 1.
    choice = choose(FLAT_WIDE, acceptance=(0.9, 0.05, 0.05))
    assert choice.gamma == 1


def test_a_gain_within_the_margin_decodes_plainly():
    costs = StepCosts(target_s=(0.10, 0.15), draft_s=(0.005,))
    alpha = (0.65,)  # 1.65 tokens for 0.155 s: 1.065x plain
    assert choose(costs, alpha, min_gain=1.05).gamma == 1
    assert choose(costs, alpha, min_gain=1.10).gamma == 0


@pytest.mark.parametrize(
    ("target_s", "draft_s", "match"),
    [
        ((), (), "target_s must be positive"),
        ((0.1, 0.0), (0.01,), "target_s must be positive"),
        ((0.1, 0.2), (-0.01,), "draft_s must be non-negative"),
        ((0.1,), (0.01,), "needs target_s up to width 2"),
    ],
)
def test_bad_costs_are_refused_by_name(target_s, draft_s, match):
    with pytest.raises(ValueError, match=match):
        StepCosts(target_s, draft_s)


def test_acceptance_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match=r"acceptance must hold probabilities in \[0, 1\]"):
        choose(FLAT_WIDE, (1.2, 0.5))


@pytest.fixture
def cache(tmp_path):
    return CostCache(tmp_path / "tuning")


def test_the_cache_gives_back_what_was_stored_for_the_same_key(cache):
    key = cache.key(target="t", drafter="d", batch=1, max_gamma=3)
    assert cache.load(key) is None
    cache.store(key, FLAT_WIDE, (0.9, 0.8, 0.7), judged=(20, 15, 9))
    assert cache.load(key) == (FLAT_WIDE, (0.9, 0.8, 0.7), (20.0, 15.0, 9.0))
    # A later run may name the parts in another order: the same entry.
    assert cache.key(max_gamma=3, batch=1, drafter="d", target="t") == key


def test_the_cache_misses_after_a_change_of_jax_version_model_or_batch(cache, monkeypatch):
    parts = dict(target=model_id(tiny_model(seed=0)), drafter="d", batch=1, max_gamma=3)
    key = cache.key(**parts)
    cache.store(key, FLAT_WIDE, (0.9,))
    assert cache.key(**{**parts, "batch": 2}) != key
    assert cache.key(**{**parts, "target": model_id(tiny_model(seed=0, num_layers=3))}) != key
    monkeypatch.setattr(jax, "__version__", "0.0.1")
    assert cache.key(**parts) != key
    assert cache.load(cache.key(**parts)) is None


def test_model_id_follows_shapes_dtypes_and_precision_not_values():
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    assert model_id(a) == model_id(b)  # the same architecture costs the same
    assert model_id(a) != model_id(tiny_model(seed=0, vocab_size=a.vocab_size * 2))
    from specjax.models.quant import quantize

    assert model_id(quantize(a, "int8")) != model_id(a)


def test_learnt_acceptance_is_found_for_the_same_pair_at_any_precision(cache):
    """A chip's prediction (`specjax.chips`) reads what this machine's runs of the same
    models learnt: the pair's id ignores precision, and the entry that judged the most
    drafts wins; another pair's entries are never read."""
    from specjax.models.quant import quantize

    target, draft = tiny_model(seed=0), tiny_model(seed=1)
    pair = tuning.pair_id(target, specjax.DraftModel(draft))
    quantized = specjax.DraftModel(quantize(draft, "int8"), num_draft=2)
    assert tuning.pair_id(quantize(target, "int8"), quantized) == pair
    other = tuning.pair_id(target, specjax.PromptLookup())
    assert other != pair
    assert cache.learnt_acceptance(pair) is None
    cache.store(cache.key(batch=1), FLAT_WIDE, (0.5, 0.4), judged=(10, 4), pair=pair)
    cache.store(cache.key(batch=2), FLAT_WIDE, (0.8, 0.7), judged=(90, 60), pair=pair)
    cache.store(cache.key(batch=3), FLAT_WIDE, (0.1, 0.1), judged=(900, 900), pair=other)
    assert cache.learnt_acceptance(pair) == ((0.8, 0.7), (90.0, 60.0))


def test_an_unreadable_entry_is_a_miss_and_is_replaced(cache):
    key = cache.key(x=1)
    cache.root.mkdir(parents=True)
    cache.path(key).write_text("{not json")
    assert cache.load(key) is None
    cache.store(key, SLOW_WIDE, (0.5,))
    assert cache.load(key) == (SLOW_WIDE, (0.5,), (1.0,))
    assert [p.name for p in cache.root.iterdir()] == [f"{key}.json"]  # no temporary left


def test_a_run_held_to_a_width_chooses_within_it_at_that_width_s_cost():
    """``forward_width=W``: γ at most W - 1, and every γ, 0 included, pays the W-wide
    forward; the speedups stay over plain decoding at width 1."""
    alpha = (0.9, 0.9, 0.9)
    held = choose(FLAT_WIDE, alpha, forward_width=3)
    assert (held.gamma, held.forward_width) == (2, 3) and len(held.speedups) == 3
    step = FLAT_WIDE.target_s[2] + FLAT_WIDE.draft_s[1]
    assert held.expected_speedup == pytest.approx(
        expected_tokens(alpha, 2) / step * FLAT_WIDE.target_s[0]
    )
    assert held.speedups[0] == pytest.approx(FLAT_WIDE.target_s[0] / FLAT_WIDE.target_s[2])
    lost = choose(SLOW_WIDE, alpha, forward_width=4)
    assert (lost.gamma, lost.forward_width) == (0, 4)  # plain, still at the held width
    with pytest.raises(ValueError, match="forward_width=5: the costs cover widths 1..4"):
        choose(FLAT_WIDE, alpha, forward_width=5)


def test_tune_reads_the_cache_and_measures_only_on_a_miss(cache, monkeypatch):
    """`tune` keys by target, drafter and batch: a stored entry is used without timing
    anything; a miss measures once and stores; `learn` pools a run's acceptance in."""
    target = tiny_model(seed=0)
    drafter = specjax.DraftModel(tiny_model(seed=1), num_draft=3)
    calls = []

    def fake_measure(target, drafter, prompts, **kw):
        calls.append(len(prompts))
        return FLAT_WIDE, (0.9, 0.9, 0.9), (5.0, 4.0, 3.0)

    monkeypatch.setattr(tuning_session, "measure", fake_measure)
    first = tuning.tune(target, drafter, [[1, 2]], cache=cache, method="measure")
    assert first.measured and calls == [1] and first.gamma == 3
    again = tuning.tune(target, drafter, [[5, 6, 7]], cache=cache, method="measure")
    assert not again.measured and calls == [1] and again.key == first.key
    batch = tuning.tune(target, drafter, [[1, 2], [3, 4]], cache=cache, method="measure")
    assert batch.measured and calls == [1, 2]  # another batch size: measured for it

    # what a run reports: only position 0 was judged, 50 drafts, none kept
    stats = RunStats(
        acceptance_by_position=np.array([0.0, 0.5, 0.5]),
        position_reached=np.array([50, 0, 0]),
        position_accepted=np.array([0, 0, 0]),
    )

    again.learn(stats)
    pooled = (0.9 * 5.0 * tuning.DECAY) / (5.0 * tuning.DECAY + 50)
    costs, alpha, judged = cache.load(first.key)
    assert costs == FLAT_WIDE and alpha == pytest.approx((pooled, 0.9, 0.9))
    assert judged == pytest.approx((5.0 * tuning.DECAY + 50, 4.0, 3.0))
    assert tuning.tune(target, drafter, [[1]], cache=cache, method="measure").gamma == 0


def test_learn_weighs_each_run_by_the_drafts_it_judged(cache, monkeypatch):
    """A short run moves the stored acceptance by its share of the drafts, not to its own
    value; runs of equal size pool towards their mean, the latest weighing most."""

    def fake_measure(target, drafter, prompts, **kw):
        return FLAT_WIDE, (0.8, 0.8, 0.8), (40.0, 30.0, 20.0)

    monkeypatch.setattr(tuning_session, "measure", fake_measure)
    drafter = specjax.DraftModel(tiny_model(seed=1), num_draft=3)
    tuned = tuning.tune(tiny_model(seed=0), drafter, [[1, 2]], cache=cache, method="measure")

    def run(accepted, judged):
        stats = RunStats(
            acceptance_by_position=np.array([accepted / judged, 0.0, 0.0]),
            position_reached=np.array([judged, 0, 0]),
            position_accepted=np.array([accepted, 0, 0]),
        )

        tuned.learn(stats)
        return tuned.acceptance[0]

    # Worked by hand, with DECAY = 0.5. 4 drafts, none kept, against the stored 40
    # halved: (0.8 * 20 + 0) / (20 + 4) = 2/3, now weighing 24.
    assert tuning.DECAY == 0.5
    assert run(0, 4) == pytest.approx(2 / 3)
    assert tuned.acceptance[1:] == (0.8, 0.8)  # positions a run never judged keep theirs
    # 30 of 40 kept, against 2/3 weighing 24 halved: (8 + 30) / (12 + 40) = 38/52 ...
    assert run(30, 40) == pytest.approx(38 / 52)
    # ... and the same run again: (38/52 * 26 + 30) / (26 + 40) = 49/66, not yet 0.75.
    assert run(30, 40) == pytest.approx(49 / 66)
    assert tuned.judged == pytest.approx((66.0, 30.0, 20.0))
    costs, alpha, judged = cache.load(tuned.key)  # what the next tune reads
    assert alpha == pytest.approx((49 / 66, 0.8, 0.8)) and judged == pytest.approx(tuned.judged)


def test_review_reads_the_run_s_acceptance_where_it_judged_drafts(cache, monkeypatch):
    """`Tuned.review`: every γ's expected speedup from the same costs at the acceptance a
    run achieved; positions the run never judged keep the choice's acceptance."""
    monkeypatch.setattr(
        tuning_session, "measure", lambda *a, **kw: (FLAT_WIDE, (0.9, 0.8, 0.7), (9.0, 8.0, 7.0))
    )
    drafter = specjax.DraftModel(tiny_model(seed=1), num_draft=3)
    tuned = tuning.tune(tiny_model(seed=0), drafter, [[1, 2]], cache=cache, method="measure")

    # a γ = 1 run: one position, judged 20 times
    stats = RunStats(acceptance_by_position=np.array([0.25]), position_reached=np.array([20]))

    review = tuned.review(stats)
    assert review["acceptance_by_position"] == pytest.approx([0.25, 0.8, 0.7])
    expected = choose(FLAT_WIDE, (0.25, 0.8, 0.7), min_gain=1.0).speedups
    assert review["expected_speedup_by_gamma"] == pytest.approx(list(expected))
    assert review["expected_speedup"] == pytest.approx(expected[tuned.gamma])
    assert review["expected_speedup"] < tuned.choice.expected_speedup  # it drafted worse

    class Unjudged:  # a run that judged nothing: its 0.0 is no measurement
        acceptance_by_position = np.array([0.0])
        position_reached = np.array([0])

    unjudged = tuned.review(Unjudged())
    assert unjudged["acceptance_by_position"] == pytest.approx([0.9, 0.8, 0.7])
    assert unjudged["expected_speedup"] == pytest.approx(tuned.choice.expected_speedup)


def test_a_probe_times_the_parts_and_starts_from_what_runs_of_the_pair_learnt(cache):
    """`tune`'s default: the target's forward at every width, the proposals at every γ
    and what dispatching each costs, each timed alone, with the acceptance learnt for
    the pair at another precision, else the prior, which the first run replaces."""
    from specjax.models.quant import quantize

    target, draft = tiny_model(seed=0), tiny_model(seed=1)
    drafter = specjax.DraftModel(draft, num_draft=2)
    lines = []
    fresh = tuning.tune(target, drafter, [[1, 2, 3]], cache=cache, log=lines.append)
    assert fresh.measured and len(fresh.costs.target_s) == 3 and len(fresh.costs.draft_s) == 2
    timed = [line.split(":")[0] for line in lines if " ms " in line]
    assert timed == [
        "target forward 1 wide",
        "target forward 2 wide",
        "target forward 3 wide",
        "gamma 1",
        "gamma 2",
        "dispatch, target",
        "dispatch, drafter",
    ]
    assert fresh.acceptance == (tuning.PRIOR_ACCEPTANCE,) * 2 and fresh.judged == (0.0, 0.0)
    assert any("target's forward at widths 1..3" in line for line in lines)

    # a run: 10 drafts judged at position 0, 6 kept
    stats = RunStats(
        acceptance_by_position=np.array([0.6, 0.0]),
        position_reached=np.array([10, 0]),
        position_accepted=np.array([6, 0]),
    )

    fresh.learn(stats)
    assert fresh.acceptance[0] == pytest.approx(0.6)  # the prior weighed nothing
    other = tuning.tune(
        quantize(target, "int8"),
        specjax.DraftModel(quantize(draft, "int8"), num_draft=2),
        [[1, 2, 3]],
        cache=cache,
    )
    assert other.measured and other.acceptance == pytest.approx((0.6, 0.7))


def test_an_unknown_method_is_refused_by_name(cache):
    drafter = specjax.DraftModel(tiny_model(seed=1), num_draft=2)
    with pytest.raises(ValueError, match='method must be "probe" or "measure", got \'fast\''):
        tuning.tune(tiny_model(seed=0), drafter, [[1, 2]], cache=cache, method="fast")


def test_the_old_module_path_warns_and_gives_this_package():
    """``specjax.decoding.cost_model`` was public: imports of it keep working, each name
    read through it warns with the new path."""
    import specjax.decoding.cost_model as old

    with pytest.warns(DeprecationWarning, match="use specjax.tuning"):
        from specjax.decoding.cost_model import choose as old_choose
    assert old_choose is tuning.choose
    with pytest.warns(DeprecationWarning, match="use specjax.tuning"):
        assert specjax.decoding.cost_model.Tuned is tuning.Tuned
    assert old is specjax.decoding.cost_model
    with pytest.raises(AttributeError):
        old.__path__  # noqa: B018 - not a package: the import system's probe finds nothing


@pytest.mark.slow
def test_measure_then_decode_at_the_chosen_width_equals_plain_decoding():
    """Tiny target and draft: `measure` times widths 1..3 and γ 1..2, the choice is
    one of them, and greedy decoding at the chosen width equals plain decoding there."""
    target = tiny_model(seed=0)
    drafter = specjax.DraftModel(tiny_model(seed=0), num_draft=2)  # the target itself
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    lines = []
    costs, alpha, judged = tuning.measure(
        target, drafter, prompts, max_new_tokens=12, repeats=2, log=lines.append
    )
    assert len(costs.target_s) == 3 and len(costs.draft_s) == 2 and len(lines) == 5
    assert len(judged) == 2 and judged[0] > 0
    assert alpha == pytest.approx((1.0, 1.0))  # a drafter that is the target: all accepted
    choice = choose(costs, alpha)
    assert 0 <= choice.gamma <= 2 and choice.forward_width == choice.gamma + 1
    # Where plain decoding is chosen, the narrowest drafted width is checked instead.
    gamma = choice.gamma or 1
    greedy = specjax.SamplingConfig.greedy()
    options = dict(max_new_tokens=12, sampling=greedy, forward_width=gamma + 1)
    plain = specjax.generate(None, target, prompts, **options)
    out = specjax.speculative_generate(None, target, drafter.with_draft(gamma), prompts, **options)
    assert out.to_lists() == plain.to_lists()
    assert all(len(row) == 12 for row in plain.to_lists())
