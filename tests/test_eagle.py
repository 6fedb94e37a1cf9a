"""`specjax.EagleDrafter`: exact, its offsets right, trainable, and the shipped head works.

The tiny target has V = 8, 4 layers and ``init_scale = 8``. Its heads: a random one, which
accepts almost nothing, and one trained with `train_drafter` for 60 steps on text the
target generated (a module fixture, also the reference run of the training tests),
which accepts a lot (greedy, batch 8: about 0.8 / 0.6 at γ = 1 / 4). That target's
greedy output soon settles on a repeated token, which is what makes it easy to draft,
so the greedy tests also run a random head on a second target of the same shape (seed
1) whose output keeps changing; both share every compiled decode program. The bundled
pair's target gets the shipped head (``default_drafter("eagle")``, trained by
``scripts/training/train_eagle.py``) and a random head of the same shape.

1. Offsets, directly: the q each draft is sampled from equals the training-time test's
   step-i distribution (`ttt_step_logits`, a separate code path without a cache) at
   the drafted position, after ``init`` (ragged prompts of 1, 3 and 6 tokens), after an
   ``update`` with rejected drafts, after a γ = 0 step, and for a row that emitted
   nothing. This is what "drafts over its own output features" means, and it ties the
   decoder-side state to the training objective.
2. Greedy: speculative output equals `specjax.generate`'s greedy output token for token
   at the same forward width, ragged batch of 8 (prompts of 1..8 tokens), γ ∈ {1, 4},
   both modes, random and trained heads, with a budget of 13 and with per-row budgets;
   with an adaptive-γ table that drafts γ = 0 while many rows are active; and on the
   bundled target with the shipped head (8 prompts of 7 to 26 tokens, 48 new tokens).
3. Sampled output is exact: one batch of 4 × N_PER_GROUP rows, row i in group i % 4
   (temperature 1; top-k 3; top-p 0.8; min-p 0.1), mode "sample", γ = 2, the first
   K = 3 tokens, each group chi-square tested against `exact_sequence_probs`.
   N_PER_GROUP = 1,500 and each test rejects at p < FALSE_ALARM = 1e-4; 4 tests, so the
   family-wise false-alarm rate is below 4e-4 (Bonferroni). Keys are fixed, so the
   outcome is deterministic. Every accept count 0..γ occurs and the acceptance is well
   above zero (measured 0.68). Negative control: a head that drafts its argmax but
   reports a uniform q is rejected by the same test at the same N (measured p ~ 0; why
   this bug and not a subtler one: `MislabelledHead`).
4. The shipped head on the bundled pair (greedy, γ = 4, 8 code prompts, 48 tokens):
   acceptance 0.60 and 3.28 tokens per target call, against a random head's 0.001 and
   1.005 (and the bundled block drafter's 0.39 and 2.48 at γ = 4); measured, asserted:
   above 0.3 and 2.0, and the random head below 0.05.
5. The loss: gradients reach only the head (exactly zero for every target parameter,
   nonzero for every head parameter); the 0.8^i weighting is recomputed independently
   (numpy soft cross-entropies of decode-path `step_logits` chains); a short run
   lowers it; resume is bit-identical.
6. Save/load round-trips bit for bit; bad inputs raise ValueErrors naming the argument;
   ``scripts/training/train_eagle.py --quick`` runs end to end (slow).

Compiles dominate the run time (about 4 s per tiny decode program, 8 to 12 s per bundled
one on a 2-core CPU); the whole file takes about 3 minutes, the script run (slow) 30 s.
"""

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from support import GREEDY, group_rows, ragged_prompts

import specjax
from specjax import training as train
from specjax.drafters.eagle import EagleDrafter
from specjax.io import drafter_weights
from specjax.io.pretrained import default_drafter
from specjax.models.forward import prefill, score
from specjax.sampling import greedy_tokens
from specjax.testing import chi_square_pvalue, exact_sequence_probs, sequence_counts, tiny_model
from specjax.training.eagle import eagle_ttt_loss, ttt_step_logits

V = 8
MAX_NEW = 13
ROW_BUDGETS = np.asarray([13, 1, 7, 11, 3, 17, 19, 23], np.int32)
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "training" / "train_eagle.py"

