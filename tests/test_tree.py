"""Tree drafting and exact tree verification (`specjax.verification.tree`).

1. `Tree`: the tables of a static tree (parents, depths, ranks, children, ancestors,
   levels), checked against hand-written ones, and bad trees refused.
2. The model contract's ``tree=``: one forward over a whole tree gives, at every node,
   the logits of a full forward over the prompt plus that node's root path (with and
   without scanned layers, with sliding-window layers); writes past the cache's end are
   dropped and no committed slot changes.
3. `KVCache.compact_path` moves exactly the path's entries, and after decoding with trees the
   target's cache (and a draft model's) equals a fresh prefill of the committed tokens:
   slot == position again.
4. Greedy: speculative output with DraftModel, BlockDrafter and EagleDrafter trees of several shapes
   equals plain greedy token for token at the same forward width, on ragged batches,
   with per-row budgets, EOS, B == D + 1, and continuous batching; the drafts are partly
   accepted (asserted), so both the descend and the stop paths run.
5. Sampled: for the same key and seeds, tree decoding reproduces plain decoding token
   for token at the same forward width (the emitted tokens are the target's own
   position-keyed samples), with scalar and per-row settings, under both verifications.
6. A chain-shaped tree (1, ..., 1) accepts exactly what the chain drafter accepts, for
   DraftModel, BlockDrafter and EagleDrafter (whose features then come from the path).
7. Bad input: models without tree support, drafters without trees, trees with adaptive
   γ, trees deeper than a block drafter's block or than a sliding window.

The statistical tests (distributions, and the negative control) are in
``tests/test_tree_exact.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from support import GREEDY

import specjax
from specjax import decoding
from specjax.models.cache import KVCache, TreeMask
from specjax.testing import tiny_model
from specjax.verification.tree import Tree, tree_verify


def _noised(model, scale: float, seed: int):
    """``model`` with Gaussian noise on every weight matrix: a correlated draft."""
    leaves, treedef = jax.tree.flatten(model.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [
        x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype) if x.ndim == 2 else x
        for x, k in zip(leaves, keys, strict=True)
    ]
    return model.replace(params=jax.tree.unflatten(treedef, noisy))


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(seed=3, init_scale=4.0)
    return target, _noised(target, 0.6, seed=4)


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [9, 9, 9, 1, 2], [40, 41, 42, 43]]


# ----------------------------------------------------------------------------
# 1. The tree's tables.


def test_tables_of_a_full_tree():
    tree = Tree.from_branching((2, 1, 2))
    assert tree.num_nodes == 2 + 2 + 4 and tree.depth == 3
    assert tree.parents == (0, 0, 1, 2, 3, 3, 4, 4)
    np.testing.assert_array_equal(tree.depths, [0, 1, 1, 2, 2, 3, 3, 3, 3])
    np.testing.assert_array_equal(tree.ranks, [0, 0, 1, 0, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(tree.children[:5], [[1, 2], [3, -1], [4, -1], [5, 6], [7, 8]])
    # Node 7 descends 0 -> 2 -> 4 -> 7.
    np.testing.assert_array_equal(np.flatnonzero(tree.ancestors[7]), [0, 2, 4, 7])
    assert [tree.level(d) for d in range(4)] == [(0, 1), (1, 3), (3, 5), (5, 9)]
    assert Tree.from_branching((3, 2, 2, 1)).num_nodes == 3 + 6 + 12 + 12
    assert Tree.parse("1,1,1") == Tree((0, 1, 2)) == Tree.from_branching((1, 1, 1))


@pytest.mark.parametrize(
    "parents, message",
    [
        ((), "at least one"),
        ((0, 2), r"parents\[1\]"),
        ((0, 1, 0), "level by level"),
        ((0, -1), r"parents\[1\]"),
        ((0, True), r"parents\[1\]"),
    ],
)
def test_bad_parents_are_refused(parents, message):
    with pytest.raises(ValueError, match=message):
        Tree(parents)


@pytest.mark.parametrize("branching", [(), (0,), (2, -1), 3, "3", (1.5,), (True,)])
def test_bad_branching_is_refused(branching):
    with pytest.raises(ValueError, match="branching"):
        Tree.from_branching(branching)


def test_bad_tree_text_is_refused():
    with pytest.raises(ValueError, match="--tree"):
        Tree.parse("3,x")


# ----------------------------------------------------------------------------
# 2. The model contract's tree forward.


def _tree_logits(model, prompt_BP, nodes_BN, tree, cache_len=32):
    b, p = prompt_BP.shape
    cache = model.init_cache(b, cache_len)
    cache = model(prompt_BP[:, :-1], jnp.broadcast_to(jnp.arange(p - 1), (b, p - 1)), cache).cache
    start = jnp.full((b,), p - 1, jnp.int32)
    tokens = jnp.concatenate([prompt_BP[:, -1:], nodes_BN], axis=1)
    mask = TreeMask(
        start=start,
        slots=start[:, None] + jnp.arange(tree.num_nodes + 1)[None],
        visible=jnp.asarray(tree.ancestors),
    )
    positions = start[:, None] + jnp.asarray(tree.depths)[None]
    out = model(tokens, positions, cache, tree=mask)
    return (out.logits, out.cache), cache


@pytest.mark.parametrize(
    "overrides",
    [{}, {"scan_layers": True}, {"sliding_window": 4}, {"qk_norm": True}],
    ids=["loop", "scan", "sliding", "qk_norm"],
)
# Slow tier: 12 s per layout.
@pytest.mark.slow
def test_tree_forward_equals_a_full_forward_of_each_path(overrides):
    model = tiny_model(seed=5, init_scale=3.0, **overrides)
    tree = Tree.from_branching((2, 2, 1))
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, 64, (2, 6)), jnp.int32)
    nodes = jnp.asarray(rng.integers(0, 64, (2, tree.num_nodes)), jnp.int32)
    (logits, _), _ = _tree_logits(model, prompt, nodes, tree)
    for j in range(tree.num_nodes + 1):
        path = [i - 1 for i in np.flatnonzero(tree.ancestors[j]) if i > 0]
        seq = jnp.concatenate([prompt, nodes[:, path]], axis=1)
        full = model(seq, jnp.broadcast_to(jnp.arange(seq.shape[1]), seq.shape), None).logits
        np.testing.assert_allclose(logits[:, j], full[:, -1], atol=2e-5, rtol=1e-5)


def test_tree_forward_at_the_cache_end_writes_nothing_out_of_bounds():
    """A tree whose slots run past the cache's end: those writes are dropped, the
    committed slots keep their values, and the nodes that fit are still exact."""
    model = tiny_model(seed=5, init_scale=3.0)
    tree = Tree.from_branching((3, 2))
    prompt = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
    nodes = jnp.arange(tree.num_nodes, dtype=jnp.int32)[None] + 10
    cache_len = 9  # root at slot 5: nodes 1..3 fit, nodes 4..9 do not
    (logits, new_cache), cache = _tree_logits(model, prompt, nodes, tree, cache_len)
    np.testing.assert_array_equal(new_cache.k[..., :5], cache.k[..., :5])
    np.testing.assert_array_equal(new_cache.v[..., :5, :], cache.v[..., :5, :])
    assert new_cache.k.shape == cache.k.shape
    assert bool(jnp.all(jnp.isfinite(logits)))
    seq = jnp.concatenate([prompt, nodes[:, :1]], axis=1)
    full = model(seq, jnp.arange(7)[None], None).logits
    np.testing.assert_allclose(logits[:, 1], full[:, -1], atol=2e-5, rtol=1e-5)


def test_tree_needs_a_cache():
    model = tiny_model(seed=5)
    mask = TreeMask(
        start=jnp.zeros(1, jnp.int32),
        slots=jnp.zeros((1, 1), jnp.int32),
        visible=jnp.ones((1, 1), bool),
    )
    with pytest.raises(ValueError, match="tree= needs a cache"):
        model(jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32), None, tree=mask)


# ----------------------------------------------------------------------------
# 3. Compaction and cache consistency.


def test_compact_path_moves_exactly_the_path():
    cache = specjax.KVCache.zeros(2, 2, 12, 1, 3)
    k = jnp.arange(cache.k.size, dtype=jnp.float32).reshape(cache.k.shape)
    v = jnp.arange(cache.v.size, dtype=jnp.float32).reshape(cache.v.shape) + 0.5
    cache = cache.replace(k=k, v=v)
    start = jnp.asarray([2, 5])
    path = jnp.asarray([[2, 4, 7], [1, 3, 3]])
    out = cache.compact_path(start, path)
    for b in range(2):
        moved = {int(start[b]) + 1 + d: int(start[b] + path[b, d]) for d in range(3)}
        for slot in range(12):
            src = moved.get(slot, slot)
            np.testing.assert_array_equal(out.k[:, b, :, :, slot], k[:, b, :, :, src])
            np.testing.assert_array_equal(out.v[:, b, :, slot], v[:, b, :, src])


def _assert_cache_is_prefill_of(model, cache, seq_BS, lengths_B):
    """Every committed slot (< length - 1) of ``cache`` equals a fresh prefill's."""
    for b in range(seq_BS.shape[0]):
        n = int(lengths_B[b]) - 1
        fresh = model.init_cache(1, cache.max_len)
        fresh = model(seq_BS[b : b + 1, :n], jnp.arange(n)[None], fresh).cache
        assert int(cache.lengths[b]) == n
        np.testing.assert_allclose(cache.k[:, b, ..., :n], fresh.k[:, 0, ..., :n], atol=1e-5)
        np.testing.assert_allclose(cache.v[:, b, :, :n], fresh.v[:, 0, :, :n], atol=1e-5)


