"""Exact in distribution through every decoder path, with a real draft, in the fast tier.

The promise under test: the tokens `specjax.speculative_generate` emits are distributed
exactly as the target's own sampling, whatever drafted them. It is checked end to end
on each decoder path, with a draft that differs from the target so that drafts are both
accepted and rejected (asserted from the run's accept-count histogram):

1. rejection sampling with a `DraftModel` that samples its drafts (their q verified);
2. coupled verification with the same draft model;
3. a draft tree, `DraftModel.with_tree((3, 1))`, walked by `tree_verify`;
4. a drafter that reads the target's features: an untrained `EagleDrafter` head in
   ``"sample"`` mode (its q verified), under rejection sampling.

Setup, every seed fixed (so every outcome is deterministic): target
``tiny_model(seed=0, V=8, init_scale=15, num_layers=1)``, draft ``tiny_model(seed=1)``
of the same shape, head ``EagleDrafter.random(target, key=key(2))``; γ = 2 and
temperature 1. Each path decodes N = 1,000 copies of one prompt in one batched call
(``key(KEY_SEED)``, per-row seeds 0..N-1) and keeps the first K = 2 tokens, which span
one step or two (a step that rejects its first draft emits one token). The null law is
the target's alone: `exact_sequence_probs`, one forward of all 64 two-token
continuations, no decoder. Pearson's chi-square test of the 64 cells (expected counts
below 5 pooled) rejects at p < FALSE_ALARM = 1e-4; the file runs 4 such null tests, so
its family-wise false-alarm rate is below 4e-4 (Bonferroni).

Negative controls. Each path's real decoder is patched into a known bug (pytest's
monkeypatch on a public seam of the step: `ChainStep.draft_probs`, the verification
functions; `jax.clear_caches()` before
and after, so that the patched run compiles its own program and no later run reuses
it), and the same test at the same N and FALSE_ALARM must reject its tokens:

1. the verifier reads the draft's q rolled by one position along γ (`ChainStep.draft_probs`):
   draft 0 is judged against q_1 and draft 1 against q_0;
2. coupled verification checks only the first draft: once it equals the target's
   sample, the later drafts are accepted unchecked (`coupled_verify`);
3. the tree walk scores every node with the root's distribution (`tree_verify` reads
   the wrong node's row);
4. as 1, through the EAGLE head's chain.

Power. Each bug's law of the first two tokens is enumerated here from the models' own
next-token distributions (the target's law, the draft model's forward, the head's
`ttt_step_logits`), not from the decoder, and `chi_square_power` of the test against
it at N must be at least MIN_POWER = 0.99 (asserted in each control). The smallest N
with power 0.99 is 356 (rolled q, draft model), 452 (coupled), 344 (tree) and 118
(rolled q, EAGLE head), so N = 1,000 is at least twice each; at N = 1,000 the power is
above 1 - 1e-36 against all four (measured control p-values: below 1e-76). The same
enumeration with the correct rule reproduces the target's law
(`test_the_enumerated_rejection_rule_reproduces_the_target_law`), which checks the
model of the algorithm that the bugs' laws come from.

Run time: building the decode programs dominates, one per path and one per patched
path (4 to 7 s each on a 2-core CPU, most of it tracing); decoding the N rows takes
under a second.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.decoding.stages import ChainStep
from specjax.testing import (
    chi_square_power,
    chi_square_pvalue,
    continuation_logits,
    exact_sequence_probs,
    sequence_counts,
    tiny_model,
)
from specjax.training.eagle import ttt_step_logits
from specjax.verification import tree as tree_verification
from specjax.verification import verifiers
from specjax.verification.chain import target_samples

V = 8
INIT_SCALE = 15.0  # peaked, input-dependent distributions: the bugs' laws differ clearly
# One layer: every decode program here builds about a third faster than with two (the
# builds are most of this file's time), and the next-token law still depends on the
# whole prefix through attention.
NUM_LAYERS = 1
PROMPT = [1, 2, 3, 1, 2]
P = len(PROMPT)
GAMMA = 2
TREE = (3, 1)  # three children of the root, one grandchild under each: depth γ
K = 2
N = 1_000
FALSE_ALARM = 1e-4
MIN_POWER = 0.99
KEY_SEED = 2029
SAMPLING = specjax.SamplingConfig(temperature=1.0)
PATHS = ("draft_model-rejection", "draft_model-coupled", "draft_model-tree", "eagle-rejection")


@pytest.fixture(scope="module")
def models():
    target = tiny_model(seed=0, vocab_size=V, init_scale=INIT_SCALE, num_layers=NUM_LAYERS)
    draft = tiny_model(seed=1, vocab_size=V, init_scale=INIT_SCALE, num_layers=NUM_LAYERS)
    eagle = specjax.EagleDrafter.random(
        target, key=jax.random.key(2), num_draft=GAMMA, mode="sample"
    )
    return target, draft, eagle


def _decoder(models, path):
    """``(drafter, verification)`` of a path."""
    _, draft, eagle = models
    if path == "draft_model-rejection":
        return specjax.DraftModel(draft, num_draft=GAMMA), "rejection"
    if path == "draft_model-coupled":
        return specjax.DraftModel(draft, num_draft=GAMMA), "coupled"
    if path == "draft_model-tree":
        return specjax.DraftModel(draft).with_tree(TREE), "rejection"
    return eagle, "rejection"


def _decode(models, path):
    """``(tokens int[N, K], accepted_hist)``: one batched call, N rows of one prompt."""
    target = models[0]
    drafter, verification = _decoder(models, path)
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (N, P))
    res = specjax.speculative_generate(
        jax.random.key(KEY_SEED),
        target,
        drafter,
        prompts,
        max_new_tokens=K,
        sampling=SAMPLING,
        seeds=np.arange(N),
        verification=verification,
    )
    np.testing.assert_array_equal(res.lengths, K)
    return np.asarray(res.tokens)[:, :K], np.asarray(res.stats.accepted_hist)


def _pvalue(tokens, law):
    return chi_square_pvalue(sequence_counts(tokens, V), law)


# --------------------------------------------------------------------------------------
# The reference: the models' next-token distributions, and the laws of the first two
# tokens under the correct rule and under each bug, in numpy float64.


def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _draft_model_q(draft):
    """The draft model's q for the two drafts of the first step and of a second step.

    ``(q0 [V], q1 [V, V], r0 [V, V], r1 [V, V, V])``: q0 at the prompt, q1[x0] after
    draft x0; r0[y0] the first draft's q of a step that starts after the emitted token
    y0, r1[y0, x0] its second draft's. A draft model's q is its next-token law given
    the whole prefix, so r0 = q1 and r1 is its law after prompt + y0 + x0: all from one
    forward of every two-token continuation (`continuation_logits`), at temperature 1.
    """
    probs = _softmax(continuation_logits(draft, PROMPT, 2)).reshape(V, V, P + 2, V)
    first, second, third = probs[0, 0, P - 1], probs[:, 0, P], probs[:, :, P + 1]
    return first, second, second, third


def _eagle_q(target, eagle):
    """As `_draft_model_q`, for the EAGLE head: its draft step i at each position.

    The head's q depends on the draft step (step 0 reads the target's features, step 1
    its own output features), so each is `ttt_step_logits`' step at the position that
    step drafts from (the decoder-side q equals it: tests/test_eagle.py).
    """
    seqs = jnp.asarray([PROMPT + [a, b] for a in range(V) for b in range(V)], jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(P + 2, dtype=jnp.int32), seqs.shape)

    @jax.jit  # one compile instead of an op-by-op forward
    def steps(eagle):
        out = eagle.target(seqs, positions, None, feature_layers=eagle.target_layers)
        return ttt_step_logits(eagle, eagle.params, seqs, out.features, 2)

    step0, step1 = (
        _softmax(np.asarray(s, np.float64)).reshape(V, V, P + 2, V) for s in steps(eagle)
    )
    return step0[0, 0, P - 1], step1[:, 0, P], step0[:, 0, P], step1[:, :, P + 1]


@pytest.fixture(scope="module")
def laws(models):
    target, draft, eagle = models
    exact = exact_sequence_probs(target, PROMPT, K, SAMPLING)
    p0 = exact.sum(axis=1)  # the target after the prompt, and after prompt + y0
    return dict(
        exact=exact,
        p0=p0,
        p1=exact / p0[:, None],
        draft_q=_draft_model_q(draft),
        eagle_q=_eagle_q(target, eagle),
    )


def _residual(p, q):
    """What a rejection resamples from: ``max(p - q, 0)`` normalised, p if none is left."""
    r = np.maximum(p - q, 0.0)
    return r / r.sum() if r.sum() > 0 else p


def _accept(p, q, x):
    """Probability that draft x is accepted: ``min(1, p(x) / q(x))``."""
    return min(1.0, p[x] / q[x]) if q[x] > 0 else float(p[x] > 0)


def _first_token_law(p, q_first, q_second, rolled):
    """Law of the first token of a rejection-sampling step.

    ``p``: the target at the step's start; ``q_first``: the first draft's q;
    ``q_second[x0]``: the second draft's q after x0, which the rolled-q bug judges
    the first draft against.
    """
    out = np.zeros(V)
    for x0 in range(V):
        judged = q_second[x0] if rolled else q_first
        a = _accept(p, judged, x0)
        out[x0] += q_first[x0] * a
        out += q_first[x0] * (1 - a) * _residual(p, judged)
    return out


def _rejection_law(p0, p1, q, rolled=False):
    """Law ``[V, V]`` of the first two tokens of rejection sampling with γ = 2.

    Step one drafts x0 ~ q0, x1 ~ q1[x0]. Rejecting x0 emits y0 from the residual and
    the second token is the first of a new step after y0; accepting x0 then rejecting
    x1 emits x0 and a residual token; accepting both emits x0, x1. Every emitted token
    is decided by the noise at its own position only (`specjax.sampling.noise`), so the second
    step is independent of the first given y0. ``rolled``: the bug that judges draft 0
    against q1[x0] and draft 1 against q0.
    """
    q0, q1, r0, r1 = q
    second_step = np.stack([_first_token_law(p1[y0], r0[y0], r1[y0], rolled) for y0 in range(V)])
    law = np.zeros((V, V))
    for x0 in range(V):
        judged0 = q1[x0] if rolled else q0
        judged1 = q0 if rolled else q1[x0]
        a0 = _accept(p0, judged0, x0)
        law += q0[x0] * (1 - a0) * _residual(p0, judged0)[:, None] * second_step
        for x1 in range(V):
            both = q0[x0] * a0 * q1[x0, x1]
            a1 = _accept(p1[x0], judged1, x1)
            law[x0, x1] += both * a1
            law[x0] += both * (1 - a1) * _residual(p1[x0], judged1)
    return law


def _coupled_first_draft_only_law(p0, p1, q):
    """Law of the first two tokens when coupled verification checks only draft 0.

    The draft x0 and the target's token t0 race on the same exponential noise E
    (``argmax w_i / E_i``), so both equal y with probability ``1 / sum_i max(q0_i /
    q0_y, p0_i / p0_y)``. Then draft 1 ~ q1[y] is accepted unchecked; otherwise t0 = y
    is emitted and the next step's first token, checked, is the target's p1[y].
    """
    q0, q1, _, _ = q
    both = np.array([1.0 / np.sum(np.maximum(q0 / q0[y], p0 / p0[y])) for y in range(V)])
    coupled = (both / p0)[:, None]
    return p0[:, None] * (coupled * q1 + (1 - coupled) * p1)


def _tree_root_everywhere_law(p0, p1, q):
    """Law of the first two tokens when the tree walk scores every node with the root's p.

    The root's token y0 ~ p0 is still right. If it is one of the root's children (the
    draft's top-3 at the prompt) the walk descends and draws the next token from p0
    again; otherwise y0 ends the step and the next step's root is scored correctly.
    """
    children = np.argsort(-q[0])[: TREE[0]]
    descends = np.isin(np.arange(V), children)[:, None]
    return p0[:, None] * np.where(descends, p0[None], p1)


# --------------------------------------------------------------------------------------
# The tests.


def test_the_enumerated_rejection_rule_reproduces_the_target_law(laws):
    """The algorithm model the bugs' laws are computed with gives the target's law for
    both drafters' q when the rule is the correct one (and proper laws for the bugs)."""
    for name in ("draft_q", "eagle_q"):
        law = _rejection_law(laws["p0"], laws["p1"], laws[name])
        np.testing.assert_allclose(law, laws["exact"], atol=1e-6, err_msg=name)
    for law in (
        _rejection_law(laws["p0"], laws["p1"], laws["draft_q"], rolled=True),
        _coupled_first_draft_only_law(laws["p0"], laws["p1"], laws["draft_q"]),
        _tree_root_everywhere_law(laws["p0"], laws["p1"], laws["draft_q"]),
    ):
        assert (law >= 0).all() and abs(law.sum() - 1) < 1e-6


@pytest.mark.parametrize("path", PATHS)
def test_emitted_tokens_follow_the_target_law(models, laws, path):
    """The first two tokens of N rows, one batched call, against the target's own law."""
    tokens, accepted_hist = _decode(models, path)
    # The draft differs from the target: steps rejected their first draft, and others
    # accepted drafts.
    assert accepted_hist[0] > 0 and accepted_hist[1:].sum() > 0, accepted_hist
    p = _pvalue(tokens, laws["exact"])
    assert p > FALSE_ALARM, f"{path}: chi-square p = {p:.2e}"


def _assert_rejected(models, laws, monkeypatch, path, name, broken, alternative, module):
    """Patches ``module.<name>`` to ``broken``, decodes
    ``path``, and checks that the test has the power against the bug's law and rejects
    the patched decoder's tokens."""
    power = chi_square_power(laws["exact"], alternative, N, FALSE_ALARM)
    assert power >= MIN_POWER, f"{path}: power {power:.4f} against the bug"
    monkeypatch.setattr(module, name, broken)
    jax.clear_caches()  # the correct program must not be reused
    try:
        tokens, _ = _decode(models, path)
    finally:
        monkeypatch.undo()
        jax.clear_caches()  # nor the broken one, by later tests
    p = _pvalue(tokens, laws["exact"])
    assert p < FALSE_ALARM, f"{path}: the broken decoder passed, p = {p:.2e}"


def _rolled_draft_probs():
    """`ChainStep.draft_probs` that hands the verifier q rolled by one draft position."""
    real = ChainStep.draft_probs

    def rolled(self, proposal):
        q_BGV = real(self, proposal)
        return None if q_BGV is None else jnp.roll(q_BGV, 1, axis=1)

    return rolled


@pytest.mark.parametrize(
    "path, q", [("draft_model-rejection", "draft_q"), ("eagle-rejection", "eagle_q")]
)
def test_control_rejection_with_the_wrong_q_row_is_rejected(models, laws, monkeypatch, path, q):
    alternative = _rejection_law(laws["p0"], laws["p1"], laws[q], rolled=True)
    broken = _rolled_draft_probs()
    _assert_rejected(models, laws, monkeypatch, path, "draft_probs", broken, alternative, ChainStep)


def test_control_coupled_checking_only_the_first_draft_is_rejected(models, laws, monkeypatch):
    real = verifiers.coupled_verify

    def first_draft_only(keys_BW, chain_BG, target_BWV):
        block_BW, num_accepted = real(keys_BW, chain_BG, target_BWV)
        gamma = chain_BG.shape[1]
        accept_all = num_accepted >= 1
        all_BW = jnp.concatenate([chain_BG, target_samples(keys_BW, target_BWV)[:, gamma:]], 1)
        return (
            jnp.where(accept_all[:, None], all_BW, block_BW),
            jnp.where(accept_all, gamma, num_accepted),
        )

    alternative = _coupled_first_draft_only_law(laws["p0"], laws["p1"], laws["draft_q"])
    _assert_rejected(
        models,
        laws,
        monkeypatch,
        "draft_model-coupled",
        "coupled_verify",
        first_draft_only,
        alternative,
        module=verifiers,
    )


def test_control_tree_walk_with_the_root_distribution_is_rejected(models, laws, monkeypatch):
    real = tree_verification.tree_verify

    def root_everywhere(keys_BD1, node_tokens_BN, target_BN1V, tree, *args, **kwargs):
        root_BN1V = jnp.broadcast_to(target_BN1V[:, :1], target_BN1V.shape)
        return real(keys_BD1, node_tokens_BN, root_BN1V, tree, *args, **kwargs)

    alternative = _tree_root_everywhere_law(laws["p0"], laws["p1"], laws["draft_q"])
    _assert_rejected(
        models,
        laws,
        monkeypatch,
        "draft_model-tree",
        "tree_verify",
        root_everywhere,
        alternative,
        module=tree_verification,
    )
