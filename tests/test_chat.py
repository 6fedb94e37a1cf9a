"""Chat templates: rendering against transformers, end-of-turn ids, and ``specjax generate --chat``.

The oracle is transformers' own ``PreTrainedTokenizerFast(tokenizer_object=...)
.apply_chat_template``, given the same ``tokenizers.Tokenizer`` and the same special
tokens. The templates below are written for these tests in the styles of real families
(ChatML as SmolLM2 and Qwen use it, with a default system message; Llama 3 headers with
a BOS and trimmed content; Gemma turns, which fold the system message into the first
user turn and refuse roles that do not alternate; a Phi-3 style one that requires a
system message; one that uses ``tojson``, loop controls and ``tools``). Each is rendered
with and without the generation prompt, on one- to four-message conversations, as text
and as ids.

The CLI test saves a tiny random model with a ChatML template and a word-level
tokenizer. Which id ``<|im_end|>`` gets is chosen so that this model's greedy answer
to the chat prompt reaches it after a few tokens (the model's output depends only on
the ids): the test then checks that ``--chat`` prints just the answer and stops there.
"""

import json
import os
import subprocess
import sys
from datetime import date

import jax
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models

import specjax
from specjax import cli
from specjax.io.chat import END_OF_TURN_TOKENS, apply_chat_template, end_of_turn_ids
from specjax.models import Model, ModelConfig
from specjax.testing import tiny_config
from specjax.training.tokenizer import train_tokenizer

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}
    {% set first_prefix = messages[0]['content'] + '\\n\\n' %}
    {% set turns = messages[1:] %}
{% else %}
    {% set first_prefix = '' %}
    {% set turns = messages %}
{% endif %}
{% for message in turns %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}
    {% endif %}
    {% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<start_of_turn>{{ role }}
{{ (first_prefix if loop.first else '') + message['content'] | trim }}<end_of_turn>
{% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}
"""

PHI_SYSTEM = """{% if messages[0]['role'] != 'system' %}
{{ raise_exception('This template needs a system message first.') }}
{% endif %}
{% for message in messages %}
<|{{ message['role'] }}|>
{{ message['content'] }}<|end|>
{% endfor %}
{% if add_generation_prompt %}
<|assistant|>
{% else %}
{{ eos_token }}
{% endif %}"""

TOOLS = """{% for message in messages %}
{% if message['role'] == 'tool' %}{% continue %}{% endif %}
{{ message['role'] }}: {{ message['content'] | tojson }}
{% if loop.index >= 4 %}{% break %}{% endif %}
{% endfor %}
{% if tools %}tools: {{ tools | tojson(indent=2) }}
{% endif %}
{% if add_generation_prompt %}assistant:{% endif %}"""

# name: (template, bos token, eos token, end-of-turn token)
TEMPLATES = {
    "chatml": (CHATML, None, "<|im_end|>", "<|im_end|>"),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"),
    "gemma": (GEMMA, "<bos>", "<eos>", "<end_of_turn>"),
    "phi_system": (PHI_SYSTEM, None, "<|endoftext|>", "<|end|>"),
    "tools": (TOOLS, None, "<|endoftext|>", None),
}
SPECIAL = (
    "<|endoftext|> <|im_start|> <|im_end|> <|begin_of_text|> <|end_of_text|> "
    "<|start_header_id|> <|end_header_id|> <|eot_id|> <bos> <eos> <start_of_turn> "
    "<end_of_turn> <|system|> <|user|> <|assistant|> <|end|>"
).split()

CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "Write a Python function that reverses a string."}],
    "system_user": [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "  What is 2 + 2?  "},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Hello. <b>How</b> can I help?"},
        {"role": "user", "content": "Écris « bonjour » en Python:\nprint('bonjour')"},
    ],
}


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["def f(x):\n    return x[::-1]\n" * 5, "Hello, how can I help? Bonjour!\n" * 5]
    tok = train_tokenizer(texts, vocab_size=300)
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL[1:]])
    return tok


def _model(tokenizer, name):
    template, bos, eos, _ = TEMPLATES[name]
    config = ModelConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        bos_token_id=tokenizer.token_to_id(bos) if bos else None,
        eos_token_id=tokenizer.token_to_id(eos),
    )
    return Model.random(config).replace(tokenizer=tokenizer, chat_template=template)


@pytest.fixture(scope="module")
def models(tokenizer):
    return {name: _model(tokenizer, name) for name in TEMPLATES}


def _oracle(tokenizer, name):
    from transformers import PreTrainedTokenizerFast

    _, bos, eos, _ = TEMPLATES[name]
    specials = {k: v for k, v in dict(bos_token=bos, eos_token=eos).items() if v}
    # A copy: transformers configures the backend tokenizer it is given.
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer.to_str()), **specials
    )


def _cases():
    for name in TEMPLATES:
        for conversation, messages in CONVERSATIONS.items():
            if name == "phi_system" and messages[0]["role"] != "system":
                continue  # refused by the template: tested below
            yield name, conversation


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name, conversation", list(_cases()))
def test_rendering_equals_transformers(
    tokenizer, models, name, conversation, add_generation_prompt
):
    messages = CONVERSATIONS[conversation]
    oracle = _oracle(tokenizer, name)
    template = TEMPLATES[name][0]
    kw = dict(add_generation_prompt=add_generation_prompt)
    expected = oracle.apply_chat_template(messages, chat_template=template, tokenize=False, **kw)
    text = apply_chat_template(models[name], messages, **kw)
    assert text == expected
    expected_ids = oracle.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=False, **kw
    )
    assert apply_chat_template(models[name], messages, tokenize=True, **kw) == list(expected_ids)


def test_bos_is_written_once_and_a_bare_tokenizer_takes_the_template(tokenizer, models):
    messages = CONVERSATIONS["system_user"]
    ids = apply_chat_template(models["llama3"], messages, tokenize=True)
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    assert ids[0] == bos and ids.count(bos) == 1
    # A bare tokenizer knows no special-token strings: pass them as template variables.
    bare = apply_chat_template(
        tokenizer, messages, chat_template=LLAMA3, bos_token="<|begin_of_text|>"
    )
    assert bare == apply_chat_template(models["llama3"], messages)
    assert specjax.apply_chat_template is apply_chat_template


def test_template_variables_reach_the_template(tokenizer, models):
    tools = [{"name": "reverse", "description": "Reverses <text>", "parameters": {"s": "str"}}]
    messages = CONVERSATIONS["multi_turn"] + [{"role": "tool", "content": "skipped"}]
    oracle = _oracle(tokenizer, "tools")
    expected = oracle.apply_chat_template(
        messages, tools=tools, chat_template=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert apply_chat_template(models["tools"], messages, tools=tools) == expected
    # strftime_now is the local time, as in transformers.
    text = apply_chat_template(
        tokenizer, CONVERSATIONS["one_user"], chat_template="{{ strftime_now('%Y-%m-%d') }}"
    )
    assert text == date.today().strftime("%Y-%m-%d")


@pytest.mark.parametrize(
    "name, expected",
    [(name, (TEMPLATES[name][2], TEMPLATES[name][3])) for name in TEMPLATES if name != "tools"],
)
def test_end_of_turn_ids(tokenizer, models, name, expected):
    """The config's EOS, then the template's end-of-turn token (found by the probe, or
    for the Phi-style template, which refuses the probe's conversation, by name)."""
    ids = end_of_turn_ids(models[name])
    assert ids == tuple(dict.fromkeys(tokenizer.token_to_id(t) for t in expected))
    assert expected[1] in END_OF_TURN_TOKENS


def test_end_of_turn_ids_without_a_template_or_markup(tokenizer, models):
    eos = (tokenizer.token_to_id("<|endoftext|>"),)
    assert end_of_turn_ids(models["tools"]) == eos  # its template writes no markup
    assert end_of_turn_ids(models["chatml"].replace(chat_template=None)) == (
        tokenizer.token_to_id("<|im_end|>"),
    )


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda m, t: apply_chat_template(m.replace(chat_template=None), []),
            ValueError,
            "the model has no chat template",
        ),
        (
            lambda m, t: apply_chat_template(t, [{"role": "user", "content": "hi"}]),
            ValueError,
            "a bare tokenizer has no chat template",
        ),
        (lambda m, t: apply_chat_template(m, "hi"), TypeError, "messages must be a list"),
        (lambda m, t: apply_chat_template(m, []), ValueError, "messages is empty"),
        (
            lambda m, t: apply_chat_template(m, [{"content": "hi"}]),
            ValueError,
            r"messages\[0\] needs a 'role'",
        ),
        (
            lambda m, t: apply_chat_template(m, [{"role": "user"}]),
            ValueError,
            r"messages\[0\] \(user\) has no 'content'",
        ),
        (
            lambda m, t: apply_chat_template(m, [{"role": "user", "content": 3}]),
            TypeError,
            r"messages\[0\]\['content'\] must be a string",
        ),
        (lambda m, t: apply_chat_template(m, ["hi"]), TypeError, r"messages\[0\] must be a dict"),
        (
            lambda m, t: apply_chat_template(
                m, CONVERSATIONS["one_user"], chat_template="{% if %}"
            ),
            ValueError,
            "not a valid Jinja template",
        ),
        (
            lambda m, t: apply_chat_template(
                m.replace(chat_template=PHI_SYSTEM), CONVERSATIONS["one_user"]
            ),
            ValueError,
            "refused the messages: This template needs a system message first",
        ),
        (
            lambda m, t: apply_chat_template(
                m.replace(chat_template=GEMMA),
                [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            ),
            ValueError,
            "Conversation roles must alternate",
        ),
        (
            lambda m, t: apply_chat_template(
                m.replace(tokenizer=None), CONVERSATIONS["one_user"], tokenize=True
            ),
            ValueError,
            "tokenize=True needs a tokenizer",
        ),
    ],
)
def test_bad_input_is_refused(tokenizer, models, call, error, match):
    with pytest.raises(error, match=match):
        call(models["chatml"], tokenizer)


