"""The multiply-adds of a jax program, counted on its jaxpr.

Compilers rewrite products into forms of their own (a TPU's matrix-vector products
become fused multiply-reduce loops, its matrix products convolutions), so the flops
are counted where every product is still a ``dot_general``: ``2 · (output size) ·
(contracted size)`` per product, times the length of the ``scan`` that holds it; a
``cond`` counts its dearest branch (a rarely taken refill included), a
``while_loop`` its body once per step (its trip count is not static).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from specjax.chips.flops import dot_flops
    >>> jaxpr = jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((8, 4)), jnp.ones((4, 2)))
    >>> dot_flops(jaxpr)
    128.0
"""

from __future__ import annotations

import math

from jax.extend import core

__all__ = ["dot_flops"]


def dot_flops(jaxpr) -> float:
    """``2 · M · N · K`` summed over the products of a (closed) jaxpr."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2.0 * math.prod(out) * math.prod(lhs[a] for a in contract)
        elif name == "cond":
            total += max((dot_flops(b) for b in eqn.params["branches"]), default=0.0)
        elif name == "scan":
            total += eqn.params["length"] * dot_flops(eqn.params["jaxpr"])
        else:
            for inner in _sub_jaxprs(eqn.params):
                total += dot_flops(inner)
    return total


def _sub_jaxprs(params: dict):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, (core.Jaxpr, core.ClosedJaxpr)):
                yield item
