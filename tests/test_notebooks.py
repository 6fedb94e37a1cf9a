"""The notebooks in colab/: what they ask for, how they install, what they store and assert.

Fast, static checks (no kernel), each shown to fail on a mutated copy:

* each notebook asks Colab for a TPU runtime (``accelerator`` and ``colab.gpuType``
  in its metadata) and its first cell says which runtime to pick;
* no cell installs anything from a URL or a VCS (``pip install git+https://...``):
  specjax is installed only from a wheel or a clone that the reader uploads, and the
  install cell does nothing when specjax is already importable;
* every code cell stores the outputs of one top-to-bottom run (execution counts
  1, 2, 3, ...), none of them an error, without per-cell timing metadata, local paths
  or large outputs;
* the exactness notebook asserts its p-values against its false-alarm rate
  (``p >= FALSE_ALARM`` for each check, ``p < FALSE_ALARM`` for the negative control)
  and the power of its checks, not only its control.

Slow: each notebook runs top to bottom in a fresh Jupyter kernel (nbclient) with
``SPECJAX_NOTEBOOK_SMALL=1`` on CPU, against this checkout's specjax; a cell that
raises (a failed assertion included) fails the test. Real tier (``pytest -m real``):
each runs again at full size, as a reader runs it.

The stored outputs come from a full-size CPU run: ``python tests/test_notebooks.py``
executes every notebook again and writes it back with its outputs.
"""

from __future__ import annotations

import ast
import copy
import os
import re
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
COLAB = REPO / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
CELL_TIMEOUT_S = 300
# Colab's ``colab.gpuType`` values for TPU runtimes: v5e-1, and the older v2-8.
TPU_TYPES = {"V5E1", "V28"}
MAX_OUTPUT_BYTES = 150_000  # one output: a plot or a few lines of text, never an array dump
MAX_NOTEBOOK_BYTES = 400_000
# A pip install line, as an IPython magic or a shell escape: `%pip install ...`, `!pip ...`,
# `!python -m pip install ...`.
PIP_INSTALL = re.compile(r"^\s*[%!]\s*(?:python3?\s+-m\s+)?pip3?\s+install\b(?P<args>.*)$")


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code_cells(nb) -> list:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _python(source: str) -> ast.Module:
    """A code cell's source as Python, IPython magics turned into calls."""
    from IPython.core.inputtransformer2 import TransformerManager

    return ast.parse(TransformerManager().transform_cell(source))


# --- the checks: each returns what is wrong with a notebook ([] when nothing is) ---


def _tpu_problems(nb) -> list[str]:
    problems = []
    if nb.metadata.get("accelerator") != "TPU":
        problems.append(f"metadata.accelerator is {nb.metadata.get('accelerator')!r}, not 'TPU'")
    gpu_type = nb.metadata.get("colab", {}).get("gpuType")
    if gpu_type not in TPU_TYPES:
        problems.append(f"metadata.colab.gpuType is {gpu_type!r}, not one of {sorted(TPU_TYPES)}")
    first = nb.cells[0].source if nb.cells and nb.cells[0].cell_type == "markdown" else ""
    if "Change runtime type → TPU" not in first or "CPU" not in first:
        problems.append("the first cell does not say to pick a TPU runtime and that CPU works")
    return problems


def _install_problems(nb) -> list[str]:
    problems = []
    guarded = False
    for i, cell in enumerate(nb.cells):
        if "specjax-dev" in cell.source:
            problems.append(f"cell {i} names the placeholder organisation specjax-dev")
        if cell.cell_type != "code":
            continue
        lines = cell.source.splitlines()
        installs = [m["args"] for line in lines if (m := PIP_INSTALL.match(line))]
        for args in installs:
            if "://" in args or "git+" in args or " @ " in args:
                problems.append(f"cell {i} installs from a URL: pip install{args}")
        if installs:
            if 'find_spec("specjax")' not in cell.source:
                problems.append(f"cell {i} installs without checking that specjax is importable")
            guarded = True
    if not guarded:
        problems.append("no install cell")
    return problems


