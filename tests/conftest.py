"""Keeps JAX strict and the suite deterministic."""

import os
import shutil
import tempfile

# Tests run on CPU, single-threaded eigen would be slower; keep XLA's defaults
# but never let a stray accelerator or a preallocating backend change results.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Where XLA's optimisation stays off, and why: the suite is dominated by compiling
# many small programs, not by running them. Skipping LLVM's backend optimisation and
# expensive passes cuts CPU compile time by about a third, and XLA:CPU's older
# elemental emitters compile a decode loop about a fifth faster than its fusion
# emitters. It changes speed only: every test in this process compares programs
# compiled with the same flags, or a program against torch at a stated tolerance.
# The one claim that depends on the flags, speculative == plain token for token at one
# forward width, is tested at the flags users run (jax's defaults) in a process of its
# own: tests/test_numerics.py hands it the caller's XLA_FLAGS, kept here.
os.environ.setdefault("SPECJAX_TEST_CALLER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = (
    os.environ["SPECJAX_TEST_CALLER_XLA_FLAGS"]
    + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    + " --xla_cpu_use_fusion_emitters=false"
).strip()

# One persistent compilation cache for the whole run, shared by the xdist workers (they
# inherit this variable from the controller, which sets it first): a program compiled
# by one test module or worker is loaded from disk by the others, including after
# the module-end jax.clear_caches() below. A fresh folder each run, so that the
# suite's time never depends on an earlier run; SPECJAX_COMPILATION_CACHE set by the
# caller is kept (set it to a fixed folder to reuse programs across runs). Sharing one
# folder per checkout between the two tiers was tried (2026-12-04): the slow tier
# took 31 min 52 s after the fast one, against 24 min 19 s with its own folder.
_RUN_CACHE = None
if "SPECJAX_COMPILATION_CACHE" not in os.environ:
    _RUN_CACHE = tempfile.mkdtemp(prefix="specjax-test-xla-")
    os.environ["SPECJAX_COMPILATION_CACHE"] = _RUN_CACHE

# gamma="auto" keeps the step costs it measures (specjax.tuning) in a
# folder that is fresh each run, as on a new machine, and shared by the workers the
# same way: each target, drafter and batch size is measured once per run.
if "SPECJAX_TUNING_CACHE" not in os.environ:
    os.environ["SPECJAX_TUNING_CACHE"] = tempfile.mkdtemp(prefix="specjax-test-tuning-")

# The suite never reaches the Hugging Face Hub (tests/test_hub.py serves one of its own
# to a subprocess): a Hub id is looked up in the Hub's cache only, and fails at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# GGUF loads convert every time in tests unless a test turns the converted-weights
# cache on (tests/test_gguf.py, "converted-weights cache"): several tests load one
# file twice with the conversion patched, which a cache hit would silently skip.
os.environ.setdefault("SPECJAX_WEIGHT_CACHE", "off")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from specjax.core import compilation_cache  # noqa: E402

# The tiers (fast, slow, real), their per-test limits and the fast tier's budget.
pytest_plugins = ["tiers"]

# An implicit broadcast between arrays of different ranks (a [B] against a [B, V]) is
# a bug in this library, never an intent: make it an error. (The matmul precision is
# left at jax's default, as users run it: no test may rely on a higher one.)
jax.config.update("jax_numpy_rank_promotion", "raise")
# The run's shared cache above (`import specjax` turns nothing on by itself).
compilation_cache.enable_from_environment()


class _LongestGroupsFirst:
    """A plugin, because conftest.py can hold only one function per hook name."""

    @pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
    def pytest_collection_modifyitems(self, items):
        _sort_longest_modules_first(items)


def pytest_configure(config):
    config.pluginmanager.register(_LongestGroupsFirst(), "specjax-longest-groups-first")


def _sort_longest_modules_first(items):
    # Longest groups first: xdist's --dist loadgroup hands out whole groups (a module,
    # or a part of one that names its group, tests/tiers.py) in this order, and a long
    # group started last keeps one core busy while the other idles. Measured times,
    # not a contract: a group missing here just runs after these, in file order. The
    # sort is stable, so tests keep their order within a group.
    rank = {name: i for i, name in enumerate(_LONGEST_GROUPS_FIRST)}

    def group(item):
        marker = item.get_closest_marker("xdist_group")
        return marker.args[0] if marker else item.path.stem

    items.sort(key=lambda item: rank.get(group(item), len(rank)))


# Seconds per group on a 2-core CPU, most first (2026-12-06), the two tiers merged:
# slow tier numerics-int8, continuous_batching (about 500 s), the other numerics
# precisions, constraints, exact_per_row, cli (about 250 s each), ...; fast tier
# numerics (80 s), docs (40 s), features, verify; the rest below 25 s a tier.
_LONGEST_GROUPS_FIRST = tuple(
    """
    test_numerics-int8 test_continuous_batching test_numerics-float32
    test_numerics-int8-weights test_numerics-bfloat16 test_numerics test_constraints
    test_exact_per_row test_cli test_bench_smoke test_docs test_hf_interop
    test_notebooks test_penalties test_reproducible test_features test_decode
    test_verify test_tree test_compilation_cache test_eagle test_block_drafter
    test_sharding test_decoder_exactness test_bad_input test_models test_gguf
    test_per_row test_train test_sampling test_vocab
    """.split()
)


def pytest_sessionfinish(session):
    # The controller (or a run without xdist) made the folder; workers leave it alone.
    if _RUN_CACHE is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_RUN_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _deterministic_numpy():
    # Any test that forgets to seed its own generator still sees the same numbers.
    np.random.seed(0)  # noqa: NPY002 (seeding the legacy global generator is the point)
    yield


# Implicit dtype promotion (an int32 plus a bool, a Python float into an int32 array) is
# an error in every module whose code allows it: a silent widening or narrowing in the
# decoder is a bug. Not yet in these: optax's optimisers promote their int32 step count
# (training: test_train, and the modules that train drafters or test training's
# errors), RMSNorm multiplies bfloat16 weights into float32 activations (test_models),
# and test_quant's round-trip checks mix int8 codes with float32 scales.
_STANDARD_PROMOTION = frozenset(
    "test_train test_block_drafter test_eagle test_bad_input test_models test_quant".split()
)


@pytest.fixture(autouse=True, scope="module")
def _strict_dtype_promotion(request):
    if request.module.__name__ in _STANDARD_PROMOTION:
        yield
        return
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    # Each test module compiles hundreds of small XLA programs; kept for the whole
    # session they pile up (about 10 GB and tens of thousands of memory maps), and a
    # full run crashed inside XLA's CPU compiler near the end. Modules share little
    # compiled code, so releasing it between modules costs only a few recompiles.
    yield
    jax.clear_caches()


def _fetch_or_skip(name: str):
    from specjax.io.fetch import FetchError, fetch

    try:
        return fetch(name)
    except FetchError as e:
        pytest.skip(f"{name} unavailable ({e}); `specjax fetch {name}` fetches it by hand")


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF (98 MB), fetched once into the
    cache. Real tier only (`pytest -m real`)."""
    return _fetch_or_skip("smollm2-135m")


@pytest.fixture(scope="session")
def real_pair_paths():
    """The Qwen2.5-Coder 1.5B target and 0.5B draft GGUF files (about 1.6 GB), fetched
    once into the cache. Real tier only (`pytest -m real`)."""
    return _fetch_or_skip("qwen2.5-coder-1.5b"), _fetch_or_skip("qwen2.5-coder-0.5b")