TRAIN_CONFIG = train.EagleTrainConfig(
    steps=60,
    batch_size=8,
    seq_len=32,
    ttt_steps=4,
    learning_rate=1e-2,
    warmup_steps=6,
    checkpoint_every=20,
    keep_checkpoints=3,
    seed=0,
    progress=False,
)

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


PROMPTS8 = ragged_prompts(8, seed=8, high=V)


def _per_row(settings):
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
def diverse():
    """A target of the same shape whose greedy output keeps changing, and a random head."""
    other = tiny_model(seed=1, vocab_size=V, init_scale=8.0, num_layers=4)
    return other, EagleDrafter.random(other, key=jax.random.key(2), num_draft=4)


@pytest.fixture(scope="module")
def random_head(target):
    return EagleDrafter.random(target, key=jax.random.key(1), num_draft=4)


@pytest.fixture(scope="module")
def corpus(target):
    """About 3,000 tokens: ragged prompts and 40-token continuations, greedy and T=1."""
    rng = np.random.default_rng(123)
    pieces = []
    for i in range(8):
        prompts = ragged_prompts(8, seed=rng, high=V)
        out = specjax.generate(
            jax.random.key(100 + i),
            target,
            prompts,
            max_new_tokens=40,
            sampling=specjax.SamplingConfig(temperature=float(i % 2)),
        )
        for prompt, row in zip(prompts, out.to_lists(), strict=True):
            pieces += prompt + row
    return np.asarray(pieces, np.int32)


