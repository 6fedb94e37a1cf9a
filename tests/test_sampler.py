"""`specjax.Sampler` and `specjax.ChatSampler`: text in and out, batches, chat turns,
streaming, greedy without a key, EOS from the tokenizer and the chat template,
speculative equal to plain at the same forward width, and the CLI's defaults.

The oracle for every text is the functional API (`specjax.generate`) on the same ids,
decoded with the tokenizer. The models are tiny and random with word-level tokenizers
(ids are words ``w<i>``), so each decode compiles in seconds; the defaults test loads
the bundled pair without decoding.
"""

import dataclasses
import inspect

import jax
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models

import specjax
from specjax.testing import tiny_model, tiny_tokenizer
from specjax.text import ChatSampler, Sampler
from specjax.text.defaults import DEFAULTS

V = 64
PROMPT = "w1 w2 w3"


def _word_tokenizer(special: dict[int, str] = (), words: dict[int, str] = ()) -> Tokenizer:
    """Word level over ``w<i>``; ids in ``words`` renamed, ids in ``special`` added tokens."""
    special, words = dict(special), dict(words)
    vocab = {special.get(i, words.get(i, f"w{i}")): i for i in range(V)}
    tok = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(t, special=True) for t in special.values()])
    return tok


@pytest.fixture(scope="module")
def model():
    # Scaled weights: peaked, prompt-dependent greedy continuations.
    return tiny_model(seed=0, init_scale=8.0).replace(tokenizer=tiny_tokenizer(V))


def _oracle(model, prompt, max_new_tokens: int, **kw) -> list[int]:
    """Greedy ids of `specjax.generate` for ``prompt`` (text, or ids)."""
    ids = prompt
    if isinstance(prompt, str):
        ids = model.tokenizer.encode(prompt, add_special_tokens=False).ids
    out = specjax.generate(
        jax.random.key(0),
        model,
        [ids],
        max_new_tokens=max_new_tokens,
        sampling=specjax.SamplingConfig(temperature=0.0),
        **kw,
    )
    return out.to_lists()[0]


def test_text_in_text_out_and_a_batch(model):
    sampler = Sampler(model, drafter=None)
    text = sampler.sample(PROMPT, max_new_tokens=6)
    expected = model.tokenizer.decode(_oracle(model, PROMPT, 6), skip_special_tokens=False)
    assert isinstance(text, str) and text == expected and len(text.split()) == 6
    texts = sampler.sample([PROMPT, "w7 w8"], max_new_tokens=6)
    assert isinstance(texts, list) and len(texts) == 2
    assert texts[0] == text
    assert texts[1] == model.tokenizer.decode(_oracle(model, "w7 w8", 6))
    assert texts[1] != texts[0]  # the rows are the prompts' own


def test_streamed_pieces_join_to_the_same_text(model):
    sampler = Sampler(model, drafter=specjax.PromptLookup(), gamma=4, max_new_tokens=16)
    pieces = list(sampler.sample(PROMPT, stream=True))
    assert len(pieces) > 1  # streamed, not returned whole
    assert "".join(pieces) == sampler.sample(PROMPT)


def test_sampling_without_a_key_uses_the_seed_and_a_key_wins(model):
    sampler = Sampler(model, drafter=None, max_new_tokens=6)
    hot = specjax.SamplingConfig(temperature=1.0)
    # No key: jax.random.key(seed), the sampler's seed (0 by default, as --seed).
    assert sampler.seed == DEFAULTS.seed
    a = sampler.sample(PROMPT, sampling=hot)
    assert a == sampler.sample(PROMPT, sampling=hot, key=jax.random.key(DEFAULTS.seed))
    seeded = Sampler(model, drafter=None, max_new_tokens=6, seed=3)
    assert seeded.sample(PROMPT, sampling=hot) == sampler.sample(
        PROMPT, sampling=hot, key=jax.random.key(3)
    )
    others = {sampler.sample(PROMPT, sampling=hot, key=jax.random.key(k)) for k in range(2, 6)}
    assert others - {a}, "sampled text does not depend on the key"
    # Greedy: the key is irrelevant.
    greedy = sampler.sample(PROMPT)
    assert greedy == sampler.sample(PROMPT, key=jax.random.key(7))