@pytest.mark.parametrize("branching", [(2, 2, 1), (3, 1)])
# Slow tier: 22 s: tree steps, then a fresh prefill of every row.
@pytest.mark.slow
def test_cache_after_tree_steps_equals_a_prefill_of_the_committed_tokens(pair, branching):
    target, draft = pair
    drafter = specjax.DraftModel(draft).with_tree(branching)
    decoder, state = decoding.init(
        jax.random.key(0), target, PROMPTS, drafter=drafter, max_new_tokens=40, sampling=GREEDY
    )
    state = decoding.run(decoder, state, num_steps=6)
    assert int(jnp.sum(decoding.result(decoder, state).stats.accepted)) > 0
    _assert_cache_is_prefill_of(target, state.target_cache, state.seq, state.seq_lengths)
    # The draft's cache holds committed tokens only, and (`DraftModel.keep_path`) it
    # kept the accepted path above the leaves: it lacks the pending token and at most
    # an accepted leaf, and what it holds is what feeding the tokens would write.
    dc = state.drafter_state
    assert bool(jnp.all(dc.lengths <= state.seq_lengths - 1))
    assert bool(jnp.all(dc.lengths >= state.seq_lengths - 2)), (dc.lengths, state.seq_lengths)
    for b in range(len(PROMPTS)):
        n = int(dc.lengths[b])
        fresh = draft.init_cache(1, dc.max_len)
        fresh = draft(state.seq[b : b + 1, :n], jnp.arange(n)[None], fresh).cache
        np.testing.assert_allclose(dc.k[:, b, ..., :n], fresh.k[:, 0, ..., :n], atol=1e-5)
        np.testing.assert_allclose(dc.v[:, b, :, :n], fresh.v[:, 0, :, :n], atol=1e-5)


