"""A byte-level BPE tokenizer trained with the Hugging Face ``tokenizers`` package.

Byte-level means every string maps to bytes first and every byte has its own
base token, so *any* text tokenizes (no unknown token) and
``decode(tok, encode(tok, text)) == text`` holds exactly. No normalizer is
installed on purpose: NFC/NFKC folding would break that round trip.

The saved ``tokenizer.json`` is the standard format, so it also loads with
``tokenizers.Tokenizer.from_file`` and with ``transformers.PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specjax.core.validation import check_int, check_int_array

EOS_TOKEN = "<|endoftext|>"
"""End of sequence; also separates documents in the training stream."""


def _iter_texts(texts_or_files: Iterable[str | os.PathLike]) -> Iterator[str]:
    for i, item in enumerate(texts_or_files):
        if isinstance(item, os.PathLike):
            with open(item, encoding="utf-8") as f:
                yield f.read()
        elif isinstance(item, str):
            yield item
        else:
            raise TypeError(
                f"texts_or_files[{i}] must be a str (a text) or an os.PathLike (a file), "
                f"got {type(item).__name__}"
            )


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE with the specjax pre-tokenizer and decoder."""
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: a leading space would be invented on encode and
    # would have to be stripped on decode, which loses information.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts_or_files: Iterable[str | os.PathLike],
    vocab_size: int = 4096,
    *,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> Tokenizer:
    """Trains a byte-level BPE tokenizer.

    Training is deterministic for a fixed input order (the ``tokenizers`` BPE
    trainer breaks frequency ties by token content).

    Args:
        texts_or_files: strings (document texts) or ``os.PathLike`` paths of
            UTF-8 text files, in the order they should be read.
        vocab_size: total vocabulary size V, including the 256 byte tokens and
            the special ``<|endoftext|>`` token (id 0).
        min_frequency: a pair must occur at least this often to be merged.
        show_progress: show the trainer's own progress bar.

    Returns:
        The trained ``tokenizers.Tokenizer``; ``tok.get_vocab_size() == vocab_size``
        unless the corpus is too small to learn that many merges.

    Raises:
        TypeError: ``texts_or_files`` is a single ``str``, ``bytes`` or path
            (iterating a string would train on its characters, one per
            "document", and learn no merges), or holds something else.
        ValueError: ``vocab_size`` is not above 256, or ``min_frequency`` < 0.
    """
    if isinstance(texts_or_files, (str, bytes, os.PathLike)):
        raise TypeError(
            "texts_or_files must be a list of texts or of file paths, not a single "
            f"{type(texts_or_files).__name__}; pass [text] to train on one text"
        )
    vocab_size = check_int("vocab_size", vocab_size)
    if vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size} must be > 256 (bytes + {EOS_TOKEN})")
    min_frequency = check_int("min_frequency", min_frequency, lo=0)
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        # All 256 byte symbols, even those absent from the corpus, so nothing
        # can ever be out of vocabulary.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(_iter_texts(texts_or_files), trainer=trainer)
    return tok


def eos_id(tok: Tokenizer) -> int:
    """The id of ``<|endoftext|>``."""
    i = tok.token_to_id(EOS_TOKEN)
    if i is None:
        raise ValueError(f"tokenizer has no {EOS_TOKEN} token")
    return i


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens are added)."""
    return tok.encode(text, add_special_tokens=False).ids


def encode_batch(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of many texts, encoded in parallel by the Rust backend."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def decode(tok: Tokenizer, ids: Iterable[int]) -> str:
    """The text of ``ids``; special tokens are kept so the round trip is exact.

    Raises:
        ValueError: an id outside ``[0, V)`` (the Rust decoder would silently
            drop it), naming the id.
        TypeError: ids that are not integers (floats are not truncated).
    """
    ids = list(ids)
    if not ids:
        return ""
    v = tok.get_vocab_size(with_added_tokens=True)
    try:
        ids = check_int_array("ids", ids, lo=0, hi=v - 1, ndim=1)
    except ValueError as e:
        raise ValueError(f"{e}: not an id of this tokenizer's {v}-token vocabulary") from None
    return tok.decode(ids.tolist(), skip_special_tokens=False)


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> None:
    """Writes ``tok`` as ``tokenizer.json`` into directory ``path`` (or to the file ``path``)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    tok.save(path)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Reads a ``tokenizer.json`` file, or the one inside directory ``path``."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    # The tokenizers library raises a bare Exception that does not say which file.
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer file {path} does not exist")
    return Tokenizer.from_file(path)