def test_the_template_is_sandboxed(models):
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ValueError, match="refused the messages"):
        apply_chat_template(models["chatml"], CONVERSATIONS["one_user"], chat_template=escape)


# --------------------------------------------------------------------------------------
# specjax generate --chat


WORDS = ["system", "user", "assistant", "You", "are", "a", "helpful", "AI", "hi", "Be", "brief"]
CHAT_V = 64
CHAT_SPECIAL = {"<|endoftext|>": 0, "<|im_start|>": 1}


def _chat_tokenizer(im_end_id: int) -> Tokenizer:
    """Word level: the special tokens, WORDS, fillers ``f<i>``, ``<|im_end|>`` at ``im_end_id``."""
    vocab = dict(CHAT_SPECIAL)
    vocab.update({word: 2 + i for i, word in enumerate(WORDS)})
    free = [i for i in range(CHAT_V) if i not in vocab.values()]
    for i in free:
        vocab["<|im_end|>" if i == im_end_id else f"f{i}"] = i
    tok = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tok


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    """A tiny chat model whose greedy answer to "hi" ends its turn after a few tokens.

    The model is fixed; ``<|im_end|>`` may sit at any free id. Every candidate id gives
    another prompt (the template writes ``<|im_end|>`` after the system and user turns),
    so all candidates are decoded in one batch and the first whose answer emits that id
    as its first stop token, after at least 3 answer tokens, is kept.
    """
    config = tiny_config(CHAT_V, max_position_embeddings=128, eos_token_id=0)
    messages = [{"role": "user", "content": "hi"}]
    candidates = [i for i in range(CHAT_V) if i >= 2 + len(WORDS)]
    prompts = [
        apply_chat_template(_chat_tokenizer(i), messages, chat_template=CHATML, tokenize=True)
        for i in candidates
    ]
    for seed in range(5):  # seed 0 is the first that works (measured)
        model = Model.random(config, seed=seed)
        model = model.replace(
            params=jax.tree.map(lambda p: p * 8 if p.ndim == 2 else p, model.params)
        )
        out = specjax.generate(
            jax.random.key(0),
            model,
            prompts,
            max_new_tokens=12,
            sampling=specjax.SamplingConfig.greedy(),
        )
        found = [
            (im_end, answer[: stops[0] + 1])
            for im_end, answer in zip(candidates, out.to_lists(), strict=True)
            if (stops := [k for k, t in enumerate(answer) if t in (0, im_end)])
            and stops[0] >= 3
            and answer[stops[0]] == im_end
        ]
        if found:
            im_end, answer = found[0]
            break
    else:
        pytest.fail("no id for <|im_end|> ends these models' answers; try other seeds")
    tok = _chat_tokenizer(im_end)
    folder = tmp_path_factory.mktemp("chat") / "model"
    specjax.save_pretrained(model.replace(tokenizer=tok, chat_template=CHATML), folder)
    assert end_of_turn_ids(specjax.load_pretrained(folder)) == (0, im_end)
    return folder, tok, answer


