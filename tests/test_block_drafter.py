"""`specjax.drafters.block.BlockDrafter`: exact, trainable, and fed by the target's own forwards.

The main target is tiny (V = 8, 4 layers, ``init_scale = 8``); the drafters share one
architecture (1 draft layer, blocks of up to 9, so γ ∈ {1, 4, 8} via ``with_draft``): a
random one, which accepts almost nothing (about 1%), and one trained for 120 steps with
`train_drafter` on text the target generated (a module fixture, also the reference
run of the training tests), which accepts a lot (greedy, batch 8: about 0.74 / 0.49 /
0.40 at γ = 1 / 4 / 8, with whole blocks accepted). The main target's greedy output soon
settles on a repeated token, which is what makes it easy to draft, so the greedy tests
also run a random drafter on a second target of the same shape whose greedy output keeps
changing. Targets and drafters of one shape share every compiled decode program (weights
are traced; γ, the mode and the architecture are static).

1. Greedy: speculative output equals `specjax.generate`'s greedy output token for token
   at the same forward width, in both modes and for γ ∈ {1, 4, 8}, at batch 8 (ragged
   prompts; a budget of 13; per-row budgets none of which is a multiple of γ+1; an EOS
   that lands inside a block: accepted as a draft with the trained drafter, at a length
   that is not a multiple of γ+1 with the random one) and at batch 1. Batch 5 with γ = 4
   (B == γ+1) mixes a greedy row and sampled rows, with budgets and seeds per row, under
   coupled verification, whose output must equal plain `generate`'s token for token at
   the same forward width in both modes.
2. Sampled output is exact: one batch of 4 × N_PER_GROUP rows, row i in group i % 4
   (temperature 1; with top-k 3; with top-p 0.8; with min-p 0.1), γ = 2, the first K = 3
   tokens (step one's accept/reject at both drafted positions, the bonus token, and a
   second step after a rejection). Each group is chi-square tested against the exact
   distribution enumerated by `exact_sequence_probs`. N_PER_GROUP = 1,500 rows, and each
   test rejects at p < FALSE_ALARM = 1e-4; there are 2 modes × 4 groups = 8 such tests,
   so the family-wise false-alarm rate is below 8e-4 (Bonferroni). Keys are fixed, so
   the outcome is deterministic. Every accept count 0..γ occurs and the acceptance rate
   is asserted well above zero (measured: about 0.24 in argmax mode, where it is
   p(argmax q), and 0.73 in sample mode), so the accept and reject paths both carry
   weight.
3. Negative control: a drafter that proposes the argmax but reports the full marginal as
   q (so min(1, p/q) is applied to a token that was not drawn from q) is rejected by the
   same test at the same N (measured p ~ 0 in every group). Sampled drafts verified as
   one-hot would be no control: rejection sampling with a one-hot q is exact whatever
   the tokens.
4. Training: the loss falls, resume from a checkpoint is bit-identical (losses and
   weights), and `specjax.io.drafter_weights` ``save`` / ``load`` round-trip the weights
   and the output.
5. The features contract: the whole decoder, traced through a counting wrapper, runs
   exactly two target forwards (the prefill and the loop body's verify forward), both
   asking for the drafter's layers; a `Model` called with ``feature_layers`` returns the
   residual stream after those layers, checked against the layers run one by one.

Compiles dominate the run time (about 4 s per decode program on a 2-core CPU); the
batch-1 combinations beyond one are marked slow for that reason.
"""

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct
from support import GREEDY, group_rows, ragged_prompts

import specjax
from specjax import training as train
from specjax.drafters import Proposal
from specjax.drafters.block import BlockDrafter
from specjax.io import drafter_weights
from specjax.io.pretrained import smollm2_drafter
from specjax.models.attention import rope_inv_freq
from specjax.models.contract import check_before_compiling
from specjax.sampling import greedy_tokens, probs_from_logits
from specjax.testing import chi_square_pvalue, exact_sequence_probs, sequence_counts, tiny_model

V = 8
GAMMAS = (1, 4, 8)
MODES = ("argmax", "sample")
BLOCK_SIZE = 9  # the largest γ + 1

