"""The package's layers: each imports only from those below it (import-linter).

models → sampling → verification → drafters → decoding, with io, training and the
command line above them, and ``specjax.core`` (validation, jit and timing helpers)
beneath everything. The contract is ``.importlinter`` at the repository root; any
import against it, at module level or inside a function, fails this test.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package under ``root``, with the repository's contract."""
    lint = shutil.which("lint-imports")
    if lint is None:
        pytest.fail("lint-imports is missing: pip install -e '.[test]' installs import-linter")
    return subprocess.run(
        [lint, "--config", str(ROOT / ".importlinter"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)},
    )


def test_each_layer_imports_only_the_layers_below_it():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken" in done.stdout, done.stdout[-2000:]


def test_control_an_upward_import_inside_a_function_breaks_the_contract(tmp_path):
    """A copy of the package whose models layer imports the decoder inside a function."""
    shutil.copytree(ROOT / "specjax", tmp_path / "specjax", ignore=shutil.ignore_patterns("assets"))
    upward = "def _late():\n    from specjax.decoding import generate\n\n    return generate\n"
    (tmp_path / "specjax" / "models" / "_upward.py").write_text(upward)
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "specjax.models._upward -> specjax.decoding" in done.stdout, done.stdout[-2000:]
