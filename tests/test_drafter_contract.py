"""A new drafter is one file and one registry line.

`RepeatLast` is defined here and nowhere else: it follows `specjax.Drafter` (one
signature for every drafter: ``init`` and ``update`` take ``hidden``, ``None`` for
a drafter that reads no target layers), is registered in `specjax.drafters.registry`
and then serves like a built-in one: greedy speculative decoding with it equals plain
greedy decoding at the same forward width, and the decoders' memory check counts its `state_bytes`.
"""

import jax
import jax.numpy as jnp
import pytest
from flax import struct
from support import GREEDY

import specjax
from specjax.drafters import registry
from specjax.testing import tiny_model

PROMPTS = [[1, 2, 3], [4, 5]]
MAX_NEW = 6


@struct.dataclass
class RepeatLast(specjax.Drafter):
    """Proposes each row's last token γ times, keeping a per-slot buffer as its state.

    The buffer (``int32[B, S]``, the tokens it saw) stands in for a cache, so that the
    memory check has bytes to count.
    """

    num_draft: int = struct.field(pytree_node=False, default=3)
    noun = "repeat-last drafter"

    @property
    def vocab_size(self):
        return None

    def init(self, prompts_BS, seq_lengths_B, cache_len, hidden=None):
        assert hidden is None  # it reads no target layers
        b, p = prompts_BS.shape
        return jnp.zeros((b, cache_len), jnp.int32).at[:, :p].set(prompts_BS)

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        last = jnp.take_along_axis(seq_BS, seq_lengths_B[:, None] - 1, axis=1)
        tokens = jnp.repeat(last, self.num_draft, axis=1).astype(jnp.int32)
        return specjax.Proposal(tokens=tokens, probs=None, state=state)

    def update(self, state, seq_lengths_B, hidden=None):
        assert hidden is None
        return state

    def state_bytes(self, batch_size, cache_len):
        return batch_size * cache_len * 4


@pytest.fixture
def registered(monkeypatch):
    """``"repeat_last"`` in the registry for one test; the registry is restored after."""
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))
    registry.register("repeat_last", RepeatLast)
    return registry.get("repeat_last")


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)


def test_the_registry_reaches_it_by_name(registered):
    assert registered.cls is RepeatLast and not registered.has_weights
    assert "repeat_last" in registry.names()
    with pytest.raises(ValueError, match="no drafter is called 'repeat_lst'"):
        registry.get("repeat_lst")
    with pytest.raises(TypeError, match="cls must be a Drafter subclass"):
        registry.register("not_a_drafter", dict)


def test_greedy_speculative_output_equals_plain_greedy(registered, target):
    drafter = registered.cls()
    kwargs = dict(
        max_new_tokens=MAX_NEW, sampling=GREEDY, forward_width=specjax.drafters.lookahead(drafter)
    )
    spec = specjax.speculative_generate(jax.random.key(0), target, drafter, PROMPTS, **kwargs)
    plain = specjax.generate(jax.random.key(0), target, PROMPTS, **kwargs)
    assert spec.to_lists() == plain.to_lists()
    assert int(spec.stats.target_calls) <= int(plain.stats.target_calls)
    # γ through the contract's with_draft, as the CLI sets it.
    assert drafter.with_draft(2).num_draft == 2
    with pytest.raises(ValueError, match="RepeatLast has no drafting modes"):
        drafter.with_draft(mode="sample")


@struct.dataclass
class EchoPrompt(specjax.Drafter):
    """A drafter of one method: proposes the row's first γ prompt tokens again."""

    num_draft: int = struct.field(pytree_node=False, default=2)

    def propose(self, keys_BG, state, seq_BS, seq_lengths_B, sampling):
        return specjax.Proposal(tokens=seq_BS[:, : self.num_draft], probs=None, state=state)


def test_a_drafter_of_one_method_runs_in_both_decoders_and_equals_plain(target):
    """Only `propose` written: the closed decoder and the open one with refill (two
    slots for three prompts) both give plain decoding's tokens at the same width."""
    drafter = EchoPrompt()
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3, 1, 2]]
    width = specjax.drafters.lookahead(drafter)
    kwargs = dict(max_new_tokens=MAX_NEW, sampling=GREEDY, forward_width=width)
    plain = specjax.generate(None, target, prompts, **kwargs).to_lists()
    closed = specjax.speculative_generate(None, target, drafter, prompts, **kwargs)
    assert closed.to_lists() == plain
    decoder, state = specjax.decoding.init(
        None, target, prompts, drafter=drafter, num_slots=2, **kwargs
    )
    state = specjax.decoding.run(decoder, state)
    assert specjax.decoding.result(decoder, state).to_lists() == plain
    with pytest.raises(TypeError, match="abstract method propose"):
        type("NoPropose", (specjax.Drafter,), {"num_draft": 2})()


class _MemoryChecked(Exception):
    """Stops a decoder right after its memory check, before anything compiles."""


def test_memory_check_counts_its_state_bytes(registered, target, monkeypatch):
    asked = {}

    def record(name, nbytes, what):
        asked[type(drafter).__name__] = nbytes
        raise _MemoryChecked

    monkeypatch.setattr(specjax.decoding.checks, "check_fits_memory", record)
    cache_len = 64
    for drafter in (specjax.drafters.NoDraft(), registered.cls()):
        with pytest.raises(_MemoryChecked):
            specjax.speculative_generate(
                jax.random.key(0),
                target,
                drafter,
                PROMPTS,
                max_new_tokens=MAX_NEW,
                cache_len=cache_len,
            )
    # The statistics add int32 counters per draft position, three [γ] and a [γ + 1]
    # histogram (one column for NoDraft), for every slot and for every prompt's output.
    counters = 2 * len(PROMPTS) * 16 * drafter.num_draft
    assert asked["RepeatLast"] - asked["NoDraft"] == len(PROMPTS) * cache_len * 4 + counters
