"""The byte-level BPE tokenizer: exact round trips, determinism, HF interop."""

import hashlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.training import data
from specjax.training import tokenizer as tokenizer_lib

VOCAB = 400


@pytest.fixture(scope="module")
def docs():
    return data.stdlib_documents("train", max_documents=12)


@pytest.fixture(scope="module")
def tok(docs):
    return tokenizer_lib.train_tokenizer(docs, VOCAB)


def test_vocab_size_special_token_and_all_bytes(tok):
    assert tok.get_vocab_size() == VOCAB
    assert tokenizer_lib.eos_id(tok) == 0
    assert tokenizer_lib.encode(tok, tokenizer_lib.EOS_TOKEN) == [0]
    # Every single byte is one base token, so nothing is ever out of vocabulary.
    for b in range(256):
        assert len(tokenizer_lib.encode(tok, bytes([b]).decode("latin-1"))) <= 2


def test_training_is_deterministic(docs, tok):
    again = tokenizer_lib.train_tokenizer(docs, VOCAB)
    assert again.to_str() == tok.to_str()


def test_merges_learn_the_corpus(tok, docs):
    ids = tokenizer_lib.encode(tok, docs[0])
    assert len(ids) < len(docs[0].encode("utf-8")) / 1.5


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00",
        "a\x00b\x00",
        "def f(x):\n\treturn x  # ok\r\n",
        "    indented\n        more",
        " leading and trailing spaces  ",
        "👩‍👩‍👧‍👦 family, 🇺🇦 flag",
        "e\u0301 vs \u00e9 (combining vs precomposed)",
        "\ufeffBOM and \u200b zero width and \U0010ffff",
        "中文 日本語 한국어 العربية",
        "x<|endoftext|>y",
    ],
)
def test_round_trip_examples(tok, text):
    assert tokenizer_lib.decode(tok, tokenizer_lib.encode(tok, text)) == text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_unicode(tok, text):
    # st.text excludes lone surrogates, which are not valid in UTF-8 strings.
    assert tokenizer_lib.decode(tok, tokenizer_lib.encode(tok, text)) == text


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_round_trip_any_bytes(tok, raw):
    # Arbitrary bytes, carried in a str one code point per byte (latin-1).
    text = raw.decode("latin-1")
    assert tokenizer_lib.decode(tok, tokenizer_lib.encode(tok, text)) == text


def test_train_from_files(tmp_path, docs):
    paths = []
    for i, d in enumerate(docs[:4]):
        p = tmp_path / f"doc{i}.py"
        p.write_text(d, encoding="utf-8")
        paths.append(p)
    from_files = tokenizer_lib.train_tokenizer(paths, 300)
    from_texts = tokenizer_lib.train_tokenizer(docs[:4], 300)
    assert from_files.to_str() == from_texts.to_str()


def test_save_load_and_transformers(tmp_path, tok, docs):
    from transformers import PreTrainedTokenizerFast

    tokenizer_lib.save_tokenizer(tok, tmp_path)
    path = tmp_path / "tokenizer.json"
    assert path.is_file()
    loaded = tokenizer_lib.load_tokenizer(tmp_path)
    assert loaded.to_str() == tok.to_str()

    hf = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=tokenizer_lib.EOS_TOKEN)
    assert hf.eos_token_id == 0
    for text in [docs[1][:500], "héllo 👋\x00 wörld", "x<|endoftext|>y"]:
        ids = tokenizer_lib.encode(tok, text)
        assert hf.encode(text, add_special_tokens=False) == ids
        assert hf.decode(ids, clean_up_tokenization_spaces=False) == text


def test_heldout_split_is_a_stable_path_hash():
    rel = "json/decoder.py"
    expected = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") / 2**64 < 0.02
    assert data.is_heldout(rel) == expected
    assert data.is_heldout(rel, 1.0) and not data.is_heldout(rel, 0.0)


def test_stdlib_documents_sorted_filtered(tmp_path):
    root = tmp_path / "lib"
    for rel, content in {
        "b.py": "b = 1\n",
        "a/z.py": "z = 2\n",
        "a/y.txt": "not python",
        "site-packages/pkg.py": "third party\n",
        "bad.py": b"\xff\xfe latin junk",
        "empty.py": "",
    }.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    docs = data.stdlib_documents("all", root=root)
    assert docs == ["z = 2\n", "b = 1\n"]  # sorted by relative path: a/z.py < b.py
    train = data.stdlib_documents("train", root=root, heldout_fraction=0.5)
    heldout = data.stdlib_documents("heldout", root=root, heldout_fraction=0.5)
    assert sorted(train + heldout) == sorted(docs)


def test_real_stdlib_corpus_is_found():
    root = data.stdlib_root()
    assert (root / "os.py").is_file()
    assert isinstance(Path(root), Path)
