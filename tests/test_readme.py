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
def test_readme_python_block_runs(index):
    code = BLOCKS[index]
    compiled = compile(code, f"README.md[python block {index}]", "exec")
    if code.startswith("# not run"):
        return
    exec(compiled, {"__name__": f"readme_block_{index}"})
