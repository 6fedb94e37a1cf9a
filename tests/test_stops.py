"""Stop strings: matched on device, split across tokens, per row, never overrun.

The reference is the host: a row's output with stop strings must be its output without
them, cut after the first token at which the bytes of the generated tokens contain one
of the row's stop strings (``tokenizer.decode`` spells the same bytes, checked too).
The stop strings are taken from the unstopped outputs themselves, chosen to straddle
token boundaries, so the matches are real and split across tokens.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from support import GREEDY

import specjax
from specjax.sampling.stops import StopStrings, token_bytes, trim_at_stop
from specjax.testing import tiny_model, tiny_tokenizer

NEW = 40
GAMMA = 4
# Speculative output equals plain output token for token only at the same forward width:
# every run compared with `bundled`'s rows, plain ones too, scores the drafters' verify
# width (γ + 1 columns).
WIDTH = specjax.drafters.lookahead(specjax.PromptLookup(ngram=2, num_draft=GAMMA))


@pytest.fixture(scope="module")
def bundled():
    target, draft, tokenizer = specjax.default_pair()
    texts = ["def fibonacci(n):", "import os\n", "class Config:\n    def __init__(self"]
    prompts = [tokenizer.encode(t).ids for t in texts]
    base = specjax.generate(
        jax.random.key(0), target, prompts, max_new_tokens=NEW, sampling=GREEDY, forward_width=WIDTH
    )
    return target, draft, tokenizer, prompts, base.to_lists()


def _split_stop(tokenizer, row, start):
    """A 4-byte string of ``row``'s text that starts inside token ``start`` and ends in a
    later token (so it is split across tokens)."""
    table = token_bytes(tokenizer, tokenizer.get_vocab_size())
    pieces = [table[t] for t in row]
    for i in range(start, len(row) - 1):
        if len(pieces[i]) >= 2:
            text = b"".join(pieces[i:])
            return text[len(pieces[i]) - 2 : len(pieces[i]) + 2].decode("utf-8", "ignore")
    raise AssertionError("no token to split a stop string across")


def _reference(tokenizer, row, stops):
    """``row`` cut after the first token whose bytes complete one of ``stops``."""
    table = token_bytes(tokenizer, tokenizer.get_vocab_size())
    text = b""
    for j, t in enumerate(row):
        text += table[t]
        if any(s.encode() in text for s in stops):
            return row[: j + 1]
    return row


def _stops_per_row(tokenizer, rows):
    """Different stops per row: one split string early in the row, one later, a miss."""
    return [
        [_split_stop(tokenizer, rows[0], 25), "\n\n\n\n\n\n", _split_stop(tokenizer, rows[0], 8)],
        [_split_stop(tokenizer, rows[1], 12)],
        ["never appears in this text: §§§"],
    ]


def test_token_bytes_spell_what_the_tokenizer_decodes(bundled):
    _, _, tokenizer, _, rows = bundled
    table = token_bytes(tokenizer, tokenizer.get_vocab_size())
    ids = tokenizer.encode("naïve ünïcode — and\n\ttabs ```code```").ids + rows[0]
    assert b"".join(table[i] for i in ids) == tokenizer.decode(ids).encode()


@pytest.mark.parametrize("drafter_name", ["plain", "draft_model", "lookup"])
# Fast tier: plain decoding; the drafters (one program each on the bundled pair) are slow.
@pytest.mark.first_case_fast
def test_greedy_output_is_cut_after_the_first_stop(bundled, drafter_name):
    target, draft, tokenizer, prompts, rows = bundled
    stops = _stops_per_row(tokenizer, rows)
    want = [_reference(tokenizer, row, s) for row, s in zip(rows, stops, strict=True)]
    assert len(want[0]) < len(rows[0]) and len(want[1]) < len(rows[1])  # real stops
    assert want[2] == rows[2]  # the stop that never appears changes nothing
    key = jax.random.key(0)
    kw = dict(max_new_tokens=NEW, sampling=GREEDY, stop=stops, forward_width=WIDTH)
    if drafter_name == "plain":
        out = specjax.generate(key, target, prompts, **kw)
    else:
        drafter = (
            specjax.DraftModel(draft, num_draft=GAMMA)
            if drafter_name == "draft_model"
            else specjax.PromptLookup(ngram=2, num_draft=GAMMA)
        )
        out = specjax.speculative_generate(key, target, drafter, prompts, **kw)
    assert out.to_lists() == want
    for row, s in zip(out.to_lists()[:2], stops, strict=False):
        text = tokenizer.decode(row)
        assert any(x in text for x in s) and trim_at_stop(text, s) != text


@pytest.mark.slow  # the bundled pair sampled, plain and coupled (two programs, ~15 s)
def test_sampled_coupled_output_equals_plain_with_stops(bundled):
    """At T = 1 coupled verification reproduces plain sampling token for token at the
    same forward width, stops included (one list of stops for every row, B = 5 = γ + 1)."""
    target, draft, tokenizer, _, _ = bundled
    prompts = [tokenizer.encode(t).ids for t in ["def f(x):", "import", "x = ", "#", "if "]]
    sampling = specjax.SamplingConfig(temperature=1.0)
    key = jax.random.key(5)
    stops = ["\n", "("]
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    width = specjax.drafters.lookahead(drafter)
    kw = dict(max_new_tokens=NEW, sampling=sampling, forward_width=width)
    plain = specjax.generate(key, target, prompts, stop=stops, **kw)
    coupled = specjax.speculative_generate(
        key, target, drafter, prompts, verification="coupled", stop=stops, **kw
    )
    assert coupled.to_lists() == plain.to_lists()
    unstopped = specjax.generate(key, target, prompts, **kw)
    for row, full in zip(plain.to_lists(), unstopped.to_lists(), strict=True):
        assert row == _reference(tokenizer, full, stops)
    assert any(len(r) < NEW for r in plain.to_lists())


@pytest.mark.slow  # continuous batching on the bundled target (one more program, ~8 s)
def test_stops_follow_the_prompt_through_refilled_slots(bundled):
    target, _, tokenizer, prompts, rows = bundled
    stops = _stops_per_row(tokenizer, rows)
    out = specjax.generate(
        jax.random.key(0),
        target,
        prompts,
        max_new_tokens=NEW,
        sampling=GREEDY,
        stop=stops,
        num_slots=1,
        forward_width=WIDTH,  # as `bundled`'s rows
    )
    assert out.to_lists() == [_reference(tokenizer, r, s) for r, s in zip(rows, stops, strict=True)]


def test_trim_at_stop():
    assert trim_at_stop("a = 1\n\nb = 2", ["\n\n", "b"]) == "a = 1"
    assert trim_at_stop("abc", ["x"]) == "abc"


def test_bad_stops_are_refused_by_name_before_compiling(bundled):
    target, _, tokenizer, prompts, _ = bundled
    run = lambda stop, model=target, prompts=prompts: specjax.generate(  # noqa: E731
        jax.random.key(0), model, prompts, max_new_tokens=4, stop=stop
    )
    with pytest.raises(TypeError, match="stop must be a list of strings"):
        run("\n\n")
    with pytest.raises(ValueError, match="non-empty str"):
        run(["\n", ""])
    with pytest.raises(ValueError, match="non-empty str"):
        run(["\n", 3])
    with pytest.raises(ValueError, match="stop has 2 lists, but there are 3 prompts"):
        run([["a"], ["b"]])
    with pytest.raises(ValueError, match="need the target's tokenizer"):
        run(["a"], model=tiny_model(seed=0), prompts=[[1, 2]])
    wordpiece = tiny_tokenizer(64)  # spells w0 .. w63: no "Z" anywhere
    with pytest.raises(ValueError, match="cannot be spelled by the tokenizer"):
        StopStrings.build(["Z"], wordpiece, 64, 1)
    built = StopStrings.build(["a"], tokenizer, target.vocab_size, 2)
    with pytest.raises(ValueError, match="StopStrings built for V = 4096 and 2 prompts"):
        run(built)


@pytest.mark.slow  # one more program on the bundled target (~10 s)
def test_a_stop_in_the_prompt_does_not_count(bundled):
    """Only generated text counts: a prompt that ends with the stop string still runs."""
    target, _, tokenizer, _, _ = bundled
    prompt = tokenizer.encode("x = 1\n\n").ids
    out = specjax.generate(
        jax.random.key(0),
        target,
        [prompt, prompt, prompt],
        max_new_tokens=NEW,
        sampling=GREEDY,
        stop=["\n\n"],
    )
    full = specjax.generate(
        jax.random.key(0), target, [prompt] * 3, max_new_tokens=NEW, sampling=GREEDY
    ).to_lists()[0]
    assert out.to_lists()[0] == _reference(tokenizer, full, ["\n\n"])
    assert np.asarray(out.lengths)[0] >= 1