# ----------------------------------------------------------------------------
# 4. Greedy equality, at the same forward width.

TREES = [(2, 2, 1), (3, 2, 2, 1), (4,), (1, 3, 1), (1, 1, 1)]


@pytest.fixture(scope="module")
def greedy_reference(pair):
    """``reference(W)``: the budgets and plain greedy output at forward width W (each W
    decoded once), to compare with a tree drafter at the same W."""
    target, _ = pair
    budgets = np.asarray([30, 17, 23, 9])
    outs = {}

    def reference(width):
        if width not in outs:
            outs[width] = specjax.generate(
                jax.random.key(1),
                target,
                PROMPTS,
                max_new_tokens=budgets,
                sampling=GREEDY,
                eos_id=7,
                forward_width=width,
            )
        return budgets, outs[width]

    return reference


@pytest.mark.parametrize("branching", TREES, ids=str)
# Slow tier: tests/test_numerics.py keeps this drafter's equality with plain decoding at
# one width in the fast tier.
@pytest.mark.slow
def test_draft_model_tree_greedy_equals_plain_greedy(pair, greedy_reference, branching):
    target, draft = pair
    drafter = specjax.DraftModel(draft).with_tree(branching)
    width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
    budgets, ref = greedy_reference(width)
    kw = dict(max_new_tokens=budgets, sampling=GREEDY, eos_id=7, forward_width=width)
    out = specjax.speculative_generate(jax.random.key(1), target, drafter, PROMPTS, **kw)
    assert out.to_lists() == ref.to_lists()
    np.testing.assert_array_equal(out.truncated, ref.truncated)
    accepted, calls = int(jnp.sum(out.stats.accepted)), int(jnp.sum(out.stats.row_target_calls))
    assert 0 < accepted < calls * len(branching), (accepted, calls)


