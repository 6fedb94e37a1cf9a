"""Bad input, as a new user would give it: one clear error that names the argument.

Organised by entry point. Every case asserts the exception type and that the
message names the argument (or, for the CLI, the flag). Cases that could lose
data assert that the old checkpoint still loads and still computes the same
logits. Tests run as root, so a full disk (ENOSPC) and a permission error
(EACCES) are simulated by stubbing the write or the rename part-way through.
"""

import errno
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from safetensors.numpy import load_file, save_file

from specjax import cli
from specjax import training as train
from specjax.io import load_pretrained, save_pretrained
from specjax.models import ModelConfig
from specjax.testing import tiny_config, tiny_model
from specjax.training import tokenizer as tokenizer_lib

V = 64
TOKENS_BT = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) * 5 % V)


def logits_of(model) -> np.ndarray:
    return np.asarray(jax.jit(train.forward)(model, TOKENS_BT))


def assert_same_logits(folder, model) -> None:
    np.testing.assert_array_equal(logits_of(load_pretrained(folder)), logits_of(model))


@pytest.fixture(scope="module")
def llama():
    return tiny_model(seed=0, vocab_size=V)


@pytest.fixture(scope="module")
def llama_other():
    return tiny_model(seed=1, vocab_size=V)


@pytest.fixture(scope="module")
def qwen3():
    return tiny_model(seed=2, vocab_size=V, model_type="qwen3")


def leftovers(parent, keep) -> list[str]:
    """Entries next to the checkpoint that a save should not have left behind."""
    return sorted(set(os.listdir(parent)) - set(keep))


# --- save_pretrained / load_pretrained ---


def test_save_refuses_a_folder_holding_another_checkpoint(tmp_path, llama, qwen3):
    folder = tmp_path / "ckpt"
    save_pretrained(qwen3, folder)
    (folder / "README.md").write_text("my notes")
    with pytest.raises(ValueError, match=r"qwen3 checkpoint.*overwrite=True"):
        save_pretrained(llama, folder)
    assert (folder / "README.md").read_text() == "my notes"
    assert_same_logits(folder, qwen3)

    save_pretrained(llama, folder, overwrite=True)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]  # README gone
    assert_same_logits(folder, llama)
    assert leftovers(tmp_path, ["ckpt"]) == []


@pytest.mark.parametrize(
    "contents, what",
    [
        ({"notes.txt": "x"}, "no config.json|other files"),
        ({"config.json": "[1, 2]"}, "config.json without a model_type"),
        ({"model.safetensors": "x"}, "weight files without a config.json"),
    ],
)
def test_save_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, llama, contents, what):
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"path .*({what}).*overwrite"):
        save_pretrained(llama, tmp_path)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == contents


def test_save_refuses_a_same_family_checkpoint_with_other_files(tmp_path, llama, llama_other):
    save_pretrained(llama, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "README.md").write_text("card")
    with pytest.raises(ValueError, match=r"other files \(README\.md\).*overwrite=True"):
        save_pretrained(llama_other, tmp_path / "ckpt")
    assert_same_logits(tmp_path / "ckpt", llama)


def test_save_over_the_same_family_replaces_it_whole(tmp_path, llama, llama_other):
    folder = tmp_path / "ckpt"
    save_pretrained(llama, folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").exists()
    save_pretrained(llama_other, folder)  # unsharded now: no stale shard or index remains
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
    assert_same_logits(folder, llama_other)
    assert leftovers(tmp_path, ["ckpt"]) == []


def test_saved_files_get_the_default_mode_not_safetensors_0600(tmp_path, llama):
    probe = tmp_path / "probe"
    probe.touch()
    default = probe.stat().st_mode & 0o777
    save_pretrained(llama, tmp_path / "ckpt")
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "ckpt").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {default}, modes


def test_save_to_a_file_is_refused(tmp_path, llama):
    (tmp_path / "model").write_text("not a folder")
    with pytest.raises(ValueError, match="path .* is a file"):
        save_pretrained(llama, tmp_path / "model", overwrite=True)
    assert (tmp_path / "model").read_text() == "not a folder"


def _failing_save_file(fail_on_call: int, code: int):
    """``save_file`` that writes half a file and raises ``OSError(code)`` on one call."""
    real = safetensors.numpy.save_file
    calls = []

    def stub(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == fail_on_call:
            with open(filename, "wb") as f:
                f.write(b"\x00" * 100)  # part of the file reached the disk
            raise OSError(code, os.strerror(code), filename)
        return real(tensors, filename, metadata=metadata)

    return stub


def _failing_replace(fail_on_call: int, code: int):
    """``os.replace`` that raises ``OSError(code)`` on one call and renames otherwise."""
    real = os.replace
    calls = []

    def stub(src, dst, *args, **kwargs):
        calls.append((src, dst))
        if len(calls) == fail_on_call:
            raise OSError(code, os.strerror(code), str(src))
        return real(src, dst, *args, **kwargs)

    return stub


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES], ids=["full_disk", "permission"])
@pytest.mark.parametrize(
    "stage",
    ["first_shard", "second_shard", "rename_old_away", "rename_new_in"],
)
def test_failed_save_leaves_the_old_checkpoint_loadable(
    tmp_path, monkeypatch, llama, llama_other, code, stage
):
    folder = tmp_path / "ckpt"
    save_pretrained(llama, folder, max_shard_size="20KB")
    before = sorted(os.listdir(folder))
    if stage.endswith("shard"):
        fail = 1 if stage == "first_shard" else 2
        monkeypatch.setattr(safetensors.numpy, "save_file", _failing_save_file(fail, code))
    else:
        fail = 1 if stage == "rename_old_away" else 2
        monkeypatch.setattr(os, "replace", _failing_replace(fail, code))
    with pytest.raises(OSError) as info:
        save_pretrained(llama_other, folder, max_shard_size="20KB")
    assert info.value.errno == code
    monkeypatch.undo()
    assert sorted(os.listdir(folder)) == before
    assert_same_logits(folder, llama)
    assert leftovers(tmp_path, ["ckpt"]) == []  # the temporary folder is cleaned up


def test_failed_first_save_leaves_nothing(tmp_path, monkeypatch, llama):
    monkeypatch.setattr(safetensors.numpy, "save_file", _failing_save_file(1, errno.ENOSPC))
    with pytest.raises(OSError, match="No space left"):
        save_pretrained(llama, tmp_path / "new")
    assert os.listdir(tmp_path) == []


def test_config_json_holding_a_list(tmp_path, llama):
    save_pretrained(llama, tmp_path)
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object.*list"):
        load_pretrained(tmp_path)