@pytest.fixture(scope="module")
def training(random_head, corpus, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("eagle_run")
    return train.train_drafter(random_head, corpus, TRAIN_CONFIG, checkpoint_dir=ckpt), ckpt


@pytest.fixture(scope="module")
def trained(training):
    return training[0].model


# --------------------------------------------------------------------------------------
# 1. Offsets: the decoder-side drafts are the training-time test's chains.


@functools.partial(jax.jit, static_argnums=2)
def _ttt_probs_jit(drafter, tokens_1T, num_steps):
    positions = jnp.arange(tokens_1T.shape[1], dtype=jnp.int32)[None]
    layers = drafter.target_layers
    features = drafter.target(tokens_1T, positions, None, feature_layers=layers).features
    steps = ttt_step_logits(drafter, drafter.params, tokens_1T, features, num_steps)
    return jnp.stack([jax.nn.softmax(s[0], axis=-1) for s in steps])


def _ttt_probs(drafter, tokens, num_steps):
    """``[num_steps, T, V]`` softmax of `ttt_step_logits` over one whole sequence.

    Padded to 16 tokens so that one program serves every length: the head and the
    target are causal, so what follows a position does not change it."""
    toks = jnp.asarray(list(tokens) + [0] * (16 - len(tokens)), jnp.int32)[None]
    return np.asarray(_ttt_probs_jit(drafter, toks, num_steps))


_prefill = jax.jit(prefill, static_argnums=(3, 4))
_score = jax.jit(score, static_argnums=4)
_init = jax.jit(lambda d, *args: d.init(*args), static_argnums=3)
_propose = jax.jit(lambda d, *args: d.propose(*args))
_update = jax.jit(lambda d, *args: d.update(*args))


def _check_drafts_are_ttt_chains(drafter, proposal, seq, lengths):
    """Each row's draft-i q equals TTT step i at position L-1+i of ``seq[:L] + drafts``."""
    gamma = proposal.tokens.shape[1]
    for b, length in enumerate(lengths):
        full = list(seq[b][:length]) + np.asarray(proposal.tokens[b]).tolist()
        want = _ttt_probs(drafter, full, gamma)
        for i in range(gamma):
            np.testing.assert_allclose(
                np.asarray(proposal.probs[b, i]),
                want[i, length - 1 + i],
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"row {b} draft {i}",
            )


# Slow tier: 13 s.
@pytest.mark.slow
def test_drafts_are_the_training_time_test_chains(target, trained):
    """init → propose → update (rejections; a row that emits nothing) → γ = 0 step →
    propose: every q is the TTT step distribution at the drafted position."""
    gamma, cache_len = 3, 32
    head = trained.with_draft(num_draft=gamma, mode="sample")
    head0 = head.with_draft(num_draft=0)
    sampling = specjax.SamplingConfig(temperature=jnp.ones(3))
    keys = lambda i: jax.random.split(jax.random.key(i), 3 * gamma).reshape(3, gamma)  # noqa: E731
    rows = [[1, 2, 3, 4, 5, 6], [3, 1, 4], [5]]
    lengths = np.asarray([len(r) for r in rows], np.int32)
    prompts = jnp.asarray([r + [0] * (6 - len(r)) for r in rows], jnp.int32)
    tcache, features = _prefill(
        target, prompts, jnp.asarray(lengths), cache_len, head.target_layers
    )
    state = _init(head, prompts, jnp.asarray(lengths), cache_len, features)
    seq = [list(r) for r in rows]

    def verify(drafter, state, tcache, proposal, lengths, accept, correction, emit=None):
        """A verify forward's features and the rows' new lengths and tokens."""
        drafts = np.asarray(proposal.tokens)
        g = drafts.shape[1]
        pending = [s[n - 1] for s, n in zip(seq, lengths, strict=True)]
        tokens_in = jnp.asarray(np.concatenate([np.asarray(pending)[:, None], drafts], 1))
        positions = jnp.asarray(lengths - 1)[:, None] + jnp.arange(g + 1)[None]
        _, tcache, features = _score(target, tokens_in, positions, tcache, drafter.target_layers)
        new = lengths.copy()
        for b in range(3):
            if emit is not None and not emit[b]:
                continue
            seq[b] = seq[b][: lengths[b]] + drafts[b, : accept[b]].tolist() + [correction[b]]
            new[b] = lengths[b] + accept[b] + 1
        state = _update(drafter, proposal.state, jnp.asarray(new), features)
        return state, tcache.rollback(jnp.asarray(new) - 1), new

    seq_buf = lambda: jnp.asarray([s + [0] * (cache_len - len(s)) for s in seq], jnp.int32)  # noqa: E731
    proposal = _propose(head, keys(0), state, seq_buf(), jnp.asarray(lengths), sampling)
    _check_drafts_are_ttt_chains(head, proposal, seq, lengths)

    # Row 0 rejects at once, row 1 accepts all γ (bonus token), row 2 accepts one.
    state, tcache, lengths = verify(head, state, tcache, proposal, lengths, [0, 3, 1], [7, 0, 2])
    proposal = _propose(head, keys(1), state, seq_buf(), jnp.asarray(lengths), sampling)
    _check_drafts_are_ttt_chains(head, proposal, seq, lengths)

    # A γ = 0 step (adaptive γ) on a state built for γ = 3; row 1 then emits nothing.
    state, tcache, lengths = verify(head, state, tcache, proposal, lengths, [2, 0, 3], [1, 6, 4])
    empty = _propose(head0, keys(2), state, seq_buf(), jnp.asarray(lengths), sampling)
    assert empty.tokens.shape == (3, 0) and empty.probs is None
    state, tcache, lengths = verify(
        head0, state, tcache, empty, lengths, [0, 0, 0], [3, 5, 0], emit=[True, False, True]
    )
    proposal = _propose(head, keys(3), state, seq_buf(), jnp.asarray(lengths), sampling)
    _check_drafts_are_ttt_chains(head, proposal, seq, lengths)


# --------------------------------------------------------------------------------------
# 2. Greedy: speculative output == plain greedy output, at the same forward width.


def _plain(target, prompts, max_new_tokens, forward_width=None):
    return specjax.generate(
        jax.random.key(0),
        target,
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=GREEDY,
        forward_width=forward_width,
    )


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("mode", ["argmax", "sample"])
# Slow tier: tests/test_numerics.py keeps this drafter's equality with plain decoding at
# one width in the fast tier.
@pytest.mark.slow
def test_greedy_ragged_batch_equals_plain(target, random_head, trained, diverse, mode, gamma):
    key = jax.random.key(0)
    rates = {}
    cases = {"random": (target, random_head), "trained": (target, trained), "diverse": diverse}
    for name, (model, head) in cases.items():
        drafter = head.with_draft(num_draft=gamma, mode=mode)
        width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
        kw = dict(sampling=GREEDY, forward_width=width)
        spec = specjax.speculative_generate(
            key, model, drafter, PROMPTS8, max_new_tokens=MAX_NEW, **kw
        )
        _assert_same_output(spec, _plain(model, PROMPTS8, MAX_NEW, forward_width=width))
        rates[name] = float(spec.stats.acceptance_rate)
        budgets = specjax.speculative_generate(
            key, model, drafter, PROMPTS8, max_new_tokens=ROW_BUDGETS, **kw
        )
        _assert_same_output(budgets, _plain(model, PROMPTS8, ROW_BUDGETS, forward_width=width))
        np.testing.assert_array_equal(np.asarray(budgets.lengths), ROW_BUDGETS)
    # The trained head's drafts are accepted far more often than the random head's.
    assert rates["trained"] > 0.3 and rates["trained"] > 2 * rates["random"] + 0.1, rates


# Slow tier: 6 s.
@pytest.mark.slow
def test_greedy_with_gamma_zero_steps_equals_plain(target, trained):
    """γ = 0 while more than 3 rows are active, then γ = 4: exact (plain decoding's
    output at the same forward width), and the head's state stays right through the
    γ = 0 steps (its later drafts are still accepted)."""
    drafter = trained.with_draft(num_draft=4)
    width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
    plain = _plain(target, PROMPTS8, ROW_BUDGETS, forward_width=width)
    spec = specjax.speculative_generate(
        jax.random.key(0),
        target,
        drafter,
        PROMPTS8,
        max_new_tokens=ROW_BUDGETS,
        sampling=GREEDY,
        gamma_by_active_rows={3: 4, 8: 0},
        forward_width=width,
    )
    _assert_same_output(spec, plain)
    assert int(np.sum(spec.stats.drafted)) > 0
    assert float(spec.stats.acceptance_rate) > 0.3


# --------------------------------------------------------------------------------------
# 3. Sampled output is exact, and a mislabelled q is caught.


@struct.dataclass
class MislabelledHead(EagleDrafter):
    """Drafts its argmax but reports a uniform q: min(1, p/q) = min(1, V p) then keeps
    the argmax whenever the target gives it more than 1/V, so its share of the output
    rises towards 1 and every other token's falls, whatever the head learned.

    Why not the subtler bug of reporting the head's full q: its distortion at the argmax,
    p (1/q - 1), vanishes as the trained head grows confident, so its power depended on
    how training rounded on a given CPU (CI measured p = 0.15 at T = 1 where this
    machine measures p ~ 0). This one moves the first token's distribution whatever the
    head drafts: if the target gives the drafted token more than 1/V, it is emitted with
    probability 1, where the exact first-token distributions give no token more than
    0.65 (top-k 3; 0.44 at T = 1); if less, its probability is multiplied by V = 8.
    Both are far beyond what N_PER_GROUP = 1,500 resolves (measured p ~ 0 in every group).
    """

    def _draw(self, key_B, logits_BV, sampling):
        uniform_BV = jnp.full(logits_BV.shape, 1.0 / logits_BV.shape[-1], jnp.float32)
        return greedy_tokens(logits_BV), uniform_BV


@pytest.fixture(scope="module")
def stat_samples(target, trained):
    names = list(GROUPS)
    num_rows = N_PER_GROUP * len(names)
    sampling = _per_row([GROUPS[names[i % len(names)]] for i in range(num_rows)])
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))
    sample_head = trained.with_draft(num_draft=STAT_GAMMA, mode="sample")
    fields = {f.name: getattr(sample_head, f.name) for f in dataclasses.fields(sample_head)}
    out = {}
    for name, drafter in (("sample", sample_head), ("mislabelled", MislabelledHead(**fields))):
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
# Slow tier: 15 s: statistical, 10,000+ rows per group.
@pytest.mark.slow
def test_sampled_output_has_the_target_distribution(stat_samples, exact, group):
    tokens, _ = stat_samples["sample"]
    rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
    p = chi_square_pvalue(sequence_counts(rows, V), exact[group])
    assert p > FALSE_ALARM, f"{group}: chi-square p = {p:.2e}"


