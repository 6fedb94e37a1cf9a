"""`specjax.GenerationOptions`: every field is a ``specjax generate`` flag with the same
default, and the command and `specjax.Sampler` decode the same tokens for the same
options, one case per field set to a value other than its default (the bundled pair,
a few greedy tokens, the command run in this process)."""

import dataclasses
import json

import pytest

import specjax
from specjax.text.defaults import DEFAULTS
from specjax.text.flags import SAMPLING_FLAGS, as_flags, flag_of, sampling_default
from specjax.text.options import GenerationOptions

FIELDS = [f.name for f in dataclasses.fields(GenerationOptions)]
PROMPT = "def fibonacci(n):"
BASE = {"gamma": 2, "max_new_tokens": 4}  # a fixed γ: no cost measurement per case


def _generate_parser():
    from specjax.cli.parser import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices["generate"]


def test_every_field_is_a_flag_with_the_same_default():
    actions = {s: a for a in _generate_parser()._actions for s in a.option_strings}
    for name in FIELDS:
        if name == "sampling":  # one flag per SamplingConfig field, at the config's default
            for field in SAMPLING_FLAGS:
                action = actions["--" + field.replace("_", "-")]
                assert action.default == sampling_default(field), field
            continue
        action = actions.get(flag_of(name))
        assert action is not None, f"GenerationOptions.{name} has no flag {flag_of(name)}"
        assert action.dest == name
        assert action.default == getattr(GenerationOptions(), name), name
        assert action.help.startswith(GenerationOptions.__dataclass_fields__[name].metadata["help"])


def test_the_parsed_defaults_are_the_options_defaults():
    from specjax.cli.generate import options_of
    from specjax.cli.parser import build_parser

    parsed = options_of(build_parser().parse_args(["generate", "x"]))
    for name in FIELDS:
        if name != "sampling":
            assert getattr(parsed, name) == getattr(GenerationOptions(), name), name
    assert parsed.sampling == specjax.sampling.SamplingConfig(temperature=DEFAULTS.temperature)
    assert (parsed.gamma, parsed.drafter, parsed.eos_id) == ("auto", "auto", "auto")


def test_errors_read_as_flags():
    assert as_flags("gamma=3 and tree='2,2' disagree; drop gamma") == (
        "--gamma 3 and --tree 2,2 disagree; drop --gamma"
    )
    assert as_flags("forward_width must be >= 1, got 0") == "--forward-width must be >= 1, got 0"
    assert as_flags("eos_id must be 'auto'") == "--no-eos must be 'auto'"
    assert as_flags("corpus= is for drafter='suffix'") == "--corpus is for --drafter suffix"


def _schema(tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    return schema, str(path)


# One case per field: (the Python settings, the flags). A field with no case fails
# `test_every_field_has_a_case`.
def _cases(tmp_path):
    schema, schema_file = _schema(tmp_path)
    corpus = tmp_path / "corpus.py"
    corpus.write_text("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)\n")
    sampled = specjax.SamplingConfig(temperature=0.8, top_k=20)
    return {
        "drafter": ({"drafter": "lookup"}, ["--drafter", "lookup"]),
        "gamma": ({"gamma": 3}, ["--gamma", "3"]),
        "tree": ({"tree": "2,1", "gamma": "auto"}, ["--tree", "2,1", "--gamma", "auto"]),
        "forward_width": ({"forward_width": 5}, ["--forward-width", "5"]),
        "verification": (
            {"verification": "coupled", "sampling": sampled},
            ["--verification", "coupled", "--temperature", "0.8", "--top-k", "20"],
        ),
        "draft_confidence": ({"draft_confidence": 0.5}, ["--draft-confidence", "0.5"]),
        "quantize": ({"quantize": "int8-weights"}, ["--quantize", "int8-weights"]),
        "draft_quantize": ({"draft_quantize": "int8"}, ["--draft-quantize", "int8"]),
        "draft_head": ({"draft_head": 300}, ["--draft-head", "300"]),
        "block_mode": (
            {"drafter": "block", "block_mode": "argmax"},
            ["--drafter", "block", "--block-mode", "argmax"],
        ),
        "ngram": ({"drafter": "lookup", "ngram": 2}, ["--drafter", "lookup", "--ngram", "2"]),
        "corpus": (
            {"drafter": "suffix", "corpus": str(corpus)},
            ["--drafter", "suffix", "--corpus", str(corpus)],
        ),
        "max_new_tokens": ({"max_new_tokens": 2}, ["--max-new-tokens", "2"]),
        "sampling": ({"sampling": sampled}, ["--temperature", "0.8", "--top-k", "20"]),
        "seed": (
            {"seed": 7, "sampling": sampled},
            ["--seed", "7", "--temperature", "0.8", "--top-k", "20"],
        ),
        "stop": ({"stop": ("(",)}, ["--stop", "("]),
        "regex": ({"regex": r"\n +[a-z]+"}, ["--regex", r"\n +[a-z]+"]),
        "json_schema": ({"json_schema": schema}, ["--json-schema", schema_file]),
        "eos_id": ({"eos_id": ()}, ["--no-eos"]),
    }


def test_every_field_has_a_case(tmp_path):
    assert sorted(_cases(tmp_path)) == sorted(FIELDS)


# Slow tier: about 10 s of CPU a case (each side compiles its decode of the bundled pair).
@pytest.mark.slow
@pytest.mark.parametrize("field", FIELDS)
def test_the_command_and_the_sampler_decode_alike(field, tmp_path, capsys):
    from specjax import cli

    settings, flags = _cases(tmp_path)[field]
    settings = {**BASE, **settings}
    for name, value in BASE.items():
        if flag_of(name) not in flags:
            flags = [*flags, flag_of(name), str(value)]
    sampler = specjax.Sampler.from_pretrained(**settings)
    if field not in ("max_new_tokens", "eos_id"):  # the case sets the field itself
        assert getattr(sampler.options, field) != getattr(GenerationOptions(), field), field
    _, result = sampler.sample(PROMPT, return_result=True)
    capsys.readouterr()
    args = ["generate", PROMPT, "--json", "--no-stream", *flags]
    assert cli.main(args) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["token_ids"] == result.to_lists(), (field, args)
