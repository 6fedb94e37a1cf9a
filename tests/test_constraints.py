"""Constrained decoding: regex and JSON-schema automata, exact under speculation.

The reference is independent of `specjax.sampling.constraints` and of outlines-core: which ids
may follow a text is decided by the ``regex`` module's partial matching over the bytes
(an id is allowed when the text plus its bytes can still become a match; EOS when the
text is a whole match; a row ends when it is a whole match that nothing extends), and
the constrained law of a short completion is enumerated from full forwards of the
tiny model, masked and renormalised at each position, in numpy float64.

Statistical tests (slow tier). One batch interleaves three groups of rows (row i is
group i % 3): regex A, regex B and no constraint, so that one table holds two automata
and rows without one. Plain decoding, the draft model, prompt lookup and the block
drafter (sampling its drafts), each under rejection and coupled verification, and a
draft-model tree (two children, one below each: the path's mask follows the path),
γ = 2 (depth 2), K = 3 tokens at temperature 1. Each group's rows are tested against
the exact law of their first K tokens (a row that ends early pads with "none") by a
chi-square test at p < FALSE_ALARM = 1e-4; 8 decoders x 3 groups = 24 tests,
family-wise false alarm below 0.24% (Bonferroni).

Power and the negative controls. The known-wrong variants: (1) the verifier masks every
drafted position with the state *before* the step (its earlier drafts not read), and
(2) the mask applied to the draft's q only, not to the target's p. With the target
drafting for itself, the output's second token then follows the stale-masked law in
(1) and the first token the unmasked law in (2), whatever is accepted (rejection
sampling returns p's law at every reached position). The control tests check the
first two tokens' law, and `test_sample_size_has_power_against_the_controls` computes
with `specjax.testing.chi_square_power` that N_PER_GROUP = 600 rejects both variants'
two-token laws with power above 0.999 at FALSE_ALARM (the smallest such N per group
is computed there and must be at most half of N_PER_GROUP), then the controls run the
broken decoders and check that the test rejects them.
"""

from __future__ import annotations

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from support import make_drafter, peaked_pair

import specjax
from specjax.decoding import api
from specjax.sampling.constraints import AutomatonCursor, ConstraintTable
from specjax.sampling.history import RowHistory
from specjax.testing import (
    chi_square_power,
    chi_square_pvalue,
    continuation_logits,
    min_sample_size,
    tiny_model,
)

regex_module = pytest.importorskip("regex")

V = 8
EOS = 7
# Byte strings per id: "ab" can be spelled [a, b] or [ab], "abab" also [a, ba, b].
TOKENS = [b"a", b"b", b"ab", b"0", b"1", b"ba", b"c", b""]
PATTERNS = {"A": r"(ab|c)+[01]?", "B": r"(ba|c)*1(a|b)?"}
GROUPS = ["A", "B", None]
PROMPT = [1, 2, 3, 1, 2]
K = 3
GAMMA = 2
N_PER_GROUP = 600
FALSE_ALARM = 1e-4
# The statistical tests sample from the model's own distribution.
SAMPLED = specjax.SamplingConfig(temperature=1.0)


# --------------------------------------------------------------------------------------
# The reference: partial regex matching over bytes (the `regex` module).


def _viable(pattern, text: bytes) -> bool:
    return regex_module.fullmatch(pattern.encode(), text, partial=True) is not None


def _whole(pattern, text: bytes) -> bool:
    m = regex_module.fullmatch(pattern.encode(), text)
    return m is not None and not m.partial


def _reference_allowed(pattern, text: bytes) -> list[int]:
    """Ids allowed after ``text``: EOS when it is a whole match; others that keep it viable."""
    ids = [t for t in range(V) if TOKENS[t] and _viable(pattern, text + TOKENS[t])]
    return ids + ([EOS] if _whole(pattern, text) else [])


def _reference_complete(pattern, text: bytes) -> bool:
    return _whole(pattern, text) and _reference_allowed(pattern, text) == [EOS]


@pytest.fixture(scope="module")
def constraints():
    return {g: specjax.Constraint.regex(PATTERNS[g], TOKENS) for g in PATTERNS}


# --------------------------------------------------------------------------------------
# Fast tier: the automaton against the reference, the table, greedy equality, bad input.


