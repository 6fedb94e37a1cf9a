"""Every notebook in colab/ runs top to bottom on CPU, in its small-size mode.

Each notebook runs in a fresh Jupyter kernel (nbclient) with
``SPECJAX_NOTEBOOK_SMALL=1``. A cell that raises fails the test. The
notebooks are also checked to be stored without outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbclient
import nbformat
import pytest

COLAB = Path(__file__).resolve().parent.parent / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def _bundled_pair_available() -> bool:
    try:
        from specjax.io.pretrained import default_pair_path
    except ImportError:
        return False
    root = default_pair_path()
    return all((root / name / "config.json").is_file() for name in ("target", "draft"))


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPECJAX_NOTEBOOK_SMALL="1",
        JAX_PLATFORMS="cpu",
        # Tiny shapes: XLA's CPU optimisation passes only cost compile time here.
        XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    if not _bundled_pair_available():
        # quickstart.ipynb then uses random tiny models with the same API.
        env["SPECJAX_NOTEBOOK_MODELS"] = "tiny"
    return env


def test_notebooks_found():
    assert {p.name for p in NOTEBOOKS} >= {
        "quickstart.ipynb",
        "exactness.ipynb",
        "bring_your_own_model.ipynb",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name}: clear the outputs before committing"
            )
    assert path.stat().st_size < 40_000


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute(env=_kernel_env())
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell failed:\n{e}", pytrace=False)
