"""The README stays a front door, and CI runs the test command it gives.

Its Python examples run with the docs' (tests/test_docs.py).
"""

import re
from pathlib import Path

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
