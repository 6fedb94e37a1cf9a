"""The tiers' rules (tests/tiers.py), run on small suites written here.

Each rule is shown to hold on this suite's configuration and to fail a suite that
breaks it: a fast test over its budget fails (a slow-marked one of the same length
does not) where CI is set or with ``--enforce-fast-budget``, and is only reported
otherwise, where a hang still fails at the tier's time limit; a test that asks for a
real checkpoint without the `real` mark or with both marks is a collection error, and
every test carries its tier's time limit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tiers

pytest_plugins = ["pytester"]

TIERS_PLUGIN = Path(__file__).with_name("tiers.py")


@pytest.fixture
def suite(pytester, monkeypatch):
    """A pytester folder that loads tests/tiers.py as this suite does, budget 0.2 s.

    Only the plugins the rules need are loaded (loading every installed one costs
    seconds a run)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    shutil.copy(TIERS_PLUGIN, pytester.path / "tiers.py")
    pytester.makeconftest(
        'pytest_plugins = ["tiers"]\n'
        "import pytest\n"
        "@pytest.fixture\n"
        "def smollm2_path():\n"
        "    return 'SmolLM2.gguf'\n"
    )
    pytester.makeini("[pytest]\naddopts = -p pytest_timeout\nfast_test_budget_s = 0.2\n")
    return pytester


def test_this_suite_budgets_ten_seconds_a_fast_test(pytestconfig):
    assert float(pytestconfig.getini("fast_test_budget_s")) == 10.0


def test_a_fast_test_over_its_budget_fails_and_a_marked_one_does_not(suite, monkeypatch):
    suite.makepyfile(
        "import time, pytest\n"
        "def test_unmarked():\n"
        "    time.sleep(0.5)\n"
        "@pytest.mark.slow\n"
        "def test_marked():\n"
        "    time.sleep(0.5)\n"
        "def test_quick():\n"
        "    pass\n"
    )
    result = suite.runpytest("--enforce-fast-budget")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked took 0.5 s, over the fast tier's 0.2 s*"])
    # Without CI or the option (a user's busy machine): it passes and is reported.
    monkeypatch.delenv("CI", raising=False)
    relaxed = suite.runpytest()
    relaxed.assert_outcomes(passed=3)
    relaxed.stdout.fnmatch_lines(["*fast tests over their budget*", "*test_unmarked took*"])


def test_where_ci_is_set_the_budget_fails_a_test_without_the_option(suite, monkeypatch):
    suite.makepyfile("import time\ndef test_unmarked():\n    time.sleep(0.5)\n")
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked took 0.5 s, over the fast tier's 0.2 s*"])


def test_a_hung_test_times_out_where_the_budget_only_reports(suite, monkeypatch):
    """A user's run (no CI, no option) still stops a hang at the tier's limit, here cut to
    1 s, and shows where it hung. A subprocess: the limit's alarm would replace the one
    pytest-timeout set for this test."""
    monkeypatch.delenv("CI", raising=False)
    conftest = suite.path / "conftest.py"
    conftest.write_text(
        conftest.read_text() + "\ndef pytest_configure(config):\n"
        "    import tiers\n"
        "    tiers.TIMEOUT_S['fast'] = 1\n"
    )
    suite.makepyfile("import time\ndef test_hangs():\n    time.sleep(60)\n")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*time.sleep(60)", "*Timeout (>1.0s) from pytest-timeout*"])


def test_a_failing_fast_test_keeps_its_own_failure(suite):
    suite.makepyfile("import time\ndef test_slow_and_wrong():\n    time.sleep(0.5)\n    assert 0\n")
    result = suite.runpytest("--enforce-fast-budget")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 0*"])


@pytest.mark.parametrize(
    ("marks", "message"),
    [
        ("", "*test_needs_it uses ?'smollm2_path'?: mark it `real`*"),
        ("@pytest.mark.slow\n", "*test_needs_it uses ?'smollm2_path'?: mark it `real`*"),
        ("@pytest.mark.real\n@pytest.mark.slow\n", "*marked real and slow: one tier only*"),
    ],
    ids=["unmarked", "slow", "real-and-slow"],
)
def test_a_test_in_no_tier_or_two_is_a_collection_error(suite, marks, message):
    suite.makepyfile(f"import pytest\n{marks}def test_needs_it(smollm2_path):\n    pass\n")
    result = suite.runpytest("-m", "")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_each_tier_gets_its_limit_and_a_module_is_one_group(suite):
    suite.makepyfile(
        test_limits="import pytest\n"
        "@pytest.fixture\n"
        "def limits(request):\n"
        "    return request.node.get_closest_marker('timeout').args[0]\n"
        "def test_fast(limits):\n"
        f"    assert limits == {tiers.TIMEOUT_S['fast']}\n"
        "@pytest.mark.slow\n"
        "def test_slow(limits):\n"
        f"    assert limits == {tiers.TIMEOUT_S['slow']}\n"
        "@pytest.mark.real\n"
        "def test_real(limits, smollm2_path):\n"
        f"    assert limits == {tiers.TIMEOUT_S['real']}\n"
        "@pytest.mark.timeout(7)\n"
        "def test_own(limits, request):\n"
        "    assert limits == 7\n"
        "    assert request.node.get_closest_marker('xdist_group').args[0] == 'test_limits'\n"
    )
    result = suite.runpytest("-m", "")
    result.assert_outcomes(passed=4)


def test_first_case_fast_puts_the_other_cases_in_the_slow_tier(suite):
    suite.makepyfile(
        "import pytest\n"
        "@pytest.mark.first_case_fast\n"
        "@pytest.mark.parametrize('n', [1, 2, 3])\n"
        "def test_cases(n):\n"
        "    pass\n"
    )
    fast = suite.runpytest("-m", "not slow and not real")
    fast.assert_outcomes(passed=1, deselected=2)
    slow = suite.runpytest("-m", "slow")
    slow.assert_outcomes(passed=2, deselected=1)
