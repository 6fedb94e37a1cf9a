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
        jax.random.key(0), model, [ids], max_new_tokens=max_new_tokens,
        sampling=specjax.SamplingConfig(temperature=0.0), **kw,
    )  # fmt: skip
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
    sampler = Sampler(model, drafter=specjax.PromptLookup(), max_new_tokens=16)
    pieces = list(sampler.sample(PROMPT, stream=True))
    assert len(pieces) > 1  # streamed, not returned whole
    assert "".join(pieces) == sampler.sample(PROMPT)


def test_greedy_needs_no_key_and_sampling_does(model):
    sampler = Sampler(model, drafter=None, max_new_tokens=6)
    hot = specjax.SamplingConfig(temperature=1.0)
    with pytest.raises(ValueError, match=r"needs a PRNG key: pass key=jax\.random\.key\(0\)"):
        sampler.sample(PROMPT, sampling=hot)
    a = sampler.sample(PROMPT, sampling=hot, key=jax.random.key(1))
    assert a == sampler.sample(PROMPT, sampling=hot, key=jax.random.key(1))
    others = {sampler.sample(PROMPT, sampling=hot, key=jax.random.key(k)) for k in range(2, 6)}
    assert others - {a}, "sampled text does not depend on the key"
    # Greedy: the key is irrelevant and not needed.
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
    assert sampler.eos_ids == (eos,)
    text, result = sampler.sample(PROMPT, return_result=True)
    assert result.to_lists() == [plain[: stop_at + 1]]  # stopped at EOS, EOS emitted
    assert text == eos_model.tokenizer.decode(plain[:stop_at]) and "<|endoftext|>" not in text
    # Control: without EOS ids the same sampler runs to max_new_tokens.
    _, free = Sampler(eos_model, drafter=None, eos_ids=()).sample(
        PROMPT, max_new_tokens=12, return_result=True
    )
    assert free.to_lists() == [plain]


@pytest.mark.parametrize("drafter", ["draft_model", "lookup"])
def test_speculative_equals_plain_at_the_same_forward_width(model, drafter):
    draft = specjax.DraftModel(model) if drafter == "draft_model" else specjax.PromptLookup()
    width = draft.num_draft + 1
    spec = Sampler(model, drafter=draft, forward_width=width, max_new_tokens=16)
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
    assert eot in chat.eos_ids
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


def test_defaults_equal_the_cli_defaults():
    """The parsed defaults of ``specjax generate`` and those of the Sampler, one by one."""
    from specjax.cli import generate as cli_generate
    from specjax.cli.parser import build_parser
    from specjax.drafters.block import BlockDrafter

    args = build_parser().parse_args(["generate", "def f(x):"])
    sampler = Sampler.from_pretrained()
    assert args.max_new_tokens == sampler.max_new_tokens == DEFAULTS.max_new_tokens
    assert args.temperature == float(sampler.sampling.temperature) == DEFAULTS.temperature
    assert args.verification == sampler.verification == DEFAULTS.verification
    assert args.seed == DEFAULTS.seed
    assert args.forward_width is None and sampler.forward_width is None
    for fn in (Sampler.__init__, Sampler.from_pretrained):
        assert inspect.signature(fn).parameters["drafter"].default == args.drafter == "auto"
    # The drafter "auto" picks for the bundled pair, at the same γ.
    _, cli_drafter, _ = cli_generate._load_models(args)
    assert type(sampler.drafter) is type(cli_drafter) is specjax.DraftModel
    assert sampler.drafter.num_draft == cli_drafter.num_draft == DEFAULTS.gamma
    # The block drafter's mode: the CLI's, the Sampler's and BlockDrafter's own.
    fields = {f.name: f.default for f in dataclasses.fields(BlockDrafter)}
    random_mode = inspect.signature(BlockDrafter.random).parameters["mode"].default
    assert args.block_mode == DEFAULTS.draft_mode == fields["mode"] == random_mode
    block_args = build_parser().parse_args(["generate", "x", "--drafter", "block"])
    _, cli_block, _ = cli_generate._load_models(block_args)
    block = Sampler.from_pretrained(drafter="block").drafter
    assert block.mode == cli_block.mode == args.block_mode
    assert block.num_draft == cli_block.num_draft
    # With a target of one's own and no draft: prompt lookup, at the CLI's n-gram.
    lookup = Sampler(sampler.target).drafter
    assert isinstance(lookup, specjax.PromptLookup) and lookup.ngram == args.ngram
    assert lookup.num_draft == DEFAULTS.gamma


