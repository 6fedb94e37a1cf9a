"""`specjax.check_model`: passes working models, names the rule each broken toy breaks.

The toys are the broken models a Flax researcher brought: not a pytree,
``[B, V]`` logits, a cache without ``rollback``, a ``vocab_size`` wider than the
logits, and attention masked by ``cache.lengths`` instead of by position. Each
broken toy differs from a passing one in exactly that rule, so a check that passed
everything, or refused everything, fails here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import struct

import specjax
from specjax.testing import tiny_model

V = 11


@struct.dataclass
class LengthsOnly:
    lengths: jax.Array  # int32[B]

    def rollback(self, lengths):
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))


@struct.dataclass
class NoRollback:
    lengths: jax.Array


@struct.dataclass
class Bigram:
    """The worked example of docs/models.md: logits depend on the current token only."""

    table: jax.Array  # float32[V, V]

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    def init_cache(self, batch_size, max_len):
        return LengthsOnly(lengths=jnp.zeros((batch_size,), jnp.int32))

    def __call__(self, tokens_BT, positions_BT, cache):
        logits = self.table[tokens_BT].astype(jnp.float32)
        return specjax.ModelOutput(logits, cache.rollback(positions_BT[:, -1] + 1))


class NotAPytree:
    """A plain class around a working model: jax.jit cannot take it."""

    def __init__(self, inner):
        self.inner = inner
        self.vocab_size = inner.vocab_size

    def init_cache(self, batch_size, max_len):
        return self.inner.init_cache(batch_size, max_len)

    def __call__(self, *args):
        return self.inner(*args)


@struct.dataclass
class LastLogitsOnly(Bigram):
    def __call__(self, tokens_BT, positions_BT, cache):
        out = super().__call__(tokens_BT, positions_BT, cache)
        return out.replace(logits=out.logits[:, -1])  # [B, V]


@struct.dataclass
class CacheWithoutRollback(Bigram):
    def init_cache(self, batch_size, max_len):
        return NoRollback(lengths=jnp.zeros((batch_size,), jnp.int32))

    def __call__(self, tokens_BT, positions_BT, cache):
        return specjax.ModelOutput(self.table[tokens_BT], NoRollback(positions_BT[:, -1] + 1))


@struct.dataclass
class WiderVocab(Bigram):
    @property
    def vocab_size(self) -> int:
        return self.table.shape[0] + 1


@struct.dataclass
class AttentionCache:
    keys: jax.Array  # float32[B, S, D]
    values: jax.Array  # float32[B, S, D]
    lengths: jax.Array  # int32[B]

    def rollback(self, lengths):
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))


@struct.dataclass
class OneHeadAttention:
    """One causal attention layer over a KV cache, writing each token at its position.

    ``by_lengths=True`` masks keys by the cache's lengths (key slot ``s`` is visible
    to the ``t``-th new token when ``s <= lengths + t``), which agrees with masking by
    position only when the new tokens start at ``lengths``.
    """

    embed: jax.Array  # float32[V, D]
    by_lengths: bool = struct.field(pytree_node=False, default=False)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    def init_cache(self, batch_size, max_len):
        d = self.embed.shape[1]
        zeros = jnp.zeros((batch_size, max_len, d), jnp.float32)
        return AttentionCache(zeros, zeros, jnp.zeros((batch_size,), jnp.int32))

    def __call__(self, tokens_BT, positions_BT, cache):
        x_BTD = self.embed[tokens_BT]
        rows = jnp.arange(tokens_BT.shape[0])[:, None]
        keys = cache.keys.at[rows, positions_BT].set(x_BTD)
        values = cache.values.at[rows, positions_BT].set(jnp.tanh(x_BTD))
        slots_S = jnp.arange(keys.shape[1])
        if self.by_lengths:
            last_BT = cache.lengths[:, None] + jnp.arange(tokens_BT.shape[1])[None, :]
        else:
            last_BT = positions_BT
        visible_BTS = slots_S[None, None, :] <= last_BT[:, :, None]
        scores = jnp.einsum("btd,bsd->bts", x_BTD, keys)
        weights = jax.nn.softmax(jnp.where(visible_BTS, scores, -1e30), axis=-1)
        out_BTD = jnp.einsum("bts,bsd->btd", weights, values)
        logits = out_BTD @ self.embed.T
        return specjax.ModelOutput(logits, AttentionCache(keys, values, positions_BT[:, -1] + 1))


def _table(seed=0):
    return jax.random.normal(jax.random.key(seed), (V, V), jnp.float32)


def _attention(by_lengths):
    embed = jax.random.normal(jax.random.key(1), (V, 8), jnp.float32)
    return OneHeadAttention(embed, by_lengths=by_lengths)


def test_passes_specjax_models_and_the_readme_examples():
    specjax.check_model(tiny_model(seed=0))
    specjax.check_model(Bigram(_table()))
    specjax.check_model(_attention(by_lengths=False))


def test_passes_a_target_with_its_feature_drafter():
    target = tiny_model(seed=0, num_layers=2)
    head = specjax.EagleDrafter.random(target, key=jax.random.key(1), num_draft=2)
    specjax.check_model(target, drafter=head)


@pytest.mark.parametrize(
    "model, rule",
    [
        (NotAPytree(Bigram(_table())), "pytree"),
        (LastLogitsOnly(_table()), "logits [B, T, V]"),
        (CacheWithoutRollback(_table()), "rollback"),
        (WiderVocab(_table()), "vocab_size"),
        (_attention(by_lengths=True), "repeated positions"),
    ],
    ids=["not-a-pytree", "B-V-logits", "no-rollback", "wide-vocab_size", "masks-by-lengths"],
)
def test_names_the_rule_each_broken_toy_breaks(model, rule):
    with pytest.raises(specjax.ModelContractError, match="check_model") as info:
        specjax.check_model(model)
    assert info.value.rule == rule
    assert f"rule '{rule}'" in str(info.value)


@pytest.mark.parametrize(
    "model, rule",
    [
        (NotAPytree(Bigram(_table())), "pytree"),
        (LastLogitsOnly(_table()), "logits [B, T, V]"),
        (CacheWithoutRollback(_table()), "rollback"),
        (WiderVocab(_table()), "vocab_size"),
    ],
    ids=["not-a-pytree", "B-V-logits", "no-rollback", "wide-vocab_size"],
)
@pytest.mark.parametrize("decoder", ["generate", "speculative_generate", "as_drafter"])
def test_the_decoders_name_the_rule_before_compiling(model, rule, decoder):
    """The rules shapes decide, from both decoders and for a drafter's own model; masking
    by lengths needs values, so only `check_model` sees it."""
    key, prompts = jax.random.key(0), [[1, 2, 3]]
    with pytest.raises(specjax.ModelContractError, match="check_model") as info:
        if decoder == "generate":
            specjax.generate(key, model, prompts, max_new_tokens=2)
        elif decoder == "speculative_generate":
            drafter = specjax.PromptLookup(ngram=1, num_draft=2)
            specjax.speculative_generate(key, model, drafter, prompts, max_new_tokens=2)
        else:
            # A target one id wider, so that the pair's vocabulary check (a drafter's
            # vocab_size at most the target's) lets every broken drafter through.
            wide = Bigram(jax.random.normal(jax.random.key(5), (V + 1, V + 1), jnp.float32))
            specjax.speculative_generate(
                key, wide, specjax.DraftModel(model, num_draft=2), prompts, max_new_tokens=2
            )
    assert info.value.rule == rule
