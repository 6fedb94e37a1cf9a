"""The decoder's modules stay small: no function in ``specjax/decoding`` has more than
60 lines of logic, and the input checks and the sampling math each fit in 400 lines.

Lines of logic are a function body's non-blank, non-comment lines, its docstring
aside (nested functions count within their parent too).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = {"specjax/decoding/checks.py": 400, "specjax/sampling/distributions.py": 400}


def logic_lines(source: str) -> dict[str, int]:
    """``{function name: lines of logic}`` of every function in ``source``."""
    lines = source.split("\n")
    out = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant
        ):
            body = body[1:]
        counted = {
            n
            for stmt in body
            for n in range(stmt.lineno, stmt.end_lineno + 1)
            if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")
        }
        out[f"{node.name}:{node.lineno}"] = len(counted)
    return out


def test_no_decoding_function_has_more_than_60_lines_of_logic():
    long = {
        f"{path.relative_to(ROOT)}:{name}": n
        for path in sorted((ROOT / "specjax" / "decoding").rglob("*.py"))
        for name, n in logic_lines(path.read_text()).items()
        if n > MAX_FUNCTION_LINES
    }
    assert not long, f"split these functions (lines of logic): {long}"


@pytest.mark.parametrize("path", sorted(MAX_MODULE_LINES))
def test_the_checks_and_the_sampling_math_fit_in_400_lines(path):
    n = len((ROOT / path).read_text().splitlines())
    assert n < MAX_MODULE_LINES[path], f"{path} has {n} lines"


# Packages (and modules) whose every module fits in 500 lines.
MODULES_UNDER_500 = (
    "specjax/models",
    "specjax/io",
    "specjax/chips",
    "specjax/training",
    "specjax/drafters",
    "specjax/sampling",
    "specjax/cli/train.py",
)


def test_models_io_chips_training_drafters_and_sampling_modules_fit_in_500_lines():
    paths = [
        path
        for root in MODULES_UNDER_500
        for path in ([ROOT / root] if root.endswith(".py") else (ROOT / root).rglob("*.py"))
    ]
    assert len(paths) > 50
    long = {
        str(path.relative_to(ROOT)): n
        for path in paths
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, f"split these modules (lines): {long}"


def test_control_a_long_function_is_counted():
    body = "\n".join(f"    x{i} = {i}  # step {i}" for i in range(61))
    source = f'def f():\n    """Doc."""\n\n    # a comment\n{body}\n'
    assert logic_lines(source) == {"f:1": 61}
