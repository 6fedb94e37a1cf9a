"""Tree verification is exact: enumerated distributions, and a negative control.

1. End to end (V = 8): one batch of N_PER_GROUP rows per setting group, interleaved (row
   i in group i % 4: temperature 0.6; 1.0; 1.3 with top-p 0.8; 0.6 with top-k 3), is
   decoded with tree drafters: DraftModel with the trees (2, 2, 1) under rejection and
   (3, 1) under coupled verification, a BlockDrafter with (2, 2), and an EagleDrafter
   with (2, 1, 1) under coupled verification. The first K = 3
   tokens reach past the first tree step. Each group is chi-square tested against the
   exact distribution `exact_sequence_probs` enumerates with its own settings.
   N_PER_GROUP = 2,000 rows, each test rejecting at p < FALSE_ALARM = 1e-4; 4 drafters
   × 4 groups = 16 tests here plus 2 below, so the family-wise false-alarm rate is below
   1.8e-3 (Bonferroni). Keys are fixed, so the outcome is deterministic. The drafts are
   accepted often enough to matter (asserted: at least 20% of the steps descend).
   Negative control: the same test rejects a group's rows against a neighbouring
   group's law (what a tree step that read another row's settings would sample). N is
   sized by a power calculation (`specjax.testing.chi_square_power`, checked by
   `test_sample_size_has_power_against_every_control`): power 0.999 at p < 1e-4 needs
   514, 492, 115 and 23 rows for the four control pairs; at N = 2,000 (N was 10,000)
   the power is 1 to double precision.
2. The verifier on its own: a tree (3, 2) over V = 8 with fixed target distributions p
   at every node, and children that are the top-k of a draft distribution q. The exact
   law of the outcome (the first token, then the second one if the first was a child)
   is p_root(y0)·p_child(y1). `tree_verify` passes at N_DRAWS = 200,000; the negative
   control, the biased rule that accepts each top-k child with min(1, p/q) and moves to
   the residual max(0, p - q) after a rejection (the rule for children *sampled* from q,
   applied to deterministic ones), is rejected by the same test at the same N.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import group_rows, make_drafter, peaked_pair

import specjax
from specjax.testing import (
    chi_square_power,
    chi_square_pvalue,
    exact_sequence_probs,
    sequence_counts,
)
from specjax.verification.tree import Tree, tree_verify

pytestmark = pytest.mark.slow

V = 8
PROMPT = [1, 2, 3, 1, 2]
K = 3
N_PER_GROUP = 2_000
FALSE_ALARM = 1e-4
GROUPS = {
    "t0.6": dict(temperature=0.6),
    "t1.0": dict(temperature=1.0),
    "t1.3_topp0.8": dict(temperature=1.3, top_p=0.8),
    "t0.6_topk3": dict(temperature=0.6, top_k=3),
}
DECODERS = {
    "draft_model-(2,2,1)-rejection": ("draft_model", (2, 2, 1), "rejection"),
    "draft_model-(3,1)-coupled": ("draft_model", (3, 1), "coupled"),
    "block-(2,2)-rejection": ("block", (2, 2), "rejection"),
    "eagle-(2,1,1)-coupled": ("eagle", (2, 1, 1), "coupled"),
}


@pytest.fixture(scope="module")
def target():
    return peaked_pair(V)[0]


@pytest.fixture(scope="module")
def samples(target):
    _, draft = peaked_pair(V)
    names = list(GROUPS)
    num_rows = N_PER_GROUP * len(names)
    fields = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    sampling = specjax.SamplingConfig(
        **{
            f: np.asarray([GROUPS[names[i % len(names)]].get(f, d) for i in range(num_rows)])
            for f, d in fields.items()
        }
    )
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))
    out = {}
    for name, (kind, branching, verification) in DECODERS.items():
        drafter = make_drafter(kind, target, draft, len(branching)).with_tree(branching)
        res = specjax.speculative_generate(
            jax.random.key(2027),
            target,
            drafter,
            prompts,
            max_new_tokens=K,
            sampling=sampling,
            verification=verification,
        )
        assert int(jnp.min(res.lengths)) == K
        steps = int(jnp.sum(res.stats.row_target_calls))
        out[name] = (np.asarray(res.tokens), int(jnp.sum(res.stats.accepted)) / steps)
    return out


def _exact_law(target, group):
    """The exact law of a group's first K tokens (``[V] * K``)."""
    return exact_sequence_probs(target, PROMPT, K, specjax.SamplingConfig(**GROUPS[group]))


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_each_group_follows_its_exact_distribution(target, samples, decoder, group):
    tokens, accepted_per_step = samples[decoder]
    assert accepted_per_step > 0.2, accepted_per_step
    rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
    p = chi_square_pvalue(sequence_counts(rows, V), _exact_law(target, group))
    assert p > FALSE_ALARM, f"{decoder}/{group}: chi-square p = {p:.2e}"


# Controls: a group's rows against another group's law.

CONTROL_PAIRS = (
    ("t0.6", "t1.0"),
    ("t1.0", "t1.3_topp0.8"),
    ("t1.3_topp0.8", "t1.0"),
    ("t0.6_topk3", "t0.6"),
)


def test_sample_size_has_power_against_every_control(target):
    for group, other in CONTROL_PAIRS:
        power = chi_square_power(
            _exact_law(target, other), _exact_law(target, group), N_PER_GROUP, FALSE_ALARM
        )
        assert power > 0.999, (group, other, power)


