"""Continuous batching (more prompts than slots), adaptive γ and argmax drafting.

The reference everywhere is a decoder with one slot per prompt, which earlier tests
show equals each prompt decoded alone. Refilled runs must equal it prompt by prompt:
token for token at temperature 0, and at any setting for plain decoding and coupled
verification, whose noise is keyed by the prompt's seed and the position. Speculative
runs equal plain ones only at the same forward width: each comparison of the two runs
both at ``WIDTH``, the drafters' verify width. The distributional tests of refilled
sampling are in ``test_exact_per_row.py``.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from support import GREEDY

import specjax
from specjax import decoding
from specjax.testing import perturbed, tiny_model

V = 32
NUM_PROMPTS = 40
EOS = 7
GAMMA = 3
# Every drafter here verifies γ + 1 columns: the forward width of the compared runs.
WIDTH = specjax.drafters.lookahead(specjax.PromptLookup(ngram=2, num_draft=GAMMA))
# Greedy decoding to EOS at that width: the settings of every greedy equality here.
GREEDY_TO_EOS = dict(sampling=GREEDY, eos_id=EOS, forward_width=WIDTH)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab_size=V, init_scale=8.0)


@pytest.fixture(scope="module")
def drafters(target):
    draft = perturbed(target, seed=3)
    return {
        "draft_model": specjax.DraftModel(draft, num_draft=GAMMA),
        "draft_model_argmax": specjax.DraftModel(draft, num_draft=GAMMA, greedy_draft=True),
        "lookup": specjax.PromptLookup(ngram=2, num_draft=GAMMA),
        # Argmax drafts: one-hot q (Proposal.probs None), as draft_confidence refuses.
        "block": specjax.BlockDrafter.random(
            target, key=jax.random.key(5), num_draft=GAMMA, mode="argmax"
        ),
    }


def _prompts(num=NUM_PROMPTS, seed=0):
    """Ragged, repetitive prompts (prompt lookup finds matches) and ragged budgets."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(0, V, size=rng.integers(1, 7))) * 2 for _ in range(num)]
    budgets = rng.integers(1, 25, size=num)
    return prompts, budgets


def _decode(target, drafter, prompts, **kw):
    key = jax.random.key(1)
    if drafter is None:
        return specjax.generate(key, target, prompts, **kw)
    return specjax.speculative_generate(key, target, drafter, prompts, **kw)


@pytest.fixture(scope="module")
def greedy_reference(target):
    prompts, budgets = _prompts()
    out = _decode(target, None, prompts, max_new_tokens=budgets, **GREEDY_TO_EOS)
    return prompts, budgets, out


@pytest.mark.parametrize(
    "name, num_slots",
    [
        ("plain", 8),
        ("plain", 1),
        ("draft_model", 8),
        ("draft_model", 4),
        ("draft_model_argmax", 8),
        ("lookup", 8),
        ("block", 8),
    ],
)
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_forty_ragged_prompts_through_few_slots_equal_plain_greedy(
    target, drafters, greedy_reference, name, num_slots
):
    """40 ragged prompts with EOS and budgets 1..24 through 8 slots (4 = γ+1, and 1)."""
    prompts, budgets, ref = greedy_reference
    drafter = None if name == "plain" else drafters[name]
    kw = dict(max_new_tokens=budgets, num_slots=num_slots, **GREEDY_TO_EOS)
    out = _decode(target, drafter, prompts, **kw)
    assert out.tokens.shape == ref.tokens.shape == (NUM_PROMPTS, budgets.max())
    assert out.to_lists() == ref.to_lists()
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.truncated, ref.truncated)
    # The case is not degenerate: EOS cut some prompts, budgets cut others.
    lengths = np.asarray(ref.lengths)
    assert 0 < np.sum(lengths < budgets) < NUM_PROMPTS
    # Prompts really shared slots: the loop ran longer than any one prompt.
    assert int(out.stats.target_calls) > int(np.max(out.stats.row_target_calls))
    if name == "plain":
        np.testing.assert_array_equal(out.stats.row_target_calls, ref.stats.row_target_calls)