def _output_problems(nb) -> list[str]:
    problems = []
    for n, cell in enumerate(_code_cells(nb), start=1):
        where = f"code cell {n}"
        if cell.execution_count != n:
            problems.append(f"{where}: execution count {cell.execution_count}, not {n}")
        if not cell.outputs:
            problems.append(f"{where}: no stored output")
        if "execution" in cell.metadata:
            problems.append(f"{where}: per-cell timing metadata is stored")
        for out in cell.outputs:
            text = nbformat.writes(nbformat.from_dict({"o": out}))
            if out.output_type == "error":
                problems.append(f"{where}: stored error {out.ename}: {out.evalue}")
            if len(text) > MAX_OUTPUT_BYTES:
                problems.append(f"{where}: an output of {len(text):,} bytes")
            if re.search(r"/(?:work|tmp|root|home)/", text):
                problems.append(f"{where}: an output shows a local path")
    return problems


def _pvalue_assert_problems(nb) -> list[str]:
    """The exactness notebook asserts ``p >= FALSE_ALARM`` (null checks), ``p <
    FALSE_ALARM`` (negative control) and ``power >= MIN_POWER``, and computes p-values
    and power with specjax.testing."""
    code = "\n".join(cell.source for cell in _code_cells(nb))
    asserts = set()
    for cell in _code_cells(nb):
        for node in ast.walk(_python(cell.source)):
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                test = node.test
                for op, right in zip(test.ops, test.comparators, strict=True):
                    asserts.add((ast.unparse(test.left), type(op).__name__, ast.unparse(right)))
    problems = []
    wanted = {
        "each check asserts p >= FALSE_ALARM": ("p", "GtE", "FALSE_ALARM"),
        "the negative control asserts p < FALSE_ALARM": ("p", "Lt", "FALSE_ALARM"),
        "the power is asserted": ("power", "GtE", "MIN_POWER"),
    }
    for claim, compare in wanted.items():
        if compare not in asserts:
            problems.append(f"missing assertion: {claim}")
    for helper in ("chi_square_pvalue(", "chi_square_power(", "FALSE_ALARM = ", "MIN_POWER = "):
        if helper not in code:
            problems.append(f"the notebook does not use {helper}")
    return problems


# --- fast tier ---


def test_notebooks_found():
    assert {p.name for p in NOTEBOOKS} >= {
        "quickstart.ipynb",
        "exactness.ipynb",
        "bring_your_own_model.ipynb",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid_and_small(path):
    nbformat.validate(_read(path))
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_asks_for_a_tpu_runtime(path):
    assert _tpu_problems(_read(path)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_installs_nothing_from_a_url(path):
    assert _install_problems(_read(path)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_stores_the_outputs_of_one_run(path):
    assert _output_problems(_read(path)) == [], "refresh them: python tests/test_notebooks.py"


def test_exactness_notebook_asserts_its_pvalues():
    assert _pvalue_assert_problems(_read(COLAB / "exactness.ipynb")) == []


def _install_cell(nb):
    return next(c for c in _code_cells(nb) if "%pip install" in c.source)


def _mutations():
    """(check, notebook, mutation) triples: each mutation must make its check complain."""

    def drop_accelerator(nb):
        del nb.metadata["accelerator"]

    def gpu_runtime(nb):
        nb.metadata.colab["gpuType"] = "T4"

    def no_runtime_advice(nb):
        nb.cells[0].source = nb.cells[0].source.replace("Change runtime type → TPU", "")

    def git_install(nb):
        cell = _install_cell(nb)
        cell.source = cell.source.replace(
            "%pip install -q {wheel}", "%pip install -q git+https://github.com/specjax-dev/specjax"
        )

    def url_install(nb):
        cell = _install_cell(nb)
        cell.source += "\n!pip install https://example.com/specjax-0.1.0-py3-none-any.whl"

    def unguarded_install(nb):
        cell = _install_cell(nb)
        cell.source = cell.source.replace('find_spec("specjax") is not None', "False")

    def cleared_output(nb):
        _code_cells(nb)[-1].outputs = []

    def error_output(nb):
        _code_cells(nb)[-1].outputs.append(
            nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])
        )

    def not_executed(nb):
        _code_cells(nb)[1].execution_count = None

    def timing_metadata(nb):
        _code_cells(nb)[0].metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}

    def huge_output(nb):
        _code_cells(nb)[0].outputs.append(nbformat.v4.new_output("stream", text="0 " * 90_000))

    def local_path(nb):
        _code_cells(nb)[0].outputs.append(
            nbformat.v4.new_output("stream", text="/work/main/specjax/__init__.py\n")
        )

    def print_instead_of_assert(nb):
        for cell in _code_cells(nb):
            cell.source = cell.source.replace("assert p >= FALSE_ALARM", "print(p >= FALSE_ALARM)")

    def control_only(nb):
        for cell in _code_cells(nb):
            cell.source = cell.source.replace("assert power >= MIN_POWER", "pass  # power")

    return [
        (_tpu_problems, "quickstart", drop_accelerator),
        (_tpu_problems, "exactness", gpu_runtime),
        (_tpu_problems, "bring_your_own_model", no_runtime_advice),
        (_install_problems, "quickstart", git_install),
        (_install_problems, "exactness", url_install),
        (_install_problems, "bring_your_own_model", unguarded_install),
        (_output_problems, "quickstart", cleared_output),
        (_output_problems, "exactness", error_output),
        (_output_problems, "bring_your_own_model", not_executed),
        (_output_problems, "quickstart", timing_metadata),
        (_output_problems, "exactness", huge_output),
        (_output_problems, "bring_your_own_model", local_path),
        (_pvalue_assert_problems, "exactness", print_instead_of_assert),
        (_pvalue_assert_problems, "exactness", control_only),
    ]