# Batch 8: ragged prompts of 1..8 tokens; 13 and the per-row budgets are all odd and
# none is a multiple of 5 or 9, so no budget is a multiple of γ + 1 for γ ∈ {1, 4, 8}.
MAX_NEW = 13
ROW_BUDGETS = np.asarray([13, 1, 7, 11, 3, 17, 19, 23], np.int32)

# Training: greedy and temperature-1 continuations of random prompts by the target.
TRAIN_CONFIG = train.BlockTrainConfig(
    steps=120,
    batch_size=8,
    seq_len=32,
    num_anchors=8,
    decay=4.0,
    learning_rate=2e-2,
    warmup_steps=10,
    checkpoint_every=40,
    keep_checkpoints=3,
    seed=0,
    progress=False,
)

# The statistical tests.
PROMPT = [1, 2, 3, 1, 2]
K = 3
STAT_GAMMA = 2
N_PER_GROUP = 1_500
FALSE_ALARM = 1e-4
GROUPS = {
    "t1": dict(temperature=1.0),
    "t1_topk3": dict(temperature=1.0, top_k=3),
    "t1_topp0.8": dict(temperature=1.0, top_p=0.8),
    "t1_minp0.1": dict(temperature=1.0, min_p=0.1),
}
_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def _per_row(settings):
    """A SamplingConfig with one [B] array per field, row b taking ``settings[b]``."""
    return specjax.SamplingConfig(
        **{f: np.asarray([s.get(f, d) for s in settings]) for f, d in _DEFAULTS.items()}
    )


def _assert_same_output(spec, plain):
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(plain.lengths))


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab_size=V, init_scale=8.0, num_layers=4)


@pytest.fixture(scope="module")
def random_drafter(target):
    return BlockDrafter.random(
        target, key=jax.random.key(1), num_draft=BLOCK_SIZE - 1, block_size=BLOCK_SIZE
    )


@pytest.fixture(scope="module")
def diverse():
    """Another target of the same shape (so the same compiled programs) whose greedy
    output keeps changing: `target`'s greedy output soon settles on a repeated token,
    which is what makes it easy to draft. With a random drafter of its own."""
    other = tiny_model(seed=1, vocab_size=V, init_scale=8.0, num_layers=4)
    drafter = BlockDrafter.random(
        other, key=jax.random.key(2), num_draft=BLOCK_SIZE - 1, block_size=BLOCK_SIZE
    )
    return other, drafter


@pytest.fixture(scope="module")
def corpus(target):
    """About 3,000 tokens: prompts and 40-token continuations, greedy and at temperature 1.

    Batch 8 with a 64-slot cache, plain decoding one token wide.
    """
    rng = np.random.default_rng(123)
    pieces = []
    for i in range(8):
        prompts = ragged_prompts(8, seed=rng, high=V)
        sampling = specjax.SamplingConfig(temperature=float(i % 2))
        out = specjax.generate(
            jax.random.key(100 + i), target, prompts, max_new_tokens=40, sampling=sampling
        )
        for prompt, row in zip(prompts, out.to_lists(), strict=True):
            pieces += prompt + row
    return np.asarray(pieces, np.int32)


@pytest.fixture(scope="module")
def training(target, random_drafter, corpus, tmp_path_factory):
    """The reference run: TRAIN_CONFIG, with checkpoints every 40 steps."""
    ckpt = tmp_path_factory.mktemp("block_drafter_run")
    result = train.train_drafter(random_drafter, corpus, TRAIN_CONFIG, checkpoint_dir=ckpt)
    return result, ckpt


@pytest.fixture(scope="module")
def trained(training):
    return training[0].model


# --------------------------------------------------------------------------------------
# 1. Greedy: speculative output == plain greedy output, at the same forward width.

PROMPTS8 = ragged_prompts(8, seed=8, high=V)