def test_index_without_weight_map(tmp_path, llama):
    save_pretrained(llama, tmp_path, max_shard_size="20KB")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match="weight_map"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_attention_heads", 0),
        ("hidden_size", 0),
        ("vocab_size", -1),
        ("num_hidden_layers", 0),
        ("num_key_value_heads", 0),
        ("intermediate_size", 2.5),
    ],
)
def test_non_positive_sizes_in_config_json_are_named(tmp_path, llama, field, value):
    save_pretrained(llama, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises((ValueError, TypeError), match=f"config.json {field}"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_heads", 0),
        ("num_kv_heads", 0),
        ("vocab_size", 0),
        ("head_dim", -2),
        ("max_position_embeddings", 0),
        ("rms_norm_eps", 0.0),
        ("rope_theta", math.nan),
    ],
)
def test_model_config_names_a_bad_size(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


def test_model_config_refuses_a_float_size():
    with pytest.raises(TypeError, match="hidden_size"):
        ModelConfig(hidden_size=64.0)


@pytest.mark.parametrize("dtype", [jnp.int32, np.bool_, "not a dtype"])
def test_load_pretrained_needs_a_floating_dtype(tmp_path, llama, dtype):
    save_pretrained(llama, tmp_path)
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        load_pretrained(tmp_path, dtype=dtype)


def test_integer_tensor_is_refused_not_cast(tmp_path, llama):
    save_pretrained(llama, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name].astype(np.int32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{name} is stored as I32"):
        load_pretrained(tmp_path)


# --- train ---

SEQ = 16
TRAIN_TOKENS = np.random.default_rng(0).integers(0, V, 512).astype(np.int32)


def small_config(**kw):
    base = dict(steps=2, batch_size=2, seq_len=SEQ, warmup_steps=0, progress=False, log_every=1)
    return train.TrainConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("learning_rate", math.nan, ValueError),
        ("learning_rate", math.inf, ValueError),
        ("learning_rate", 0.0, ValueError),
        ("learning_rate", -1e-3, ValueError),
        ("learning_rate", "1e-3", TypeError),
        ("batch_size", 0, ValueError),
        ("seq_len", 0, ValueError),
        ("steps", 0, ValueError),
        ("steps", 2.5, TypeError),
        ("seed", 10**30, ValueError),
        ("b2", 1.0, ValueError),
        ("eps", 0.0, ValueError),
        ("grad_clip", 0.0, ValueError),
        ("warmup_steps", -1, ValueError),
        ("max_minutes", -1.0, ValueError),
        ("keep_checkpoints", 0, ValueError),
        ("kl_weight", math.nan, ValueError),
    ],
)
def test_train_config_refuses_garbage(field, value, error):
    with pytest.raises(error, match=field):
        small_config(**{field: value})


@pytest.mark.parametrize(
    "tokens, error, fragment",
    [
        (np.append(TRAIN_TOKENS, V), ValueError, f"tokens holds {V}"),
        (np.append(TRAIN_TOKENS, -1), ValueError, "tokens holds -1"),
        (list(TRAIN_TOKENS) + [2**32 + 5], ValueError, "tokens holds 4294967301"),
        (jnp.asarray(np.append(TRAIN_TOKENS, V + 3)), ValueError, f"tokens holds {V + 3}"),
        (TRAIN_TOKENS.astype(np.float32), TypeError, "tokens must hold integers"),
        (TRAIN_TOKENS.reshape(2, -1), ValueError, "tokens must have rank 1"),
        (TRAIN_TOKENS[:SEQ], ValueError, "tokens holds 16 ids, too few .*seq_len"),
    ],
    ids=["id_V", "negative", "beyond_int32", "device_array", "floats", "2d", "too_short"],
)
def test_train_refuses_bad_tokens_before_anything_is_saved(
    tmp_path, llama, tokens, error, fragment
):
    with pytest.raises(error, match=fragment):
        train.train(llama, tokens, small_config(), checkpoint_dir=tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_train_refuses_seq_len_beyond_the_context(tmp_path):
    model = tiny_model(vocab_size=V, max_position_embeddings=8)
    with pytest.raises(ValueError, match="seq_len=16 is beyond the model's context"):
        train.train(model, TRAIN_TOKENS, small_config(), checkpoint_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_train_refuses_a_teacher_with_another_vocabulary(llama):
    teacher = tiny_model(seed=3, vocab_size=V + 8)
    with pytest.raises(ValueError, match=f"teacher has a vocabulary of {V + 8}"):
        train.train(llama, TRAIN_TOKENS, small_config(), teacher=teacher)


def test_train_refuses_wrong_argument_types(llama):
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        train.train(llama, TRAIN_TOKENS, {"steps": 2})
    with pytest.raises(TypeError, match="teacher must be a specjax Model"):
        train.train(llama, TRAIN_TOKENS, small_config(), teacher="target")


def test_train_refuses_a_file_as_checkpoint_dir(tmp_path, llama):
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(ValueError, match="checkpoint_dir .* is a file"):
        train.train(llama, TRAIN_TOKENS, small_config(), checkpoint_dir=tmp_path / "ckpt")


def test_nan_weights_stop_at_step_1_and_save_nothing(tmp_path, llama):
    params = jax.tree.map(lambda p: p.at[(0,) * p.ndim].set(jnp.nan), llama.params)
    broken = llama.replace(params=params)
    with pytest.raises(FloatingPointError, match="step 1.*no checkpoint"):
        train.train(broken, TRAIN_TOKENS, small_config(), checkpoint_dir=tmp_path)
    assert train.list_checkpoints(tmp_path) == []
    state = train.init_train_state(broken, small_config())
    with pytest.raises(FloatingPointError, match="not finite; checkpoint not saved"):
        train.save_checkpoint(tmp_path, broken, state, small_config(), [])
    assert os.listdir(tmp_path) == []


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, llama):
    # lr 1e30: step 1 is finite but leaves weights near 1e30, so step 2 overflows.
    config = small_config(steps=4, learning_rate=1e30, checkpoint_every=1)
    with pytest.raises(FloatingPointError, match="step 2.*step_00000001"):
        train.train(llama, TRAIN_TOKENS, config, checkpoint_dir=tmp_path)
    assert [p.name for p in train.list_checkpoints(tmp_path)] == ["step_00000001"]


def test_failed_checkpoint_resave_keeps_the_old_one(tmp_path, monkeypatch, llama):
    config = small_config(steps=1)
    result = train.train(llama, TRAIN_TOKENS, config, checkpoint_dir=tmp_path)
    (ckpt,) = train.list_checkpoints(tmp_path)
    state, losses = train.load_checkpoint(ckpt, llama, config)
    monkeypatch.setattr(safetensors.numpy, "save_file", _failing_save_file(1, errno.ENOSPC))
    with pytest.raises(OSError, match="No space left"):
        train.save_checkpoint(tmp_path, llama, state, config, losses)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [ckpt.name]
    assert_same_logits(ckpt, result.model)
    assert train.load_checkpoint(ckpt, llama, config)[1] == result.losses


# --- CLI ---

CLI_SMALL = [
    *"--steps 2 --batch-size 2 --vocab-size 280 --size tiny --checkpoint-every 0".split(),
    *("--seq-len", str(SEQ)),
]


def run_cli(capsys, *args) -> tuple[int, list[str]]:
    """``specjax.cli.main`` in-process: the exit status and the ``specjax`` stderr lines."""
    capsys.readouterr()
    rc = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    # tqdm may draw a progress bar before a late error; the error is its own line.
    return rc, [line for line in err.splitlines() if line.startswith("specjax")]


def assert_one_line_error(rc, lines, *fragments, status=2):
    assert rc == status, lines
    assert len(lines) == 1 and "error:" in lines[0], lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("def add(a, b):\n    return a + b\n" * 40 + "the quick brown fox\n" * 40)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """The output folder of one successful `specjax train` (copy it before changing it)."""
    out = tmp_path_factory.mktemp("trained") / "model"
    assert cli.main(["train", str(corpus), "--out", str(out), *CLI_SMALL]) == 0
    return out


def copy_of(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--steps", "0"], "--steps"),
        (["--batch-size", "0"], "--batch-size"),
        (["--seq-len", "0"], "--seq-len"),
        (["--lr", "nan"], "--lr"),
        (["--lr", "0"], "--lr"),
        (["--lr", "-1"], "--lr"),
        (["--seed", str(10**30)], "--seed"),
        (["--vocab-size", "100"], "--vocab-size"),
        (["--max-minutes", "-1"], "--max-minutes"),
        (["--checkpoint-every", "-1"], "--checkpoint-every"),
        (["--steps", "abc"], "--steps"),
        (["--resume", "--overwrite"], "--overwrite"),
    ],
)
def test_cli_bad_flags_fail_before_training(capsys, tmp_path, corpus, flags, fragment):
    rc, lines = run_cli(capsys, "train", corpus, "--out", tmp_path / "out", *CLI_SMALL, *flags)
    assert_one_line_error(rc, lines, fragment)
    assert not (tmp_path / "out").exists()


