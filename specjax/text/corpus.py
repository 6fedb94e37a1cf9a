"""A corpus for `specjax.drafters.suffix.SuffixDrafter`: your files, tokenised once.

``Sampler(drafter="suffix", corpus=PATH)`` and ``specjax generate --drafter suffix
--corpus PATH`` draft from a file or a folder of text or code (read recursively,
UTF-8, binary files skipped). Tokenising a large folder takes a while, so the token ids
are kept in ``<specjax cache>/corpus/``, keyed by every file's content and the
tokenizer: a later run reads them back, and a changed file or another tokenizer
tokenises again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["corpus_documents", "load_corpus"]

#: Files larger than this are skipped (a corpus is text someone wrote, not data dumps).
MAX_FILE_BYTES = 4 * 2**20


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"corpus {path}: no such file or folder")
    found = sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    return [p for p in found if p.stat().st_size <= MAX_FILE_BYTES]


def _texts(files: list[Path]) -> list[tuple[str, str]]:
    """``(sha256, text)`` of each readable UTF-8 file."""
    out = []
    for f in files:
        data = f.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            out.append((hashlib.sha256(data).hexdigest(), data.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return out


def _tokenizer_digest(tokenizer) -> str:
    blob = tokenizer.to_str() if hasattr(tokenizer, "to_str") else repr(tokenizer)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_corpus(path: str | os.PathLike, tokenizer, *, cache: bool = True) -> list[np.ndarray]:
    """The token ids of every text file under ``path``, one array per file.

    Args:
        path: a file or a folder (read recursively; hidden files, binary files and
            files over `MAX_FILE_BYTES` are skipped).
        tokenizer: a ``tokenizers.Tokenizer`` (the target's).
        cache: read and keep the ids in ``<specjax cache>/corpus/``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: it holds no text file.
    """
    from specjax.core.paths import cache_root

    texts = _texts(_files(Path(path)))
    if not texts:
        raise ValueError(f"corpus {path}: no UTF-8 text file found")
    key = hashlib.sha256(
        json.dumps([_tokenizer_digest(tokenizer), [h for h, _ in texts]]).encode()
    ).hexdigest()[:24]
    where = cache_root() / "corpus" / f"{key}.npz"
    if cache and where.is_file():
        with np.load(where) as stored:
            return [stored[f"doc{i}"] for i in range(len(stored.files))]
    docs = [
        np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, np.int32)
        for _, text in texts
    ]
    if cache:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_suffix(".tmp.npz")
        np.savez(tmp, **{f"doc{i}": d for i, d in enumerate(docs)})
        os.replace(tmp, where)
    return docs


def corpus_documents(corpus, tokenizer) -> list[np.ndarray]:
    """Documents of token ids from what ``corpus=`` takes: a path, a list of strings, or a
    list of token-id sequences."""
    if corpus is None:
        return []
    if isinstance(corpus, (str, os.PathLike)):
        return load_corpus(corpus, tokenizer)
    if isinstance(corpus, Sequence):
        return [
            np.asarray(tokenizer.encode(d, add_special_tokens=False).ids, np.int32)
            if isinstance(d, str)
            else np.asarray(d, np.int32)
            for d in corpus
        ]
    what = type(corpus).__name__
    raise TypeError(f"corpus must be a path, a list of strings or of token-id lists, got {what}")