def test_eos_is_taken_from_the_tokenizer(model):
    """The tokenizer names ``<|endoftext|>``; the config names no EOS. The row stops there."""
    plain = _oracle(model, PROMPT, 12)
    prompt_ids = model.tokenizer.encode(PROMPT).ids
    stop_at = next(
        k for k in range(2, 12) if plain[k] not in plain[:k] and plain[k] not in prompt_ids
    )
    eos = plain[stop_at]
    eos_model = model.replace(tokenizer=_word_tokenizer(special={eos: "<|endoftext|>"}))
    assert eos_model.config.eos_token_ids == ()
    sampler = Sampler(eos_model, drafter=None, max_new_tokens=12)
    assert sampler.eos_id == (eos,)
    text, result = sampler.sample(PROMPT, return_result=True)
    assert result.to_lists() == [plain[: stop_at + 1]]  # stopped at EOS, EOS emitted
    assert text == eos_model.tokenizer.decode(plain[:stop_at]) and "<|endoftext|>" not in text
    # Control: without EOS ids the same sampler runs to max_new_tokens.
    _, free = Sampler(eos_model, drafter=None, eos_id=()).sample(
        PROMPT, max_new_tokens=12, return_result=True
    )
    assert free.to_lists() == [plain]


@pytest.mark.parametrize("drafter", ["draft_model", "lookup"])
def test_speculative_equals_plain_at_the_same_forward_width(model, drafter):
    draft = specjax.DraftModel(model) if drafter == "draft_model" else specjax.PromptLookup()
    width = draft.num_draft + 1
    spec = Sampler(
        model, drafter=draft, gamma=draft.num_draft, forward_width=width, max_new_tokens=16
    )
    plain = Sampler(model, drafter=None, forward_width=width, max_new_tokens=16)
    text, result = spec.sample([PROMPT, "w9 w9 w9"], return_result=True)
    assert text == plain.sample([PROMPT, "w9 w9 w9"])
    assert bool(result.from_draft.any()), "no draft was accepted: not a speculative run"


# A chat template that writes its end-of-turn token only after an assistant's answer, so
# the first turn's prompt is the same whichever id that token gets.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
    "{% if m['role'] == 'assistant' %}<|eot|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
ROLES = {60: "user", 61: "assistant", 62: ":", 63: "system"}


def test_chat_turns_stop_at_the_end_of_turn(model):
    words = _word_tokenizer(words=ROLES)
    first = "w1 w2"
    prompt = apply_template(words, [{"role": "user", "content": first}])
    probe = _oracle(model.replace(tokenizer=words), prompt, 12)
    prompt_ids = set(words.encode(prompt).ids)
    stop_at = next(
        k for k in range(2, 12) if probe[k] not in probe[:k] and probe[k] not in prompt_ids
    )
    eot = probe[stop_at]
    tok = _word_tokenizer(special={eot: "<|eot|>"}, words=ROLES)
    chat_model = model.replace(tokenizer=tok, chat_template=TEMPLATE)

    chat = ChatSampler(chat_model, drafter=None, max_new_tokens=12)
    assert eot in chat.eos_id
    answer = chat.chat(first)
    assert answer == tok.decode(probe[:stop_at])  # ended at the end of the turn
    assert chat.turns == [
        {"role": "user", "content": first},
        {"role": "assistant", "content": answer},
    ]
    # Control: a Sampler knows no end of turn and runs past it.
    assert len(Sampler(chat_model, drafter=None).sample(prompt, max_new_tokens=12).split()) == 12

    second = chat.chat("w5")
    history = specjax.apply_chat_template(chat_model, chat.turns[:3], tokenize=True)
    expected = _oracle(chat_model, history, 12)
    if eot in expected:
        expected = expected[: expected.index(eot)]
    assert second == tok.decode(expected)
    assert [t["role"] for t in chat.turns] == ["user", "assistant"] * 2

    chat.reset()
    assert chat.turns == []
    assert chat.chat(first) == answer


