"""The README stays a front door, and CI runs the test command it gives.

Its Python examples run with the docs' (tests/test_docs.py).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_is_short():
    """At most 300 lines: the guides live in docs/."""
    lines = README.read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail into docs/"


def test_ci_runs_the_quickstart_test_command():
    """.ci/run's last line is the Quickstart's second command, so CI runs what users run."""
    quickstart = re.search(r"## Quickstart.*?```bash\n(.*?)```", README.read_text(), flags=re.S)
    commands = quickstart.group(1).strip().splitlines()
    assert len(commands) == 2, commands
    ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == commands[1]
    assert "pytest -m slow" in commands[1] and commands[1].index("pytest &&") < commands[1].index(
        "-m slow"
    )


@pytest.mark.slow
def test_each_python_block_runs_on_its_own():
    """Pasted alone into a fresh interpreter, every Python block of the README runs: none
    leans on a name an earlier block defined (the docs' test runs them in sequence)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-c", block],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
        )
        assert done.returncode == 0, f"{block[:200]}\n{done.stderr[-2000:]}"
