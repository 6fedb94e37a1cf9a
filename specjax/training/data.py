"""Training data: the Python standard library as a corpus, and deterministic batches.

The corpus is the ``.py`` source of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``, without ``site-packages``): it exists on
every machine with Python and needs no download. It depends on the Python
version, so a bundled model is reproducible for the same interpreter version.

Files are read in sorted order of their path relative to the stdlib root, and
each file goes to the held-out split by a hash of that relative path, so the
split does not depend on directory listing order or on which other files exist.
Documents are concatenated into one token stream, each followed by
``<|endoftext|>``.

Batches are windows sampled from the stream by a key: the batch of step ``s`` is
a pure function of ``(tokens, fold_in(key, s))``, so a resumed run sees exactly
the batches an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.training import tokenizer as tokenizer_lib

_EXCLUDED_TOP_DIRS = ("site-packages", "dist-packages", "__pycache__")


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str, heldout_fraction: float = 0.02) -> bool:
    """Whether the file at ``relpath`` (POSIX, relative to the root) is held out.

    Uses the first 8 bytes of SHA-256 of the path, so the decision is stable
    across machines, processes and ``PYTHONHASHSEED``.
    """
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction


def stdlib_documents(
    split: str = "train",
    *,
    heldout_fraction: float = 0.02,
    root: str | os.PathLike | None = None,
    max_documents: int | None = None,
) -> list[str]:
    """Texts of the standard library's ``.py`` files, in sorted path order.

    Files that are not valid UTF-8 (a few test fixtures) are skipped, so every
    document is a ``str``.

    Args:
        split: ``"train"``, ``"heldout"`` or ``"all"``.
        heldout_fraction: fraction of files (by path hash) in the held-out split.
        root: corpus root; defaults to :func:`stdlib_root`. Any directory of
            ``.py`` files works (tests use a small one).
        max_documents: keep only the first this many documents of the split.

    Returns:
        The list of document texts.
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split={split!r}; expected 'train', 'heldout' or 'all'")
    root = Path(root) if root is not None else stdlib_root()
    relpaths = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir.parts and rel_dir.parts[0] in _EXCLUDED_TOP_DIRS:
            dirnames[:] = []
            continue
        relpaths += [(rel_dir / f).as_posix() for f in filenames if f.endswith(".py")]
    docs = []
    for rel in sorted(relpaths):
        if split != "all" and is_heldout(rel, heldout_fraction) != (split == "heldout"):
            continue
        try:
            text = (root / rel).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            docs.append(text)
        if max_documents is not None and len(docs) >= max_documents:
            break
    return docs


def site_packages_root() -> Path:
    """Directory of the running interpreter's installed pure-Python packages."""
    return Path(sysconfig.get_paths()["purelib"])