def _plain(
    target,
    prompts,
    max_new_tokens,
    *,
    sampling=GREEDY,
    seeds=None,
    eos_id=None,
    key=None,
    forward_width=None,
):
    """`specjax.generate` for up to 8 rows, run as a batch of 8 (padded with copies of
    row 0, budget 1) so that every call at one ``forward_width`` shares one batch-8
    program; a row's output depends on its key, seed, prompt and settings only, never on
    the rest of the batch."""
    n = len(prompts)
    pad = lambda x, fill: np.concatenate([np.broadcast_to(x, (n,)), np.full(8 - n, fill)])
    budgets = np.broadcast_to(np.asarray(max_new_tokens, np.int32), (n,))
    sampling8 = jax.tree.map(lambda x: pad(x, np.asarray(x).reshape(-1)[0]), sampling)
    seeds8 = pad(np.arange(n) if seeds is None else seeds, 0).astype(np.int32)
    out = specjax.generate(
        jax.random.key(0) if key is None else key,
        target,
        list(prompts) + [prompts[0]] * (8 - n),
        max_new_tokens=pad(budgets, 1).astype(np.int32),
        sampling=sampling8,
        seeds=seeds8,
        eos_id=eos_id,
        forward_width=forward_width,
    )
    width = int(budgets.max())
    return out.replace(
        tokens=out.tokens[:n, :width], lengths=out.lengths[:n], logprobs=out.logprobs[:n, :width]
    )


def _eos_rows(tokens, lengths, from_draft, eos, gamma):
    """Rows whose output ends at its first ``eos`` after at least one other token: those
    where that EOS is emitted at a length that is not a multiple of γ + 1, and those where
    it is an accepted draft (so that the target's token after it in the same block, at
    least, was cut)."""
    off_grid, drafted = [], []
    for b in range(len(tokens)):
        hits = np.flatnonzero(np.asarray(tokens[b][: lengths[b]]) == eos)
        if hits.size and hits[0] >= 1:
            j = hits[0]
            if (j + 1) % (gamma + 1) != 0:
                off_grid.append(b)
            if from_draft[b][j]:
                drafted.append(b)
    return off_grid, drafted


