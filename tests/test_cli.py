"""The ``specjax`` command, run as a user runs it: in a subprocess.

Argument errors, which end before any model is loaded or compiled, run through
`specjax.cli.main` in this process (`cli_in_process`): the same code as the command
without the 3 to 7 s an interpreter takes to import jax. One of them also runs in a
subprocess, so the process boundary (status, one stderr line, no traceback) stays tested.
"""

import json
import os
import statistics
import subprocess
import sys

import pytest

from specjax.io import save_pretrained
from specjax.models import Model
from specjax.testing import tiny_config
from specjax.training.tokenizer import eos_id, train_tokenizer


def run_cli(*args, timeout=600):
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "specjax.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture
def cli_in_process(capsys, monkeypatch):
    """``cli_in_process(*args)``: `specjax.cli.main` here, as a ``CompletedProcess``."""
    from specjax import cli

    monkeypatch.setenv("NO_COLOR", "1")

    def run(*args):
        capsys.readouterr()  # drop what earlier code printed
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run


def assert_user_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("specjax")]
    assert lines, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "drafter, resolved, gamma",
    # auto: the draft model for the bundled pair; block: the bundled BlockDrafter
    # at its saved γ.
    [("auto", "model", 4), ("block", "block", 2)],
)
def test_generate_bundled_pair_greedy_equals_plain(drafter, resolved, gamma):
    proc = run_cli(
        "generate",
        "def fibonacci(n):",
        *"--max-new-tokens 24 --compare --json --no-eos --drafter".split(),
        drafter,
        *"--repeats 1 --gamma".split(),
        str(gamma),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["drafter"], out["gamma"]) == (resolved, gamma)
    # Equal to plain decoding at the verify's width, the default forward width.
    assert out["forward_width"] == gamma + 1 and out["equals_plain_at_width"] is True
    assert out["tokens"] == 24 and len(out["completions"][0]) > 0
    assert 0.0 <= out["acceptance_rate"] <= 1.0
    assert out["tokens_per_target_call"] >= 1.0
    # Per position: γ rates, each in [0, 1]; position 0 is judged at every step.
    assert len(out["acceptance_by_position"]) == gamma
    assert all(0.0 <= a <= 1.0 for a in out["acceptance_by_position"])
    assert out["position_reached"][0] == out["target_calls"]
    assert len(out["row_acceptance_rate"]) == 1