def apply_template(tokenizer, messages) -> str:
    return specjax.apply_chat_template(tokenizer, messages, chat_template=TEMPLATE)


def test_chat_streams_and_records_the_turn(model):
    tok = _word_tokenizer(words=ROLES)
    chat = ChatSampler(
        model.replace(tokenizer=tok, chat_template=TEMPLATE), drafter=None, max_new_tokens=8
    )
    pieces = list(chat.chat("w1 w2", stream=True))
    assert len(pieces) > 1
    assert chat.turns[-1] == {"role": "assistant", "content": "".join(pieces)}
    chat.reset()
    assert chat.chat("w1 w2") == "".join(pieces)


def test_chat_takes_stop_strings_and_returns_the_result(model):
    tok = _word_tokenizer(words=ROLES)
    chat_model = model.replace(tokenizer=tok, chat_template=TEMPLATE)
    chat = ChatSampler(chat_model, drafter=None, max_new_tokens=8)
    answer, result = chat.chat("w1 w2", return_result=True)
    assert isinstance(result, specjax.GenerationResult)
    assert chat.turns[-1] == {"role": "assistant", "content": answer}
    words = answer.split()
    cut = next(i for i in range(1, len(words)) if words[i] not in words[:i])
    chat.reset()
    stopped = chat.chat("w1 w2", stop=[words[cut]])
    assert stopped.split() == words[: cut + 1]  # ends with the stop string, kept
    assert chat.turns[-1]["content"] == stopped


def test_quantize_and_draft_quantize_reach_the_models(model):
    """As --quantize and --draft-quantize: the draft follows the target unless set;
    "none" keeps the draft's precision; a drafter without a model is refused."""
    draft = specjax.DraftModel(tiny_model(seed=1))
    both = Sampler(model, drafter=draft, gamma=2, quantize="int8")
    assert both.target.quantization == both.drafter.model.quantization == "int8"
    target_only = Sampler(model, drafter=draft, gamma=2, quantize="int8", draft_quantize="none")
    assert target_only.drafter.model.quantization is None
    draft_only = Sampler(model, drafter=draft, gamma=2, draft_quantize="int8-weights")
    assert draft_only.target.quantization is None
    assert draft_only.drafter.model.quantization == "int8-weights"
    with pytest.raises(ValueError, match="quantize must be one of"):
        Sampler(model, quantize="int4")
    with pytest.raises(ValueError, match="draft_quantize needs a draft model"):
        Sampler(model, drafter=specjax.PromptLookup(), draft_quantize="int8")


def test_a_tree_of_drafts_equals_plain_at_its_width(model):
    sampler = Sampler(model, drafter=specjax.DraftModel(model), tree="2,1", max_new_tokens=10)
    assert sampler.drafter.tree is not None and sampler.drafter.num_draft == 2
    assert not sampler.auto  # a tree has no γ to choose
    width = sampler.drafter.tree.num_nodes + 1
    plain = Sampler(model, drafter=None, forward_width=width, max_new_tokens=10)
    assert sampler.sample(PROMPT) == plain.sample(PROMPT)
    with pytest.raises(ValueError, match="tree=2,1 needs a drafter that proposes trees"):
        Sampler(model, drafter=specjax.PromptLookup(), tree="2,1")
    with pytest.raises(ValueError, match="gamma=3 and tree=2,1 disagree"):
        Sampler(model, drafter=specjax.DraftModel(model), tree="2,1", gamma=3)


@pytest.mark.slow
def test_regex_and_json_schema_shape_the_text():
    """The bundled pair: the text matches the regex, and parses as the schema says."""
    import json
    import re

    sampler = specjax.Sampler.from_pretrained(drafter="none", max_new_tokens=24)
    pattern = r"[0-9]{1,3}(, [0-9]{1,3}){2}"
    assert re.fullmatch(pattern, sampler.sample("x = ", regex=pattern))
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
    }
    doc = json.loads(sampler.sample("config = ", json_schema=schema, max_new_tokens=40))
    assert set(doc) == {"name", "ok"} and isinstance(doc["ok"], bool)
    with pytest.raises(ValueError, match="regex= or json_schema=, not both"):
        sampler.sample("x", regex=pattern, json_schema=schema)