def _mid_block_eos(out, gamma, drafted_only):
    """An EOS id that lands inside a block for some row of ``out``: as an accepted draft
    if ``drafted_only``, else at a length that is not a multiple of γ + 1."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    from_draft = np.asarray(out.from_draft)
    scores = {}
    for eos in range(V):
        off_grid, drafted = _eos_rows(tokens, lengths, from_draft, eos, gamma)
        if drafted if drafted_only else off_grid:
            scores[eos] = (len(set(off_grid) & set(drafted)), len(off_grid) + len(drafted))
    assert scores, "no EOS id lands mid-block: the test would not cover it"
    return max(scores, key=scores.get)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("mode", MODES)
# Slow tier: tests/test_numerics.py keeps this drafter's equality with plain decoding at
# one width in the fast tier.
@pytest.mark.slow
def test_greedy_batch8_equals_plain(target, random_drafter, trained, diverse, mode, gamma):
    key = jax.random.key(0)
    rates = {}
    cases = {
        "random": (target, random_drafter),
        "trained": (target, trained),
        "diverse_random": diverse,
    }
    for name, (model, base) in cases.items():
        drafter = base.with_draft(num_draft=gamma, mode=mode)
        width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
        run = lambda model=model, drafter=drafter, width=width, **kw: specjax.speculative_generate(
            key, model, drafter, PROMPTS8, sampling=GREEDY, forward_width=width, **kw
        )
        spec = run(max_new_tokens=MAX_NEW)
        _assert_same_output(spec, _plain(model, PROMPTS8, MAX_NEW, forward_width=width))
        assert np.asarray(spec.lengths).tolist() == [MAX_NEW] * 8
        rates[name] = float(spec.stats.acceptance_rate)
        if name == "random":
            continue

        budgets = run(max_new_tokens=ROW_BUDGETS)
        _assert_same_output(budgets, _plain(model, PROMPTS8, ROW_BUDGETS, forward_width=width))
        np.testing.assert_array_equal(np.asarray(budgets.lengths), ROW_BUDGETS)

        # EOS inside a block: the trained drafter has it accepted as a draft (so the rest
        # of that block is cut); with the random one it lands off the γ+1 grid.
        drafted_only = name == "trained"
        eos = _mid_block_eos(spec, gamma, drafted_only)
        spec_eos = run(max_new_tokens=MAX_NEW, eos_id=eos)
        plain_eos = _plain(model, PROMPTS8, MAX_NEW, eos_id=eos, forward_width=width)
        _assert_same_output(spec_eos, plain_eos)
        tokens, lengths = np.asarray(spec_eos.tokens), np.asarray(spec_eos.lengths)
        for b in range(8):  # a row stops at its first EOS, EOS included
            assert eos not in tokens[b, : lengths[b] - 1].tolist()
            assert tokens[b, lengths[b] - 1] == eos or lengths[b] == MAX_NEW
        off_grid, drafted = _eos_rows(tokens, lengths, np.asarray(spec_eos.from_draft), eos, gamma)
        assert drafted if drafted_only else off_grid, (name, eos, off_grid, drafted)

        if name == "trained" and gamma > 1:  # multi-token blocks were really accepted
            assert np.asarray(spec.stats.accepted_hist)[2:].sum() > 0
    # The trained drafter accepts a lot, the random one little.
    floor = {1: 0.4, 4: 0.25, 8: 0.15}[gamma]
    assert rates["trained"] > floor and rates["trained"] > 2 * rates["random"], rates


# Batch 1 costs one compile per (mode, γ) (about 4 s): one runs by default, the other
# five in the slow set (the batch-8 test above covers all six combinations).
@pytest.mark.parametrize(
    "mode, gamma",
    [
        # All slow (about 6 s a case): the fast tier keeps B == γ+1 below.
        pytest.param("argmax", 8, marks=pytest.mark.slow),
        pytest.param("sample", 1, marks=pytest.mark.slow),
        pytest.param("argmax", 1, marks=pytest.mark.slow),
        pytest.param("argmax", 4, marks=pytest.mark.slow),
        pytest.param("sample", 4, marks=pytest.mark.slow),
        pytest.param("sample", 8, marks=pytest.mark.slow),
    ],
)
def test_greedy_batch1_equals_plain(target, trained, diverse, mode, gamma):
    key = jax.random.key(0)
    for model, base in ((target, trained), diverse):
        for prompt in (PROMPTS8[:1], PROMPTS8[3:4]):
            drafter = base.with_draft(num_draft=gamma, mode=mode)
            width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
            plain = _plain(model, prompt, MAX_NEW, forward_width=width)
            kw = dict(max_new_tokens=MAX_NEW, sampling=GREEDY, forward_width=width)
            spec = specjax.speculative_generate(key, model, drafter, prompt, **kw)
            _assert_same_output(spec, plain)
            # EOS: the token greedy decoding emits at index 6 (a row stops at its first).
            eos = int(np.asarray(plain.tokens)[0, 6])
            spec_eos = specjax.speculative_generate(key, model, drafter, prompt, eos_id=eos, **kw)
            plain_eos = _plain(model, prompt, MAX_NEW, eos_id=eos, forward_width=width)
            _assert_same_output(spec_eos, plain_eos)
            assert spec_eos.to_lists()[0][-1] == eos


@pytest.mark.parametrize("mode", MODES)
# Fast tier: the first case of each parametrize list; the others run with -m slow.
@pytest.mark.first_case_fast
def test_batch_of_gamma_plus_one_rows_coupled_equals_plain(target, trained, mode):
    """B = 5 = γ+1 with per-row settings, budgets and seeds: coupled verification gives
    `generate`'s sample at the same forward width token for token, its greedy row
    included."""
    settings = [
        dict(temperature=0.0),
        GROUPS["t1"],
        GROUPS["t1_topk3"],
        GROUPS["t1_topp0.8"],
        GROUPS["t1_minp0.1"],
    ]
    sampling = _per_row(settings)
    prompts = ragged_prompts(5, seed=5, high=V)
    budgets = np.asarray([13, 9, 6, 11, 7], np.int32)
    seeds = np.asarray([7, 3, 11, 0, 5], np.int32)
    drafter = trained.with_draft(num_draft=4, mode=mode)
    width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
    greedy = _plain(target, prompts[:1], budgets[0], forward_width=width)
    accepted = 0
    for i in range(2):
        key = jax.random.key(40 + i)
        kw = dict(max_new_tokens=budgets, sampling=sampling, seeds=seeds, forward_width=width)
        coupled = specjax.speculative_generate(
            key, target, drafter, prompts, verification="coupled", **kw
        )
        plain = _plain(target, prompts, key=key, **kw)
        _assert_same_output(coupled, plain)
        np.testing.assert_array_equal(np.asarray(coupled.lengths), budgets)
        np.testing.assert_allclose(
            np.asarray(coupled.logprobs), np.asarray(plain.logprobs), rtol=1e-5, atol=1e-6
        )
        assert coupled.to_lists()[0] == greedy.to_lists()[0]
        accepted += int(np.sum(coupled.stats.accepted))
    assert accepted > 0  # the coupled drafts were accepted at least sometimes


# --------------------------------------------------------------------------------------
# 2./3. Sampled output is exact, and a mislabelled q is caught.


@struct.dataclass
class MislabelledDrafter(BlockDrafter):
    """Proposes the argmax tokens but reports the full marginals as their q.

    The verifier then accepts with min(1, p/q) a token that was not drawn from q: the
    output is no longer the target's distribution.
    """

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        logits_BGV = self.block_logits(state, seq_BS, seq_lengths_B)
        probs = probs_from_logits(logits_BGV, sampling)
        return Proposal(tokens=greedy_tokens(logits_BGV), probs=probs, state=state)


def _mislabelled(drafter):
    fields = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)}
    return MislabelledDrafter(**fields)


@pytest.fixture(scope="module")
def stat_samples(target, trained):
    """Tokens [4 N, K] and stats of each drafter on one mixed batch, one key throughout."""
    names = list(GROUPS)
    num_rows = N_PER_GROUP * len(names)
    sampling = _per_row([GROUPS[names[i % len(names)]] for i in range(num_rows)])
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))
    drafters = {mode: trained.with_draft(num_draft=STAT_GAMMA, mode=mode) for mode in MODES}
    drafters["mislabelled"] = _mislabelled(trained.with_draft(num_draft=STAT_GAMMA))
    out = {}
    for name, drafter in drafters.items():
        res = specjax.speculative_generate(
            jax.random.key(2026),
            target,
            drafter,
            prompts,
            max_new_tokens=K,
            sampling=sampling,
            cache_len=16,
        )
        assert int(jnp.min(res.lengths)) == K
        out[name] = (np.asarray(res.tokens), jax.device_get(res.stats))
    return out


@pytest.fixture(scope="module")
def exact(target):
    return {
        g: exact_sequence_probs(target, PROMPT, K, specjax.SamplingConfig(**s))
        for g, s in GROUPS.items()
    }


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("mode", MODES)
# Slow tier: 19 s: statistical, 10,000+ rows per group.
@pytest.mark.slow
def test_sampled_output_has_the_target_distribution(stat_samples, exact, mode, group):
    tokens, _ = stat_samples[mode]
    rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
    p = chi_square_pvalue(sequence_counts(rows, V), exact[group])
    assert p > FALSE_ALARM, f"{mode}/{group}: chi-square p = {p:.2e}"


@pytest.mark.parametrize("mode", MODES)
# Slow tier: it reads the statistical samples (16 s to draw).
@pytest.mark.slow
def test_statistical_tests_exercise_accept_and_reject(stat_samples, mode):
    """Power over both paths: every accept count 0..γ occurs, and a good share is accepted."""
    _, stats = stat_samples[mode]
    hist = np.asarray(stats.accepted_hist)
    assert (hist > 0).all(), hist
    rate = np.sum(stats.accepted) / np.sum(stats.drafted)
    assert rate > {"argmax": 0.15, "sample": 0.4}[mode], rate


# Slow tier: the negative control of the statistical test above, on its samples.
@pytest.mark.slow
def test_control_mislabelled_q_is_rejected(stat_samples, exact):
    """Negative control: the same test at the same N rejects the mislabelled drafter."""
    tokens, _ = stat_samples["mislabelled"]
    for group in GROUPS:
        rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
        p = chi_square_pvalue(sequence_counts(rows, V), exact[group])
        assert p < FALSE_ALARM, f"mislabelled/{group}: p = {p:.2e} (the test has no power)"


# --------------------------------------------------------------------------------------
# 4. Training, resume, save/load.


def test_training_loss_falls(training):
    losses = np.asarray(training[0].losses)
    assert len(losses) == TRAIN_CONFIG.steps and np.isfinite(losses).all()
    first, last = losses[:20].mean(), losses[-20:].mean()
    assert last < first - 0.25, (first, last)


def test_resume_is_bit_identical(target, random_drafter, corpus, training, tmp_path):
    reference, ckpt = training
    ckpt_copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, ckpt_copy)
    names = [p.name for p in train.list_checkpoints(ckpt_copy)]
    assert names == ["step_00000040", "step_00000080", "step_00000120"]
    shutil.rmtree(ckpt_copy / names[-1])  # the newest is lost: resume from step 80

    resumed = train.train_drafter(
        random_drafter, corpus, TRAIN_CONFIG, checkpoint_dir=ckpt_copy, resume=True
    )
    assert resumed.start_step == 80 and resumed.steps == TRAIN_CONFIG.steps
    assert resumed.losses == reference.losses
    want, got = jax.tree.leaves(reference.model.params), jax.tree.leaves(resumed.model.params)
    assert len(want) == len(got)
    for x, y in zip(want, got, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_load_round_trip(target, trained, tmp_path):
    drafter = trained.with_draft(num_draft=4, mode="argmax")
    folder = drafter_weights.save(drafter, tmp_path / "drafter")
    loaded = drafter_weights.load(BlockDrafter, folder, target)
    for field in ("config", "target_layers", "block_size", "num_draft", "mode"):
        assert getattr(loaded, field) == getattr(drafter, field), field
    want, got = jax.tree.leaves(drafter.params), jax.tree.leaves(loaded.params)
    assert len(want) == len(got)
    for x, y in zip(want, got, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    key = jax.random.key(0)
    a = specjax.speculative_generate(
        key, target, drafter, PROMPTS8, max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    b = specjax.speculative_generate(
        key, target, loaded, PROMPTS8, max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    _assert_same_output(b, a)
    np.testing.assert_array_equal(np.asarray(b.from_draft), np.asarray(a.from_draft))

    other = drafter_weights.load(BlockDrafter, folder, target, num_draft=8, mode="sample")
    assert (other.num_draft, other.mode) == (8, "sample")
    # Saving over a saved drafter replaces it.
    drafter_weights.save(drafter.with_draft(num_draft=1), folder)
    assert drafter_weights.load(BlockDrafter, folder, target).num_draft == 1


# --------------------------------------------------------------------------------------
# 5. The features contract.


@struct.dataclass
class CountingModel:
    """A transparent wrapper around a `Model` that records every forward traced through it."""

    inner: object
    calls: object = struct.field(pytree_node=False)  # a `_Calls`

    @property
    def vocab_size(self):
        return self.inner.vocab_size

    @property
    def config(self):
        return self.inner.config

    @property
    def dtype(self):
        return self.inner.dtype

    def init_cache(self, batch_size, cache_len):
        return self.inner.init_cache(batch_size, cache_len)

    def embed(self, tokens_BT):
        return self.inner.embed(tokens_BT)

    def head(self, hidden_BTE):
        return self.inner.head(hidden_BTE)

    def __call__(self, tokens_BT, positions_BT, cache, *, feature_layers=()):
        self.calls.append((tokens_BT.shape[1], tuple(feature_layers)))
        return self.inner(tokens_BT, positions_BT, cache, feature_layers=feature_layers)


class _Calls(list):
    """Compared and hashed by identity, so that a new wrapper is a new jit cache entry
    (and the decoder is traced afresh)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def test_decoder_runs_no_second_target_forward(target, trained):
    """Tracing the whole decoder through a counting wrapper (also the drafter's own target,
    which it may use only for embed/head) finds two target forwards: the prefill and the
    one verify forward of the loop body, both asking for the drafter's layers. The body
    runs once per step, which is what stats.target_calls counts."""
    gamma = 4
    calls = _Calls()
    counted = CountingModel(inner=target, calls=calls)
    drafter = trained.with_draft(num_draft=gamma).replace(target=counted)
    # The decoders' contract probe (one eval_shape forward per model signature, outside
    # the compiled program) runs first, so that only the decode program's forwards count.
    check_before_compiling(counted, "target")
    calls.clear()
    jax.eval_shape(
        lambda key: (
            specjax.speculative_generate(
                key, counted, drafter, PROMPTS8, max_new_tokens=MAX_NEW, sampling=GREEDY
            ).tokens
        ),
        jax.random.key(0),
    )
    layers = drafter.target_layers
    assert list(calls) == [(16, layers), (gamma + 1, layers)]  # prefill (width 16), verify

    # On a real run: one target call per loop iteration, fewer than plain decoding's 13
    # (both at one forward width, so that their outputs are equal).
    width = specjax.drafters.lookahead(drafter)
    out = specjax.speculative_generate(
        jax.random.key(0),
        target,
        trained.with_draft(num_draft=gamma),
        PROMPTS8,
        max_new_tokens=MAX_NEW,
        sampling=GREEDY,
        forward_width=width,
    )
    plain = _plain(target, PROMPTS8, MAX_NEW, forward_width=width)
    _assert_same_output(out, plain)
    steps = int(out.stats.target_calls)
    assert steps == int(np.max(out.stats.row_target_calls))
    assert int(plain.stats.target_calls) == MAX_NEW and steps < MAX_NEW