@pytest.mark.parametrize("decoder", list(DECODERS))
def test_control_other_groups_distribution_is_rejected(target, samples, decoder):
    tokens, _ = samples[decoder]
    for group, other in CONTROL_PAIRS:
        rows = group_rows(tokens, GROUPS, group, (N_PER_GROUP, K))
        p = chi_square_pvalue(sequence_counts(rows, V), _exact_law(target, other))
        assert p < FALSE_ALARM, f"{decoder}: {group} vs {other}: p = {p:.2e}"


# ----------------------------------------------------------------------------
# The verifier alone, and the biased rule as a negative control.

N_DRAWS = 200_000
TREE = Tree.from_branching((3, 2))  # nodes 1..3 at depth 1, 4..9 at depth 2


def _fixed_distributions():
    """``(p [N+1, V], q [N+1, V], node_tokens [N])``: children = top-k of the parent's q."""
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(V, 0.6), TREE.num_nodes + 1)
    # q: a draft close to p at the top, so children are likely and the rule matters.
    q = 0.5 * p + 0.5 * rng.dirichlet(np.full(V, 0.6), TREE.num_nodes + 1)
    tokens = np.zeros(TREE.num_nodes, np.int64)
    for j in range(1, TREE.num_nodes + 1):
        parent, rank = TREE.parent_of[j], TREE.ranks[j]
        tokens[j - 1] = np.argsort(-q[parent], kind="stable")[rank]
    return p, q, tokens


def _outcome_probs(p, tokens):
    """Exact law of (y0, y1) with y1 = V ("none") when y0 is not a child of the root."""
    probs = np.zeros((V, V + 1))
    children = {int(tokens[c - 1]): c for c in TREE.children[0] if c >= 0}
    for y0 in range(V):
        if y0 in children:
            probs[y0, :V] = p[0, y0] * p[children[y0]]
        else:
            probs[y0, V] = p[0, y0]
    return probs


def _outcome_counts(tokens_ND1):
    y0, y1 = tokens_ND1[:, 0], np.where(tokens_ND1[:, 1] < 0, V, tokens_ND1[:, 1])
    return np.bincount(y0 * (V + 1) + y1, minlength=V * (V + 1))


def _biased_node(key, p_V, q_V, child_tokens):
    """Per node: accept child i with min(1, r/q), r the running residual; else sample r."""
    keys = jax.random.split(key, len(child_tokens) + 1)
    r = p_V
    chosen, done = jnp.int32(-1), jnp.bool_(False)
    for i, c in enumerate(child_tokens):
        u = jax.random.uniform(keys[i])
        accept = (~done) & (u * q_V[c] < r[c])
        chosen = jnp.where(accept, c, chosen)
        done = done | accept
        residual = jnp.maximum(r - q_V, 0.0)
        r = jnp.where(done, r, residual / jnp.maximum(jnp.sum(residual), 1e-30))
    fallback = jax.random.categorical(keys[-1], jnp.log(r))
    return jnp.where(done, chosen, fallback), done


def _biased_verify(key, p, q, tokens):
    """The biased rule on the depth-2 tree: (y0, y1 or -1)."""
    k0, k1 = jax.random.split(key)
    kids = [int(c) for c in TREE.children[0] if c >= 0]
    y0, hit = _biased_node(k0, p[0], q[0], [int(tokens[c - 1]) for c in kids])
    child = jnp.asarray(kids)[jnp.argmax(jnp.asarray([int(tokens[c - 1]) for c in kids]) == y0)]
    # Below the root the bias does not matter for this outcome: y1 is drawn from p itself.
    y1 = jax.random.categorical(k1, jnp.log(jnp.asarray(p)[child]))
    return jnp.stack([y0, jnp.where(hit, y1, -1)])


def test_tree_verify_alone_is_exact():
    p, _, tokens = _fixed_distributions()
    keys = jax.random.split(jax.random.key(11), N_DRAWS * (TREE.depth + 1))
    keys = keys.reshape(N_DRAWS, TREE.depth + 1)
    probs = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (N_DRAWS, *p.shape))
    nodes = jnp.broadcast_to(jnp.asarray(tokens, jnp.int32), (N_DRAWS, TREE.num_nodes))
    out, n, _, _ = jax.jit(tree_verify, static_argnums=3)(keys, nodes, probs, TREE)
    out = np.asarray(out)
    assert 0.3 < float(jnp.mean(n >= 1)) < 0.95  # both outcomes carry weight
    pval = chi_square_pvalue(_outcome_counts(out), _outcome_probs(p, tokens))
    assert pval > FALSE_ALARM, f"tree_verify: p = {pval:.2e}"


def test_control_min_p_over_q_on_top_k_children_is_rejected():
    p, q, tokens = _fixed_distributions()
    keys = jax.random.split(jax.random.key(12), N_DRAWS)
    run = jax.jit(jax.vmap(lambda k: _biased_verify(k, jnp.asarray(p), jnp.asarray(q), tokens)))
    out = np.asarray(run(keys))
    pval = chi_square_pvalue(_outcome_counts(out), _outcome_probs(p, tokens))
    assert pval < FALSE_ALARM, f"the biased rule passed: p = {pval:.2e}"