@pytest.mark.parametrize(
    "pattern, byte_pattern, tokens",
    [
        (PATTERNS["A"], None, TOKENS),
        (PATTERNS["B"], None, TOKENS),
        # A two-byte character spelled whole or split across two tokens.
        ("(é|e)+x", rb"(\xc3\xa9|e)+x", [b"\xc3", b"\xa9", b"\xc3\xa9", b"e", b"x", b"ex", b""]),
    ],
)
def test_the_automaton_allows_what_the_reference_allows(pattern, byte_pattern, tokens):
    """Every token sequence up to length 4: the allowed ids, final and complete states."""
    c = specjax.Constraint.regex(pattern, tokens)
    ref = (byte_pattern or pattern.encode()).decode("latin-1")
    v, eos = len(tokens), len(tokens) - 1

    def ref_allowed(text):
        ids = [
            t
            for t in range(v)
            if tokens[t]
            and regex_module.fullmatch(ref.encode("latin-1"), text + tokens[t], partial=True)
        ]
        m = regex_module.fullmatch(ref.encode("latin-1"), text)
        return ids, m is not None and not m.partial

    checked = 0
    for length in range(5):
        for seq in itertools.product(range(v - 1), repeat=length):
            text = b"".join(tokens[t] for t in seq)
            viable = regex_module.fullmatch(ref.encode("latin-1"), text, partial=True)
            state = c.walk(seq)
            assert (state >= 0) == (viable is not None), (seq, text)
            if state < 0:
                continue
            ids, whole = ref_allowed(text)
            assert c.allowed_ids(state) == ids, (seq, text)
            assert bool(c.final[state]) == whole, (seq, text)
            assert bool(c.complete[state]) == (whole and not ids), (seq, text)
            checked += 1
    assert checked > 20
    del eos


def test_one_table_holds_several_automata_and_unconstrained_rows(constraints):
    """The union keeps each automaton's moves; state 0 allows every id and stays."""
    a, b = constraints["A"], constraints["B"]
    table = ConstraintTable.build([a, None, b, a], V)
    initial = np.asarray(table.initial)
    assert initial[1] == 0 and initial[0] == initial[3] != initial[2]
    eos = jnp.asarray([EOS, -1], jnp.int32)
    # Every prefix of up to 3 ids that the automaton accepts, walked in the union table
    # (all of them at once) and in the automaton alone.
    for start, c in ((initial[0], a), (initial[2], b)):
        prefixes = [
            seq
            for n in range(4)
            for seq in itertools.product(range(V - 1), repeat=n)
            if c.walk(seq) >= 0
        ]
        width = max(len(p) for p in prefixes)
        ids = np.asarray([list(p) + [-1] * (width - len(p)) for p in prefixes], np.int32)
        states = jnp.full((len(prefixes),), start, jnp.int32)
        for i in range(width):
            moved = table.step(states, jnp.asarray(ids[:, i]))
            states = jnp.where(jnp.asarray(ids[:, i]) >= 0, moved, states)
        cursor = AutomatonCursor(table, states, eos)
        allowed = np.asarray(cursor.allowed(jnp.zeros((len(prefixes), V))))
        for row, seq in zip(allowed, prefixes, strict=True):
            own = c.walk(seq)
            want = c.allowed_ids(own) + ([EOS] if c.final[own] else [])
            assert np.flatnonzero(row).tolist() == want, seq
    free = AutomatonCursor(table, jnp.asarray([0]), eos).allowed(jnp.zeros((1, V)))
    assert bool(jnp.all(free))
    assert int(table.step(jnp.asarray(0), jnp.asarray(5))) == 0


pair = pytest.fixture(peaked_pair, scope="module", name="pair")


def _text(row) -> bytes:
    return b"".join(TOKENS[t] for t in row)


