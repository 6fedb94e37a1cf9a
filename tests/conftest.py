"""Keeps JAX strict and the suite deterministic."""

import os

# Tests run on CPU, single-threaded eigen would be slower; keep XLA's defaults
# but never let a stray accelerator or a preallocating backend change results.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite is dominated by compiling many small programs, not by running
# them; skipping LLVM's expensive passes cuts CPU compile time by about a third.
# This changes speed only: every comparison in the suite is between programs
# compiled with the same flags, or against torch at a stated tolerance.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")


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
    from specjax.fetch import FetchError, smollm2_gguf

    try:
        return smollm2_gguf()
    except FetchError as e:
        pytest.skip(f"SmolLM2-135M-Instruct GGUF unavailable: {e}")
