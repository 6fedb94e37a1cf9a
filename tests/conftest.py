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

# GGUF loads convert every time in tests unless a test turns the converted-weights
# cache on (tests/test_gguf.py, "converted-weights cache"): several tests load one
# file twice with the conversion patched, which a cache hit would silently skip.
os.environ.setdefault("SPECJAX_WEIGHT_CACHE", "off")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from specjax.core import compilation_cache  # noqa: E402

# jax's default matmul precision, as users run: no test may rely on a higher one.
jax.config.update("jax_numpy_rank_promotion", "raise")
# The run's shared cache above (`import specjax` turns nothing on by itself).
compilation_cache.enable_from_environment()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the slow mark
def pytest_collection_modifyitems(config, items):
    # `first_case_fast`: the first case of each parametrize list stays in the fast tier
    # (it checks the contract); the other cases are slow-marked (they widen it).
    for item in items:
        callspec = getattr(item, "callspec", None)
        if item.get_closest_marker("first_case_fast") and callspec is not None:
            if any(index != 0 for index in callspec.indices.values()):
                item.add_marker(pytest.mark.slow)


class _LongestModulesFirst:
    """A plugin, because conftest.py can hold only one function per hook name."""

    @pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
    def pytest_collection_modifyitems(self, items):
        _sort_longest_modules_first(items)


def pytest_configure(config):
    config.pluginmanager.register(_LongestModulesFirst(), "specjax-longest-modules-first")


def _sort_longest_modules_first(items):
    # Longest modules first: xdist's --dist loadfile hands out whole modules in this
    # order, and a long module started last keeps one core busy while the other idles
    # (alphabetically, test_verify was among the last). Measured fast-tier times, not
    # a contract: a module missing here just runs after these, in file order. The sort
    # is stable, so tests keep their order within a module.
    rank = {name: i for i, name in enumerate(_LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


# Fast-tier seconds per module on a 2-core CPU, most first (2026-12-03): decode 69,
# verify 64, block_drafter 42, cli 39, bad_input 39, models 37, tree 35, gguf 31,
# per_row 31, train 31, sampling 27, eagle 27; the rest below 25.
_LONGEST_MODULES_FIRST = (
    "test_numerics", "test_decode", "test_verify", "test_block_drafter", "test_cli",
    "test_bad_input", "test_models", "test_tree", "test_gguf", "test_per_row", "test_train",
    "test_sampling", "test_eagle", "test_compilation_cache", "test_vocab", "test_reproducible",
    "test_hf_interop",
)  # fmt: skip


def pytest_sessionfinish(session):
    # The controller (or a run without xdist) made the folder; workers leave it alone.
    if _RUN_CACHE is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_RUN_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _deterministic_numpy():
    # Any test that forgets to seed its own generator still sees the same numbers.
    np.random.seed(0)  # noqa: NPY002 (seeding the legacy global generator is the point)
    yield


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    # Each test module compiles hundreds of small XLA programs; kept for the whole
    # session they pile up (about 10 GB and tens of thousands of memory maps), and a
    # full run crashed inside XLA's CPU compiler near the end. Modules share little
    # compiled code, so releasing it between modules costs only a few recompiles.
    yield
    jax.clear_caches()


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF, fetched once into the cache."""
    from specjax.io.fetch import FetchError, smollm2_gguf

    try:
        return smollm2_gguf()
    except FetchError as e:
        pytest.skip(f"SmolLM2-135M-Instruct GGUF unavailable: {e}")