@pytest.mark.parametrize(
    "drafter_name", ["self", "draft_model", "lookup", "block", "eagle", "tree"]
)
@pytest.mark.parametrize("form", ["per_row", "one"])
# Fast tier: the target drafting for itself with per-row constraints; the other drafters
# and the single constraint run with -m slow.
@pytest.mark.first_case_fast
def test_greedy_speculative_equals_plain_under_the_constraint(
    pair, constraints, form, drafter_name
):
    """B = 3 = γ + 1 rows; every constrained output is in its language (whole, or a
    viable prefix when the budget ends it), and the constraint changes the output."""
    target, draft = pair
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5], [6, 0, 6, 0, 6]]
    per_row = [constraints["A"], None, constraints["B"]]
    constraint = per_row if form == "per_row" else constraints["A"]
    rows = per_row if form == "per_row" else [constraints["A"]] * 3
    greedy = specjax.SamplingConfig.greedy()
    key = jax.random.key(0)
    drafter = make_drafter(drafter_name, target, draft, GAMMA, mode="argmax")
    # Equal token for token only at one forward width: the drafter's verify width.
    width = specjax.drafters.lookahead(drafter)
    kw = dict(max_new_tokens=12, sampling=greedy, eos_id=EOS, forward_width=width)
    plain = specjax.generate(key, target, prompts, constraint=constraint, **kw)
    bare = specjax.generate(key, target, prompts, **kw)
    assert plain.to_lists() != bare.to_lists()
    # Tables are padded to buckets: other constraints of a similar size compile nothing.
    size = api._generate_jit._cache_size()
    swapped = specjax.generate(key, target, prompts, constraint=per_row[::-1], **kw)
    assert api._generate_jit._cache_size() == size
    assert swapped.to_lists() != plain.to_lists()
    for row, c in zip(plain.to_lists(), rows, strict=True):
        if c is not None:
            body = row[:-1] if row and row[-1] == EOS else row
            assert _viable(c.pattern, _text(body)), row
            if len(row) < 12:  # ended by EOS or completion: a whole match
                assert _whole(c.pattern, _text(body)), row
    out = specjax.speculative_generate(key, target, drafter, prompts, constraint=constraint, **kw)
    assert out.to_lists() == plain.to_lists()
    if drafter_name == "self":  # the draft's mask reads its own earlier drafts
        assert float(out.stats.acceptance_rate) == 1.0


