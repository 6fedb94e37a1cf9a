"""Training: loss goes down, distillation approaches the teacher, resume is exact."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import training as train
from specjax.io import load_pretrained
from specjax.models import Model, ModelConfig
from specjax.training import data
from specjax.training import tokenizer as tokenizer_lib

VOCAB = 384
SEQ = 32


@pytest.fixture(scope="module")
def corpus():
    docs = data.stdlib_documents("train", max_documents=16)
    tok = tokenizer_lib.train_tokenizer(docs, VOCAB)
    tokens = data.tokenize_documents(tok, docs)
    split = int(len(tokens) * 0.9)
    return tok, tokens[:split], tokens[split:]


def tiny_config(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=SEQ,
        eos_token_id=0,
    )
    return ModelConfig(**{**base, **kw})


def tiny_train_config(**kw):
    base = dict(
        steps=30,
        batch_size=4,
        seq_len=SEQ,
        learning_rate=1e-2,
        warmup_steps=3,
        progress=False,
        log_every=5,
    )
    return train.TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained_teacher(corpus):
    tok, tokens, _ = corpus
    model = Model.random(tiny_config(hidden_size=48), seed=7).replace(tokenizer=tok)
    return train.train(model, tokens, tiny_train_config(steps=40)).model


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"tie_word_embeddings": False},
        {"qk_norm": True, "model_type": "qwen3"},
        {"attention_bias": True, "model_type": "qwen2"},
    ],
)
def test_forward_matches_cached_model_call(kw):
    model = Model.random(tiny_config(**kw), seed=3)
    tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, VOCAB)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    expected = jax.jit(lambda m: m(tokens, positions, m.init_cache(2, 9)).logits)(model)
    got = jax.jit(train.forward)(model, tokens)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_windows_are_deterministic_and_in_range():
    tokens = jnp.arange(100, dtype=jnp.int32)
    key = jax.random.key(0)
    a = data.batch_for_step(tokens, key, 3, 8, 10)
    b = jax.jit(data.batch_for_step, static_argnums=(3, 4))(tokens, key, 3, 8, 10)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (8, 11)
    np.testing.assert_array_equal(np.diff(np.asarray(a), axis=1), 1)  # consecutive tokens
    assert not np.array_equal(a, data.batch_for_step(tokens, key, 4, 8, 10))
    w = data.eval_windows(np.arange(25), 8)
    np.testing.assert_array_equal(w[:, 0], [0, 8, 16])
    np.testing.assert_array_equal(w[:, -1], [8, 16, 24])


def test_training_decreases_loss(corpus):
    tok, tokens, heldout = corpus
    model = Model.random(tiny_config(), seed=0).replace(tokenizer=tok)
    before = train.evaluate(model, heldout, seq_len=SEQ, max_windows=16)
    result = train.train(model, tokens, tiny_train_config())
    after = train.evaluate(result.model, heldout, seq_len=SEQ, max_windows=16)
    assert len(result.losses) == result.steps == 30
    assert not result.stopped_early
    assert np.log(VOCAB) - 0.1 < result.losses[0] < np.log(VOCAB) + 0.1
    assert np.mean(result.losses[-5:]) < result.losses[0] - 1.0
    assert after < before - 1.0
    # The input model was not donated away.
    assert np.isfinite(np.asarray(jax.tree.leaves(model.params)[0])).all()


def test_evaluate_is_mean_next_token_nll(corpus):
    _, _, heldout = corpus
    model = Model.random(tiny_config(), seed=1)
    windows = data.eval_windows(heldout, SEQ, 3)
    logp = jax.nn.log_softmax(jax.jit(train.forward)(model, jnp.asarray(windows[:, :-1])))
    nll = -np.take_along_axis(np.asarray(logp), windows[:, 1:, None], -1).mean()
    got = train.evaluate(model, heldout, seq_len=SEQ, max_windows=3, batch_size=2)
    np.testing.assert_allclose(got, nll, rtol=1e-5)


@jax.jit
def _jit_divergence(student, teacher, windows):
    return train.distill_losses(train.forward(student, windows), train.forward(teacher, windows))


def _divergence(student, teacher, tokens):
    windows = jnp.asarray(data.eval_windows(tokens, SEQ, 8))[:, :-1]
    return {k: float(v) for k, v in _jit_divergence(student, teacher, windows).items()}


@pytest.mark.parametrize("weights", [{"kl_weight": 1.0}, {"kl_weight": 0.0, "tvd_weight": 1.0}])
# Slow tier: a teacher and a draft trained (about 11 s); the fast tier keeps the loss
# decreasing in training.
@pytest.mark.slow
def test_distillation_moves_draft_towards_teacher(corpus, trained_teacher, weights):
    tok, tokens, heldout = corpus
    draft = Model.random(tiny_config(hidden_size=16, num_layers=1), seed=2).replace(tokenizer=tok)
    before = _divergence(draft, trained_teacher, heldout)
    result = train.train(draft, tokens, tiny_train_config(**weights), teacher=trained_teacher)
    after = _divergence(result.model, trained_teacher, heldout)
    assert after["kl"] < 0.6 * before["kl"]
    assert after["tvd"] < before["tvd"] - 0.1
    assert result.losses[-1] < result.losses[0]


def test_distill_losses_zero_for_identical_and_match_formula():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 7))
    same = train.distill_losses(logits, logits)
    assert abs(float(same["kl"])) < 1e-6 and abs(float(same["tvd"])) < 1e-6
    other = jax.random.normal(jax.random.key(1), (2, 3, 7))
    p, q = jax.nn.softmax(logits), jax.nn.softmax(other)
    d = train.distill_losses(other, logits)
    np.testing.assert_allclose(d["kl"], (p * (jnp.log(p) - jnp.log(q))).sum(-1).mean(), rtol=1e-5)
    np.testing.assert_allclose(d["tvd"], 0.5 * jnp.abs(p - q).sum(-1).mean(), rtol=1e-5)


class _Crash(Exception):
    pass


def _crash_at(step):
    def callback(s, metrics):
        if s == step:
            raise _Crash

    return callback


def _assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_resume_is_bit_identical(corpus, tmp_path):
    tok, tokens, _ = corpus
    model = Model.random(tiny_config(), seed=4).replace(tokenizer=tok)
    config = tiny_train_config(steps=9, checkpoint_every=3)
    reference = train.train(model, tokens, config)

    ckpt = tmp_path / "ckpt"
    # A crash after step 5 loses steps 4 and 5; the newest checkpoint is step 3.
    with pytest.raises(_Crash):
        train.train(model, tokens, config, checkpoint_dir=ckpt, callback=_crash_at(5))
    assert [p.name for p in train.list_checkpoints(ckpt)] == ["step_00000003"]
    # A half-written checkpoint (crash during save) is never picked up.
    (ckpt / ".tmp-step_00000006-junk").mkdir()
    (ckpt / "step_00000006").mkdir()

    resumed = train.train(model, tokens, config, checkpoint_dir=ckpt, resume=True)
    assert resumed.steps == 9
    assert resumed.losses == reference.losses
    _assert_same_params(resumed.model, reference.model)
    # keep_checkpoints=2: step 3 was pruned after 6 and 9 were written.
    names = [p.name for p in train.list_checkpoints(ckpt)]
    assert names == ["step_00000006", "step_00000009"]

    # The checkpoint is a Hugging Face folder with the tokenizer.
    final = ckpt / "step_00000009"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(final))
    _assert_same_params(load_pretrained(final), reference.model)

    # Resuming a finished run is a no-op that returns the full history.
    again = train.train(model, tokens, config, checkpoint_dir=ckpt, resume=True)
    assert again.losses == reference.losses and again.steps == 9


def test_time_budget_stops_cleanly_then_resumes(corpus, tmp_path):
    tok, tokens, _ = corpus
    model = Model.random(tiny_config(), seed=5).replace(tokenizer=tok)
    config = tiny_train_config(steps=6, checkpoint_every=0)
    reference = train.train(model, tokens, config)

    budget = dataclasses.replace(config, max_minutes=0.0)
    stopped = train.train(model, tokens, budget, checkpoint_dir=tmp_path)
    assert stopped.stopped_early and stopped.steps == 1
    assert stopped.checkpoint.endswith("step_00000001")
    assert stopped.losses == reference.losses[:1]

    resumed = train.train(model, tokens, config, checkpoint_dir=tmp_path, resume=True)
    assert resumed.losses == reference.losses
    _assert_same_params(resumed.model, reference.model)

    # Ctrl-C saves the last finished step before propagating.
    def interrupt(step, metrics):
        if step == 4:
            raise KeyboardInterrupt

    ctrl_c = tmp_path / "ctrl_c"
    with pytest.raises(KeyboardInterrupt):
        train.train(model, tokens, config, checkpoint_dir=ctrl_c, callback=interrupt)
    assert [p.name for p in train.list_checkpoints(ctrl_c)] == ["step_00000004"]
    resumed = train.train(model, tokens, config, checkpoint_dir=ctrl_c, resume=True)
    assert resumed.start_step == 4 and resumed.losses == reference.losses


def test_resume_refuses_a_different_run(corpus, tmp_path):
    tok, tokens, _ = corpus
    model = Model.random(tiny_config(), seed=6).replace(tokenizer=tok)
    train.train(model, tokens, tiny_train_config(steps=2), checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="resume=True"):
        train.train(model, tokens, tiny_train_config(steps=2), checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="learning_rate"):
        train.train(
            model,
            tokens,
            tiny_train_config(steps=2, learning_rate=0.5),
            checkpoint_dir=tmp_path,
            resume=True,
        )


def test_no_pickle_files_written(corpus, tmp_path):
    tok, tokens, _ = corpus
    model = Model.random(tiny_config(), seed=8).replace(tokenizer=tok)
    train.train(model, tokens, tiny_train_config(steps=2), checkpoint_dir=tmp_path / "c")
    data.load_token_stream(tok, "train", cache_path=tmp_path / "t.npy", max_documents=2)
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert files
    for f in files:
        assert not f.endswith((".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt"))
        with open(f, "rb") as fh:
            head = fh.read(2)
        # Pickle protocol 2+ streams start with the PROTO opcode 0x80.
        assert head[:1] != b"\x80", f
    np.testing.assert_array_equal(
        np.load(tmp_path / "t.npy", allow_pickle=False),
        data.load_token_stream(tok, "train", max_documents=2),
    )