def test_a_json_schema_is_a_dict_its_text_or_a_file(tmp_path):
    """As ``--json-schema FILE``: the three spellings build the same constraint."""
    import json

    from specjax.text.options import schema_text

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert json.loads(schema_text(schema)) == json.loads(schema_text(str(path))) == schema
    assert schema_text(path) == schema_text(json.dumps(schema)) == json.dumps(schema)
    with pytest.raises(ValueError, match="json_schema: cannot read"):
        schema_text(str(tmp_path / "missing.json"))


def test_options_object_keywords_and_gamma_zero(model):
    """`GenerationOptions` and keywords set the same fields; ``gamma=0`` decodes plainly
    (as ``--gamma 0``); ``eos_id=None`` still means the tokenizer's ids, with a warning."""
    draft = specjax.DraftModel(model)
    options = specjax.GenerationOptions(gamma=2, max_new_tokens=5)
    by_object = Sampler(model, options, drafter=draft)
    by_keywords = Sampler(model, drafter=draft, gamma=2, max_new_tokens=5)
    assert by_object.drafter.num_draft == by_keywords.drafter.num_draft == 2
    assert by_object.max_new_tokens == by_keywords.max_new_tokens == 5
    plain = Sampler(model, options.replace(gamma=0), drafter=draft)
    assert plain.drafter is None and not plain.auto
    assert plain.sample(PROMPT) == Sampler(model, options, drafter=None).sample(PROMPT)
    with pytest.warns(DeprecationWarning, match="eos_id='auto'"):
        old = Sampler(model, drafter=None, eos_id=None)
    assert old.eos_id == Sampler(model, drafter=None).eos_id
    with pytest.raises(TypeError, match="unknown option"):
        Sampler(model, gama=2)
    with pytest.warns(DeprecationWarning, match="specjax.text.chat.ChatSampler"):
        from specjax.text.sampler import ChatSampler as moved
    assert moved is ChatSampler


def test_defaults_equal_the_cli_defaults():
    """The parsed defaults of ``specjax generate`` are `GenerationOptions`' (one field at a
    time in tests/test_options.py); what they resolve to for the bundled pair."""
    from specjax.cli.generate import options_of
    from specjax.cli.parser import build_parser
    from specjax.drafters.block import BlockDrafter

    options = options_of(build_parser().parse_args(["generate", "def f(x):"]))
    sampler = Sampler.from_pretrained(options=options)
    assert sampler.max_new_tokens == options.max_new_tokens == DEFAULTS.max_new_tokens
    assert float(sampler.sampling.temperature) == DEFAULTS.temperature
    assert sampler.verification == options.verification == DEFAULTS.verification
    assert sampler.seed == options.seed == DEFAULTS.seed
    assert options.forward_width is None and sampler.forward_width is None
    assert options.gamma == "auto" and sampler.auto
    # The drafter "auto" picks for the bundled pair, at its own γ.
    assert type(sampler.drafter) is specjax.DraftModel
    assert sampler.drafter.num_draft == DEFAULTS.gamma
    # The block drafter's mode: the options', the defaults' and BlockDrafter's own.
    fields = {f.name: f.default for f in dataclasses.fields(BlockDrafter)}
    random_mode = inspect.signature(BlockDrafter.random).parameters["mode"].default
    assert options.block_mode == DEFAULTS.draft_mode == fields["mode"] == random_mode
    block = Sampler.from_pretrained(drafter="block").drafter
    assert block.mode == options.block_mode
    # With a target of one's own and no draft: prompt lookup, at the options' n-gram.
    lookup = Sampler(sampler.target).drafter
    assert isinstance(lookup, specjax.PromptLookup) and lookup.ngram == options.ngram
    assert lookup.num_draft == DEFAULTS.gamma


