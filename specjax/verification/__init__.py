"""Verification: which drafted tokens to keep so the output is exactly the target's.

* `~specjax.verification.chain`: a chain of γ drafts per row, verified greedily, by
  speculative rejection sampling (``min(1, p/q)``, one-hot or full q) or by coupling;
  each docstring carries its proof;
* `~specjax.verification.tree`: a static tree of drafts (`Tree`), verified by the same
  exact walk along its accepted path;
* `~specjax.verification.verifiers`: the decoder's verifier of a chain as an object
  (`Rejection`, `Coupled`), chosen by ``verification=``.
"""

from specjax.verification.chain import coupled_verify as coupled_verify
from specjax.verification.chain import greedy_verify as greedy_verify
from specjax.verification.chain import rejection_sample as rejection_sample
from specjax.verification.chain import rejection_sample_onehot as rejection_sample_onehot
from specjax.verification.chain import target_samples as target_samples
from specjax.verification.tree import Tree as Tree
from specjax.verification.tree import tree_verify as tree_verify
from specjax.verification.verifiers import VERIFIERS as VERIFIERS
from specjax.verification.verifiers import Coupled as Coupled
from specjax.verification.verifiers import Rejection as Rejection
from specjax.verification.verifiers import Verifier as Verifier

__all__ = [
    "VERIFIERS",
    "Coupled",
    "Rejection",
    "Tree",
    "Verifier",
    "coupled_verify",
    "greedy_verify",
    "rejection_sample",
    "rejection_sample_onehot",
    "target_samples",
    "tree_verify",
]
