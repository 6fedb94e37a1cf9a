"""`typed_jit`: models of different classes with the same fields never share a program.

In jaxlib 0.10 the tree structures of two different dataclass types with the same
fields compare equal, so plain ``jax.jit`` can run one class's compiled program for
the other (a flaky `check_model` failure in the suite was this: a ``WiderVocab`` toy
ran the program compiled for ``LastLogitsOnly``). The decoders, `check_model` and
the training step compile through `typed_jit`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import struct

import specjax
from specjax.core.typed_jit import dataclass_types, typed_jit

# Same-field classes per test. Plain jax.jit gave 7-9 wrong results of 60 in each of five
# fresh processes (9-19 of 100, 47 of 300), so a run of 64 with none wrong under plain
# jit is not to be expected (about 0.87**64 ~ 1e-4 if calls went wrong independently).
NUM_CLASSES = 64


@struct.dataclass
class Offset:
    x: jax.Array

    def value(self):
        return self.x


def _classes(n):
    def make(k):
        return struct.dataclass(type(f"Offset{k}", (Offset,), {"value": lambda self: self.x + k}))

    return [make(k) for k in range(n)]


def _wrong(jitted, classes):
    return [k for k, cls in enumerate(classes) if int(jitted(cls(jnp.zeros((), jnp.int32)))) != k]


def test_each_class_runs_its_own_program():
    classes = _classes(NUM_CLASSES)
    assert _wrong(typed_jit(lambda m: m.value()), classes) == []


def test_negative_control_plain_jit_mixes_them_up_while_jax_compares_the_types_equal():
    classes = _classes(NUM_CLASSES)
    if jax.tree.structure(classes[0](0)) != jax.tree.structure(classes[1](0)):
        pytest.skip("this jaxlib compares dataclass tree structures by type: nothing to control")
    assert _wrong(jax.jit(lambda m: m.value()), classes) != []


def test_static_and_donated_arguments_work_as_in_jax_jit():
    def f(a, b, *, scale):
        return a * scale + b

    g = typed_jit(f, static_argnames=("scale",), donate_argnums=0)
    assert float(g(jnp.ones(()), jnp.ones(()), scale=3)) == 4.0
    assert float(g(jnp.ones(()), jnp.ones(()), scale=5)) == 6.0


def test_finds_nested_dataclass_types_in_order():
    inner = _classes(2)
    tree = {"a": inner[1](jnp.zeros(())), "b": [inner[0](jnp.zeros(())), jnp.zeros(())]}
    assert dataclass_types(tree) == (inner[1], inner[0])


@struct.dataclass
class ConstantModel:
    """Always predicts ``favourite`` (its subclasses differ only in the method)."""

    table: jax.Array  # float32[V]

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    def init_cache(self, batch_size, max_len):
        return _Lengths(jnp.zeros((batch_size,), jnp.int32))

    def favourite(self) -> int:
        return 0

    def __call__(self, tokens_BT, positions_BT, cache):
        logits = jnp.where(jnp.arange(self.vocab_size) == self.favourite(), 10.0, 0.0)
        logits_BTV = jnp.broadcast_to(logits + 0 * self.table, tokens_BT.shape + logits.shape)
        return specjax.ModelOutput(
            logits_BTV.astype(jnp.float32), cache.rollback(positions_BT[:, -1] + 1)
        )


@struct.dataclass
class _Lengths:
    lengths: jax.Array

    def rollback(self, lengths):
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))


def test_generate_runs_each_model_class_of_the_same_fields():
    models = [
        struct.dataclass(type(f"Const{k}", (ConstantModel,), {"favourite": lambda self, k=k: k}))
        for k in range(4)
    ]
    for k, cls in enumerate(models):
        out = specjax.generate(jax.random.key(0), cls(jnp.zeros((5,))), [[1, 2]], max_new_tokens=3)
        assert out.tokens.tolist() == [[k, k, k]]


def test_lower_is_keyed_like_the_call():
    """`.lower` (what a profile of the compiled program reads) lowers the program the call runs."""
    import jax.numpy as jnp

    from specjax.core.typed_jit import typed_jit

    double = typed_jit(lambda x: 2 * x)
    x = jnp.arange(3.0)
    assert (double.lower(x).compile()(x) == double(x)).all()