def test_cli_out_is_a_file(capsys, tmp_path, corpus):
    (tmp_path / "out").write_text("keep me")
    rc, lines = run_cli(capsys, "train", corpus, "--out", tmp_path / "out", *CLI_SMALL)
    assert_one_line_error(rc, lines, "--out", "is a file")
    assert (tmp_path / "out").read_text() == "keep me"


def test_cli_never_replaces_a_model_without_overwrite(capsys, tmp_path, corpus, trained):
    out = copy_of(trained, tmp_path)
    model = load_pretrained(out)
    rc, lines = run_cli(capsys, "train", corpus, "--out", out, *CLI_SMALL, "--seed", "1")
    assert_one_line_error(rc, lines, "--out", "--overwrite", "--resume")
    assert_same_logits(out, model)

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    notes = tmp_path / "notes"
    rc, lines = run_cli(capsys, "train", corpus, "--out", notes, *CLI_SMALL, "--resume")
    assert_one_line_error(rc, lines, "--out", "not the output of a training run")
    assert os.listdir(tmp_path / "notes") == ["todo.txt"]


def test_cli_overwrite_replaces_the_model_whole(capsys, tmp_path, corpus, trained):
    out = copy_of(trained, tmp_path)
    old = load_pretrained(out)
    (out / "README.md").write_text("stale")
    rc, _ = run_cli(capsys, "train", corpus, "--out", out, *CLI_SMALL, "--seed", "1", "--overwrite")
    assert rc == 0
    assert sorted(os.listdir(out)) == [
        "checkpoints",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert not np.array_equal(logits_of(load_pretrained(out)), logits_of(old))
    assert leftovers(tmp_path, ["model"]) == []


def test_cli_full_disk_keeps_the_old_model(capsys, tmp_path, monkeypatch, corpus, trained):
    out = copy_of(trained, tmp_path)
    old = load_pretrained(out)
    monkeypatch.setattr(safetensors.numpy, "save_file", _failing_save_file(1, errno.ENOSPC))
    rc, lines = run_cli(capsys, "train", corpus, "--out", out, *CLI_SMALL, "--overwrite")
    assert_one_line_error(rc, lines, "No space left", status=1)
    monkeypatch.undo()
    assert_same_logits(out, old)


def test_cli_resume_with_a_changed_config(capsys, tmp_path, corpus, trained):
    out = copy_of(trained, tmp_path)
    model = load_pretrained(out)
    rc, lines = run_cli(capsys, "train", corpus, "--out", out, *CLI_SMALL, "--resume", "--lr", ".5")
    assert_one_line_error(rc, lines, "learning_rate")
    other_vocab = [a if a != "280" else "270" for a in CLI_SMALL]
    rc, lines = run_cli(capsys, "train", corpus, "--out", out, *other_vocab, "--resume")
    assert_one_line_error(rc, lines, "--resume", "tokenizer")
    assert_same_logits(out, model)


def test_cli_diverging_run_saves_no_model(capsys, tmp_path, corpus):
    out = tmp_path / "out"
    rc, lines = run_cli(capsys, "train", corpus, "--out", out, *CLI_SMALL, "--lr", "1e30")
    assert_one_line_error(rc, lines, "step 2", "--lr")
    assert not (out / "config.json").exists()


def test_cli_distill_from_a_teacher_with_another_vocabulary(capsys, tmp_path, corpus, trained):
    tok = load_pretrained(trained).tokenizer
    teacher = tiny_model(vocab_size=tok.get_vocab_size() - 7).replace(tokenizer=tok)
    save_pretrained(teacher, tmp_path / "teacher")
    folder, out = tmp_path / "teacher", tmp_path / "d"
    rc, lines = run_cli(capsys, "distill", corpus, "--model", folder, "--out", out, *CLI_SMALL)
    assert_one_line_error(rc, lines, "--model", "vocabulary")
    assert not (tmp_path / "d").exists()


def test_cli_bad_target_folder(capsys, tmp_path, corpus):
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.json").write_text("[]")
    folder, out = tmp_path / "teacher", tmp_path / "d"
    rc, lines = run_cli(capsys, "distill", corpus, "--model", folder, "--out", out, *CLI_SMALL)
    assert_one_line_error(rc, lines, "--model", "JSON object")


# --- tokenizer ---


@pytest.fixture(scope="module")
def tok():
    return tokenizer_lib.train_tokenizer(["hello world, hello specjax\n" * 20], 300)


@pytest.mark.parametrize("text", ["some text", b"some bytes"])
def test_train_tokenizer_refuses_a_bare_string(text):
    with pytest.raises(TypeError, match="list of texts"):
        tokenizer_lib.train_tokenizer(text, 400)


def test_train_tokenizer_refuses_other_items():
    with pytest.raises(TypeError, match=r"texts_or_files\[1\] must be a str"):
        tokenizer_lib.train_tokenizer(["fine", 123], 400)
    with pytest.raises(TypeError, match="vocab_size"):
        tokenizer_lib.train_tokenizer(["fine"], 400.0)


@pytest.mark.parametrize("bad", [10**6, -1, 2**32 + 5])
def test_decode_refuses_ids_outside_the_vocabulary(tok, bad):
    with pytest.raises(ValueError, match=f"ids holds {bad}.*vocabulary"):
        tokenizer_lib.decode(tok, [1, 2, bad])


def test_decode_refuses_floats_and_accepts_empty(tok):
    with pytest.raises(TypeError, match="ids must hold integers"):
        tokenizer_lib.decode(tok, [1.0, 2.0])
    assert tokenizer_lib.decode(tok, []) == ""
    ids = tokenizer_lib.encode(tok, "hello world")
    assert tokenizer_lib.decode(tok, np.asarray(ids)) == "hello world"


# --- generate / speculative_generate / decoding.init ---
# Every case is refused on the host, before anything compiles, in both decoders (and the
# open loop's init, which shares the checks).

from flax import struct  # noqa: E402

import specjax  # noqa: E402
from specjax import decoding  # noqa: E402
from specjax.sampling import SamplingConfig, probs_from_logits, sample  # noqa: E402
from specjax.verification.chain import (  # noqa: E402
    coupled_verify,
    rejection_sample,
    rejection_sample_onehot,
)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab_size=V)