def site_packages_documents(
    *,
    fraction: float = 1.0,
    exclude: list[str] | None = None,
    root: str | os.PathLike | None = None,
    max_file_bytes: int = 200_000,
) -> list[str]:
    """Texts of installed packages' ``.py`` files: more Python for pre-training.

    Only ever a training corpus: the held-out split is the standard library's
    (:func:`stdlib_documents`), so held-out losses stay comparable whatever is
    installed. Files are chosen by a hash of their path relative to ``root``
    (stable across machines), read in sorted path order; very large files
    (generated tables, vendored bundles) and files that are not UTF-8 are
    skipped, and so is any file whose text equals one of ``exclude`` (vendored
    copies of held-out standard-library modules must not leak into training).

    Args:
        fraction: the share of files kept, by path hash, in ``(0, 1]``.
        exclude: texts never to return (pass the held-out documents).
        root: corpus root; defaults to :func:`site_packages_root`.
        max_file_bytes: files larger than this are skipped.

    Returns:
        The list of document texts.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction}; expected a value in (0, 1]")
    root = Path(root) if root is not None else site_packages_root()
    excluded = {hashlib.sha256(t.encode("utf-8")).digest() for t in exclude or ()}
    relpaths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel_dir = Path(dirpath).relative_to(root)
        relpaths += [(rel_dir / f).as_posix() for f in filenames if f.endswith(".py")]
    docs = []
    for rel in sorted(relpaths):
        if fraction < 1 and not is_heldout(rel, fraction):  # the hash picks the kept share
            continue
        path = root / rel
        try:
            if path.stat().st_size > max_file_bytes:
                continue
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text and hashlib.sha256(text.encode("utf-8")).digest() not in excluded:
            docs.append(text)
    return docs


def tokenize_documents(tok, documents: list[str]) -> np.ndarray:
    """One ``int32[N]`` token stream: each document's ids followed by EOS.

    Equal to encoding the documents joined (and terminated) by ``<|endoftext|>``,
    because special tokens are split off before BPE runs.
    """
    eos = tokenizer_lib.eos_id(tok)
    pieces = []
    for ids in tokenizer_lib.encode_batch(tok, documents):
        pieces.append(np.asarray(ids, np.int32))
        pieces.append(np.asarray([eos], np.int32))
    if not pieces:
        return np.zeros((0,), np.int32)
    return np.concatenate(pieces)


def load_token_stream(
    tok, split: str = "train", *, cache_path: str | os.PathLike | None = None, **kwargs
) -> np.ndarray:
    """The tokenized stdlib split, optionally cached as a ``.npy`` file.

    The cache is a plain ``int32`` array, read with ``allow_pickle=False``. It
    is only valid for the tokenizer that wrote it; delete it after retraining
    the tokenizer.

    Args:
        tok: the tokenizer.
        split: see :func:`stdlib_documents`.
        cache_path: where to read/write the cached stream.
        **kwargs: passed to :func:`stdlib_documents`.

    Returns:
        ``int32[N]`` token ids.
    """
    if cache_path is not None and os.path.exists(cache_path):
        return np.load(cache_path, allow_pickle=False)
    tokens = tokenize_documents(tok, stdlib_documents(split, **kwargs))
    if cache_path is not None:
        tmp = f"{os.fspath(cache_path)}.tmp.npy"
        np.save(tmp, tokens, allow_pickle=False)
        os.replace(tmp, cache_path)
    return tokens


def sample_windows(tokens_N: jax.Array, key: jax.Array, batch_size: int, seq_len: int) -> jax.Array:
    """Samples ``batch_size`` windows of ``seq_len + 1`` consecutive tokens.

    Jittable (``batch_size`` and ``seq_len`` must be static). Window starts are
    uniform over every valid offset; windows may cross document boundaries,
    which the ``<|endoftext|>`` separator marks.

    Args:
        tokens_N: ``int32[N]`` token stream, ``N > seq_len``.
        key: PRNG key that fully determines the batch.
        batch_size: B.
        seq_len: T; each row holds T inputs and, shifted by one, T targets.

    Returns:
        ``int32[B, T + 1]`` windows.
    """
    n = tokens_N.shape[0]
    if n <= seq_len:
        raise ValueError(f"token stream of length {n} is too short for seq_len={seq_len}")
    starts_B = jax.random.randint(key, (batch_size,), 0, n - seq_len)
    idx_BT1 = starts_B[:, None] + jnp.arange(seq_len + 1)[None, :]
    return tokens_N[idx_BT1]


def batch_for_step(
    tokens_N: jax.Array, key: jax.Array, step: jax.Array | int, batch_size: int, seq_len: int
) -> jax.Array:
    """The training batch of ``step``: :func:`sample_windows` with ``fold_in(key, step)``."""
    return sample_windows(tokens_N, jax.random.fold_in(key, step), batch_size, seq_len)


def eval_windows(tokens_N: np.ndarray, seq_len: int, max_windows: int | None = None) -> np.ndarray:
    """Non-overlapping ``int32[W, T + 1]`` windows covering the stream from its start.

    Consecutive windows share their boundary token (the last target of one is
    the first input of the next), so every token but the first is predicted
    exactly once. The ragged tail is dropped.
    """
    tokens_N = np.asarray(tokens_N)
    w = (len(tokens_N) - 1) // seq_len
    if max_windows is not None:
        w = min(w, max_windows)
    if w <= 0:
        raise ValueError(f"{len(tokens_N)} tokens are too few for one window of {seq_len}")
    idx = np.arange(w)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return tokens_N[idx].astype(np.int32)