# Slow tier: about 15 s: two bundled-pair decodes in fresh processes.
@pytest.mark.slow
def test_generate_with_a_regex_and_a_json_schema(tmp_path):
    import re

    pattern = r"[0-9]{1,3}(, [0-9]{1,3}){2}"
    proc = run_cli(
        "generate",
        "x = ",
        "--regex",
        pattern,
        *"--max-new-tokens 24 --json --temperature 1 --batch-size 4 --compare --repeats 1".split(),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert all(re.fullmatch(pattern, c) for c in out["completions"]), out["completions"]
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
    }
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    proc = run_cli(
        "generate",
        "config = ",
        "--json-schema",
        str(tmp_path / "schema.json"),
        *"--max-new-tokens 40 --json".split(),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(json.loads(proc.stdout)["completions"][0])
    assert set(doc) == {"name", "ok"} and isinstance(doc["ok"], bool)


@pytest.mark.slow
def test_generate_lookup_and_text_output():
    proc = run_cli(
        "generate", "x = 1\ny = 2\nx = 1\ny =", "--drafter", "lookup", "--max-new-tokens", "8"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("x = 1\ny = 2\nx = 1\ny =")
    assert "tokens/s" in proc.stderr and "acceptance" in proc.stderr


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """Two tiny target/draft folders sharing a tokenizer, and one with another vocabulary."""
    root = tmp_path_factory.mktemp("models")
    texts = ["def f(x):\n    return x + 1\n" * 20, "hello world, hello specjax\n" * 20]
    tok = train_tokenizer(texts, vocab_size=300)
    v = tok.get_vocab_size()

    def make(name, vocab, seed, max_pos=256):
        config = tiny_config(
            vocab,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            max_position_embeddings=max_pos,
            eos_token_id=eos_id(tok),
        )
        model = Model.random(config, seed=seed).replace(tokenizer=tok if vocab == v else None)
        save_pretrained(model, root / name)
        return str(root / name)

    return {
        "target": make("target", v, 0),
        "draft": make("draft", v, 1),
        "other_vocab": make("other", v + 7, 2),
    }


def _on_target(folders) -> tuple:
    """``generate "def f(x):" --model TARGET``: the start of a decode of the target folder."""
    return ("generate", "def f(x):", "--model", folders["target"])


def _on_pair(folders) -> tuple:
    """`_on_target` with ``--draft DRAFT``."""
    return (*_on_target(folders), "--draft", folders["draft"])


# Slow tier: 10 s.
@pytest.mark.slow
def test_generate_with_model_folders(model_folders):
    proc = run_cli(*_on_pair(model_folders), *"--max-new-tokens 6 --json --compare".split())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["equals_plain_at_width"] is True


def _spy_on_models(monkeypatch) -> dict:
    """``{"target", "draft"}``: the models the CLI decodes with, after its flags."""
    from specjax.text import drafting

    seen = {}
    real = drafting.with_draft_settings

    def spy(target, drafter, options):
        target, drafter = real(target, drafter, options)
        seen["target"], seen["draft"] = target, getattr(drafter, "model", None)
        return target, drafter

    monkeypatch.setattr(drafting, "with_draft_settings", spy)
    return seen


@pytest.mark.parametrize(
    "flags, quantized",
    [
        (("--draft-quantize", "int8"), (None, "int8")),
        (("--quantize", "int8-weights", "--draft-quantize", "none"), ("int8-weights", None)),
        (("--quantize", "int8-weights"), ("int8-weights", "int8-weights")),
        (("--quantize", "int8"), ("int8", "int8")),
    ],
)
# Slow tier: 17 s a case (--compare decodes twice); tests/test_quant.py's fast cases
# keep the library's equality, the user-error tests below the flags' checks.
@pytest.mark.slow
def test_generate_with_quantized_models_is_greedy_exact(
    cli_in_process, model_folders, flags, quantized, monkeypatch
):
    """--quantize / --draft-quantize reach the models, and the quantized target's
    speculative output equals its plain output at the same forward width (an int8
    target with int8 activations too)."""
    seen = _spy_on_models(monkeypatch)
    proc = cli_in_process(
        *_on_pair(model_folders), *"--max-new-tokens 6 --json --compare".split(), *flags
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["equals_plain_at_width"] is True
    assert (seen["target"].quantization, seen["draft"].quantization) == quantized


# Slow tier: --compare decodes twice (~15 s a case); tests/test_head_ids.py and
# tests/test_continuous_batching.py keep the library's equality in the fast tier, the
# bad-input cases below the flags' checks.
@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ("--draft-head", "40", "--draft-quantize", "int8"),
        ("--gamma", "4", "--draft-confidence", "1.0"),
    ],
    ids=["draft-head", "draft-confidence"],
)
def test_draft_flags_reach_the_draft_and_stay_exact(
    cli_in_process, model_folders, monkeypatch, flags
):
    seen = _spy_on_models(monkeypatch)
    proc = cli_in_process(
        *_on_pair(model_folders), *"--max-new-tokens 8 --json --compare".split(), *flags
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["equals_plain_at_width"] is True
    if "--draft-head" in flags:
        head = seen["draft"].head_ids
        assert head is not None and len(head) == 40
    else:
        # τ = 1: one draft per call (a softmax is below 1), so at most 2 tokens per call.
        assert report["tokens_per_target_call"] <= 2.0


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--drafter", "lookup", "--draft-head", "8"), "--draft-head needs a draft model"),
        (("--draft-head", "0"), "--draft-head must be in [1, "),
        (("--draft-head", "100000000"), "--draft-head must be in [1, "),
        (("--draft-confidence", "1.5"), "--draft-confidence must be in [0, 1], got 1.5"),
        (("--draft-confidence", "-0.1"), "--draft-confidence must be in [0, 1]"),
        (("--drafter", "lookup", "--draft-confidence", "0.5"), "it needs --drafter model"),
        (("--tree", "2,1", "--draft-confidence", "0.5"), "and no --tree"),
    ],
)
def test_draft_flags_bad_input_is_named(cli_in_process, model_folders, flags, message):
    draft = () if "lookup" in flags else ("--draft", model_folders["draft"])
    proc = cli_in_process(*_on_target(model_folders), *draft, "--max-new-tokens", "8", *flags)
    assert_user_error(proc, message)