def _decoders(target):
    lookup = specjax.PromptLookup(num_draft=2)
    return {
        "generate": lambda key, prompts, **kw: specjax.generate(key, target, prompts, **kw),
        "speculative": lambda key, prompts, **kw: specjax.speculative_generate(
            key, target, lookup, prompts, **kw
        ),
        "init": lambda key, prompts, **kw: decoding.init(key, target, prompts, **kw),
    }


DECODER_CASES = [
    # (overrides, exception, message fragment)
    (dict(prompts=[[1, 2, 2**32 + 5]]), ValueError, r"prompts\[0\] holds 4294967301"),
    (dict(prompts=np.asarray([[1, 2, 2**32 + 5]], np.int64)), ValueError, "prompts holds"),
    (dict(prompts=[[1, 2, -3]]), ValueError, r"prompts hold token ids in \[-3"),
    (dict(prompts=[[1, 2, V]]), ValueError, "vocabulary"),
    (dict(prompts=[[1.5, 2]]), TypeError, r"prompts\[0\] must hold integers"),
    (dict(prompts="1 2 3"), TypeError, "prompts must be"),
    (dict(prompts=[list(range(1, 40)) * 20]), ValueError, "context"),
    (dict(max_new_tokens=2**30), ValueError, "max_new_tokens .*int32"),
    (dict(max_new_tokens=5, cache_len=10**9), ValueError, "cache_len asks for"),
    (dict(max_new_tokens=3.7), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens="5"), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens=None), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens=2**31), ValueError, "max_new_tokens must be in"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an integer, got a bool"),
    (dict(cache_len=64.0), TypeError, "cache_len must be an integer"),
    (dict(eos_id=2.7), TypeError, "eos_id must be an integer"),
    (dict(eos_id=-5), ValueError, r"eos_id must be in \[0, 63\]"),
    (dict(eos_id=V), ValueError, r"eos_id must be in \[0, 63\]"),
    (dict(sampling=0.7), TypeError, "sampling must be a specjax.SamplingConfig"),
    (dict(sampling={"temperature": 0.7}), TypeError, "sampling must be a specjax.SamplingConfig"),
    (dict(seeds=[2**40]), ValueError, "seeds holds"),
    (dict(sampling=SamplingConfig(vocab_limit=0)), ValueError, "vocab_limit must be >= 1"),
    (dict(sampling=SamplingConfig(vocab_limit=-3)), ValueError, "vocab_limit must be >= 1"),
    (
        dict(sampling=SamplingConfig(vocab_limit=V + 1)),
        ValueError,
        rf"vocab_limit must be in \[1, {V}\] \(the target's vocabulary size V = {V}\), got 65",
    ),
    (
        dict(sampling=SamplingConfig(vocab_limit=jnp.float32(60.0))),
        TypeError,
        "SamplingConfig.vocab_limit must be an integer",
    ),
    (
        dict(sampling=SamplingConfig(vocab_limit=np.asarray([60, 61]))),
        ValueError,
        r"SamplingConfig.vocab_limit has shape \[2\]",
    ),
    (dict(key=0), TypeError, "key must be a PRNG key"),
    (
        dict(key=None, sampling=SamplingConfig(temperature=1.0)),
        ValueError,
        r"key is None, but sampling.temperature is 1: .*key=jax\.random\.key\(0\)",
    ),
    (dict(key="jax.random.key(0)"), TypeError, "key must be a PRNG key"),
    (dict(key=jax.random.split(jax.random.key(0), 2)), ValueError, "key must be a single"),
    (dict(key=jnp.zeros((2,), jnp.float32)), TypeError, "key must be a PRNG key"),
    (dict(forward_width=0), ValueError, r"forward_width must be in \[1, "),
    (dict(forward_width=2.5), TypeError, "forward_width must be an integer, got float"),
    (dict(forward_width="4"), TypeError, "forward_width must be an integer, got str"),
    (dict(forward_width=True), TypeError, "forward_width must be an integer, got a bool"),
]


@pytest.mark.parametrize("entry", ["generate", "speculative", "init"])
@pytest.mark.parametrize("overrides, error, match", DECODER_CASES)
def test_decoders_refuse_bad_arguments(target, entry, overrides, error, match):
    args = dict(key=jax.random.key(0), prompts=[[1, 2, 3]], max_new_tokens=5) | overrides
    fn = _decoders(target)[entry]
    with pytest.raises(error, match=match):
        fn(args.pop("key"), args.pop("prompts"), **args)