# Slow tier: it reads the statistical samples (13 s to draw).
@pytest.mark.slow
def test_statistical_test_exercises_accept_and_reject(stat_samples):
    _, stats = stat_samples["sample"]
    hist = np.asarray(stats.accepted_hist)
    assert (hist > 0).all(), hist
    rate = np.sum(stats.accepted) / np.sum(stats.drafted)
    assert rate > 0.4, rate


# Slow tier: the negative control of the statistical test above, on its samples.
@pytest.mark.slow
def test_control_mislabelled_q_is_rejected(stat_samples, exact):
    tokens, _ = stat_samples["mislabelled"]
    for group in GROUPS:
        rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
        p = chi_square_pvalue(sequence_counts(rows, V), exact[group])
        assert p < FALSE_ALARM, f"mislabelled/{group}: p = {p:.2e} (the test has no power)"


# --------------------------------------------------------------------------------------
# 4. The shipped head on the bundled pair.

CODE_PROMPTS = [
    "def add(a, b):",
    "import os\n\n\ndef read_lines(path):\n    with open(path) as f:",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
    "for i in range(10):\n    if i % 2 == 0:",
    'def parse_args(argv=None):\n    """Parse the command line."""\n    parser = argparse.',
    "    def __repr__(self):\n        return",
    "try:\n    import json\nexcept ImportError:",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]