def test_draft_quantize_needs_a_draft_model(cli_in_process, model_folders):
    proc = cli_in_process(
        *_on_target(model_folders), *"--drafter lookup --draft-quantize int8".split()
    )
    assert_user_error(proc, "--draft-quantize needs a draft model")


# Slow tier: 10 s: --compare times both decoders.
@pytest.mark.slow
def test_generate_compare_reports_medians_of_interleaved_runs(model_folders):
    proc = run_cli(
        *_on_pair(model_folders),
        *"--max-new-tokens 4 --json --compare --repeats 3 --gamma 4".split(),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["repeats"] == 3
    spec, plain = out["speculative_seconds_runs"], out["plain_seconds_runs"]
    assert len(spec) == len(plain) == 3 and min(spec + plain) > 0
    assert out["seconds"] == pytest.approx(statistics.median(spec))
    assert out["plain_seconds"] == pytest.approx(statistics.median(plain))
    assert out["tokens_per_second"] == pytest.approx(out["tokens"] / statistics.median(spec))
    assert out["plain_tokens_per_second"] == pytest.approx(out["tokens"] / statistics.median(plain))
    assert out["speedup"] == pytest.approx(
        out["tokens_per_second"] / out["plain_tokens_per_second"]
    )
    # As many tokens on both sides, so the speedup is also the ratio of the median times.
    assert out["speedup"] == pytest.approx(statistics.median(plain) / statistics.median(spec))
    assert out["forward_width"] == 5 and out["equals_plain_at_width"] is True


# Slow tier: 10 s, a model-folder decode in a fresh process; --repeats' bad values stay
# in the fast tier.
@pytest.mark.slow
def test_generate_repeats_summary_line(model_folders):
    proc = run_cli(
        *_on_target(model_folders),
        *"--drafter lookup --max-new-tokens 4 --no-stream --compare --repeats 2".split(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "median of 2 interleaved runs" in proc.stderr


def test_help_shows_the_defaults_and_the_drafter_of_a_model(cli_in_process):
    from specjax.text.defaults import DEFAULTS

    proc = cli_in_process("generate", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert f"tokens to generate (EOS included) (default: {DEFAULTS.max_new_tokens})" in text
    assert f"0 = greedy (default: {DEFAULTS.temperature})" in text
    assert f"(default: {DEFAULTS.draft_mode})" in text  # --block-mode
    # What --model picks without --draft, and what auto is for the bundled pair.
    assert "Without --draft (or --block-drafter), --drafter auto drafts by prompt lookup" in text
    assert f"for the bundled pair the draft model ({DEFAULTS.bundled_drafter})" in text
    assert "the generation runs once" in text  # --repeats


def _count_decodes(monkeypatch) -> list:
    """The runs `specjax generate` decodes, one entry each."""
    from specjax.cli import generate as cli_generate

    calls, real = [], cli_generate._decode_open

    def counting(*args, **kwargs):
        calls.append(args[2] is not None)  # speculative?
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_generate, "_decode_open", counting)
    return calls


@pytest.mark.parametrize(
    "flags, runs, repeats",
    # Once by default; a first run and N timed ones with --repeats N; with --compare,
    # also plain decoding's warm-up, 5 timed runs of each, and plain decoding at the
    # speculative width for the equality check.
    [((), 1, 0), (("--repeats", "2"), 3, 2), (("--compare",), 13, 5)],
    ids=["default", "repeats", "compare"],
)
def test_generate_runs_once_unless_asked_to_repeat(
    cli_in_process, model_folders, monkeypatch, flags, runs, repeats
):
    calls = _count_decodes(monkeypatch)
    proc = cli_in_process(
        *_on_target(model_folders),
        *"--drafter lookup --gamma 4 --max-new-tokens 3 --json".split(),
        *flags,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(calls) == runs and out["repeats"] == repeats
    assert len(out["speculative_seconds_runs"]) == repeats
    if not repeats:  # the one run's time, compile included
        assert out["seconds"] == out["compile_seconds"] > 0


def test_generate_repeats_must_be_positive(cli_in_process):
    proc = cli_in_process("generate", "hi", "--compare", "--repeats", "0")
    assert_user_error(proc, "--repeats")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize(
    "case, args, fragments",
    [
        ("empty prompt", ["   "], ["prompt is empty"]),
        ("unknown option", ["hi", "--bogus"], ["unrecognized arguments: --bogus"]),
        ("bad gamma", ["hi", "--gamma", "-1"], ["--gamma must be >= 0"]),
        ("bad top-p", ["hi", "--top-p", "1.5"], ["--top-p"]),
        ("bad penalty", ["hi", "--repetition-penalty", "0"], ["--repetition-penalty"]),
        ("empty stop", ["hi", "--stop", ""], ["--stop", "non-empty"]),
        ("bad regex", ["hi", "--regex", "(ab"], ["--regex", "not a valid regex"]),
        ("no schema file", ["hi", "--json-schema", "/nonexistent.json"], ["--json-schema"]),
        ("missing folder", ["hi", "--model", "/nonexistent/model"], ["no such directory"]),
        ("bad width", ["hi", "--forward-width", "0"], ["--forward-width must be >= 1"]),
        (
            "narrow width",
            ["hi", "--drafter", "lookup", "--gamma", "3", "--forward-width", "3"],
            ["--forward-width 3 is narrower than one verify forward", "--forward-width 4"],
        ),
    ],
)
def test_bad_input_one_line_error(case, args, fragments, cli_in_process):
    assert_user_error(cli_in_process("generate", *args), *fragments)


def test_bad_input_is_one_line_from_a_real_process():
    proc = run_cli("generate", "hi", "--gamma", "-1")
    assert_user_error(proc, "--gamma")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# Slow tier: 9 s: several broken model folders through the CLI.
@pytest.mark.slow
def test_bad_model_folders(model_folders, tmp_path):
    target = model_folders["target"]
    proc = run_cli("generate", "def f", "--model", target, "--draft", model_folders["other_vocab"])
    assert_user_error(proc, "vocabulary")

    proc = run_cli("generate", "def f(x): " * 120, "--model", target, "--draft", target)
    assert_user_error(proc, "context")

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (corrupt / name).write_bytes((open(os.path.join(target, name), "rb")).read())
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    assert_user_error(run_cli("generate", "def f", "--model", str(corrupt)), "--model")

    missing = tmp_path / "weights_missing"
    missing.mkdir()
    (missing / "config.json").write_bytes((open(os.path.join(target, "config.json"), "rb")).read())
    assert_user_error(run_cli("generate", "def f", "--model", str(missing)), "--model")


# Slow tier: 12 s: trains and distils through the CLI.
@pytest.mark.slow
def test_train_and_distill_commands(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("def add(a, b):\n    return a + b\n" * 50)
    (corpus / "b.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    common = ["--steps", "3", "--batch-size", "2", "--seq-len", "32", "--vocab-size", "300"]
    proc = run_cli("train", str(corpus), "--out", str(tmp_path / "t"), *common)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t" / "config.json").exists() and (
        tmp_path / "t" / "tokenizer.json"
    ).exists()
    proc = run_cli(
        "distill",
        str(corpus),
        "--model",
        str(tmp_path / "t"),
        "--out",
        str(tmp_path / "d"),
        "--size",
        "tiny",
        *common,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "d" / "model.safetensors").exists()
    assert_user_error(
        run_cli("train", str(tmp_path / "nope"), "--out", str(tmp_path / "x")), "nope"
    )


# Slow tier: 29 s: trains a block drafter, then generates with it.
@pytest.mark.slow
def test_train_drafter_then_generate_with_it(model_folders, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 60)
    out = tmp_path / "block"
    train = (
        "train-drafter",
        str(corpus),
        "--model",
        model_folders["target"],
        "--out",
        str(out),
        *"--steps 3 --batch-size 2 --seq-len 32 --anchors 2 --layers 1 --block-size 4".split(),
    )
    proc = run_cli(*train)
    assert proc.returncode == 0, proc.stderr
    assert (out / "block_drafter.json").is_file() and (out / "model.safetensors").is_file()
    before = (out / "model.safetensors").read_bytes()
    # A second run never replaces the drafter without --overwrite or --resume.
    assert_user_error(run_cli(*train), "--out", "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before

    on_target = _on_target(model_folders)
    with_block = (*on_target, "--drafter", "block", "--block-drafter", str(out))
    gen = run_cli(*with_block, *"--max-new-tokens 6 --json --compare --repeats 1".split())
    assert gen.returncode == 0, gen.stderr
    result = json.loads(gen.stdout)
    # gamma auto measured up to its saved γ (block 4: γ 3); --gamma 3 pins it.
    assert len(result["auto"]["draft_seconds_by_gamma"]) == 3
    assert result["drafter"] == ("block" if result["gamma"] else "none")
    assert result["equals_plain_at_width"] is True
    pinned_flags = "--max-new-tokens 6 --json --repeats 1 --gamma 3".split()
    pinned = run_cli(*with_block, *pinned_flags)
    assert pinned.returncode == 0, pinned.stderr
    pinned = json.loads(pinned.stdout)
    missing = run_cli(*on_target, "--drafter", "block")
    assert_user_error(missing, "--block-drafter")
    # --drafter PATH is --drafter block --block-drafter PATH: the same tokens.
    by_path = run_cli(*on_target, "--drafter", str(out), *pinned_flags)
    assert by_path.returncode == 0, by_path.stderr
    by_path = json.loads(by_path.stdout)
    assert (by_path["drafter"], by_path["gamma"]) == ("block", 3)
    assert by_path["token_ids"] == pinned["token_ids"]
    assert by_path["target_calls"] == pinned["target_calls"]
    for bad in ("blok", str(tmp_path / "no_such_folder")):
        proc = run_cli("generate", "x", "--model", model_folders["target"], "--drafter", bad)
        assert_user_error(proc, "--drafter", bad, "block drafter folder")
    proc = run_cli(
        "generate",
        "x",
        "--model",
        model_folders["target"],
        "--drafter",
        str(out),
        "--block-drafter",
        str(tmp_path),
    )
    assert_user_error(proc, "--drafter", "--block-drafter", "two drafters")


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "block", "eagle"])
def test_generate_with_a_tree_greedy_equals_plain(drafter):
    """``--tree``: the bundled pair with a tree drafter; greedy output equals plain."""
    proc = run_cli(
        "generate",
        "def fibonacci(n):",
        *"--max-new-tokens 24 --compare --json --no-eos --drafter".split(),
        drafter,
        *"--tree 2,2,1 --repeats 1".split(),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["drafter"], out["gamma"]) == (drafter, 3)
    assert out["equals_plain_at_width"] is True
    assert out["tokens_per_target_call"] > 1.0


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--tree", "2,x"], ["--tree", "comma-separated"]),
        (["--tree", "2,0"], ["branching"]),
        (["--tree", "2,2", "--drafter", "lookup"], ["--tree", "lookup"]),
        (["--tree", "2,2", "--gamma", "3"], ["--gamma 3", "--tree 2,2", "disagree"]),
        (["--tree", "2,2,2,2,2,2,2,2", "--drafter", "block"], ["--tree", "block_size"]),
    ],
)
def test_generate_refuses_bad_trees(args, fragments, cli_in_process):
    proc = cli_in_process("generate", "x", "--max-new-tokens", "4", *args)
    assert_user_error(proc, *fragments)


@pytest.mark.slow
def test_generate_with_the_eagle_head_chain_greedy_equals_plain():
    proc = run_cli(
        "generate",
        "def fibonacci(n):",
        *"--max-new-tokens 24 --compare --json --no-eos".split(),
        *"--drafter eagle --repeats 1 --gamma 3".split(),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["drafter"] == "eagle" and out["equals_plain_at_width"] is True
    assert out["tokens_per_target_call"] > 1.0


def test_a_named_pair_gets_its_preset_unless_a_flag_sets_it(
    cli_in_process, model_folders, monkeypatch
):
    """--model/--draft giving the paths of the files of a pair with a
    `specjax.io.presets` entry (as its names do, tests/test_sampler.py): its settings,
    said on stderr; a flag keeps its own value. The loader is stubbed with a tiny model
    (no download)."""
    names = ("./Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "/m/Qwen2.5-Coder-0.5B-Instruct.gguf")
    from specjax.io import load_pretrained
    from specjax.io.presets import find
    from specjax.text import loading

    preset = find("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    from specjax.models.quant import quantize

    tiny = load_pretrained(model_folders["target"])
    loaded_as = []

    def load_model(path, argname, dtype, gguf_file=None, quantize=None, quantized=quantize):
        loaded_as.append(quantize)  # the preset's precision is applied as the model is read
        return tiny if quantize is None else quantized(tiny, quantize)

    monkeypatch.setattr(loading, "load_model", load_model)
    common = ("generate", "def f(x):", "--model", names[0], "--draft", names[1])
    common += ("--gamma", "2", "--max-new-tokens", "3", "--json")
    proc = cli_in_process(*common)
    assert proc.returncode == 0, proc.stderr
    assert loaded_as == ["int8", "int8"]
    said = f"this pair's preset (specjax.io.presets), {preset.target} + {preset.draft}"
    assert said in proc.stderr and ": --quantize int8 --draft-quantize int8" in proc.stderr
    assert json.loads(proc.stdout)["preset"] == preset.describe()
    proc = cli_in_process(*common, "--quantize", "int8-weights")
    assert said in proc.stderr and "--quantize int8 " not in proc.stderr, proc.stderr
    assert "--draft-quantize int8" in proc.stderr
    # Another drafter: nothing is applied.
    proc = cli_in_process(*common, "--drafter", "lookup")
    assert "preset" not in proc.stderr and json.loads(proc.stdout)["preset"] is None


def test_the_command_says_its_version(cli_in_process):
    import specjax

    assert cli_in_process("--version").stdout.strip() == f"specjax {specjax.__version__}"


@pytest.mark.slow
def test_version_gamma_zero_and_what_the_summary_says(cli_in_process):
    """``--version`` answers; ``--gamma 0`` decodes plainly (what auto may choose); the
    summary names the decoder and its γ, and says when the answer was cut short."""
    import specjax

    assert cli_in_process("--version").stdout.strip() == f"specjax {specjax.__version__}"
    args = ("generate", "def f(x):", "--max-new-tokens", "4", "--no-stream", "--no-eos")
    plain = cli_in_process(*args, "--gamma", "0")
    assert plain.returncode == 0, plain.stderr
    assert "[plain] 4 tokens" in plain.stderr and "cut at --max-new-tokens 4" in plain.stderr
    lookup = cli_in_process(*args, "--drafter", "lookup", "--gamma", "2")
    assert "[PromptLookup, gamma 2]" in lookup.stderr, lookup.stderr


def test_gamma_is_a_whole_number_or_auto(cli_in_process):
    proc = cli_in_process("generate", "def f(x):", "--gamma", "three")
    assert proc.returncode == 2
    assert "--gamma: must be a whole number or 'auto', got 'three'" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_gamma_auto_measures_once_chooses_and_equals_plain(tmp_path):
    """The default γ is auto. The bundled pair with its block drafter (γ = 2): the first
    run times this machine (widths 1..3, γ 1..2) and says what it chose and why; the
    output equals plain decoding at the chosen width; a second run reads the costs from
    the cache instead of timing again, and --verbose gives the reason."""
    env_cache = {"SPECJAX_TUNING_CACHE": str(tmp_path)}
    args = (
        "generate",
        "def fibonacci(n):",
        *"--max-new-tokens 12 --compare --json --no-eos --drafter block --repeats 1".split(),
    )
    first = subprocess.run(
        [sys.executable, "-m", "specjax.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NO_COLOR="1", **env_cache),
    )
    assert first.returncode == 0, first.stderr
    assert "timing plain decoding at widths 1..3" in first.stderr
    out = json.loads(first.stdout)
    auto = out["auto"]
    assert len(auto["target_forward_seconds_by_width"]) == 3
    assert len(auto["draft_seconds_by_gamma"]) == 2
    assert auto["expected_speedup_by_gamma"][0] == 1.0
    gamma = auto["gamma"]
    assert out["gamma"] == gamma and out["forward_width"] == gamma + 1
    assert auto["expected_speedup"] == max(
        [1.0] + [s for s in auto["expected_speedup_by_gamma"][1:] if s >= 1.05]
    )
    assert out["drafter"] == ("none" if gamma == 0 else "block")
    review = auto["expected_at_this_run"]  # the cost model at this run's own acceptance
    if gamma:
        assert out["equals_plain_at_width"] is True
        judged = out["acceptance_by_position"][0] if out["position_reached"][0] else None
        assert review["acceptance_by_position"][0] == pytest.approx(
            auto["acceptance_by_position"][0] if judged is None else judged
        )
        assert len(review["expected_speedup_by_gamma"]) == 3
    else:
        assert review is None
    assert f"gamma auto: {auto['reason']}" in first.stderr
    assert auto["achieved_speedup"] == out["speedup"] and auto["measured_now"] is True
    second = subprocess.run(
        [sys.executable, "-m", "specjax.cli", *args, "--verbose"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NO_COLOR="1", **env_cache),
    )
    assert second.returncode == 0, second.stderr
    assert "timing plain decoding" not in second.stderr
    again = json.loads(second.stdout)["auto"]
    assert again["measured_now"] is False and f"gamma auto: {again['reason']}" in second.stderr
    assert ("this run's acceptance by position" in second.stderr) == (again["gamma"] > 0)
    assert again["target_forward_seconds_by_width"] == auto["target_forward_seconds_by_width"]


@pytest.mark.parametrize(
    ("flag", "value", "shown"),
    [("--temperature", "-1", "got -1.0"), ("--top-k", "-3", "got -3"), ("--top-p", "2", "got 2.0")],
)
def test_bad_settings_show_the_value_as_given(cli_in_process, flag, value, shown):
    proc = cli_in_process("generate", "def f(x):", flag, value)
    assert proc.returncode == 2
    assert shown in proc.stderr and "array(" not in proc.stderr, proc.stderr