@pytest.mark.parametrize(
    "check, name, mutate", _mutations(), ids=lambda x: getattr(x, "__name__", x)
)
def test_each_check_fails_on_a_mutated_notebook(check, name, mutate):
    nb = _read(COLAB / f"{name}.ipynb")
    assert check(nb) == []
    broken = copy.deepcopy(nb)
    mutate(broken)
    assert broken != nb, "the mutation changed nothing"
    assert check(broken) != []


# --- slow tier: run each notebook ---


def _bundled_pair_available() -> bool:
    try:
        from specjax.io.pretrained import default_pair_path
    except ImportError:
        return False
    root = default_pair_path()
    return all((root / name / "config.json").is_file() for name in ("target", "draft"))


def _kernel_env(small: bool) -> dict[str, str]:
    env = dict(os.environ)
    # This checkout's specjax, whatever is installed: the install cell then does nothing.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(JAX_PLATFORMS="cpu", PYDEVD_DISABLE_FILE_VALIDATION="1")
    if small:
        env.update(
            SPECJAX_NOTEBOOK_SMALL="1",
            # Tiny shapes: XLA's CPU optimisation passes only cost compile time here.
            XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
        )
    else:
        env.pop("SPECJAX_NOTEBOOK_SMALL", None)
        env.pop("XLA_FLAGS", None)
    if not _bundled_pair_available():
        # quickstart.ipynb then uses random tiny models with the same API.
        env["SPECJAX_NOTEBOOK_MODELS"] = "tiny"
    return env


def _execute(nb, workdir: Path, small: bool):
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute(env=_kernel_env(small))
    return nb


def _runs(path: Path, workdir: Path, small: bool) -> None:
    try:
        _execute(_read(path), workdir, small=small)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell failed:\n{e}", pytrace=False)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    _runs(path, tmp_path, small=True)


@pytest.mark.real
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_full_size(path, tmp_path):
    """As a reader runs it: full sizes, jax's default flags (what the stored outputs show)."""
    _runs(path, tmp_path, small=False)


def store_outputs(paths) -> None:
    """Executes each notebook at full size on CPU and writes it back with its outputs."""
    for path in paths:
        nb = _read(path)
        metadata = copy.deepcopy(nb.metadata)
        with tempfile.TemporaryDirectory() as workdir:
            _execute(nb, Path(workdir), small=False)
        nb.metadata = metadata  # the kernel's language_info and the like are noise
        nbformat.write(nb, path)
        problems = _output_problems(nb)
        print(f"{path.name}: {path.stat().st_size:,} bytes", *problems, sep="\n  ")


if __name__ == "__main__":
    store_outputs([Path(p) for p in sys.argv[1:]] or NOTEBOOKS)
