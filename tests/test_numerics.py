"""The forward-width guarantee: speculative == plain decoding at one forward width.

`specjax.decoding.numerics` states it: at one forward width W, for one batch shape,
greedy speculative decoding emits plain decoding's tokens, and coupled verification
emits them for any sampling settings, in every precision (float32, bfloat16, int8
weights, int8 weights and activations), with every drafter (chains, and trees of at
most W nodes) and decoder feature.

The checks run in a worker process (``tests/numerics_worker.py``) at jax's default
flags, XLA's optimisation on and the default matmul precision: the
rest of the suite compiles with the optimisation off, for time (tests/conftest.py).
Every check decodes the bundled pair's five prompts, B = W = γ + 1 = 5, rows greedy,
at temperature 1 and truncated (top-p, top-k), 24 tokens, all at once in one batch.

Fast tier: float32, bfloat16 and int8, one case each with coupled verification
(float32: the draft model; bfloat16: a draft-model tree; int8: the EAGLE head), and
the negative control. Slow tier, one worker process per precision: the rest of the
cross product (every drafter and a tree in each precision), int8-weights, rejection
verification (its greedy rows), a row's independence from its neighbours, and, with
an int8 target and draft, the decoder features (penalties, a constraint, stop
strings, refill, adaptive γ with draft confidence).

The negative control runs on the float32 target with a head of near-duplicate rows
(twin tokens whose logits differ by about 1e-7 of their size), where a different
rounding of the forward flips greedy choices: the decoders must agree there at one
width, and a decoder patched to score plain decoding one token wide (the bug this
guarantee exists against) must be caught. Its power is measured, not assumed: at the
first case the patched decoder parted from speculative decoding on rows 0 and 1,
within two tokens, and the test fails unless it parts on at least one row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("numerics_worker.py")

FAST = {
    "float32": ("model-coupled", "control"),
    "bfloat16": ("tree-coupled",),
    "int8": ("eagle-coupled",),
}
FEATURES = ("penalties", "constraint", "stop", "refill", "adaptive")
SLOW = {
    "float32": tuple(
        "block-coupled eagle-coupled lookup-coupled tree-coupled model-rejection "
        "lookup-rejection neighbours".split()
    ),
    "bfloat16": tuple(
        "model-coupled block-coupled eagle-coupled lookup-coupled model-rejection "
        "neighbours".split()
    ),
    "int8": (
        *"model-coupled block-coupled tree-coupled lookup-coupled model-rejection".split(),
        *("neighbours", *FEATURES),
    ),
    "int8-weights": tuple(
        "model-coupled block-coupled eagle-coupled lookup-coupled tree-coupled "
        "model-rejection".split()
    ),
}


def _run_worker(cases: dict[str, tuple[str, ...]], tmp: Path) -> dict:
    """One worker process for these cases, precision after precision, at the caller's
    XLA flags (jax's defaults unless the caller set some). One process at a time: it
    runs while this test's xdist worker waits, so the suite stays one process a core."""
    env = dict(os.environ, XLA_FLAGS=os.environ.get("SPECJAX_TEST_CALLER_XLA_FLAGS", ""))
    out = tmp / "report.json"
    groups = [f"{precision}={','.join(names)}" for precision, names in cases.items()]
    done = subprocess.run(
        [sys.executable, str(WORKER), *groups, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"numerics worker failed:\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())["results"]


@pytest.fixture(scope="module")
def fast_reports(tmp_path_factory):
    return _run_worker(FAST, tmp_path_factory.mktemp("numerics-fast"))


@pytest.fixture(scope="module")
def slow_reports(tmp_path_factory):
    """One worker process per precision, started by the first test that needs it.

    Programs at one precision share nothing compiled with another's, so a process per
    precision costs only its start and the models' load, and lets xdist run the
    precisions on different cores (each is an `xdist_group` of its own)."""
    reports: dict[str, dict | Exception] = {}

    def report(precision: str) -> dict:
        if precision not in reports:
            try:
                tmp = tmp_path_factory.mktemp(f"numerics-slow-{precision}")
                reports[precision] = _run_worker({precision: SLOW[precision]}, tmp)[precision]
            except Exception as e:  # one failed process fails its cases, once
                reports[precision] = e
        if isinstance(reports[precision], Exception):
            raise reports[precision]
        return reports[precision]

    return report


def _check(comparisons: list[dict], case: str, precision: str) -> None:
    for c in comparisons:
        assert "error" not in c, f"{case} ({precision}) raised:\n{c['error']}"
        assert c["equal"], (
            f"{case} ({precision}): speculative decoding parted from plain decoding at the "
            f"same forward width; first differing position per checked row "
            f"{[c['first_difference'][r] for r in c.get('checked_rows', [0])]}: {c}"
        )


def _cases(table):
    return [(p, c) for p, names in table.items() for c in names if c != "control"]


@pytest.mark.parametrize("precision, case", _cases(FAST))
def test_speculative_equals_plain_at_one_width(fast_reports, precision, case):
    _check(fast_reports[precision][case]["comparisons"], case, precision)
    if case.endswith("-coupled"):
        # Drafts were accepted: an equality that holds because every draft was rejected
        # would show nothing about the verify's columns past the first.
        assert fast_reports[precision][case]["comparisons"][0]["tokens_per_call"] > 1.0


def test_negative_control_a_plain_step_narrower_than_the_verify_is_caught(fast_reports):
    """On a target with twin tokens, the decoders agree at one width, and plain
    decoding patched to score one token wide parts from speculative decoding."""
    same, patched = fast_reports["float32"]["control"]["comparisons"]
    assert same["equal"], same
    assert not patched["equal"], (
        "the control lost its power: plain decoding one token wide agreed with "
        f"speculative decoding at width 5 on the twin-token target: {patched}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "precision, case",
    [
        pytest.param(p, c, marks=pytest.mark.xdist_group(f"test_numerics-{p}"))
        for p, c in _cases(SLOW)
    ],
)
def test_speculative_equals_plain_at_one_width_everywhere(slow_reports, precision, case):
    _check(slow_reports(precision)[case]["comparisons"], case, precision)


def _head_rows(vocab: int, **decode_kw) -> set[int]:
    """Rows of every product of the compiled plain decoder that outputs V logits.

    The program is `specjax.generate`'s own (`specjax.decoding.api`), compiled here.
    A 2-D dot with a V axis is the LM head (the prefill's is dropped: its logits are
    never read); its other axis counts the rows it scores, B · W (on a CPU a float32
    product of 2 to 16 rows runs weight-first, ``[V, rows]``, padded to 8 or 16).
    """
    import re

    import jax

    from specjax.decoding import api, checks
    from specjax.drafters import NoDraft
    from specjax.testing import tiny_model

    target = tiny_model(seed=0, vocab_size=vocab, num_layers=1)
    p = checks.prepare(
        jax.random.key(0),
        target,
        NoDraft(),
        [[1, 2, 3]] * 3,
        checks.DecodeOptions(max_new_tokens=8, **decode_kw),
    )
    lowered = api._generate_jit.lower(
        p.decoder, p.inputs, cache_len=p.cache_len, num_slots=p.num_slots
    )
    hlo = lowered.compile().as_text()
    shapes = re.findall(r"= \w+\[(\d+),(\d+)\]\{[^}]*\} dot\(", hlo)
    return {int(a if int(b) == vocab else b) for a, b in shapes if vocab in (int(a), int(b))}


def test_xla_keeps_a_plain_step_w_columns_wide():
    """At forward_width=5 the head scores all 3 · 5 rows: XLA did not shrink the product
    to the one column plain decoding reads (the forward's outputs pass an
    optimization barrier). The control, forward_width=None, shows the checker sees a
    narrow head: 3 rows."""
    vocab = 96  # no other axis of the tiny model is 96 wide
    assert _head_rows(vocab) == {3}
    assert min(_head_rows(vocab, forward_width=5)) >= 15