@pytest.mark.parametrize(
    "drafter, width, match",
    [
        (specjax.PromptLookup(num_draft=2), 2, r"PromptLookup, which scores γ \+ 1 = 3 columns"),
        (
            specjax.DraftModel(tiny_model(seed=1)).with_tree((2, 1)),
            4,
            r"DraftModel, which scores the Tree\(nodes=4.*'s 5 nodes \(root included\): use "
            "forward_width >= 5",
        ),
    ],
)
@pytest.mark.parametrize("entry", ["speculative", "init"])
def test_a_forward_narrower_than_the_verify_is_refused(target, drafter, width, match, entry):
    call = {
        "speculative": lambda **kw: specjax.speculative_generate(drafter=drafter, **kw),
        "init": lambda **kw: decoding.init(drafter=drafter, **kw),
    }[entry]
    with pytest.raises(ValueError, match=f"forward_width={width} is narrower.*{match}"):
        call(
            key=jax.random.key(0),
            target=target,
            prompts=[[1, 2]],
            max_new_tokens=3,
            forward_width=width,
        )


def test_raw_uint32_keys_are_accepted(target):
    greedy = SamplingConfig.greedy()
    a = specjax.generate(jax.random.PRNGKey(0), target, [[1, 2]], max_new_tokens=4, sampling=greedy)
    b = specjax.generate(jax.random.key(0), target, [[1, 2]], max_new_tokens=4, sampling=greedy)
    assert a.to_lists() == b.to_lists()


GREEDY_FORMS = {
    "default": None,
    "scalar": SamplingConfig(temperature=0.0),
    "per_row": SamplingConfig(temperature=[0.0, 0.0]),
}


def _run_to_the_end(target, entry, key, sampling):
    prompts, kw = [[1, 2], [3]], dict(max_new_tokens=5, sampling=sampling)
    if entry == "init":
        decoder, state = decoding.init(key, target, prompts, **kw)
        return decoding.result(decoder, decoding.run(decoder, state))
    return _decoders(target)[entry](key, prompts, **kw)


@pytest.mark.parametrize("form", list(GREEDY_FORMS))
@pytest.mark.parametrize("entry", ["generate", "speculative", "init"])
def test_greedy_decoding_needs_no_key(target, entry, form):
    """key=None when every row is greedy: the default, a scalar 0 and a [B] of zeros."""
    sampling = GREEDY_FORMS[form]
    without = _run_to_the_end(target, entry, None, sampling)
    with_key = _run_to_the_end(target, entry, jax.random.key(7), sampling)
    assert without.to_lists() == with_key.to_lists()
    assert [len(row) for row in without.to_lists()] == [5, 5]


@pytest.mark.parametrize(
    "sampling, match",
    [
        (SamplingConfig(temperature=0.7), r"sampling.temperature is 0.7"),
        (SamplingConfig(temperature=[0.0, 1.0]), r"rows \[1\] of sampling.temperature are > 0"),
    ],
    ids=["scalar", "per_row"],
)
@pytest.mark.parametrize("entry", ["generate", "speculative", "init"])
def test_sampling_without_a_key_names_the_fix(target, entry, sampling, match):
    with pytest.raises(ValueError, match=rf"key is None, but {match}.*key=jax\.random\.key\(0\)"):
        _decoders(target)[entry](None, [[1, 2], [3]], max_new_tokens=5, sampling=sampling)


def test_a_traced_temperature_without_a_key_names_the_fix(target):
    """Inside a user's jit the temperature is unknown, so a key is required."""

    @jax.jit
    def run(temperature):
        sampling = SamplingConfig(temperature=temperature)
        return specjax.generate(None, target, [[1, 2]], max_new_tokens=3, sampling=sampling).tokens

    with pytest.raises(ValueError, match=r"temperature is traced.*key=jax\.random\.key\(0\)"):
        run(jnp.float32(0.0))


def test_output_width_follows_the_cache_not_the_budget(target):
    """max_new_tokens beyond what a 64-slot cache holds: a [B, 61] result, not [B, 10**6]."""
    out = specjax.generate(
        jax.random.key(0), target, [[1, 2, 3]], max_new_tokens=10**6, cache_len=64
    )
    assert out.tokens.shape == (1, 61)
    assert bool(out.truncated[0]) and int(out.lengths[0]) == 64 - 3


@pytest.mark.parametrize(
    "drafter, error, match",
    [
        (specjax.DraftModel(None), TypeError, "drafter.model must follow the model contract"),
        ("lookup", TypeError, "drafter must be a specjax Drafter"),
        (specjax.PromptLookup(num_draft=0), ValueError, "num_draft"),
        (specjax.DraftModel(tiny_model(seed=1, vocab_size=V + 1)), ValueError, "vocabulary size"),
    ],
)
def test_bad_drafters_are_refused(target, drafter, error, match):
    with pytest.raises(error, match=match):
        specjax.speculative_generate(jax.random.key(0), target, drafter, [[1]], max_new_tokens=3)


def test_a_model_given_as_the_drafter_suggests_draft_model(target):
    draft = tiny_model(seed=1, vocab_size=V)
    with pytest.raises(TypeError, match=r"wrap it: specjax.DraftModel\(draft_model, num_draft="):
        specjax.speculative_generate(jax.random.key(0), target, draft, [[1]], max_new_tokens=3)


@pytest.mark.parametrize("entry", ["generate", "speculative", "init"])
def test_a_flat_prompt_is_named_with_the_fix(target, entry):
    with pytest.raises(ValueError, match=r"got one flat list of 3 ids .* e\.g\. \[\[1, 2, 3\]\]"):
        _decoders(target)[entry](jax.random.key(0), [1, 2, 3], max_new_tokens=3)


def test_a_plain_nnx_module_is_pointed_at_the_contract():
    """An NNX module with a plain ``__call__(tokens)`` is told what the contract asks
    and where it is written, before anything is traced."""
    from flax import nnx

    class Plain(nnx.Module):
        def __init__(self):
            self.out = nnx.Linear(8, V, rngs=nnx.Rngs(0))

        def __call__(self, tokens):
            return self.out(jax.nn.one_hot(tokens, 8))

    with pytest.raises(TypeError, match=r"has no vocab_size or init_cache.*Bring your own model"):
        specjax.generate(jax.random.key(0), Plain(), [[1, 2]], max_new_tokens=3)


def test_a_hub_id_offline_and_not_cached_says_so():
    with pytest.raises(FileNotFoundError, match=r"Qwen/Qwen2.5-0.5B is not in the Hub's cache"):
        load_pretrained("Qwen/Qwen2.5-0.5B")


@pytest.mark.parametrize("bad_target", [None, "model.safetensors", 3])
def test_bad_targets_are_refused(bad_target):
    with pytest.raises(TypeError, match="target must follow the model contract"):
        specjax.generate(jax.random.key(0), bad_target, [[1]], max_new_tokens=3)


@struct.dataclass
class _StatelessDrafter(specjax.Drafter):
    """The smallest drafter (no state, γ = 2); each test below breaks one method."""

    num_draft: int = struct.field(pytree_node=False, default=2)

    @property
    def vocab_size(self):
        return None

    def init(self, prompts_BS, lengths_B, cache_len, hidden=None):
        return ()

    def propose(self, keys_BG, state, seq_BS, lengths_B, sampling):
        raise AssertionError("never traced")

    def update(self, state, lengths_B, hidden=None):
        return state