BY_NAME = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
BY_PATH = ("./Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "/m/Qwen2.5-Coder-0.5B-Instruct.gguf")


@pytest.mark.parametrize("names", [BY_NAME, BY_PATH], ids=["by name", "the same files by path"])
def test_a_named_pair_gets_its_preset(model, monkeypatch, capsys, names):
    """``from_pretrained`` of a pair of `specjax.io.presets`, by name or as the paths of
    the files those names fetch, decodes with the preset and says which one. The
    loader is stubbed (no download)."""
    from specjax.io.presets import find
    from specjax.models.quant import quantize
    from specjax.text import loading

    preset = find("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    loaded_as = []

    def load_model(path, argname, dtype, gguf_file=None, quantize=None, quantized=quantize):
        loaded_as.append(quantize)  # the preset's precision is applied as the model is read
        return model if quantize is None else quantized(model, quantize)

    monkeypatch.setattr(loading, "load_model", load_model)
    sampler = Sampler.from_pretrained(*names)
    assert loaded_as == [preset.quantize, preset.draft_quantize]
    assert sampler.preset is preset
    err = capsys.readouterr().err
    assert f"this pair's preset (specjax.io.presets), {preset.target} + {preset.draft}" in err
    assert sampler.target.quantization == preset.quantize
    assert sampler.drafter.model.quantization == preset.draft_quantize
    # γ is not the preset's: it is chosen on the machine (gamma auto) up to the
    # drafter's own.
    assert sampler.options.gamma == "auto" and sampler.auto
    assert sampler.drafter.num_draft == DEFAULTS.gamma
    assert sampler.draft_confidence == preset.draft_confidence
    # A setting given wins; without the preset, or with an explicit γ, the settings are
    # the caller's.
    own = Sampler.from_pretrained(*names, quantize="int8-weights")
    assert own.target.quantization == "int8-weights"
    assert own.drafter.model.quantization == preset.draft_quantize
    own = Sampler.from_pretrained(*names, preset=False)
    assert own.preset is None and own.target.quantization is None
    assert own.drafter.num_draft == DEFAULTS.gamma
    assert Sampler.from_pretrained(*names, gamma=3).drafter.num_draft == 3
    # Another drafter, or another file: no preset.
    assert Sampler.from_pretrained(*names, drafter="lookup").preset is None
    assert Sampler.from_pretrained("/m/other.gguf", names[1]).preset is None


@pytest.mark.slow
def test_gamma_auto_chooses_once_per_batch_size_and_equals_plain_at_its_width(model, capsys):
    """The default ``gamma="auto"``: the first sample of a batch size measures this
    machine (progress on stderr), the choice is kept per batch size and in the cache (a
    new sampler does not measure again), and the text equals plain decoding's at the
    chosen width."""
    sampler = Sampler(model, drafter=specjax.DraftModel(model, num_draft=2), max_new_tokens=12)
    assert sampler.auto and not sampler.tuned
    text = sampler.sample(PROMPT)
    tuned = sampler.tuned[1]
    assert tuned.measured and "timing the target's forward" in capsys.readouterr().err
    assert 0 <= tuned.gamma <= 2 and tuned.forward_width == tuned.gamma + 1
    plain = Sampler(model, drafter=None, forward_width=tuned.forward_width, max_new_tokens=12)
    assert text == plain.sample(PROMPT)
    assert sampler.sample(PROMPT) == text and sampler.tuned[1] is tuned  # kept
    again = Sampler(model, drafter=specjax.DraftModel(model, num_draft=2), max_new_tokens=12)
    again.sample(PROMPT)
    assert not again.tuned[1].measured and "timing" not in capsys.readouterr().err
    # A draft model that is the target is always accepted; the cache keeps what was seen
    # (positions no run has judged yet keep the prior).
    learnt = again.tuned[1].acceptance
    assert learnt[0] == pytest.approx(1.0)
    assert learnt[1] in (pytest.approx(1.0), specjax.tuning.PRIOR_ACCEPTANCE)


def _raw_model():
    return tiny_model(seed=1)


@pytest.mark.parametrize(
    "make, call, error, match",
    [
        (
            lambda m: Sampler(m),
            lambda s: s.sample([1, 2, 3]),
            TypeError,
            r"prompt\[0\] must be a str.*specjax.generate",
        ),
        (lambda m: Sampler(m), lambda s: s.sample(42), TypeError, "prompt must be a str"),
        (lambda m: Sampler(m), lambda s: s.sample([]), ValueError, "empty list"),
        (lambda m: Sampler(m), lambda s: s.sample(""), ValueError, "prompt is empty"),
        (
            lambda m: Sampler(m),
            lambda s: s.sample(["a", "b"], stream=True),
            ValueError,
            "stream=True takes one prompt",
        ),
        (
            lambda m: Sampler(m),
            lambda s: s.sample("w1", sampling={"temperature": 1}),
            TypeError,
            r"specjax.SamplingConfig\(temperature=0.7\)",
        ),
        (
            lambda m: Sampler(m.replace(tokenizer=None)),
            None,
            ValueError,
            "needs a tokenizer.*pass tokenizer=",
        ),
        (
            lambda m: Sampler("some/folder"),
            None,
            TypeError,
            r"Sampler.from_pretrained\('some/folder'\)",
        ),
        (
            lambda m: Sampler(m, drafter=_raw_model()),
            None,
            TypeError,
            r"specjax.DraftModel\(draft\)",
        ),
        (
            lambda m: Sampler(m, drafter="block"),
            None,
            ValueError,
            r"Sampler.from_pretrained\(\.\.\., drafter='block'\)",
        ),
        (lambda m: Sampler(m, max_new_tokens=0), None, ValueError, "max_new_tokens"),
        (
            lambda m: Sampler(m, verification="greedy"),
            None,
            ValueError,
            r"verification must be one of \('rejection', 'coupled', 'block'\) or None",
        ),
        (
            lambda m: Sampler(m),
            lambda s: s.sample("w1", max_new_tokens=10**6),
            ValueError,
            r"max_new_tokens=1000000: the longest prompt is \d+ tokens.*model's context of",
        ),
        (lambda m: Sampler(m, gamma=-1), None, ValueError, r"gamma must be >= 0 \(0 decodes"),
        (lambda m: Sampler(m, gamma=2.0), None, TypeError, "gamma must be an integer"),
        (
            lambda m: Sampler(m, gamma="fast"),
            None,
            ValueError,
            "gamma must be >= 0 .* or 'auto', got 'fast'",
        ),
        (lambda m: Sampler(m, forward_width=0), None, ValueError, "forward_width must be >= 1"),
        (
            lambda m: Sampler(m, gamma=3, forward_width=2),
            None,
            ValueError,
            r"forward_width=2 is narrower than one verify forward \(4 tokens.*forward_width=4",
        ),
        (
            lambda m: Sampler(m, draft_confidence=5),
            None,
            ValueError,
            r"draft_confidence must be in \[0, 1\], got 5.0",
        ),
        (lambda m: ChatSampler(m), None, ValueError, "needs a chat template.*chat_template="),
        (lambda m: Sampler.from_pretrained(draft="x"), None, ValueError, "draft needs path"),
        (
            lambda m: Sampler.from_pretrained("/nonexistent/model"),
            None,
            ValueError,
            "path /nonexistent/model: no such directory",
        ),
        (
            lambda m: Sampler.from_pretrained("Qwen/Qwen2.5-0.5B"),
            None,
            ValueError,
            "path Qwen/Qwen2.5-0.5B is not in the Hub's cache and the Hub cannot be reached",
        ),
    ],
    ids=(
        "token ids, an int, empty list, empty prompt, stream a batch, sampling dict, "
        "no tokenizer, a path, a raw model drafter, named drafter, zero budget, "
        "bad verification, past the context, gamma -1, float gamma, gamma a word, width 0, "
        "width under the verify, confidence 5, no chat template, draft without path, "
        "missing folder, a Hub id"
    ).split(", "),
)
def test_bad_input_names_the_fix(model, make, call, error, match):
    with pytest.raises(error, match=match):
        sampler = make(model)
        if call is not None:
            call(sampler)


def test_chat_bad_messages(model):
    chat = ChatSampler(model.replace(chat_template=TEMPLATE), drafter=None)
    with pytest.raises(ValueError, match="message is empty"):
        chat.chat("  ")
    with pytest.raises(TypeError, match="message must be a str"):
        chat.chat(["w1"])
    assert chat.turns == []
