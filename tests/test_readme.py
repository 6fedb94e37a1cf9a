"""The README's Python examples run as written.

Blocks that need files a reader must supply (they mention ``path/to/``) are
only compiled, not run.
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
    if "path/to/" in code:
        return
    exec(compiled, {"__name__": f"readme_block_{index}"})
