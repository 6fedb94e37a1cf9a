"""The README's Python examples run as written.

Blocks that start with ``# not run`` (they need checkpoints, devices or minutes
a reader must supply) are only compiled.
"""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
# Slow tier: every README example end to end: 91 s in all.
@pytest.mark.slow
def test_readme_python_block_runs(index):
    code = BLOCKS[index]
    compiled = compile(code, f"README.md[python block {index}]", "exec")
    if code.startswith("# not run"):
        return
    exec(compiled, {"__name__": f"readme_block_{index}"})


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