def test_a_drafter_returning_the_wrong_shape_is_named(target):
    @struct.dataclass
    class TooMany(_StatelessDrafter):
        def propose(self, keys_BG, state, seq_BS, lengths_B, sampling):
            tokens = jnp.zeros((seq_BS.shape[0], self.num_draft + 1), jnp.int32)
            return specjax.Proposal(tokens=tokens, probs=None, state=state)

    with pytest.raises(ValueError, match=r"drafter.propose must return integer tokens \[B, γ\]"):
        specjax.speculative_generate(jax.random.key(0), target, TooMany(), [[1]], max_new_tokens=3)


@pytest.mark.parametrize("method", ["init", "propose", "update"])
def test_a_drafter_method_with_the_wrong_signature_is_named(target, method):
    """Named with the call the decoder makes, before anything is traced."""

    def one_argument(self, x):
        return ()

    Broken = type("Broken", (_StatelessDrafter,), {method: one_argument})
    Broken = struct.dataclass(Broken)
    with pytest.raises(TypeError, match=rf"Broken\.{method}\(x\) cannot take the decoder's call"):
        specjax.speculative_generate(jax.random.key(0), target, Broken(), [[1]], max_new_tokens=3)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("entry", ["generate", "speculative"])
def test_a_nan_model_is_flagged_not_emitted(target, entry, temperature):
    """NaN weights give NaN logits: each row stops with invalid=True and no tokens, sampled
    or greedy (never token 0 for ever)."""
    broken = target.replace(params=jax.tree.map(lambda p: p * jnp.nan, target.params))
    sampling = SamplingConfig(temperature=temperature)
    out = _decoders(broken)[entry](
        jax.random.key(0), [[1, 2], [3]], max_new_tokens=5, sampling=sampling
    )
    assert out.invalid.tolist() == [True, True]
    assert out.lengths.tolist() == [0, 0] and (np.asarray(out.tokens) == -1).all()


def test_run_refuses_bad_arguments(target):
    decoder, state = decoding.init(jax.random.key(0), target, [[1, 2]], max_new_tokens=3)
    with pytest.raises(ValueError, match="num_steps must be in"):
        decoding.run(decoder, state, -1)
    with pytest.raises(TypeError, match="num_steps must be an integer"):
        decoding.run(decoder, state, 1.5)
    with pytest.raises(TypeError, match="state must be the DecodeState"):
        decoding.run(decoder, {"seq": 1}, 1)
    with pytest.raises(ValueError, match="steps_per_chunk must be in"):
        next(decoding.stream(decoder, state, steps_per_chunk=0))


# --- SamplingConfig / probs_from_logits ---


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(top_k=2**32 + 1), ValueError, "top_k must fit in int32"),
        (dict(top_k=2.5), ValueError, "top_k must be an integer"),
        (dict(top_k="3"), TypeError, "top_k must be an integer"),
        (dict(temperature="hot"), TypeError, "temperature must be a number"),
        (dict(vocab_limit=60.0), TypeError, "vocab_limit must be an integer"),
        (dict(vocab_limit="60"), TypeError, "vocab_limit must be an integer"),
        (dict(vocab_limit=True), TypeError, "vocab_limit must be an integer"),
        (dict(vocab_limit=2**32), ValueError, "vocab_limit must fit in int32"),
        (dict(vocab_limit=0), ValueError, "vocab_limit must be >= 1"),
    ],
)
def test_sampling_config_refuses_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingConfig(**kwargs).validate()


@pytest.mark.parametrize(
    "config",
    [
        # Out of range, but traced-like: unchecked.
        SamplingConfig(temperature=1.0, min_p=jnp.float32(1.5)),
        SamplingConfig(temperature=jnp.float32(np.inf)),
        SamplingConfig(temperature=1.0, top_p=jnp.float32(0.0)),
        SamplingConfig(temperature=1.0, min_p=jnp.float32(np.nan), top_p=jnp.float32(np.nan)),
    ],
    ids=["min_p>1", "temperature_inf", "top_p_0", "nan_settings"],
)
def test_probs_from_logits_never_returns_nan_inside_jit(config):
    """Inside a jit nothing is checked; the output is still a distribution."""
    logits = jnp.asarray([[0.0, -jnp.inf, 1.0, 2.0], [-jnp.inf] * 4, [3.0, 3.0, -1.0, 0.0]])
    probs = np.asarray(jax.jit(probs_from_logits)(logits, config))
    assert np.isfinite(probs).all() and (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_probs_from_logits_checks_concrete_settings():
    """Outside a jit the settings are known, and a min_p above 1 (which would keep only
    the most probable token) is refused with the field named."""
    with pytest.raises(ValueError, match=r"SamplingConfig.min_p must be in \[0, 1\)"):
        probs_from_logits(jnp.zeros((2, 4)), SamplingConfig(min_p=1.5))


@pytest.mark.parametrize("fn", ["probs_from_logits", "sample"])
def test_an_empty_vocabulary_is_refused(fn):
    call = {
        "probs_from_logits": lambda: probs_from_logits(jnp.zeros((2, 0)), SamplingConfig()),
        "sample": lambda: sample(jax.random.key(0), jnp.zeros((2, 0))),
    }[fn]
    with pytest.raises(ValueError, match=r"V >= 1"):
        call()


@pytest.mark.parametrize("key", [0, 1.5, np.zeros(2, np.float32)], ids=["int", "float", "floats"])
def test_sample_refuses_a_key_that_is_not_a_prng_key(key):
    with pytest.raises(TypeError, match=r"sample: key must be a PRNG key.*jax.random.key\(seed\)"):
        sample(key, jnp.full((2, 4), 0.25))


def test_sample_takes_a_raw_key_as_its_typed_key():
    probs = jnp.full((3, 16), 1 / 16)
    raw = sample(jax.random.PRNGKey(7), probs)
    typed = sample(jax.random.key(7), probs)
    assert raw.tolist() == typed.tolist()


# --- verification primitives ---

_P = jnp.asarray([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])  # [B=1, γ+1=2, V=3]
_Q = jnp.asarray([[[0.9, 0.2, -0.1]]])  # a negative probability
_X = jnp.asarray([[2]], jnp.int32)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda k: rejection_sample(k, _X, _Q, _P), "draft_probs holds negative"),
        (lambda k: rejection_sample(k, _X, jnp.abs(_Q), -_P), "target_probs holds negative"),
        (lambda k: rejection_sample_onehot(k, _X, _P * jnp.nan), "target_probs holds NaN"),
        (lambda k: coupled_verify(k, _X, _P.at[0, 1].set(0.0)), "no positive probability"),
        (lambda k: rejection_sample(jax.random.split(k, 3), _X, jnp.abs(_Q), _P), "key must be"),
    ],
)
def test_verify_primitives_refuse_bad_probabilities(call, match):
    with pytest.raises(ValueError, match=match):
        call(jax.random.key(0))