def _mixed_sampling(num):
    """Per-prompt settings: greedy, T=0.7 with top-k 5, T=1.3 with top-p 0.9, in turn."""
    temps = np.array([0.0, 0.7, 1.3] * num)[:num]
    top_k = np.array([0, 5, 0] * num)[:num]
    top_p = np.array([1.0, 1.0, 0.9] * num)[:num]
    return specjax.SamplingConfig(temperature=temps, top_k=top_k, top_p=top_p)


# Slow when per prompt: three decoders over 40 prompts with mixed settings, ~13 s each.
@pytest.mark.slow
@pytest.mark.parametrize("form", ["per_prompt", "scalar"])
@pytest.mark.parametrize("num_slots", [8, 4])
def test_settings_seeds_and_budgets_follow_the_prompt(target, drafters, form, num_slots):
    """Plain and coupled decoding with refill equal one slot per prompt, token for token
    (plain decoding at the same forward width).

    Both read each prompt's own settings, seed and budget after a refill: reading
    those of the slot (or of the prompt first in it) changes the sampled tokens.
    """
    prompts, budgets = _prompts(seed=1)
    sampling = _mixed_sampling(NUM_PROMPTS) if form == "per_prompt" else None
    seeds = np.arange(NUM_PROMPTS) * 7 + 3
    kw = dict(
        max_new_tokens=budgets, sampling=sampling, eos_id=EOS, seeds=seeds, forward_width=WIDTH
    )
    ref = _decode(target, None, prompts, **kw)
    plain = _decode(target, None, prompts, num_slots=num_slots, **kw)
    coupled = _decode(
        target, drafters["draft_model"], prompts, num_slots=num_slots, verification="coupled", **kw
    )
    for out in (plain, coupled):
        assert out.to_lists() == ref.to_lists()
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        # Equal tokens, and log-probabilities equal to float32 rounding: a refill
        # prefills one row where the reference prefills all 40, and XLA:CPU's matmuls
        # sum in a shape-dependent order (on an AMD EPYC host 2 of 960 differ by 5.6e-7
        # relative, 1.9e-6 absolute). The same tolerance as the other cross-program
        # log-probability comparisons (test_block_drafter, test_tree).
        np.testing.assert_allclose(out.logprobs, ref.logprobs, rtol=1e-5, atol=1e-6)
    assert int(jnp.sum(coupled.stats.accepted)) > 0
    # Per-prompt statistics: a coupled prompt's counts do not depend on its slot.
    alone = _decode(target, drafters["draft_model"], prompts, verification="coupled", **kw)
    for field in ("row_target_calls", "drafted", "accepted"):
        np.testing.assert_array_equal(
            getattr(coupled.stats, field), getattr(alone.stats, field), err_msg=field
        )


# Slow tier: 10 s.
@pytest.mark.slow
def test_outputs_come_back_in_prompt_order(target):
    """Budgets falling then rising: prompts finish out of order, and come back in order."""
    prompts = [[i % V, (3 * i) % V] for i in range(12)]
    budgets = np.array([20, 2, 15, 1, 9, 3, 18, 1, 4, 12, 2, 6])
    out = _decode(target, None, prompts, max_new_tokens=budgets, sampling=GREEDY, num_slots=3)
    np.testing.assert_array_equal(out.lengths, budgets)
    for i, row in enumerate(out.to_lists()):
        alone = _decode(target, None, [prompts[i]], max_new_tokens=int(budgets[i]), sampling=GREEDY)
        assert row == alone.to_lists()[0], i


CALLS = ("jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call")