@pytest.mark.parametrize("branching", [(2, 2, 1), (3, 1, 1, 1)], ids=str)
@pytest.mark.parametrize("kind", ["block", "eagle"])
# Slow tier: tests/test_numerics.py keeps this drafter's equality with plain decoding at
# one width in the fast tier.
@pytest.mark.slow
def test_feature_drafter_tree_greedy_equals_plain_greedy(pair, greedy_reference, kind, branching):
    target, _ = pair
    if kind == "block":
        drafter = specjax.BlockDrafter.random(target, key=jax.random.key(2), num_draft=4)
    else:
        drafter = specjax.EagleDrafter.random(target, key=jax.random.key(6), num_draft=4)
    drafter = drafter.with_tree(branching)
    width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
    budgets, ref = greedy_reference(width)
    kw = dict(max_new_tokens=budgets, sampling=GREEDY, eos_id=7, forward_width=width)
    out = specjax.speculative_generate(jax.random.key(1), target, drafter, PROMPTS, **kw)
    assert out.to_lists() == ref.to_lists()


# Slow tier: 9 s: trees with refill through B == D + 1 slots.
@pytest.mark.slow
def test_tree_greedy_with_batch_of_depth_plus_one_rows_and_refill(pair):
    """B == D + 1 (4 slots, depth 3), 9 ragged prompts sharing the slots; plain greedy
    output at the same forward width."""
    target, draft = pair
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 64, n).tolist() for n in (3, 8, 5, 2, 6, 4, 7, 3, 5)]
    budgets = rng.integers(3, 20, len(prompts))
    drafter = specjax.DraftModel(draft).with_tree((2, 2, 1))
    width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
    ref = specjax.generate(
        jax.random.key(2),
        target,
        prompts,
        max_new_tokens=budgets,
        sampling=GREEDY,
        forward_width=width,
    )
    out = specjax.speculative_generate(
        jax.random.key(2),
        target,
        drafter,
        prompts,
        max_new_tokens=budgets,
        sampling=GREEDY,
        num_slots=4,
        forward_width=width,
    )
    assert out.to_lists() == ref.to_lists()
    assert int(jnp.sum(out.stats.accepted)) > 0


# ----------------------------------------------------------------------------
# 5. Sampled: the same tokens as plain decoding for the same key, at the same forward width.