def test_the_open_loop_with_fewer_slots_gives_each_prompt_its_own_constraint(pair, constraints):
    """Continuous batching: 5 prompts through 2 slots; each refill starts the new
    prompt's automaton, so the output equals one slot per prompt (greedy, plain decoding
    at the same forward width)."""
    target, draft = pair
    prompts = [[1, 2, 3], [4, 5], [6, 0, 6], [2, 2], [3, 1, 4]]
    per_row = [constraints["A"], None, constraints["B"], constraints["B"], constraints["A"]]
    drafter = specjax.PromptLookup(ngram=1, num_draft=GAMMA)
    kw = dict(
        max_new_tokens=[6, 9, 4, 8, 5],
        sampling=specjax.SamplingConfig.greedy(),
        eos_id=EOS,
        constraint=per_row,
        forward_width=specjax.drafters.lookahead(drafter),
    )
    want = specjax.generate(jax.random.key(0), target, prompts, **kw).to_lists()
    decoder, state = specjax.decoding.init(
        jax.random.key(0), target, prompts, drafter=drafter, num_slots=2, **kw
    )
    for _ in range(50):
        state = specjax.decoding.run(decoder, state, 2)
    assert specjax.decoding.result(decoder, state).to_lists() == want


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: specjax.Constraint.regex("(ab", TOKENS), "not a valid regex"),
        (lambda: specjax.Constraint.regex("z+", TOKENS), "cannot spell"),
        (lambda: specjax.Constraint.regex("", TOKENS), "only the empty string"),
        (lambda: specjax.Constraint.regex(3, TOKENS), "pattern must be a str"),
        (lambda: specjax.Constraint.regex("a", None), "needs the model's tokenizer"),
        (lambda: specjax.Constraint.json_schema("{bad", TOKENS), "schema cannot be compiled"),
        (
            lambda: specjax.Constraint.json_schema({"type": "string", "pattern": "z+"}, TOKENS),
            "cannot spell",
        ),
    ],
)
def test_bad_constraints_are_refused_when_built(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize(
    "constraint, match",
    [
        (lambda c: [c], r"1 entries for 2 prompts"),
        (lambda c: [c, "a+"], r"constraint\[1\] must be a specjax.Constraint"),
        (lambda c: "a+", "constraint must be a specjax.Constraint"),
        (lambda c: specjax.Constraint.regex("a+", TOKENS + [b"z"]), r"built for V = 9"),
    ],
)
def test_bad_constraint_arguments_are_refused_by_name_before_compiling(
    constraints, constraint, match
):
    target = tiny_model(seed=0, vocab_size=V)
    with pytest.raises((ValueError, TypeError), match=match):
        specjax.generate(
            jax.random.key(0),
            target,
            [[1, 2], [3]],
            max_new_tokens=4,
            constraint=constraint(constraints["A"]),
        )


# --------------------------------------------------------------------------------------
# Slow tier: the constrained law, 1,000-row language checks, and the controls.


@pytest.fixture(scope="module")
def forward_logits(pair):
    """Next-token logits ``[V^K, P+K, V]`` of every K-token continuation of PROMPT."""
    return continuation_logits(pair[0], PROMPT, K)


def _constrained_law(logits, group, num_tokens=K, variant="exact"):
    """The law of the first ``num_tokens`` outputs over ``(V + 1) ** num_tokens`` cells
    (id V: nothing, the row ended). ``variant``: "exact"; "stale" (every position
    masked with the state before the first step); "unmasked" (no mask on p)."""
    pattern = PATTERNS.get(group)
    law = np.zeros((V + 1,) * num_tokens)
    p0 = len(PROMPT) - 1

    def walk(prefix, prob):
        i = len(prefix)
        text = _text(prefix)
        ended = bool(prefix) and (
            prefix[-1] == EOS or (pattern is not None and _reference_complete(pattern, text))
        )
        if i == num_tokens or ended:
            law[tuple(prefix) + (V,) * (num_tokens - i)] += prob
            return
        row = np.ravel_multi_index(tuple(prefix) + (0,) * (K - i), (V,) * K)
        x = logits[row, p0 + i].copy()
        if pattern is not None and variant != "unmasked":
            allowed = _reference_allowed(pattern, b"" if variant == "stale" else text)
            x[np.setdiff1d(np.arange(V), allowed)] = -np.inf
        e = np.exp(x - x.max())
        probs = e / e.sum()
        for t in range(V):
            if probs[t] > 0:
                walk(prefix + [t], prob * probs[t])

    walk([], 1.0)
    return law


def _sample(pair, constraints, name, verification, num_rows, forward_width=None):
    target, draft = pair
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (num_rows, len(PROMPT)))
    per_row = [None if g is None else constraints[g] for g in GROUPS] * (num_rows // 3)
    kw = dict(
        max_new_tokens=K,
        sampling=SAMPLED,
        eos_id=EOS,
        constraint=per_row,
        forward_width=forward_width,
    )
    key = jax.random.key(2026)
    if name == "plain":
        res = specjax.generate(key, target, prompts, **kw)
    else:
        drafter = make_drafter(name, target, draft, GAMMA)
        res = specjax.speculative_generate(
            key, target, drafter, prompts, verification=verification, **kw
        )
    return np.asarray(res.tokens)


def _cells(tokens_NK, num_tokens=K):
    """Counts over ``(V + 1) ** num_tokens`` cells (-1: nothing, id V)."""
    idx = np.where(tokens_NK[:, :num_tokens] < 0, V, tokens_NK[:, :num_tokens])
    flat = np.ravel_multi_index(tuple(idx.T), (V + 1,) * num_tokens)
    return np.bincount(flat, minlength=(V + 1) ** num_tokens)


DECODERS = [
    ("plain", "rejection"),
    ("draft_model", "rejection"),
    ("draft_model", "coupled"),
    ("lookup", "rejection"),
    ("lookup", "coupled"),
    ("block", "rejection"),
    ("block", "coupled"),
    ("tree", "rejection"),
]


@pytest.fixture(scope="module")
def mixed_samples(pair, constraints):
    # One forward width for every decoder, at least each drafter's verify width (the
    # tree's): coupled and tree output equal plain output only at the same width.
    width = max(
        specjax.drafters.lookahead(make_drafter(name, *pair, GAMMA))
        for name, _ in DECODERS
        if name != "plain"
    )
    return {d: _sample(pair, constraints, *d, N_PER_GROUP * 3, width) for d in DECODERS}


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: "-".join(d))
def test_each_group_follows_the_constrained_law(forward_logits, mixed_samples, decoder, group):
    rows = mixed_samples[decoder][GROUPS.index(group) :: 3]
    assert rows.shape == (N_PER_GROUP, K)
    p = chi_square_pvalue(_cells(rows), _constrained_law(forward_logits, group))
    assert p > FALSE_ALARM, f"{decoder}/{group}: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_coupled_output_equals_plain_output_token_for_token(mixed_samples):
    plain = mixed_samples["plain", "rejection"]
    for name in ("draft_model", "lookup", "block"):
        np.testing.assert_array_equal(mixed_samples[name, "coupled"], plain, err_msg=name)
    # The tree verifier samples each path node with that position's noise, as plain does.
    np.testing.assert_array_equal(mixed_samples["tree", "rejection"], plain, err_msg="tree")


@pytest.mark.slow
def test_sample_size_has_power_against_the_controls(forward_logits):
    """N_PER_GROUP against both broken variants' two-token laws, per constrained group."""
    for group in ("A", "B"):
        law = _constrained_law(forward_logits, group, num_tokens=2)
        for variant in ("stale", "unmasked"):
            alternative = _constrained_law(forward_logits, group, num_tokens=2, variant=variant)
            n_min = min_sample_size(law, alternative, FALSE_ALARM, power=0.999)
            assert 2 * n_min <= N_PER_GROUP, (group, variant, n_min)
            power = chi_square_power(law, alternative, N_PER_GROUP, FALSE_ALARM)
            assert power > 0.999, (group, variant, power)