# --- BlockDrafter ---
# Construction, pairing with a target, training config, save and load: each refused with
# an error naming the argument, before anything compiles; no file is touched.

from specjax.drafters.block import BlockDrafter  # noqa: E402
from specjax.io import drafter_weights  # noqa: E402


@pytest.fixture(scope="module")
def deep_target():
    return tiny_model(seed=3, vocab_size=V, num_layers=4)


@pytest.fixture(scope="module")
def block_drafter(deep_target):
    return BlockDrafter.random(deep_target, key=jax.random.key(0), num_draft=3)  # blocks of 4


class _NoFeatures:
    """A target on the old model contract: ``__call__(tokens, positions, cache)`` only."""

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.vocab_size
        self.config = model.config

    def init_cache(self, batch_size, cache_len):
        return self.model.init_cache(batch_size, cache_len)

    def __call__(self, tokens_BT, positions_BT, cache):
        return self.model(tokens_BT, positions_BT, cache)


def _speculative(target, drafter):
    return specjax.speculative_generate(
        jax.random.key(0), target, drafter, [[1, 2, 3]], max_new_tokens=3
    )


def test_block_drafter_needs_a_target_that_returns_features(deep_target, block_drafter):
    with pytest.raises(TypeError, match="feature_layers"):
        _speculative(_NoFeatures(deep_target), block_drafter)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_draft=4, block_size=4), ValueError, r"num_draft \(γ\) must be in .*\[1, 3\]"),
        (dict(num_draft=0), ValueError, "num_draft must be in"),
        (dict(num_draft=2.0), TypeError, "num_draft must be an integer"),
        (dict(num_draft=3, block_size=1), ValueError, "block_size must be in"),
        (dict(num_draft=3, mode="greedy"), ValueError, "mode must be one of"),
        (dict(num_draft=3, target_layers=(4,)), ValueError, r"target_layers must be in \[0, 3\]"),
        (dict(num_draft=3, target_layers=(-1,)), ValueError, r"target_layers must be in \[0, 3\]"),
        (dict(num_draft=3, target_layers=(1.5,)), TypeError, "target_layers must be an integer"),
        (dict(num_draft=3, target_layers=()), ValueError, "target_layers must name"),
        (dict(num_draft=3, num_layers=0), ValueError, "num_layers must be in"),
        (dict(num_draft=3, key=0), TypeError, "key must be a PRNG key"),
    ],
)
def test_block_drafter_random_refuses_bad_arguments(deep_target, kwargs, error, match):
    kwargs = dict(key=jax.random.key(0)) | kwargs
    with pytest.raises(error, match=match):
        BlockDrafter.random(deep_target, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_draft=4), r"num_draft \(γ\) must be in .*\[1, 3\].*got 4"),
        (dict(num_draft=0), r"num_draft \(γ\) must be in .*\[1, 3\].*got 0"),
        (dict(mode="beam"), "mode must be one of"),
    ],
)
def test_with_draft_refuses_what_the_drafter_cannot_do(block_drafter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        block_drafter.with_draft(**kwargs)


def test_with_draft_refuses_a_float_num_draft(block_drafter):
    # As BlockDrafter.random does: 2.0 is refused, not truncated.
    with pytest.raises(TypeError, match="num_draft must be an integer"):
        block_drafter.with_draft(num_draft=2.0)


@pytest.mark.parametrize(
    "change, match",
    [(dict(num_draft=9), r"num_draft \(γ\)"), (dict(mode="x"), "mode must be one of")],
)
def test_decoder_refuses_a_block_drafter_edited_past_its_checks(
    deep_target, block_drafter, change, match
):
    with pytest.raises(ValueError, match=match):
        _speculative(deep_target, block_drafter.replace(**change))


def test_block_drafter_for_another_target_is_refused_by_the_decoder(deep_target, block_drafter):
    deeper = tiny_model(seed=4, vocab_size=V, num_layers=6)
    reads_layer_5 = BlockDrafter.random(
        deeper, key=jax.random.key(0), num_draft=3, target_layers=(5,)
    )
    with pytest.raises(ValueError, match=r"drafter.target_layers \(5,\) must be layer indices"):
        _speculative(deep_target, reads_layer_5)
    wide = tiny_model(seed=4, vocab_size=V, num_layers=4, hidden_size=48)
    with pytest.raises(ValueError, match="target has hidden_size 48"):
        _speculative(wide, block_drafter)


def test_model_refuses_feature_layers_out_of_range(deep_target):
    tokens = jnp.zeros((1, 2), jnp.int32)
    with pytest.raises(ValueError, match=r"feature_layers \(4,\) must be layer indices"):
        deep_target(tokens, tokens, None, feature_layers=(4,))


def test_load_block_drafter_refuses_another_target(tmp_path, block_drafter):
    folder = drafter_weights.save(block_drafter, tmp_path / "drafter")
    for other in (
        tiny_model(seed=4, vocab_size=V, num_layers=4, hidden_size=48),  # another width
        tiny_model(seed=4, vocab_size=V, num_layers=6),  # another depth
        tiny_model(seed=4, vocab_size=V + 1, num_layers=4),  # another vocabulary
    ):
        with pytest.raises(ValueError, match="^target: the drafter in .* was built for"):
            drafter_weights.load(BlockDrafter, folder, other)


def test_load_block_drafter_refuses_bad_overrides(tmp_path, deep_target, block_drafter):
    folder = drafter_weights.save(block_drafter, tmp_path / "drafter")
    with pytest.raises(ValueError, match=r"num_draft \(γ\) must be in .*\[1, 3\]"):
        drafter_weights.load(BlockDrafter, folder, deep_target, num_draft=8)
    with pytest.raises(ValueError, match="mode must be one of"):
        drafter_weights.load(BlockDrafter, folder, deep_target, mode="x")


@pytest.mark.parametrize("what", ["missing", "empty", "notes", "model_checkpoint", "file"])
def test_load_block_drafter_needs_a_drafter_folder(tmp_path, deep_target, what):
    path = tmp_path / "drafter"
    if what == "empty":
        path.mkdir()
    elif what == "notes":
        path.mkdir()
        (path / "notes.txt").write_text("x")
    elif what == "model_checkpoint":
        save_pretrained(deep_target, path)
    elif what == "file":
        path.write_text("x")
    with pytest.raises(FileNotFoundError, match=r"path .*drafter holds no block_drafter\.json"):
        drafter_weights.load(BlockDrafter, path, deep_target)


def test_load_block_drafter_refuses_a_foreign_config(tmp_path, deep_target, block_drafter):
    folder = drafter_weights.save(block_drafter, tmp_path / "drafter")
    (folder / "block_drafter.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match=r"block_drafter\.json is not a specjax-block-drafter"):
        drafter_weights.load(BlockDrafter, folder, deep_target)


@pytest.mark.parametrize("what", ["notes", "model_checkpoint", "drafter_and_notes"])
def test_save_block_drafter_never_replaces_a_foreign_folder(
    tmp_path, deep_target, block_drafter, what
):
    folder = tmp_path / "out"
    if what == "notes":
        folder.mkdir()
        (folder / "notes.txt").write_text("my notes")
    elif what == "model_checkpoint":
        save_pretrained(deep_target, folder)
    else:  # a drafter folder the user also keeps notes in: the notes must survive
        drafter_weights.save(block_drafter, folder)
        (folder / "notes.txt").write_text("my notes")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(FileExistsError, match=r"path .*out holds .*delete.*overwrite=True"):
        drafter_weights.save(block_drafter, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert leftovers(tmp_path, ["out"]) == []

    drafter_weights.save(block_drafter, folder, overwrite=True)
    assert sorted(os.listdir(folder)) == ["block_drafter.json", "model.safetensors"]
    assert drafter_weights.load(BlockDrafter, folder, deep_target).num_draft == 3


def test_save_block_drafter_to_a_file_is_refused(tmp_path, block_drafter):
    path = tmp_path / "drafter.bin"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match=r"path .*drafter\.bin is a file"):
        drafter_weights.save(block_drafter, path, overwrite=True)
    assert path.read_text() == "not a folder"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_anchors=0), ValueError, "num_anchors must be in"),
        (dict(num_anchors=2.5), TypeError, "num_anchors must be an integer"),
        (dict(decay=0.0), ValueError, "decay must be > 0"),
        (dict(decay="x"), TypeError, "decay must be a number"),
    ],
)
def test_block_train_config_refuses_garbage(kwargs, error, match):
    with pytest.raises(error, match=match):
        train.BlockTrainConfig(**kwargs)