# The bundled tests' one forward width, plain and speculative: the verify width of
# γ = 4, the largest γ there (at least every drafter's verify width).
BUNDLED_WIDTH = 5
# The speculative side of the bundled comparisons: 48 greedy tokens at that width.
BUNDLED = dict(max_new_tokens=48, sampling=GREEDY, forward_width=BUNDLED_WIDTH)


@pytest.fixture(scope="module")
def bundled():
    target, _, tokenizer = specjax.default_pair()
    prompts = [tokenizer.encode(p).ids for p in CODE_PROMPTS]
    assert len({len(p) for p in prompts}) > 4  # ragged
    return target, prompts, _plain(target, prompts, 48, forward_width=BUNDLED_WIDTH)


@pytest.mark.parametrize("gamma", [1, 4])
# Slow tier: 11 s per γ: the shipped head on the bundled target.
@pytest.mark.slow
def test_shipped_head_is_exact_on_the_bundled_target(bundled, gamma):
    """One bundled decode compile per γ (8 to 12 s each on a 2-core CPU); plain and
    speculative output are equal at the same forward width, BUNDLED_WIDTH."""
    target, prompts, plain = bundled
    drafter = default_drafter("eagle", num_draft=gamma)
    assert isinstance(drafter, EagleDrafter) and drafter.num_draft == gamma
    spec = specjax.speculative_generate(jax.random.key(0), target, drafter, prompts, **BUNDLED)
    _assert_same_output(spec, plain)


# Slow tier: 7 s: acceptance of the shipped head.
@pytest.mark.slow
def test_shipped_head_accepts_far_more_than_a_random_head(bundled):
    """Greedy γ = 4 on 8 code prompts: acceptance / tokens per call 0.60 / 3.28 shipped,
    0.001 / 1.005 random (measured). It reuses the γ = 4 program of the test above."""
    target, prompts, plain = bundled
    shipped = default_drafter("eagle", num_draft=4)
    random = EagleDrafter.random(target, key=jax.random.key(0), num_draft=4)
    results = {}
    for name, drafter in (("shipped", shipped), ("random", random)):
        spec = specjax.speculative_generate(jax.random.key(0), target, drafter, prompts, **BUNDLED)
        _assert_same_output(spec, plain)
        results[name] = (float(spec.stats.acceptance_rate), float(spec.tokens_per_call))
    assert results["shipped"][0] > 0.3 and results["shipped"][1] > 2.0, results
    assert results["random"][0] < 0.05, results


# --------------------------------------------------------------------------------------
# 5. The loss.


def _batch(corpus, b=2, t=7, seed=0):
    starts = np.random.default_rng(seed).integers(0, len(corpus) - t, b)
    return jnp.asarray(np.stack([corpus[s : s + t] for s in starts]), jnp.int32)


@pytest.mark.slow  # a gradient program of the head and target (about 6 s)
def test_gradients_reach_only_the_head(trained, corpus):
    tokens = _batch(corpus, b=4, t=16)
    target = trained.target

    def loss(head_params, target_params):
        drafter = trained.replace(target=target.replace(params=target_params))
        return eagle_ttt_loss(head_params, drafter, tokens, num_steps=3)[0]

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    g_head, g_target = grad(trained.params, target.params)
    for path, g in jax.tree_util.tree_flatten_with_path(g_target)[0]:
        assert not np.any(np.asarray(g)), jax.tree_util.keystr(path)
    for path, g in jax.tree_util.tree_flatten_with_path(g_head)[0]:
        assert np.any(np.asarray(g)), jax.tree_util.keystr(path)  # every head weight learns