@struct.dataclass
class _NoMask(RowHistory):
    """A history that masks nothing (the control's p without the constraint)."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["stale", "unmasked"])
def test_control_broken_masks_are_rejected(pair, constraints, forward_logits, monkeypatch, variant):
    """The broken verifiers, run with the target drafting for itself: "stale" masks every
    drafted position with the state before the step; "unmasked" masks q only."""
    target, _ = pair

    def broken(cursor, drafts_BG):
        if variant == "unmasked":
            return _NoMask()
        g1 = drafts_BG.shape[1] + 1
        return cursor.replace(states=jnp.repeat(cursor.states[:, None], g1, axis=1))

    monkeypatch.setattr(AutomatonCursor, "along", broken)
    jax.clear_caches()  # the correct program must not be reused
    try:
        tokens = _sample((target, target), constraints, "draft_model", "rejection", N_PER_GROUP * 3)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    for group in ("A", "B"):
        rows = tokens[GROUPS.index(group) :: 3]
        p = chi_square_pvalue(
            _cells(rows, 2), _constrained_law(forward_logits, group, num_tokens=2)
        )
        assert p < FALSE_ALARM, f"{variant}/{group}: the broken variant passed, p = {p:.2e}"


@pytest.mark.slow
def test_control_the_unconstrained_law_is_rejected(forward_logits, mixed_samples):
    """The constrained groups' rows fail against the law without the constraint."""
    for group in ("A", "B"):
        rows = mixed_samples["draft_model", "rejection"][GROUPS.index(group) :: 3]
        p = chi_square_pvalue(_cells(rows), _constrained_law(forward_logits, None))
        assert p < FALSE_ALARM, f"{group}: p = {p:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "draft_model", "lookup", "block"])
def test_every_one_of_1000_sampled_rows_matches_its_regex(pair, name):
    """A bounded language (at most 7 tokens), budget 8: every row ends by completing it,
    and its text is a whole match; half the rows use each of two regexes."""
    target, draft = pair
    bounded = {
        "A": specjax.Constraint.regex(r"(ab|c){1,3}[01]", TOKENS),
        "B": specjax.Constraint.regex(r"(ba|c){0,2}1(a|b)", TOKENS),
    }
    per_row = [bounded["A"], bounded["B"]] * 500
    prompts = np.broadcast_to(np.asarray(PROMPT, np.int32), (1000, len(PROMPT)))
    kw = dict(max_new_tokens=8, sampling=SAMPLED, eos_id=EOS, constraint=per_row)
    if name == "plain":
        out = specjax.generate(jax.random.key(5), target, prompts, **kw)
    else:
        out = specjax.speculative_generate(
            jax.random.key(5), target, make_drafter(name, target, draft, GAMMA), prompts, **kw
        )
    rows = out.to_lists()
    for row, c in zip(rows, per_row, strict=True):
        assert EOS not in row and _whole(c.pattern, _text(row)), (c.pattern, row)
    assert len({tuple(r) for r in rows}) > 10  # sampled, not one fixed answer


@pytest.mark.slow
def test_every_one_of_1000_json_rows_validates():
    """1,000 sampled rows of the bundled pair under a JSON schema (draft model, γ = 3), in
    one batch (35 s; through 250 slots it took 82 s)."""
    jsonschema = pytest.importorskip("jsonschema")
    target, draft, tokenizer = specjax.io.pretrained.default_pair()
    schema = {
        "type": "object",
        "properties": {
            "id": {"enum": [1, 2, 3, 4]},
            "tag": {"type": "string", "maxLength": 4},
            "flag": {"type": "boolean"},
        },
        "required": ["id", "tag", "flag"],
    }
    c = specjax.Constraint.json_schema(schema, tokenizer, target.vocab_size, whitespace="")
    prompt = tokenizer.encode("data = ").ids
    out = specjax.speculative_generate(
        jax.random.key(7),
        target,
        specjax.DraftModel(draft, num_draft=3),
        [prompt] * 1000,
        max_new_tokens=40,
        sampling=SAMPLED,
        constraint=c,
    )
    assert not np.any(np.asarray(out.truncated))
    rows = out.to_lists()
    for row in rows:
        jsonschema.validate(json.loads(tokenizer.decode(row)), schema)
    assert len({tuple(r) for r in rows}) > 100