def test_a_named_pair_gets_its_preset_as_in_the_cli(model, monkeypatch):
    """``from_pretrained(target name, draft name)`` decodes as ``specjax generate --model
    NAME --draft NAME`` does: the pair's preset. The loader is stubbed (no download)."""
    from specjax.cli.generate import _apply_preset
    from specjax.cli.parser import build_parser
    from specjax.io.presets import find
    from specjax.text import sampler as sampler_module

    preset = find("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    monkeypatch.setattr(sampler_module, "load_model", lambda path, argname, dtype: model)
    sampler = Sampler.from_pretrained(preset.target, preset.draft)
    args = build_parser().parse_args(
        ["generate", "x", "--model", preset.target, "--draft", preset.draft]
    )
    _apply_preset(args)
    assert sampler.preset is preset
    assert sampler.target.quantization == args.quantize == preset.quantize
    assert sampler.drafter.model.quantization == args.draft_quantize
    assert sampler.drafter.num_draft == args.gamma == preset.gamma
    assert sampler.draft_confidence == args.draft_confidence
    # Without the preset, or with an explicit γ, the settings are the caller's.
    own = Sampler.from_pretrained(preset.target, preset.draft, preset=False)
    assert own.preset is None and own.target.quantization is None
    assert own.drafter.num_draft == DEFAULTS.gamma
    assert Sampler.from_pretrained(preset.target, preset.draft, gamma=3).drafter.num_draft == 3


def _raw_model():
    return tiny_model(seed=1)


@pytest.mark.parametrize(
    "make, call, error, match",
    [
        (lambda m: Sampler(m), lambda s: s.sample([1, 2, 3]), TypeError,
         r"prompt\[0\] must be a str.*specjax.generate"),
        (lambda m: Sampler(m), lambda s: s.sample(42), TypeError, "prompt must be a str"),
        (lambda m: Sampler(m), lambda s: s.sample([]), ValueError, "empty list"),
        (lambda m: Sampler(m), lambda s: s.sample(""), ValueError, "prompt is empty"),
        (lambda m: Sampler(m), lambda s: s.sample(["a", "b"], stream=True), ValueError,
         "stream=True takes one prompt"),
        (lambda m: Sampler(m), lambda s: s.sample("w1", sampling={"temperature": 1}),
         TypeError, r"specjax.SamplingConfig\(temperature=0.7\)"),
        (lambda m: Sampler(m.replace(tokenizer=None)), None, ValueError,
         "needs a tokenizer.*pass tokenizer="),
        (lambda m: Sampler("some/folder"), None, TypeError,
         r"Sampler.from_pretrained\('some/folder'\)"),
        (lambda m: Sampler(m, drafter=_raw_model()), None, TypeError,
         r"specjax.DraftModel\(draft\)"),
        (lambda m: Sampler(m, drafter="block"), None, ValueError,
         r"Sampler.from_pretrained\(\.\.\., drafter='block'\)"),
        (lambda m: Sampler(m, max_new_tokens=0), None, ValueError, "max_new_tokens"),
        (lambda m: Sampler(m, verification="greedy"), None, ValueError,
         "verification must be 'rejection' or 'coupled'"),
        (lambda m: Sampler(m), lambda s: s.sample("w1", max_new_tokens=10**6), ValueError,
         r"max_new_tokens=1000000: the longest prompt is \d+ tokens.*model's context of"),
        (lambda m: Sampler(m, gamma=0), None, ValueError, r"gamma must be in \[1, "),
        (lambda m: Sampler(m, gamma=2.0), None, TypeError, "gamma must be an integer"),
        (lambda m: Sampler(m, forward_width=0), None, ValueError,
         r"forward_width must be in \[1, "),
        (lambda m: Sampler(m, gamma=3, forward_width=2), None, ValueError,
         r"forward_width=2 is narrower than one verify forward \(4 tokens.*forward_width=4"),
        (lambda m: Sampler(m, draft_confidence=5), None, ValueError,
         "draft_confidence must be <= 1.0, got 5.0"),
        (lambda m: ChatSampler(m), None, ValueError, "needs a chat template.*chat_template="),
        (lambda m: Sampler.from_pretrained(draft="x"), None, ValueError, "draft needs path"),
        (lambda m: Sampler.from_pretrained("/nonexistent/model"), None, ValueError,
         "path /nonexistent/model: no such directory"),
        (lambda m: Sampler.from_pretrained("Qwen/Qwen2.5-0.5B"), None, ValueError,
         "not Hugging Face Hub ids: download it first.*hf download Qwen/Qwen2.5-0.5B"),
    ],
    ids=["token ids", "an int", "empty list", "empty prompt", "stream a batch",
         "sampling dict", "no tokenizer", "a path", "a raw model drafter",
         "named drafter", "zero budget", "bad verification", "past the context", "gamma 0",
         "float gamma",
         "width 0", "width under the verify", "confidence 5", "no chat template",
         "draft without path", "missing folder", "a Hub id"],
)  # fmt: skip
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