@pytest.mark.parametrize("step_weight", [0.8, 0.5])
@pytest.mark.slow  # a training-loss property, about 8 s a case; the head's decoding stays fast
def test_loss_is_the_weighted_soft_cross_entropy_of_decode_chains(trained, corpus, step_weight):
    """Recomputed without the TTT code: for every anchor a, a decode-path chain
    (`step_logits` on a cache) gives step i's q at a + i; numpy takes the soft
    cross-entropy against the target's softmax, the per-step means and the weights.

    One cache serves every anchor: it holds step 0's entries at all positions, and a
    chain from a writes its own entries at a + 1, a + 2, ... before any query reads them
    (queries see only earlier slots), as in decoding."""
    tokens = _batch(corpus, b=2, t=7)
    b, t = tokens.shape
    k = 3
    target = trained.target
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = target(tokens, positions, None, feature_layers=trained.target_layers)
    logits_p, features = out.logits, out.features
    p = np.asarray(jax.nn.softmax(logits_p, axis=-1), np.float64)
    fused = trained.net.fc(features)
    prev = jnp.pad(fused, ((0, 0), (1, 0), (0, 0)))[:, :t]  # position j is fed u_{j-1}
    step = jax.jit(lambda d, *args: d.step_logits(*args))
    logits0, g0, cache0 = step(trained, trained.init_cache(b, 16), prev, tokens, positions)
    ce = [[] for _ in range(k)]
    for a in range(t):
        logits, g, cache = logits0[:, a], g0[:, a], cache0
        for i in range(k):
            if a + i >= t:
                break
            if i:
                pos = jnp.full((b, 1), a + i, jnp.int32)
                logits, g, cache = step(trained, cache, g[:, None], tokens[:, a + i, None], pos)
                logits, g = logits[:, 0], g[:, 0]
            logq = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
            ce[i] += list(-np.sum(p[:, a + i] * logq, axis=-1))
    means = np.asarray([np.mean(c) for c in ce])
    weights = step_weight ** np.arange(k)
    want = np.sum(weights * means) / np.sum(weights)
    loss, metrics = eagle_ttt_loss(
        trained.params, trained, tokens, num_steps=k, step_weight=step_weight
    )
    np.testing.assert_allclose(np.asarray(metrics["step_losses"]), means, rtol=1e-5)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert len(ce[2]) == b * (t - 2)  # step i averages over the T - i positions j >= i


def test_training_lowers_the_loss(training):
    losses = np.asarray(training[0].losses)
    assert len(losses) == TRAIN_CONFIG.steps and np.isfinite(losses).all()
    # Measured 2.05 -> 1.83; the soft cross-entropy cannot fall below the target's own
    # entropy, so a drop of a few tenths is most of what there is to learn here.
    first, last = losses[:10].mean(), losses[-10:].mean()
    assert last < first - 0.15, (first, last)


def test_resume_is_bit_identical(random_head, corpus, training, tmp_path):
    reference, ckpt = training
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    names = [p.name for p in train.list_checkpoints(copy)]
    assert names == ["step_00000020", "step_00000040", "step_00000060"]
    shutil.rmtree(copy / names[-1])
    resumed = train.train_drafter(
        random_head, corpus, TRAIN_CONFIG, checkpoint_dir=copy, resume=True
    )
    assert resumed.start_step == 40 and resumed.losses == reference.losses
    for x, y in zip(
        jax.tree.leaves(reference.model.params), jax.tree.leaves(resumed.model.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# --------------------------------------------------------------------------------------
# 6. Save/load, bad inputs, the script.


def test_save_load_round_trip(target, trained, tmp_path):
    drafter = trained.with_draft(num_draft=3, mode="sample")
    folder = drafter_weights.save(drafter, tmp_path / "head")
    assert sorted(p.name for p in folder.iterdir()) == ["eagle_drafter.json", "model.safetensors"]
    loaded = drafter_weights.load(EagleDrafter, folder, target)
    for field in ("config", "target_layers", "num_draft", "mode", "graphdef"):
        assert getattr(loaded, field) == getattr(drafter, field), field
    want, got = jax.tree.leaves(drafter.params), jax.tree.leaves(loaded.params)
    assert len(want) == len(got)
    for x, y in zip(want, got, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    other = drafter_weights.load(EagleDrafter, folder, target, num_draft=1, mode="argmax")
    assert (other.num_draft, other.mode) == (1, "argmax")
    # bf16 on disk, the target's float32 in memory: the bf16-rounded weights.
    drafter_weights.save(drafter, folder, dtype=jnp.bfloat16)
    half = drafter_weights.load(EagleDrafter, folder, target)
    for x, y in zip(want, jax.tree.leaves(half.params), strict=True):
        assert y.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32)), y)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        drafter_weights.save(drafter, folder)


