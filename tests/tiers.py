"""The suite's three tiers, their per-test limits and the fast tier's budget (a plugin).

* ``pytest``: the fast tier, every module's contract (minutes; run it often).
* ``pytest -m slow``: the rest of what runs on the bundled pair and random models: the
  statistical tests at full size, the other cases of each parametrized contract, the
  notebooks at small size, the benchmark scripts' smoke runs.
* ``pytest -m aot``: the decoders compiled ahead of time for TPUs and a GPU from this
  host (`tests/test_aot.py`, minutes). CI runs the fast, slow and aot tiers.
* ``pytest -m real``: what loads a real checkpoint (SmolLM2-135M, the Qwen2.5-Coder
  pair; fetched once into ``$SPECJAX_CACHE``), and the notebooks at full size. Opt-in.
* ``pytest -m accelerator``: the forward-width guarantee on a GPU or TPU
  (`tests/test_accelerator.py`); skipped where jax sees only a CPU. Opt-in.

A test is in one tier: unmarked (fast), ``slow``, ``real``, ``aot`` or ``accelerator``.
The rules below are checked when the suite is collected, so a misplaced test is an
error before anything runs:

* a test that asks for a real checkpoint's fixture (`REAL_CHECKPOINT_FIXTURES`) is
  marked ``real``; a test is marked with at most one of ``real``, ``aot``, ``slow``;
* every test gets its tier's limit (`TIMEOUT_S`, pytest-timeout; setup included)
  unless it sets its own, so that a hang fails with its stack instead of running into
  CI's limit;
* a fast-tier test whose call runs over the ``fast_test_budget_s`` ini setting fails,
  saying so, where CI is set (``CI``) or with ``--enforce-fast-budget``: the fast tier's
  time is a budget, and a slow test added without a mark spends it. Elsewhere (a busy
  laptop) it passes and is listed at the end of the run. Fixtures shared by a module
  are not charged to the test that happens to build them (``--durations`` lists
  them).

`first_case_fast` keeps the first case of a parametrize list in the fast tier and
puts the other cases in the slow tier. Under ``--dist loadgroup`` a module is one
xdist group (its fixtures are built once, on one worker) unless its tests name groups
of their own, which is how a long module is spread over the cores.
"""

from __future__ import annotations

import os

import pytest

REAL_CHECKPOINT_FIXTURES = frozenset({"smollm2_path", "real_pair_paths"})
# Well above each tier's slowest test on a 2-core CPU: only a hang or a many-fold
# slowdown trips them.
TIMEOUT_S = {"fast": 300, "slow": 1200, "real": 2400, "aot": 1200, "accelerator": 1200}
DEFAULT_FAST_TEST_BUDGET_S = 10.0
# The marked tiers; a test with none of these marks is in the fast tier.
TIERS = ("real", "aot", "accelerator", "slow")


def pytest_addoption(parser):
    parser.addini(
        "fast_test_budget_s",
        "seconds one fast-tier test's call may take before it fails (tests/tiers.py)",
        default=str(DEFAULT_FAST_TEST_BUDGET_S),
    )
    parser.addoption(
        "--enforce-fast-budget",
        action="store_true",
        help="fail a fast-tier test over fast_test_budget_s (the default where CI is set); "
        "otherwise such a test passes and is reported at the end",
    )


def _budget_enforced(config) -> bool:
    """CI holds the fast tier to its budget; a user's run (a busy laptop) reports it."""
    return bool(config.getoption("--enforce-fast-budget") or os.environ.get("CI"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: the slow tier (`pytest -m slow`; CI runs it after the fast tier)",
    )
    config.addinivalue_line(
        "markers",
        "real: the real-checkpoint tier: SmolLM2-135M, the Qwen2.5-Coder pair, notebooks at "
        "full size (`pytest -m real`; opt-in)",
    )
    config.addinivalue_line(
        "markers",
        "aot: the ahead-of-time tier: decoders compiled for TPUs and a GPU (`pytest -m aot`)",
    )
    config.addinivalue_line(
        "markers",
        "accelerator: the accelerator tier: the forward-width guarantee on a GPU or TPU "
        "(`pytest -m accelerator`; opt-in, skipped on a CPU)",
    )
    config.addinivalue_line(
        "markers", "first_case_fast: only the first case of each parametrize list is fast"
    )


def tier(item: pytest.Item) -> str:
    """The tier of a collected test: ``"real"``, ``"aot"``, ``"accelerator"``, ``"slow"``
    or ``"fast"``."""
    for name in TIERS:
        if item.get_closest_marker(name):
            return name
    return "fast"


def _misplaced(item: pytest.Item) -> list[str]:
    real = item.get_closest_marker("real") is not None
    needs = REAL_CHECKPOINT_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    problems = []
    if needs and not real:
        problems.append(f"{item.nodeid} uses {sorted(needs)}: mark it `real`")
    marked = [name for name in TIERS if item.get_closest_marker(name)]
    if len(marked) > 1:
        problems.append(f"{item.nodeid} is marked {' and '.join(marked)}: one tier only")
    return problems


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the tier marks, and before xdist
def pytest_collection_modifyitems(config, items):
    problems = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            item.get_closest_marker("first_case_fast")
            and not item.get_closest_marker("real")
            and callspec is not None
            and any(index != 0 for index in callspec.indices.values())
        ):
            item.add_marker(pytest.mark.slow)
        problems += _misplaced(item)
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[tier(item)]))
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    if problems:
        raise pytest.UsageError("tests in no tier or in two:\n  " + "\n  ".join(problems))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.passed or tier(item) != "fast":
        return
    budget = float(item.config.getini("fast_test_budget_s"))
    if report.duration > budget:
        message = (
            f"{item.nodeid} took {report.duration:.1f} s, over the fast tier's {budget:g} s "
            "for one test (fast_test_budget_s, tests/tiers.py): make it faster, or mark it "
            "`slow` (`real` if it loads a real checkpoint)"
        )
        if _budget_enforced(item.config):
            report.outcome = "failed"
            report.longrepr = message
        else:
            item.config.stash.setdefault(_OVER_BUDGET, []).append(message)


# Kept on the run's config, not in this module: a run of pytest inside a test (pytester)
# shares this module, and its slow tests are not the outer run's.
_OVER_BUDGET = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter):
    over = terminalreporter.config.stash.get(_OVER_BUDGET, [])
    if over:
        terminalreporter.section("fast tests over their budget (enforced where CI is set)")
        for line in over:
            terminalreporter.write_line(line)