def _eqns(jaxpr):
    """The equations of a jaxpr, with those of nested calls (not loops) inlined."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in CALLS:
            yield from _eqns_of(eqn)
        else:
            yield eqn


def _eqns_of(call):
    for sub in jax.extend.core.jaxprs_in_params(call.params):
        yield from _eqns(sub)


def _primitives(jaxpr, found=None):
    """Every primitive name in a (closed) jaxpr, nested ones included."""
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _primitives(sub, found)
    return found


# Slow tier: 7 s.
@pytest.mark.slow
def test_one_jitted_call_serves_all_prompts(target, drafters):
    """The refill (a prefill forward) runs inside the decode loop, with no host round trip.

    The whole run is one program: its top level has one decode loop, the refill loop
    with its prefill sits inside that loop's body, nothing calls back to the host, and
    new prompt contents and budgets reuse the compiled program.
    """
    prompts, budgets = _prompts()
    prompts_NP, _ = decoding.pad_prompts(prompts)

    def run(prompts_NP, budgets_N):
        # Inside a user's jit the prompts and budgets are traced.
        return specjax.speculative_generate(
            jax.random.key(0),
            target,
            drafters["draft_model"],
            prompts_NP,
            max_new_tokens=budgets_N,
            sampling=GREEDY,
            num_slots=8,
            cache_len=64,
            forward_width=WIDTH,
        ).tokens

    closed = jax.make_jaxpr(run)(prompts_NP, jnp.asarray(budgets))
    # The decoder is one jitted program inside the user's: the one call that loops.
    calls = [e for e in closed.jaxpr.eqns if e.primitive.name in CALLS]
    programs = [e for e in calls if any(x.primitive.name == "while" for x in _eqns_of(e))]
    assert len(programs) == 1
    loops = [e for e in _eqns_of(programs[0]) if e.primitive.name == "while"]
    # One loop for the refills at start (slots done before they begin), one to decode.
    assert len(loops) == 2
    decode_body = loops[-1].params["body_jaxpr"].jaxpr
    refills = [e for e in _eqns(decode_body) if e.primitive.name == "while"]
    assert len(refills) == 1
    # The prefill's attention and MLP matmuls are in the refill loop.
    assert "dot_general" in _primitives(refills[0].params["body_jaxpr"].jaxpr)
    assert not {p for p in _primitives(closed.jaxpr) if "callback" in p}

    jitted = jax.jit(run)
    first = jitted(prompts_NP, jnp.asarray(budgets))
    other_prompts = (prompts_NP + 1) % V
    jitted(other_prompts, jnp.asarray(budgets[::-1]))
    assert jitted._cache_size() == 1
    # An array of prompts holds full rows (its padding is part of each prompt).
    ref = _decode(
        target,
        None,
        prompts_NP,
        max_new_tokens=budgets,
        sampling=GREEDY,
        cache_len=64,
        forward_width=WIDTH,
    )
    tokens = np.asarray(first)[:, : budgets.max()]
    np.testing.assert_array_equal(tokens, np.asarray(ref.tokens))


# Slow tier: 12 s: the open loop with refill, chunk by chunk.
@pytest.mark.slow
def test_open_loop_with_refill_equals_one_call(target, drafters):
    """init then run in chunks, and stream, serve all prompts like one closed call."""
    prompts, budgets = _prompts(num=20, seed=2)
    kw = dict(max_new_tokens=budgets, sampling=GREEDY, eos_id=EOS, num_slots=5)
    drafter = drafters["draft_model"]
    closed = _decode(target, drafter, prompts, **kw)
    decoder, state = decoding.init(jax.random.key(1), target, prompts, drafter=drafter, **kw)
    assert decoding.result(decoder, state).tokens.shape == closed.tokens.shape
    for _ in range(6):
        state = decoding.run(decoder, state, 3)
    partial = decoding.result(decoder, state)
    assert 0 < int(jnp.sum(partial.lengths)) < int(jnp.sum(closed.lengths))
    state = decoding.run(decoder, state)
    assert decoding.result(decoder, state).to_lists() == closed.to_lists()

    decoder, state = decoding.init(jax.random.key(1), target, prompts, drafter=drafter, **kw)
    pieces = [[] for _ in prompts]
    for _, new in decoding.stream(decoder, state, steps_per_chunk=2):
        assert len(new) == len(prompts)
        for piece, tokens in zip(pieces, new, strict=True):
            piece.extend(tokens)
    assert pieces == closed.to_lists()


# ----------------------------------------------------------------------------
# Adaptive γ.


TABLE = dict(gamma_by_active_rows={4: 3, 40: 1})
CONFIDENCE = dict(draft_confidence=0.5)
BOTH = dict(gamma_by_active_rows=[(2, 3), (6, 2), (40, 0)], draft_confidence=0.3)
PLAIN_AT_LARGE = dict(gamma_by_active_rows={3: 3, 40: 0})


# Slow: each case compiles four decoders (greedy and coupled, with their plain
# references) with up to four loop variants each, 15-35 s apiece on 2 cores.
@pytest.mark.slow
@pytest.mark.parametrize(
    "adaptive, num_slots",
    [(TABLE, 8), (TABLE, 4), (CONFIDENCE, None), (CONFIDENCE, 8), (BOTH, 4), (PLAIN_AT_LARGE, 8)],
    ids=["table-8", "table-4", "confidence-all", "confidence-8", "both-4", "gamma0-8"],
)
def test_adaptive_gamma_stays_exact(target, drafters, greedy_reference, adaptive, num_slots):
    """Greedy output equals plain greedy; coupled sampled output equals plain sampled (at
    the same forward width, which the adaptive steps keep).

    And the mechanisms really act: the table changes γ between steps, the threshold
    leaves drafts unproposed.
    """
    prompts, budgets, ref = greedy_reference
    drafter = drafters["draft_model"]
    kw = dict(max_new_tokens=budgets, eos_id=EOS, num_slots=num_slots, forward_width=WIDTH)
    greedy = _decode(target, drafter, prompts, sampling=GREEDY, **adaptive, **kw)
    assert greedy.to_lists() == ref.to_lists()

    sampled = specjax.SamplingConfig(temperature=1.0)
    plain = _decode(target, None, prompts, sampling=sampled, **kw)
    coupled = _decode(
        target, drafter, prompts, sampling=sampled, verification="coupled", **adaptive, **kw
    )
    assert coupled.to_lists() == plain.to_lists()
    stats = coupled.stats
    drafted, calls = np.asarray(stats.drafted), np.asarray(stats.row_target_calls)
    if "draft_confidence" in adaptive:
        assert np.sum(drafted) < 3 * np.sum(calls)
    if "gamma_by_active_rows" in adaptive and "draft_confidence" not in adaptive:
        per_step = drafted[calls > 0] / calls[calls > 0]
        if num_slots == 4:
            # Never more than 4 active rows: the table's first entry, γ = 3, throughout.
            np.testing.assert_array_equal(per_step, 3)
        elif adaptive is PLAIN_AT_LARGE:
            # Plain steps while many rows are active; drafts only in the tail.
            assert np.min(per_step) == 0 < np.max(per_step)
        else:
            # Some prompts drafted 1 per step and some up to 3: γ changed in the run.
            assert np.max(per_step) > 1 and np.min(per_step) < 3


@pytest.mark.parametrize("name", ["draft_model", "draft_model_argmax", "lookup", "block"])
# Slow tier: 11 s per drafter.
@pytest.mark.slow
def test_plain_steps_in_the_table_keep_every_drafter_exact(
    target, drafters, greedy_reference, name
):
    """γ = 0 (a plain step) while more than 3 rows are active: every drafter's state
    stays right through those steps, so greedy output still equals plain greedy (at the
    same forward width), and
    drafting resumes at the tail. The draft models draft with the target's own weights,
    so with their caches caught up every tail draft is accepted (a cache missing the
    tokens of the plain steps would draft from the wrong context)."""
    prompts, budgets, ref = greedy_reference
    drafter = drafters[name]
    if name.startswith("draft_model"):
        drafter = drafter.replace(model=target)
    out = _decode(
        target,
        drafter,
        prompts,
        max_new_tokens=budgets,
        num_slots=8,
        **GREEDY_TO_EOS,
        **PLAIN_AT_LARGE,
    )
    assert out.to_lists() == ref.to_lists()
    drafted, calls = np.sum(out.stats.drafted), np.sum(out.stats.row_target_calls)
    assert 0 < drafted < calls
    if name.startswith("draft_model"):
        # Every draft accepted, up to where EOS or the budget cut the row.
        hist = np.asarray(out.stats.accepted_hist)
        assert hist[3] > 0 and hist[1:3].sum() <= hist[3]


# Slow tier: 10 s.
@pytest.mark.slow
def test_confidence_one_proposes_one_draft_per_step(target, drafters, greedy_reference):
    """τ = 1 stops after the first draft unless it is certain: at T=1, one per step."""
    prompts, budgets, _ = greedy_reference
    sampled = specjax.SamplingConfig(temperature=1.0)
    kw = dict(max_new_tokens=budgets, sampling=sampled, eos_id=EOS, num_slots=8)
    out = _decode(target, drafters["draft_model"], prompts, draft_confidence=1.0, **kw)
    np.testing.assert_array_equal(out.stats.drafted, out.stats.row_target_calls)
    assert int(jnp.sum(out.stats.accepted)) > 0
    np.testing.assert_array_equal(np.asarray(out.stats.accepted_hist)[2:], 0)


# Slow tier: 12 s.
@pytest.mark.slow
def test_greedy_draft_proposes_the_argmax_without_q(target, drafters):
    prompts, _ = _prompts(num=4)
    prompts_BP, lengths = decoding.pad_prompts(prompts)
    argmax, sampled = drafters["draft_model_argmax"], drafters["draft_model"]
    state = argmax.init(prompts_BP, lengths, 64)
    sampling = specjax.sampling.per_row(specjax.SamplingConfig(temperature=1.0), 4)
    keys = jax.random.split(jax.random.key(0), 12).reshape(4, 3)
    seq = jnp.zeros((4, 64), jnp.int32).at[:, : prompts_BP.shape[1]].set(prompts_BP)
    propose = jax.jit(
        lambda drafter, state, sampling: drafter.propose(keys, state, seq, lengths, sampling)
    )
    proposal = propose(argmax, state, sampling)
    assert proposal.probs is None
    # Its tokens are the sampling drafter's at temperature 0, where q is one-hot.
    greedy = specjax.sampling.per_row(GREEDY, 4)
    reference = propose(sampled, sampled.init(prompts_BP, lengths, 64), greedy)
    np.testing.assert_array_equal(proposal.tokens, reference.tokens)


# ----------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_slots=0), "num_slots"),
        (dict(num_slots=5), "num_slots=5 is more than the 4 prompts"),
        (dict(num_slots=2.0), "num_slots"),
        (dict(num_slots=True), "num_slots"),
        (dict(gamma_by_active_rows={2: 4}), r"gamma_by_active_rows\[0\] γ"),
        (dict(gamma_by_active_rows={2: -1}), r"gamma_by_active_rows\[0\] γ"),
        (dict(gamma_by_active_rows=[]), "gamma_by_active_rows must be a non-empty"),
        (dict(gamma_by_active_rows=[(2, 1), (2, 3)]), "names one max_active_rows twice"),
        (dict(gamma_by_active_rows=[(2, 1, 3)]), r"gamma_by_active_rows\[0\] must be a"),
        (dict(gamma_by_active_rows=[(0, 1)]), "max_active_rows"),
        (dict(draft_confidence=1.5), "draft_confidence must be a float in"),
        (dict(draft_confidence=-0.1), "draft_confidence must be a float in"),
        (dict(draft_confidence=[0.5]), "draft_confidence must be a float in"),
    ],
)
def test_bad_continuous_batching_arguments_are_refused(target, drafters, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        specjax.speculative_generate(
            jax.random.key(0),
            target,
            drafters["draft_model"],
            [[1, 2]] * 4,
            max_new_tokens=4,
            **kwargs,
        )


# Fast tier: the sampling drafter; argmax drafting with -m slow.
@pytest.mark.first_case_fast
@pytest.mark.parametrize("greedy_draft", [False, True])
def test_a_draft_model_stops_drafting_by_itself(target, drafters, greedy_draft):
    """Under τ the draft model itself stops a row after its first unconfident draft.

    Greedy rows (q one-hot) and argmax drafts stop on the draft model's softmax, so τ
    acts at temperature 0 too. A draft no row proposes is not fed: the draft cache
    then holds only the proposed prefix. B = 4 = γ + 1 rows.
    """
    drafter = drafters["draft_model_argmax" if greedy_draft else "draft_model"]
    prompts, _ = _prompts(num=4)
    prompts_BP, lengths = decoding.pad_prompts(prompts)
    seq = jnp.zeros((4, 64), jnp.int32).at[:, : prompts_BP.shape[1]].set(prompts_BP)
    keys = jax.random.split(jax.random.key(0), 12).reshape(4, 3)
    greedy = specjax.sampling.per_row(GREEDY, 4)
    propose = jax.jit(
        lambda d: d.propose(keys, d.init(prompts_BP, lengths, 64), seq, lengths, greedy)
    )
    free = propose(drafter)
    assert free.num_drafted is None
    np.testing.assert_array_equal(free.state.lengths, lengths + 2)  # fed: pending, 2 drafts
    # τ = 1: every draft is below it (softmax < 1), so each row proposes one draft
    # and no second forward runs.
    one = propose(drafter.replace(stop_below=jnp.float32(1.0)))
    np.testing.assert_array_equal(one.num_drafted, 1)
    np.testing.assert_array_equal(one.state.lengths, lengths)
    np.testing.assert_array_equal(one.tokens[:, 0], free.tokens[:, 0])
    # τ = 0: nothing is below it, all γ drafts, the same as without τ.
    every = propose(drafter.replace(stop_below=jnp.float32(0.0)))
    np.testing.assert_array_equal(every.num_drafted, 3)
    np.testing.assert_array_equal(every.tokens, free.tokens)
    np.testing.assert_array_equal(every.state.lengths, free.state.lengths)


# Fast tier: the sampling drafter; argmax drafting with -m slow.
@pytest.mark.first_case_fast
@pytest.mark.parametrize("greedy_draft", [False, True])
def test_confidence_at_temperature_zero_stays_greedy(
    target, drafters, greedy_reference, greedy_draft
):
    """draft_confidence at T = 0: output equals plain greedy at the same forward width,
    and fewer drafts are proposed than γ per call (the threshold acts on greedy rows)."""
    prompts, budgets, ref = greedy_reference
    drafter = drafters["draft_model_argmax" if greedy_draft else "draft_model"]
    kw = dict(max_new_tokens=budgets[:6], draft_confidence=0.6, **GREEDY_TO_EOS)
    out = _decode(target, drafter, prompts[:6], **kw)
    assert out.to_lists() == ref.to_lists()[:6]
    drafted, calls = np.sum(out.stats.drafted), np.sum(out.stats.row_target_calls)
    assert calls <= drafted < 3 * calls


@pytest.mark.parametrize("name", ["lookup", "block"])
def test_confidence_needs_a_drafter_with_q(target, drafters, name):
    with pytest.raises(ValueError, match="draft_confidence needs a drafter that returns its q"):
        specjax.speculative_generate(
            jax.random.key(0),
            target,
            drafters[name],
            [[1, 2]],
            max_new_tokens=4,
            draft_confidence=0.5,
        )


def test_generate_refuses_too_many_slots(target):
    with pytest.raises(ValueError, match="num_slots=3 is more than the 2 prompts"):
        specjax.generate(jax.random.key(0), target, [[1], [2]], max_new_tokens=2, num_slots=3)