# Slow tier: 11 s: the CLI with a chat template end to end.
@pytest.mark.slow
def test_generate_chat_prints_the_answer_and_stops_at_the_end_of_turn(chat_folder, capsys):
    folder, tok, answer = chat_folder
    args = ["generate", "--model", str(folder), "--chat", "hi", "--max-new-tokens", "12"]
    assert cli.main([*args, "--json", "--repeats", "1", "--drafter", "none"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == [answer] and out["tokens"] == len(answer) < 12
    text = tok.decode(answer[:-1], skip_special_tokens=False)
    assert out["completions"] == [text]
    assert out["prompt"].endswith("<|im_start|>assistant\n")
    # As a user runs it (speculative, prompt lookup, streamed): only the answer is printed.
    proc = subprocess.run(
        [sys.executable, "-m", "specjax.cli", *args, "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NO_COLOR="1"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text + "\n"
    assert "<|im_end|>" not in proc.stdout and "user" not in proc.stdout


# Slow tier: 7 s, one decode program for this test alone. The rendering against
# transformers' templates and the CLI's chat argument checks stay in the fast tier.
@pytest.mark.slow
def test_generate_chat_with_a_system_message(chat_folder, capsys):
    folder, _, _ = chat_folder
    args = ["generate", "--model", str(folder), "--chat", "hi", "--system", "Be brief", "--json"]
    assert cli.main([*args, "--max-new-tokens", "4", "--repeats", "1", "--drafter", "none"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt"].startswith("<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nhi")


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["a prompt", "--chat", "hi"], "give --chat or a PROMPT, not both"),
        (["--chat", "  "], "the --chat message is empty"),
        (["hi", "--system", "Be brief"], "--system needs --chat"),
        ([], "give a PROMPT to complete, or --chat MESSAGE"),
    ],
)
def test_generate_chat_user_errors(extra, fragment, capsys):
    assert cli.main(["generate", *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_generate_chat_without_a_template_is_one_line_error(chat_folder, tmp_path, capsys):
    folder, _, _ = chat_folder
    plain = tmp_path / "plain"
    specjax.save_pretrained(specjax.load_pretrained(folder).replace(chat_template=None), plain)
    assert cli.main(["generate", "--model", str(plain), "--chat", "hi"]) == 2
    err = capsys.readouterr().err
    assert "has no chat template" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.real
def test_chat_with_smollm2_gguf_answers_and_stops_at_the_end_of_turn(smollm2_path, capsys):
    """Slow: loads the real SmolLM2-135M-Instruct GGUF and compiles its decode loop (~40 s).

    The documented chat command, greedy: the answer is Python that reverses a string, and
    generation ends on the template's end-of-turn id well before the token budget.
    """
    budget = 256
    args = ["generate", "--model", str(smollm2_path), "--temperature", "0"]
    args += ["--chat", "Write a Python function that reverses a string."]
    assert cli.main([*args, "--max-new-tokens", str(budget), "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    answer = out["completions"][0]
    assert "def " in answer and ("[::-1]" in answer or "reverse" in answer), answer
    assert "<|im_end|>" not in answer and "<|im_start|>" not in answer
    assert out["prompt"].endswith("<|im_start|>assistant\n")
    model = specjax.load_pretrained(smollm2_path)
    ids = out["token_ids"][0]
    assert len(ids) < budget and ids[-1] in end_of_turn_ids(model)
