"""Static draft trees and their exact verification.

A chain of γ drafts wastes the drafter's second and third choices. A *tree* drafter
proposes several candidates per position instead, and the target scores every node
in one forward with an ancestor-only attention mask; the verifier then keeps one
root-to-node path.

**Shape.** A `Tree` is static (part of the compiled program). Node 0 is the root: the
row's pending token, already decided. Nodes ``1..N`` are drafted, listed level by
level (breadth first): ``parents[j] < j``, and depths never decrease. A node's *rank*
is its index among its siblings, so a top-k drafter gives the node of rank r its
parent's r-th most likely token. ``Tree.from_branching((3, 2, 2, 1))`` is the full tree
with 3 children at the root, 2 under each of those, and so on (N = 3 + 6 + 12 + 12).

**Slots.** In the target's verify forward node j is written to cache slot
``start + j`` (``start`` = the root's slot = its position), at RoPE position
``start + depth[j]``, and sees the committed slots ``< start`` and its own ancestors
(`specjax.models.cache.TreeMask`). After verification the accepted path's keys and
values are moved to slots ``start + 1 .. start + n`` (the cache's ``compact_path``,
e.g. `specjax.models.cache.KVCache.compact_path`), so the cache
keeps slot == position for committed tokens.

**Exactness.** Children are deterministic (the top-k of the drafter's distribution),
so this is recursive rejection sampling with one-hot proposals, which reduces to:
at each node on the path, draw the target's own token from its processed p with that
*position's* noise (`specjax.sampling.noise`); if it equals a child, descend, otherwise emit
it. Every emitted token is the target's sample at its position with the noise plain
decoding uses there, so the output is exactly the target's distribution, and for the
same keys it is plain decoding token for token, whatever the drafter proposed. Greedy
rows (one-hot p) get the longest path matching the target's argmax, then the
target's own token. The same rule serves ``verification="rejection"`` and
``"coupled"``: it never reads q.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.sampling.distributions import mask_vocab, noise, probs_from_logits, sample
from specjax.sampling.settings import RowSampling, histories_of
from specjax.verification.chain import target_samples

__all__ = [
    "Tree",
    "child_tokens",
    "expand_top_k",
    "path_nodes_with_root",
    "tree_verify",
]


@dataclasses.dataclass(frozen=True)
class Tree:
    """A static draft tree.

    Attributes:
        parents: ``parents[j - 1]`` is the parent of node j (``0`` = the root), for the
            drafted nodes ``j = 1..N`` in breadth-first order: each parent comes
            before its children and depths never decrease.
    """

    parents: tuple[int, ...]

    def __post_init__(self):
        parents = tuple(self.parents)
        if not parents:
            raise ValueError("a Tree needs at least one drafted node; got parents=()")
        for j, p in enumerate(parents, start=1):
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= p < j:
                raise ValueError(
                    f"Tree parents[{j - 1}] (the parent of node {j}) must be an integer "
                    f"in [0, {j}) (0 is the root, nodes are breadth first); got {p!r}"
                )
        object.__setattr__(self, "parents", tuple(int(p) for p in parents))
        depths = self.depths
        if np.any(np.diff(depths) < 0):
            raise ValueError(
                f"Tree nodes must be listed level by level (depths never decrease); "
                f"got depths {depths[1:].tolist()} for parents {list(parents)}"
            )

    @classmethod
    def from_branching(cls, branching) -> Tree:
        """The full tree with ``branching[d]`` children under every node of depth d.

        Args:
            branching: e.g. ``(3, 2, 2, 1)``, each entry an integer >= 1; ``(1,) * γ``
                is a chain of γ drafts.
        """
        branching = tuple(branching) if not isinstance(branching, (int, str)) else None
        if not branching or any(
            isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in branching
        ):
            raise ValueError(
                f"branching must be a non-empty sequence of integers >= 1, e.g. (3, 2, 2, 1); "
                f"got {branching!r}"
            )
        parents, level = [], [0]
        for k in branching:
            nxt = []
            for p in level:
                for _ in range(int(k)):
                    parents.append(p)
                    nxt.append(len(parents))
            level = nxt
        return cls(tuple(parents))

    @classmethod
    def parse(cls, text: str) -> Tree:
        """``"3,2,2,1"`` -> ``Tree.from_branching((3, 2, 2, 1))`` (the CLI's ``--tree``)."""
        try:
            branching = tuple(int(x) for x in str(text).split(","))
        except ValueError:
            raise ValueError(
                f"--tree must be comma-separated integers >= 1, e.g. 3,2,2,1; got {text!r}"
            ) from None
        return cls.from_branching(branching)

    # Derived static tables (numpy, so they are constants under jit).

    @property
    def num_nodes(self) -> int:
        """N, the drafted nodes (the root excluded)."""
        return len(self.parents)

    @functools.cached_property
    def parent_of(self) -> np.ndarray:
        """``int32[N+1]``: the parent of each node, ``-1`` for the root."""
        return np.array((-1, *self.parents), np.int32)

    @functools.cached_property
    def depths(self) -> np.ndarray:
        """``int32[N+1]``: each node's depth (the root's is 0)."""
        depth = [0]
        for p in self.parents:
            depth.append(depth[p] + 1)
        return np.array(depth, np.int32)

    @property
    def depth(self) -> int:
        """D, the longest path: at most D drafts are accepted per step."""
        return int(self.depths[-1])

    @functools.cached_property
    def ranks(self) -> np.ndarray:
        """``int32[N+1]``: each node's index among its siblings (the root's is 0)."""
        seen: dict[int, int] = {}
        ranks = [0]
        for p in self.parents:
            ranks.append(seen.get(p, 0))
            seen[p] = ranks[-1] + 1
        return np.array(ranks, np.int32)

    @functools.cached_property
    def children(self) -> np.ndarray:
        """``int32[N+1, K]`` each node's children in rank order, ``-1`` padded."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for j, p in enumerate(self.parents, start=1):
            kids[p].append(j)
        width = max(len(k) for k in kids)
        return np.array([k + [-1] * (width - len(k)) for k in kids], np.int32)

    @functools.cached_property
    def ancestors(self) -> np.ndarray:
        """``bool[N+1, N+1]``: ``[i, j]`` iff node j is node i or one of its ancestors."""
        n1 = self.num_nodes + 1
        mask = np.eye(n1, dtype=bool)
        for j, p in enumerate(self.parents, start=1):
            mask[j] |= mask[p]
        return mask

    def level(self, d: int) -> tuple[int, int]:
        """``(first, stop)``: the nodes of depth ``d`` are ``first .. stop-1``."""
        idx = np.flatnonzero(self.depths == d)
        return int(idx[0]), int(idx[-1]) + 1

    def __repr__(self) -> str:
        widths = [int(np.sum(self.depths == d)) for d in range(1, self.depth + 1)]
        return f"Tree(nodes={self.num_nodes}, depth={self.depth}, level_widths={widths})"


def child_tokens(parent_logits_BPV, tree: Tree, depth: int, vocab_limit=None) -> jax.Array:
    """The drafted tokens of the nodes at ``depth + 1``: the top-k of their parents.

    Args:
        parent_logits_BPV: ``[B, P, V]`` logits of the nodes at ``depth``, in node
            order, or ``[B, 1, V]`` shared by all of them (a block drafter, whose
            distribution at a position does not depend on the path).
        tree: the static `Tree`.
        depth: d; the children of the depth-d nodes are returned.
        vocab_limit: ``None``, or a scalar / ``[B]`` limit; ids at or above it are
            ranked last (they are never the target's token, so never accepted).

    Returns:
        ``int32[B, n]`` for the ``n`` nodes of depth ``d + 1``: the node of rank r
        gets its parent's r-th most likely token.
    """
    first, stop = tree.level(depth + 1)
    parents, ranks = tree.parent_of[first:stop], tree.ranks[first:stop]
    # Ranked by logits: temperature, top-k and top-p keep the order of the tokens they
    # keep, so this is the order of the processed distribution too.
    _, top_BPK = jax.lax.top_k(mask_vocab(parent_logits_BPV, vocab_limit), int(ranks.max()) + 1)
    local = parents - tree.level(depth)[0] if parent_logits_BPV.shape[1] > 1 else 0 * parents
    return top_BPK[:, local, ranks].astype(jnp.int32)


def expand_top_k(tree: Tree, root_logits_B1V, vocab_limit, score_level, carry):
    """Drafts a tree level by level: each node's children are the top-k of its logits.

    The one expansion loop of the drafters that score each level (`DraftModel`,
    `EagleDrafter`); a block drafter, whose logits do not depend on the path, calls
    `child_tokens` directly.

    Args:
        tree: the static `Tree`.
        root_logits_B1V: ``[B, 1, V]`` the drafter's logits at the root.
        vocab_limit: as for `child_tokens`.
        score_level: ``(depth, tokens_Bn, carry) -> (logits_BnV, carry)``, scoring the
            ``n`` drafted nodes of ``depth`` (slots ``tree.level(depth)``); not called
            for the leaves.
        carry: the drafter's running state (e.g. its cache).

    Returns:
        ``(tokens int32[B, N], carry)``.
    """
    parent_logits, levels = root_logits_B1V, []
    for d in range(tree.depth):
        levels.append(child_tokens(parent_logits, tree, d, vocab_limit))
        if d + 1 < tree.depth:  # the leaves' own children are never drafted
            parent_logits, carry = score_level(d + 1, levels[-1], carry)
    return jnp.concatenate(levels, axis=1), carry


def tree_verify(
    keys_BD1, node_tokens_BN, target_BN1V, tree: Tree, sampling=None, *, every_node=False
):
    """Exact verification of a tree with deterministic children, for a batch.

    At each node on the path, the target's token is ``sample(stream(keys[depth],
    SAMPLE), p_node)``; if it equals one of the node's drafted children the path
    descends into that child, otherwise (or at a leaf) that token is emitted and the
    step ends (see the module docstring for why this is exact). Only the D + 1 nodes
    on the path are ever turned into distributions and sampled, not all N + 1, unless
    ``every_node``.

    Args:
        keys_BD1: position keys ``[B, D+1]``: depth d decides the token at the row's
            position ``length + d`` (as in the chain verifiers).
        node_tokens_BN: ``int32[B, N]`` the drafted tokens of nodes ``1..N``; an id
            outside ``[0, V)`` (e.g. -1) never matches.
        target_BN1V: ``[B, N+1, V]`` the target at every node, the root first: its
            processed probabilities p, or its logits when ``sampling`` is given. With
            ``every_node`` it may have more columns, ``[B, W, V]``, the last ``W - N -
            1`` of them padding that is never read.
        tree: the static `Tree`.
        sampling: ``None``, or the rows' `~specjax.SamplingConfig` (``[B]`` leaves; the
            decoders pass a `~specjax.sampling.RowSampling`, whose constraint states
            follow the path): then ``target_BN1V`` holds logits, and p is
            ``probs_from_logits(logits, sampling)`` at the path's nodes.
        every_node: compute p and the target's sample at all W columns in one batched
            call (`specjax.verification.chain.target_samples`), as plain decoding at forward width
            W computes its columns, and walk the path through them: the decoders' fixed
            forward width, where a token's bits must not depend on the shape of the
            computation that drew it. Costs W distributions instead of D + 1.

    Returns:
        ``(tokens int32[B, D+1], num_accepted int32[B], path_BD int32[B, D],
        probs_BD1V float32[B, D+1, V])``: ``tokens`` in the chain layout (the n accepted
        drafts, then the target's token, then -1); ``path_BD[:, d]`` the node accepted
        at depth d + 1 (for ``d >= num_accepted`` it repeats the last accepted node, or
        0); ``probs_BD1V[:, d]`` the p that decided position d (at the path's node).
    """
    b, n = node_tokens_BN.shape
    columns = target_BN1V.shape[1]
    if (
        target_BN1V.shape[0] != b
        or not (columns == n + 1 or (every_node and columns > n + 1))
        or n != tree.num_nodes
    ):
        raise ValueError(
            f"tree_verify: node_tokens_BN must be [B, N] and target_BN1V [B, N+1, V] "
            f"for the tree's N = {tree.num_nodes} nodes; got node_tokens_BN"
            f"{list(node_tokens_BN.shape)}, target_BN1V{list(target_BN1V.shape)}"
        )
    depth = tree.depth
    if tuple(keys_BD1.shape) != (b, depth + 1):
        raise ValueError(
            f"tree_verify: keys_BD1 must be [B, D+1] = [{b}, {depth + 1}]; got "
            f"{list(keys_BD1.shape)}"
        )
    sample_keys_BD1 = noise.stream(keys_BD1, noise.SAMPLE)
    tokens_BN1 = jnp.concatenate(
        [jnp.full((b, 1), -1, jnp.int32), node_tokens_BN.astype(jnp.int32)], axis=1
    )
    children = jnp.asarray(tree.children)
    rows = jnp.arange(b)

    # The rows' histories (a constraint's automaton, a user's: `specjax.sampling.history`)
    # follow the path: the node at depth d is masked with the history after the path's
    # first d tokens.
    histories = histories_of(sampling)

    if every_node:
        probs_BWV = target_BN1V.astype(jnp.float32)
        if sampling is not None:
            along = tuple(h.along_tree(node_tokens_BN, tree.parents, columns) for h in histories)
            probs_BWV = probs_from_logits(target_BN1V, RowSampling.of(sampling, along))
        # Each node draws with its depth's keys (nodes of one depth share them).
        depth_W = np.concatenate([tree.depths, np.zeros(columns - n - 1, np.int32)])
        samples_BW = target_samples(keys_BD1[:, depth_W], probs_BWV)

        def target_at(node_B, d):
            del d  # every node drew with its own depth's keys above
            return probs_BWV[rows, node_B], samples_BW[rows, node_B]

    else:

        def target_at(node_B, d):
            row_BV = target_BN1V[rows, node_B]
            if sampling is None:
                p_BV = row_BV.astype(jnp.float32)
            else:
                p_BV = probs_from_logits(row_BV, RowSampling.of(sampling, histories))
            return p_BV, sample(sample_keys_BD1[:, d], p_BV)

    node_B = jnp.zeros((b,), jnp.int32)
    alive_B = jnp.ones((b,), bool)
    num_accepted = jnp.zeros((b,), jnp.int32)
    path, emitted, probs = [], [], []
    for d in range(depth + 1):  # static and small: unrolled
        # The node on the path at depth d draws with position d's noise: nodes of one
        # depth share it, and only one of them can be on the path.
        p_BV, target_B = target_at(node_B, d)
        emitted.append(target_B)
        probs.append(p_BV)
        if d == depth:
            break
        kids_BK = children[node_B]
        kid_tokens_BK = tokens_BN1[rows[:, None], jnp.maximum(kids_BK, 0)]
        match_BK = (kid_tokens_BK == target_B[:, None]) & (kids_BK >= 0) & alive_B[:, None]
        found_B = jnp.any(match_BK, axis=1)
        child_B = kids_BK[rows, jnp.argmax(match_BK, axis=1)]
        node_B = jnp.where(found_B, child_B, node_B)
        if not every_node:
            histories = tuple(h.advance(target_B) for h in histories)
        alive_B &= found_B
        num_accepted += found_B.astype(jnp.int32)
        path.append(node_B)
    offsets = jnp.arange(depth + 1)[None]
    # Along the path the target's sample at depth d is the accepted draft itself, so
    # the emitted block is the sequence of target samples up to and including the
    # first one no child matched.
    tokens_BD1 = jnp.where(offsets <= num_accepted[:, None], jnp.stack(emitted, axis=1), -1)
    path_BD = jnp.stack(path, axis=1) if path else jnp.zeros((b, 0), jnp.int32)
    return tokens_BD1, num_accepted, path_BD, jnp.stack(probs, axis=1)


def path_nodes_with_root(path_BD: jax.Array) -> jax.Array:
    """``int32[B, D+1]``: the node that decides each emitted position (root, then the path)."""
    return jnp.concatenate([jnp.zeros((path_BD.shape[0], 1), jnp.int32), path_BD], axis=1)
