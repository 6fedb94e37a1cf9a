"""The top-level namespace: what ``import specjax`` offers, and where the rest lives."""

import dataclasses
import importlib
import inspect
import types

import jax.numpy as jnp
import numpy as np
import pytest

import specjax

PUBLIC = [
    "Sampler",
    "ChatSampler",
    "GenerationOptions",
    "generate",
    "speculative_generate",
    "GenerationResult",
    "SamplingConfig",
    "Constraint",
    "StopStrings",
    "Drafter",
    "Proposal",
    "DraftModel",
    "PromptLookup",
    "BlockDrafter",
    "EagleDrafter",
    "Model",
    "ModelConfig",
    "ModelOutput",
    "KVCache",
    "check_model",
    "ModelContractError",
    "load_pretrained",
    "save_pretrained",
    "fetch",
    "default_pair",
    "apply_chat_template",
    "enable_compilation_cache",
]

SUBMODULES = [
    "decoding",
    "drafters",
    "models",
    "sampling",
    "verification",
    "io",
    "training",
    "testing",
]

# Names that are not at the top level, and where each lives.
MOVED = {
    "DecodeState": "specjax.decoding.DecodeState",
    "GenerationStats": "specjax.decoding.GenerationStats",
    "NoDraft": "specjax.drafters.NoDraft",
    "default_drafter": "specjax.io.pretrained.default_drafter",
    "smollm2_drafter": "specjax.io.pretrained.smollm2_drafter",
    "sharding": "specjax.models.sharding",
    "compilation_cache": "specjax.core.compilation_cache",
    "probs_from_logits": "specjax.sampling.probs_from_logits",
    "sample": "specjax.sampling.sample",
    "coupled_verify": "specjax.verification.coupled_verify",
    "greedy_verify": "specjax.verification.greedy_verify",
    "rejection_sample": "specjax.verification.rejection_sample",
    "rejection_sample_onehot": "specjax.verification.rejection_sample_onehot",
}


def _resolve(path: str):
    """The object at a dotted path: a module's attribute, or a submodule."""
    parent, _, leaf = path.rpartition(".")
    module = importlib.import_module(parent)
    return getattr(module, leaf) if hasattr(module, leaf) else importlib.import_module(path)


def test_all_is_the_curated_list():
    assert specjax.__all__ == PUBLIC
    assert isinstance(specjax.__version__, str) and specjax.__version__


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_resolves_and_is_documented(name):
    obj = getattr(specjax, name)
    assert (inspect.getdoc(obj) or "").strip(), f"specjax.{name} has no docstring"


def test_star_import_gives_exactly_the_public_names():
    namespace = {}
    exec("from specjax import *", namespace)  # noqa: S102
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(PUBLIC)


@pytest.mark.parametrize("name", SUBMODULES)
def test_submodules_are_attributes(name):
    module = getattr(specjax, name)
    assert isinstance(module, types.ModuleType)
    assert module.__name__ == f"specjax.{name}"


@pytest.mark.parametrize("name", list(MOVED))
def test_moved_names_live_in_their_submodule(name):
    assert not hasattr(specjax, name), f"specjax.{name} should not be at the top level"
    assert name not in specjax.__all__
    assert (inspect.getdoc(_resolve(MOVED[name])) or "").strip()


def test_enable_compilation_cache_is_the_cache_module_switch():
    from specjax.core import compilation_cache

    assert specjax.enable_compilation_cache is compilation_cache.enable


def test_sampling_config_holds_only_user_settings():
    """The loop's per-row history (penalty counts, constraint states) is not a setting:
    it lives in `RowSampling`, which the decoders build for drafters and verification."""
    from specjax.sampling import RowSampling

    fields = {f.name for f in dataclasses.fields(specjax.SamplingConfig)}
    assert fields == {
        "temperature", "top_k", "top_p", "min_p", "vocab_limit", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "logit_bias", "forbidden_ids",
    }  # fmt: skip
    assert {f.name for f in dataclasses.fields(RowSampling)} == fields | {"histories"}
    with pytest.raises(TypeError):
        specjax.SamplingConfig(histories=())
    # A user's config lifts to one without history, settings kept.
    config = specjax.SamplingConfig(temperature=0.7, top_k=3)
    row = RowSampling.of(config)
    assert row.histories == ()
    assert row.temperature == np.float32(0.7) and row.top_k == 3


def test_the_default_sampling_is_greedy_and_plain_configs_still_work():
    """``SamplingConfig()`` is greedy, as the command line is, and `probs_from_logits`
    takes a user's config directly."""
    from specjax.sampling import probs_from_logits

    logits = jnp.asarray([[0.0, 2.0, 1.0], [3.0, 1.0, 3.0]])
    np.testing.assert_array_equal(
        probs_from_logits(logits, specjax.SamplingConfig()), [[0, 1, 0], [1, 0, 0]]
    )
    sampled = np.asarray(probs_from_logits(logits, specjax.SamplingConfig(temperature=1.0)))
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(sampled, softmax, rtol=1e-6)  # float32 rounding