FEATURE_CASES = [(0,), (1,), (2,), (3,), (3, 0, 2)]


def test_feature_layers_are_the_residual_stream(target):
    """``feature_layers=(i,)`` returns layer i's output (the residual stream after it),
    in the order asked, and changes nothing else."""
    tokens = jnp.asarray([[3, 1, 4, 1, 5, 2, 6], [2, 7, 1, 0, 0, 3, 5]], jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (2, 7))

    @jax.jit
    def manual(model):
        # Layer by layer, outside Transformer.__call__ and without a cache.
        module = nnx.merge(model.graphdef, model.params)
        inv_freq = rope_inv_freq(model.config)
        x = module.embed_tokens(tokens)
        outs = []
        for i, layer in enumerate(module.layers):
            x, _, _ = layer(x, positions, None, None, i, inv_freq, model.config.layer_windows[i])
            outs.append(x)
        return outs, module.norm(x)

    @jax.jit
    def through_the_model(model):
        cache = model.init_cache(2, 16)
        plain_logits = model(tokens, positions, cache).logits
        hidden = model(tokens, positions, None).hidden
        calls = [model(tokens, positions, cache, feature_layers=ls) for ls in FEATURE_CASES]
        return plain_logits, hidden, [(out.logits, out.features) for out in calls]

    streams, final = manual(target)
    plain_logits, hidden, calls = through_the_model(target)
    for layers, (logits, features) in zip(FEATURE_CASES, calls, strict=True):
        assert features.shape == (2, 7, len(layers) * target.config.hidden_size)
        want = jnp.concatenate([streams[i] for i in layers], axis=-1)
        np.testing.assert_allclose(np.asarray(features), np.asarray(want), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(logits), np.asarray(plain_logits))
    # The final norm of the last layer's stream is the model's own final hidden state.
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(final), rtol=1e-5, atol=1e-5)