@pytest.mark.parametrize("verification", ["rejection", "coupled"])
# Fast tier: scalar settings with rejection verification; the other three cases (a tree
# decode program each, about 7 s) are slow.
@pytest.mark.first_case_fast
@pytest.mark.parametrize(
    "sampling",
    [
        specjax.SamplingConfig(temperature=1.0),
        specjax.SamplingConfig(
            temperature=np.asarray([0.0, 0.7, 1.3, 1.0]),
            top_k=np.asarray([0, 5, 0, 0]),
            top_p=np.asarray([1.0, 1.0, 0.9, 1.0]),
        ),
    ],
    ids=["scalar", "per_row"],
)
def test_sampled_tree_decoding_reproduces_plain_decoding(pair, sampling, verification):
    """4 rows and depth 3: B == D + 1, where row and depth axes could be confused."""
    target, draft = pair
    seeds = np.asarray([3, 1, 4, 1])
    drafter = specjax.DraftModel(draft).with_tree((2, 2, 1))
    width = specjax.drafters.lookahead(drafter)  # plain and speculative at one width
    budgets = np.asarray([25, 12, 18, 25])
    kw = dict(max_new_tokens=budgets, sampling=sampling, seeds=seeds, forward_width=width)
    ref = specjax.generate(jax.random.key(9), target, PROMPTS, **kw)
    out = specjax.speculative_generate(
        jax.random.key(9), target, drafter, PROMPTS, verification=verification, **kw
    )
    assert out.to_lists() == ref.to_lists()
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
    assert int(jnp.sum(out.stats.accepted)) > 0


# ----------------------------------------------------------------------------
# 6. A chain-shaped tree is the chain.


@pytest.mark.parametrize("kind", ["draft_model", "block", "eagle"])
# Slow tier: 12 s per drafter.
@pytest.mark.slow
def test_chain_shaped_tree_accepts_what_the_chain_accepts(pair, kind):
    target, draft = pair
    if kind == "draft_model":
        chain = specjax.DraftModel(draft, num_draft=3, greedy_draft=True)
    elif kind == "eagle":
        chain = specjax.EagleDrafter.random(target, key=jax.random.key(6), num_draft=3)
    else:
        chain = specjax.BlockDrafter.random(target, key=jax.random.key(2), num_draft=3)
    tree = chain.with_tree((1, 1, 1))
    kw = dict(max_new_tokens=30, sampling=GREEDY)
    a = specjax.speculative_generate(jax.random.key(0), target, chain, PROMPTS, **kw)
    b = specjax.speculative_generate(jax.random.key(0), target, tree, PROMPTS, **kw)
    assert a.to_lists() == b.to_lists()
    np.testing.assert_array_equal(a.stats.accepted, b.stats.accepted)
    np.testing.assert_array_equal(a.stats.row_target_calls, b.stats.row_target_calls)
    if kind == "draft_model":
        assert int(jnp.sum(a.stats.accepted)) > 0


def test_tree_verify_walks_the_matching_children():
    """Greedy rows (one-hot p): descend while a child is the argmax, then emit it."""
    tree = Tree.from_branching((2, 2))  # nodes 1,2 (depth 1); 3,4 under 1; 5,6 under 2
    v = 6
    argmax = np.array([[2, 1, 4, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0]])
    probs = jax.nn.one_hot(argmax, v)
    nodes = jnp.asarray([[1, 2, 5, 0, 3, 4], [1, 2, 0, 0, 0, 0]])
    keys = jax.random.split(jax.random.key(0), 6).reshape(2, 3)
    tokens, n, path, path_probs = tree_verify(keys, nodes, probs, tree)
    # Row 0: root argmax 2 = node 2 (rank 1), whose argmax 4 = node 6, a leaf: bonus 0.
    np.testing.assert_array_equal(tokens[0], [2, 4, 0])
    assert int(n[0]) == 2 and path[0].tolist() == [2, 6]
    # Row 1: root argmax 3 matches no child: emitted at once.
    np.testing.assert_array_equal(tokens[1], [3, -1, -1])
    assert int(n[1]) == 0
    # The p that decided each position: the root, node 2, node 6 for row 0.
    np.testing.assert_array_equal(path_probs[0], probs[0, jnp.asarray([0, 2, 6])])
    # Logits and settings in: the same walk (greedy rows: the argmax).
    logits = jnp.where(probs > 0, 5.0, 0.0)
    again = tree_verify(keys, nodes, logits, tree, specjax.SamplingConfig.greedy())
    np.testing.assert_array_equal(again[0], tokens)