def test_train_block_drafter_refuses_bad_arguments(tmp_path, block_drafter):
    tokens = np.arange(200) % V
    config = train.BlockTrainConfig(steps=1, batch_size=1, seq_len=8, progress=False)
    with pytest.raises(TypeError, match="config must be a BlockTrainConfig"):
        train.train_drafter(
            block_drafter, tokens, train.TrainConfig(steps=1, batch_size=1, seq_len=8)
        )
    with pytest.raises(ValueError, match=r"tokens holds 64, outside"):
        train.train_drafter(block_drafter, np.arange(200) % (V + 1), config)
    with pytest.raises(ValueError, match="teacher must be the BlockDrafter's own target"):
        train.train(block_drafter, tokens, config, teacher=tiny_model(seed=9, vocab_size=V))
    assert os.listdir(tmp_path) == []


# --- audit: seed range, corrupt checkpoint, tokenizer path, nested prompts, PromptLookup ---


@pytest.mark.parametrize("seed", [str(10**11), str(-(10**11)), str(2**63)])
def test_cli_generate_refuses_a_seed_beyond_int32(capsys, seed):
    rc, lines = run_cli(capsys, "generate", "x", "--seed", seed)
    assert_one_line_error(rc, lines, "--seed", "[-2147483648, 2147483647]")


def test_corrupt_training_checkpoint_is_named_not_deleted(tmp_path, llama):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / train.TRAIN_STATE_FILE).write_bytes(b"\x10\x00\x00\x00garbage")
    with pytest.raises(ValueError, match=r"corrupt.*delete that checkpoint folder"):
        train.load_checkpoint(ckpt, llama, small_config())
    assert (ckpt / train.TRAIN_STATE_FILE).exists()


def test_missing_tokenizer_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        tokenizer_lib.load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        tokenizer_lib.load_tokenizer(tmp_path / "nope.json")


@pytest.mark.parametrize(
    "prompts, index", [([[1, 2], [[3], 4]], 1), ([[1, [2, 3]]], 0), ([[[1], [2, 3]]], 0)]
)
def test_nested_prompt_rows_are_named(prompts, index):
    with pytest.raises(ValueError, match=rf"prompts\[{index}\] must be a flat list of int"):
        decoding.pad_prompts(prompts)


@pytest.mark.parametrize("ngram, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError)])
def test_prompt_lookup_refuses_a_bad_ngram(ngram, error):
    with pytest.raises(error, match="PromptLookup.ngram"):
        specjax.PromptLookup(ngram=ngram)


def test_a_budget_beyond_the_targets_context_is_refused_naming_it():
    """Prompt plus budget past ``max_position_embeddings`` is refused before compiling;
    a cache within the context bounds every row, so it is accepted."""
    model = tiny_model(seed=0, max_position_embeddings=64)
    with pytest.raises(ValueError, match=r"^max_new_tokens: prompt 1 has 4 tokens, and 4 \+ 61"):
        specjax.generate(None, model, [[1, 2], [3, 4, 5, 6]], max_new_tokens=[10, 61])
    with pytest.raises(ValueError, match=r"ask for at most 60 new tokens, or pass cache_len=64"):
        specjax.generate(None, model, [[1, 2, 3, 4]], max_new_tokens=61)
    with pytest.raises(ValueError, match=r"^prompts: prompt 0 has 65 tokens, beyond the"):
        specjax.generate(None, model, [[1] * 65], max_new_tokens=1)
    out = specjax.generate(None, model, [[1, 2, 3, 4]], max_new_tokens=61, cache_len=64)
    assert bool(out.truncated[0]) and int(out.lengths[0]) < 61


def test_the_open_loops_former_methods_name_the_function_to_call():
    """``decoder.run(state)`` and its siblings are functions of ``specjax.decoding``; the
    old spelling says which, and any other missing attribute stays a plain error."""
    from specjax import decoding

    decoder, _ = decoding.init(
        jax.random.key(0), tiny_model(seed=0, vocab_size=V), [[1, 2, 3]], max_new_tokens=2
    )
    for name in ("run", "result", "stream"):
        with pytest.raises(AttributeError, match=rf"call specjax\.decoding\.{name}\(decoder"):
            getattr(decoder, name)
    with pytest.raises(AttributeError, match="no attribute 'lookahead_slots'"):
        decoder.lookahead_slots  # noqa: B018
    assert decoder.step_slots >= 1 and not hasattr(decoder, "run")