@pytest.mark.real
def test_shipped_smollm2_drafter_is_exact_on_smollm2(smollm2_path):
    """The bundled SmolLM2 drafter loads in one call, and greedy speculative decoding
    with it equals plain greedy decoding of the real model at the same forward width, at
    its saved γ and at 4.

    Slow: it compiles the 30-layer model's decode loop three times (about 2 min).
    """
    target = specjax.load_pretrained(smollm2_path, dtype=jnp.float32)
    drafter = smollm2_drafter(target)
    assert (drafter.num_draft, drafter.target_layers) == (1, (1, 14, 27))
    messages = [
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        [{"role": "user", "content": "What is a hash table?"}],
    ]
    prompts = [specjax.apply_chat_template(target, m, tokenize=True) for m in messages]
    greedy = specjax.SamplingConfig.greedy()
    key = jax.random.key(0)
    # One forward width for plain and both γ: at least every drafter's verify width.
    width = max(specjax.drafters.lookahead(drafter.with_draft(g)) for g in (1, 4))
    plain = specjax.generate(
        key, target, prompts, max_new_tokens=24, sampling=greedy, forward_width=width
    )
    for gamma in (1, 4):
        spec = specjax.speculative_generate(
            key,
            target,
            drafter.with_draft(gamma),
            prompts,
            max_new_tokens=24,
            sampling=greedy,
            forward_width=width,
        )
        assert spec.to_lists() == plain.to_lists(), gamma
        assert float(spec.tokens_per_call) > 1.0  # some of its drafts were accepted
    with pytest.raises(ValueError, match="target"):
        smollm2_drafter(specjax.testing.tiny_model(seed=0))