def test_bad_inputs_name_the_argument(target, random_head, corpus, tmp_path):
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="num_draft"):
        EagleDrafter.random(target, key=key, num_draft=-1)
    with pytest.raises(ValueError, match="num_draft"):
        random_head.with_draft(num_draft=-2)
    with pytest.raises(TypeError, match="num_draft"):
        random_head.with_draft(num_draft=2.0)
    for layers in [(0, 4), (-1,), (), (1, 1)]:
        with pytest.raises(ValueError, match="target_layers"):
            EagleDrafter.random(target, key=key, num_draft=2, target_layers=layers)
    with pytest.raises(ValueError, match="mode"):
        random_head.with_draft(mode="beam")
    folder = drafter_weights.save(random_head, tmp_path / "head")
    with pytest.raises(ValueError, match="target"):
        drafter_weights.load(EagleDrafter, folder, tiny_model(seed=0, vocab_size=V, num_layers=2))
    with pytest.raises(FileNotFoundError, match="eagle_drafter.json"):
        drafter_weights.load(EagleDrafter, tmp_path, target)
    with pytest.raises(ValueError, match="ttt_steps"):
        train.EagleTrainConfig(ttt_steps=0)
    with pytest.raises(ValueError, match="ttt_steps"):
        train.EagleTrainConfig(ttt_steps=9, seq_len=8)
    with pytest.raises(ValueError, match="step_weight"):
        train.EagleTrainConfig(step_weight=0.0)
    with pytest.raises(TypeError, match="EagleTrainConfig"):
        train.train_drafter(random_head, corpus, train.TrainConfig(steps=1, progress=False))
    with pytest.raises(ValueError, match="num_steps"):
        eagle_ttt_loss(random_head.params, random_head, _batch(corpus, t=4), num_steps=4)


@pytest.mark.slow
def test_quick_script_runs_end_to_end(tmp_path):
    """``scripts/training/train_eagle.py --quick``: data, 12 training steps, the bf16 head and its
    report. Slow: about 40 s (generation, training and two decode compiles)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = tmp_path / "head"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--no-progress", "--out", str(out)]
        + ["--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((out / "train_report.json").read_text())
    assert report["steps"] == 12 and len(report["loss_curve"]["mean_loss"]) == 12
    assert set(report["evaluation"]) == {"eagle_T0_gamma2", "random_head_T0_gamma2"}
    target = specjax.default_pair()[0]
    head = drafter_weights.load(EagleDrafter, out, target)
    assert head.num_draft == 4 and head.target_layers == (1, 3, 5)


class _MemoryChecked(Exception):
    """Stops a decoder right after its memory check, before anything compiles."""


def test_memory_check_counts_the_heads_cache(target, random_head, monkeypatch):
    """The decoders' memory check adds the head's KV cache to the target's.

    It once counted only `DraftModel` and `BlockDrafter` caches, so an EAGLE head's
    cache of ``[1, B, K, D, S]`` keys and values was left out.
    """
    asked = {}

    def record(name, nbytes, what):
        asked[type(drafter).__name__] = nbytes
        raise _MemoryChecked

    monkeypatch.setattr(specjax.decoding.checks, "check_fits_memory", record)
    prompts, cache_len = [[1, 2, 3], [4, 5]], 64
    for drafter in (specjax.drafters.NoDraft(), random_head):
        with pytest.raises(_MemoryChecked):
            specjax.speculative_generate(
                jax.random.key(0), target, drafter, prompts, max_new_tokens=8, cache_len=cache_len
            )
    c = random_head.config
    itemsize = np.dtype(target.dtype).itemsize
    head_cache = 2 * 1 * len(prompts) * c.num_kv_heads * c.head_dim * cache_len * itemsize
    head_cache += len(prompts) * 4  # lengths: int32[B]
    # The statistics add int32 counters per draft position, three [γ] and a [γ + 1]
    # histogram (one column for NoDraft), for every slot and for every prompt's output.
    head_cache += 2 * len(prompts) * 16 * random_head.num_draft
    assert asked["EagleDrafter"] - asked["NoDraft"] == head_cache