# ----------------------------------------------------------------------------
# 7. Bad input.


class _NoTreeModel:
    """A model-contract wrapper without the tree extension."""

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.vocab_size
        self.config = model.config

    def __call__(self, tokens, positions, cache):
        return self.model(tokens, positions, cache)

    def init_cache(self, batch_size, max_len):
        return self.model.init_cache(batch_size, max_len)


def test_model_without_tree_support_is_refused(pair):
    target, draft = pair
    tree_drafter = specjax.DraftModel(draft).with_tree((2, 1))
    with pytest.raises(TypeError, match="target .*does not support tree attention"):
        specjax.speculative_generate(
            jax.random.key(0), _NoTreeModel(target), tree_drafter, PROMPTS, max_new_tokens=4
        )
    with pytest.raises(TypeError, match="drafter.model .*does not support tree attention"):
        specjax.speculative_generate(
            jax.random.key(0),
            target,
            specjax.DraftModel(_NoTreeModel(draft)).with_tree((2, 1)),
            PROMPTS,
            max_new_tokens=4,
        )


def test_bad_tree_drafters_are_refused(pair):
    target, draft = pair
    # A chain drafter has no with_tree (the Sampler's and the CLI's refusals are in
    # test_sampler.py and test_cli.py).
    lookup = specjax.PromptLookup(ngram=2, num_draft=3)
    assert not isinstance(lookup, specjax.drafters.TreeDrafter)
    assert not hasattr(lookup, "with_tree")
    with pytest.raises(ValueError, match="block_size"):
        specjax.BlockDrafter.random(target, key=jax.random.key(0), num_draft=2).with_tree((2, 2, 2))
    drafter = specjax.DraftModel(draft).with_tree((2, 1))
    with pytest.raises(ValueError, match="tree's depth 2"):
        specjax.speculative_generate(
            jax.random.key(0), target, drafter.replace(num_draft=3), PROMPTS, max_new_tokens=4
        )
    for kw in ({"gamma_by_active_rows": {4: 1}}, {"draft_confidence": 0.5}):
        with pytest.raises(ValueError, match="cannot be used with a tree drafter"):
            specjax.speculative_generate(
                jax.random.key(0), target, drafter, PROMPTS, max_new_tokens=4, **kw
            )
    windowed = tiny_model(seed=3, sliding_window=2)
    with pytest.raises(ValueError, match="sliding window of 2"):
        specjax.speculative_generate(
            jax.random.key(0),
            windowed,
            specjax.DraftModel(windowed).with_tree((2, 2)),
            PROMPTS,
            max_new_tokens=4,
        )
    # A target whose own cache layout has no compact_path cannot take a tree step.
    with pytest.raises(TypeError, match="compact_path"):
        specjax.speculative_generate(
            jax.random.key(0),
            _OwnCacheLayout(target),
            specjax.DraftModel(draft).with_tree((2, 1)),
            PROMPTS,
            max_new_tokens=4,
        )


@struct.dataclass
class _CacheWithoutCompaction:
    """A `KVCache` behind another layout: lengths and rollback, no ``compact_path``."""

    inner: KVCache

    @property
    def lengths(self):
        return self.inner.lengths

    def rollback(self, lengths):
        return self.replace(inner=self.inner.rollback(lengths))


@struct.dataclass
class _OwnCacheLayout:
    """A tree-capable target whose cache has no ``compact_path``."""

    model: object
    supports_tree = True

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def init_cache(self, batch_size: int, max_len: int):
        return _CacheWithoutCompaction(self.model.init_cache(batch_size, max_len))

    def __call__(self, tokens_BT, positions_BT, cache, **kwargs):
        out = self.model(tokens_BT, positions_BT, cache.inner, **kwargs)
        return out.replace(cache=_CacheWithoutCompaction(out.cache))
