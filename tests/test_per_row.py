"""Every form the decoders' arguments admit, in plain and speculative decoding.

The per-row bug (settings read along the γ+1 positions instead of the rows) lived
because every test used scalar settings. Here each argument that takes a scalar or an
array, an int or a list, is tried in each form, in `generate` and in
`speculative_generate` with both drafters, including batches with B == γ+1, where
the two axes have the same size and a mix-up raises no error.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import GREEDY, ragged_prompts

import specjax
from specjax.testing import tiny_model

V = 64
GAMMA = 3
B = GAMMA + 1  # the size at which rows and positions can be confused
# Both drafters verify γ + 1 columns; speculative output equals plain output token for
# token only at the same forward width, so the tests that compare them both use this one.
WIDTH = specjax.drafters.lookahead(specjax.PromptLookup(ngram=2, num_draft=GAMMA))


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab_size=V, init_scale=8.0)


@pytest.fixture(scope="module")
def decoders(target):
    # The target drafting for itself: drafts are accepted often, so every one of the
    # γ+1 scored positions emits tokens (a poor drafter would leave most tokens to
    # position 0, which hides a mix-up of rows and positions).
    draft = target

    def run(name, prompts, **kw):
        key = kw.pop("key", jax.random.key(0))
        if name == "plain":
            return specjax.generate(key, target, prompts, **kw)
        drafter = (
            specjax.DraftModel(draft, num_draft=GAMMA)
            if name == "draft_model"
            else specjax.PromptLookup(ngram=2, num_draft=GAMMA)
        )
        return specjax.speculative_generate(key, target, drafter, prompts, **kw)

    return run


DECODERS = ["plain", "draft_model", "lookup"]
# For the costlier tests: the two decoders (plain and speculative) in the fast tier; the
# prompt-lookup drafter, a third program each, in the slow tier (4 s a test).
DECODERS_LOOKUP_SLOW = [
    pytest.param(n, marks=pytest.mark.slow) if n == "lookup" else n for n in DECODERS
]


def _prompts(batch, seed=0):
    """Repetitive prompts of 2 to 10 tokens (prompt lookup finds matches)."""
    return ragged_prompts(batch, seed, high=8, repeat=2, lengths=(1, 5))


# --------------------------------------------------------------------------------------
# Sampling settings: scalar or [B], in every form; anything else refused.

TEMPERATURES = [0.0, 1.5, 0.0, 2.0]  # greedy rows next to hot sampled rows


@pytest.mark.parametrize(
    "form",
    ["list", "numpy", "jax"],
)
@pytest.mark.parametrize("name", DECODERS_LOOKUP_SLOW)
def test_greedy_rows_in_a_sampled_batch_equal_plain_greedy(decoders, name, form):
    """B == γ+1: rows 0 and 2 are greedy and must equal plain greedy token for token (at
    the same forward width).

    With settings read along positions, as before the fix, rows 0 and 2 sampled at
    positions 1 and 3's temperatures (and the sampled rows decoded greedily).
    """
    temps = {
        "list": TEMPERATURES,
        "numpy": np.asarray(TEMPERATURES),
        "jax": jnp.asarray(TEMPERATURES),
    }
    prompts = _prompts(B, seed=1)
    kw = dict(max_new_tokens=12, forward_width=WIDTH)
    mixed = decoders(name, prompts, sampling=specjax.SamplingConfig(temperature=temps[form]), **kw)
    greedy = decoders("plain", prompts, sampling=GREEDY, **kw)
    tokens, ref = np.asarray(mixed.tokens), np.asarray(greedy.tokens)
    np.testing.assert_array_equal(tokens[[0, 2]], ref[[0, 2]])
    # The hot rows really sample: at temperature 1.5-2 on V = 64 they leave greedy.
    assert not np.array_equal(tokens[[1, 3]], ref[[1, 3]])


@pytest.mark.parametrize("name", DECODERS)
def test_scalar_forms_share_one_result(decoders, name):
    prompts = _prompts(B, seed=2)
    outs = [
        decoders(name, prompts, max_new_tokens=8, sampling=specjax.SamplingConfig(**kw))
        for kw in (
            dict(temperature=0.8, top_k=5),
            dict(temperature=np.float32(0.8), top_k=np.int64(5)),
            dict(temperature=jnp.float32(0.8), top_k=jnp.int32(5)),
            dict(temperature=[0.8] * B, top_k=[5] * B),
        )
    ]
    for out in outs[1:]:
        np.testing.assert_array_equal(out.tokens, outs[0].tokens)


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", np.ones((B, 1), np.float32)),  # [B, 1]: refused, not broadcast
        ("top_p", np.full((B + 1,), 0.9, np.float32)),
        ("top_k", np.zeros((B, GAMMA + 1), np.int32)),
        ("min_p", np.zeros((1,), np.float32)),
    ],
)
def test_other_setting_shapes_are_refused(decoders, name, field, value):
    with pytest.raises(ValueError, match=rf"SamplingConfig\.{field} has shape"):
        decoders(
            name, _prompts(B), max_new_tokens=4, sampling=specjax.SamplingConfig(**{field: value})
        )


def test_probs_from_logits_reads_settings_along_the_leading_axis():
    """[B] settings meet target logits [B, γ+1, V] and draft logits [B, V] along B."""
    logits = jax.random.normal(jax.random.key(0), (B, GAMMA + 1, 16)) * 3
    config = specjax.SamplingConfig(temperature=jnp.asarray([0.0, 1.0, 0.5, 2.0]))
    target = specjax.sampling.probs_from_logits(logits, config)
    draft = specjax.sampling.probs_from_logits(logits[:, 0], config)
    for b, t in enumerate([0.0, 1.0, 0.5, 2.0]):
        row = specjax.sampling.probs_from_logits(logits[b], specjax.SamplingConfig(temperature=t))
        np.testing.assert_array_equal(target[b], row)
        np.testing.assert_array_equal(draft[b], row[0])
    with pytest.raises(ValueError, match=r"SamplingConfig\.temperature has shape \[4\]"):
        specjax.sampling.probs_from_logits(logits[:3], config)


# --------------------------------------------------------------------------------------
# eos_id: an int or [K] ids.


@pytest.mark.parametrize("name", DECODERS)
def test_eos_id_forms(decoders, name):
    prompts = _prompts(B, seed=3)
    kw = dict(max_new_tokens=12, sampling=GREEDY, forward_width=WIDTH)
    free = decoders("plain", prompts, **kw).to_lists()
    first, other = free[0][4], free[1][2]
    one = decoders(name, prompts, eos_id=first, **kw).to_lists()
    for form in ([first], np.asarray([first]), jnp.asarray([first]), np.int64(first)):
        assert decoders(name, prompts, eos_id=form, **kw).to_lists() == one
    several = decoders(name, prompts, eos_id=[first, other], **kw).to_lists()
    for row, ref in zip(several, free, strict=True):
        stops = [i for i, tok in enumerate(ref) if tok in (first, other)]
        assert row == (ref[: stops[0] + 1] if stops else ref)
    assert several[0][-1] == first and several[1][-1] == other


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("eos", [-5, V, 2.7, "3", [[1, 2]], [1, V]])
def test_bad_eos_ids_are_refused(decoders, name, eos):
    with pytest.raises((ValueError, TypeError), match="eos_id"):
        decoders(name, _prompts(2), max_new_tokens=4, eos_id=eos)


# --------------------------------------------------------------------------------------
# max_new_tokens: an int or [B].


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("form", ["list", "numpy", "jax"])
def test_per_row_token_budgets(decoders, name, form):
    budgets = [3, 9, 1, 6]
    value = {"list": budgets, "numpy": np.asarray(budgets), "jax": jnp.asarray(budgets)}[form]
    prompts = _prompts(B, seed=4)
    kw = dict(sampling=GREEDY, forward_width=WIDTH)
    out = decoders(name, prompts, max_new_tokens=value, **kw)
    assert out.lengths.tolist() == budgets and out.tokens.shape == (B, 9)
    full = decoders("plain", prompts, max_new_tokens=9, **kw).to_lists()
    assert out.to_lists() == [row[:n] for row, n in zip(full, budgets, strict=True)]


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize(
    "value", [0, -1, 3.7, "5", None, 2**31, [3, 0, 2, 2], [3, 3], [[3], [3], [3], [3]]]
)
def test_bad_token_budgets_are_refused(decoders, name, value):
    with pytest.raises((ValueError, TypeError), match="max_new_tokens"):
        decoders(name, _prompts(B), max_new_tokens=value)


@pytest.mark.parametrize("name", DECODERS_LOOKUP_SLOW)
# Fast tier: plain decoding; the drafters' cases (about 7 s each) are slow.
@pytest.mark.first_case_fast
def test_traced_budgets_below_one_give_no_tokens_in_both_decoders(decoders, name):
    """Inside a user's jit the budget cannot be checked; <= 0 then means 0 tokens."""
    prompts = jnp.asarray([[1, 2, 3]] * B, jnp.int32)

    @jax.jit
    def run(budget):
        return decoders(name, prompts, max_new_tokens=budget, cache_len=64, sampling=GREEDY)

    out = run(jnp.asarray([0, -3, 2, 5], jnp.int32))
    assert out.lengths.tolist() == [0, 0, 2, 5]
    assert (np.asarray(out.tokens)[:2] == -1).all()


# --------------------------------------------------------------------------------------
# seeds: [B] ints.


@pytest.mark.parametrize("name", DECODERS)
def test_seed_forms(decoders, name):
    prompts = _prompts(B, seed=5)
    kw = dict(max_new_tokens=8, sampling=specjax.SamplingConfig(temperature=1.0))
    default = decoders(name, prompts, **kw)
    for form in (list(range(B)), np.arange(B), jnp.arange(B)):
        np.testing.assert_array_equal(
            decoders(name, prompts, seeds=form, **kw).tokens, default.tokens
        )
    other = decoders(name, prompts, seeds=[10, 11, 12, 13], **kw)
    assert not np.array_equal(other.tokens, default.tokens)


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("seeds", [3, [1, 2], [0.5] * B, [-1] * B, [2**31] * B])
def test_bad_seeds_are_refused(decoders, name, seeds):
    with pytest.raises((ValueError, TypeError), match="seeds"):
        decoders(name, _prompts(B), max_new_tokens=4, seeds=seeds)
