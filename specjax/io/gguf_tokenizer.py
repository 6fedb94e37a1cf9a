"""A ``tokenizers.Tokenizer`` rebuilt from a GGUF file's ``tokenizer.ggml.*`` metadata.

A GGUF carries no ``tokenizer.json``: it stores the vocabulary (``tokens``,
``token_type``, ``scores``), the BPE ``merges`` and the special ids, and names
the rest: ``tokenizer.ggml.model`` the algorithm and ``tokenizer.ggml.pre`` a
pre-tokenizer that llama.cpp implements under that name. Two models cover the
supported architectures:

* ``gpt2``: byte-level BPE with the file's merges (Llama 3, Qwen2/3, SmolLM).
  The text is split by the regular expressions llama.cpp runs for the named
  pre-tokenizer, then mapped to GPT-2's byte alphabet.
* ``llama``: SentencePiece-style BPE over ``▁``-escaped text with byte fallback
  (Llama 2, Mistral, Gemma). The file has no merges, only a score per piece;
  merges are rebuilt from the vocabulary, best piece first.

Control and user-defined tokens (``token_type`` 3 and 4) become added tokens,
so that they are matched whole in the text.

The pre-tokenizers follow llama.cpp, which is also what the models' own
``tokenizer.json`` do (transformers' GGUF reader knows fewer names and splits
the others like GPT-2, without SmolLM's digit split or Llama 3's
``ignore_merges``). The SentencePiece details that llama.cpp leaves to its own
encoder (how merges are ranked, where the ``▁`` prefix goes) follow
transformers' GGUF tokenizer, the oracle of the tests.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

__all__ = ["SUPPORTED_PRE_TOKENIZERS", "tokenizer_from_gguf"]

# llama.cpp's token types (llama_token_type); 1 is a normal piece.
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4

# The splits of GPT-2, Llama 3, Qwen2 and GPT-4o tokenizers, as in the
# ``tokenizer.json`` of those models (llama.cpp runs hand-rewritten equivalents
# because its regex engine lacks ``(?i:...)``; Oniguruma, under ``tokenizers``, has it).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre(*splits: str, ignore_merges: bool = False, add_bos: bool = False) -> dict:
    return dict(splits=splits, ignore_merges=ignore_merges, add_bos=add_bos)


# ``tokenizer.ggml.pre`` -> how llama.cpp pre-tokenizes for it: the regular
# expressions applied one after the other (each splits the pieces of the one
# before), whether a word found whole in the vocabulary skips the merges, and
# whether BOS is added when the file does not say.
_PRE_TOKENIZERS = {
    # No name (files from before llama.cpp recorded one): llama.cpp's fallback.
    "default": _pre(r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    **dict.fromkeys(
        (
            "gpt-2 phi-2 mpt olmo jais trillion granite-docling exaone4 jina-es jina-de "
            "jina-v2-es jina-v2-de gigachat a.x-4.0 mellum modern-bert"
        ).split(),
        _pre(_GPT2),
    ),
    **dict.fromkeys(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano".split(),
        _pre(_LLAMA3, ignore_merges=True, add_bos=True),
    ),
    **dict.fromkeys(["dbrx", "smaug-bpe"], _pre(_LLAMA3)),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan"],
        _pre(_QWEN2),
    ),
    # Digits one by one, then GPT-2's split.
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        _pre(r"\p{N}", _GPT2),
    ),
    "tekken": _pre(_TEKKEN, ignore_merges=True, add_bos=True),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _pre(_GPT4O)),
}

SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_PRE_TOKENIZERS))
"""The ``tokenizer.ggml.pre`` values of byte-level (``gpt2``) vocabularies that are understood."""

# Gemma files order their vocabulary by merge priority, and their scores do
# not follow that order (transformers' GGUF tokenizer relies on the same fact).
_RANK_BY_POSITION = frozenset({"gemma", "gemma2", "gemma3"})


def tokenizer_from_gguf(metadata: dict, *, architecture: str, source: str) -> Tokenizer | None:
    """Builds the tokenizer a GGUF file describes, or ``None`` if it has no vocabulary.

    Args:
        metadata: the file's metadata, key -> value (``tokenizer.ggml.tokens`` a
            list of str, ``tokenizer.ggml.token_type`` a list of int, ...).
        architecture: ``general.architecture`` (Gemma vocabularies rank merges
            by position).
        source: the file, named in errors.

    Returns:
        A ``tokenizers.Tokenizer`` whose ids are the file's token ids. ``encode``
        adds BOS (and EOS) exactly when ``tokenizer.ggml.add_bos_token``
        (``add_eos_token``) says so, with llama.cpp's defaults when absent
        (BOS for SentencePiece vocabularies and the Llama 3 pre-tokenizer).

    Raises:
        ValueError: an unknown ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre``,
            or inconsistent vocabulary arrays, naming the key and the file.
    """
    kind = metadata.get("tokenizer.ggml.model")
    if kind is None or kind in ("none", "no_vocab"):
        return None
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(
            f"{source}: tokenizer.ggml.model={kind!r} but tokenizer.ggml.tokens is missing"
        )
    types = metadata.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(
            f"{source}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )
    if kind == "gpt2":
        tokenizer, add_bos = _byte_level_bpe(metadata, tokens, types, source)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(metadata, tokens, types, architecture, source)
        add_bos = True
    else:
        raise ValueError(
            f"{source}: tokenizer.ggml.model={kind!r} is not supported; expected 'gpt2' "
            "(byte-level BPE) or 'llama' (SentencePiece BPE)"
        )
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    _set_post_processor(tokenizer, metadata, tokens, add_bos, add_eos, source)
    return tokenizer


def _byte_level_bpe(metadata, tokens, types, source) -> tuple[Tokenizer, bool]:
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"{source}: tokenizer.ggml.pre={pre!r} is not a known byte-level pre-tokenizer; "
            f"expected one of {SUPPORTED_PRE_TOKENIZERS}"
        )
    spec = _PRE_TOKENIZERS[pre]
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise ValueError(f"{source}: tokenizer.ggml.model='gpt2' needs tokenizer.ggml.merges")

    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())
    # Tokens are spelled in GPT-2's byte alphabet; one that is not (a literal
    # added token) is respelled from its UTF-8 bytes so every id keeps a key.
    vocab = {}
    for i, token in enumerate(tokens):
        key = token if set(token) <= spelled else "".join(alphabet[b] for b in token.encode())
        vocab[key] = i  # a repeated token keeps its last id, as in llama.cpp
    pairs = []
    for i, merge in enumerate(merges):
        # The first space after position 0 separates the halves (llama.cpp's rule).
        cut = merge.find(" ", 1)
        if cut < 0:
            raise ValueError(f"{source}: tokenizer.ggml.merges[{i}]={merge!r} is not 'left right'")
        pairs.append((merge[:cut], merge[cut + 1 :]))

    try:
        model = models.BPE(vocab, pairs, ignore_merges=spec["ignore_merges"])
    except Exception as e:  # tokenizers raises a bare Exception for a bad merge
        raise ValueError(f"{source}: tokenizer.ggml.merges do not fit the vocabulary: {e}") from e
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in spec["splits"]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a mislabel in the
    # converter; adding it would give it a fresh id past the vocabulary.
    _add_special(tokenizer, tokens, types, lambda t: set(t) <= spelled)
    return tokenizer, spec["add_bos"]


def _sentencepiece_bpe(metadata, tokens, types, architecture, source) -> Tokenizer:
    original = tokens
    if architecture in _RANK_BY_POSITION:
        # Gemma stores runs of spaces as real spaces, but looks pieces up in
        # escaped form: respell them so the rebuilt merges can reach them.
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        priority = [-float(i) for i in range(len(tokens))]
    else:
        priority = metadata.get("tokenizer.ggml.scores")
        if priority is None or len(priority) != len(tokens):
            raise ValueError(
                f"{source}: a SentencePiece vocabulary (tokenizer.ggml.model='llama') needs "
                "one tokenizer.ggml.scores entry per token"
            )
    vocab = {}
    for i, token in enumerate(tokens):
        vocab[token] = i  # a repeated token keeps its last id, as in llama.cpp
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    model = models.BPE(
        vocab,
        _merges_from_scores(vocab, priority),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    # "first": a space is prepended to the start of the text only, not after each
    # added token (transformers' choice; llama.cpp also prepends after special tokens).
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    # Matched whole by their text as the file spells it (a respelled run of
    # spaces is left to the merges).
    _add_special(tokenizer, original, types, lambda t: True)
    return tokenizer


def _merges_from_scores(vocab: dict[str, int], priority) -> list[tuple[str, str]]:
    """Every split ``(left, right)`` of a piece into two pieces, best merged piece first.

    A piece with a higher score is merged earlier. Among the splits of one piece
    (or pieces of equal score) the longer left half goes first, then vocabulary
    order, which is how transformers rebuilds these merges.
    """
    splits = []
    for piece, index in vocab.items():
        found = [
            (piece[:cut], piece[cut:])
            for cut in range(1, len(piece))
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        found.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        score = float(priority[index])
        splits.extend((-score, -len(left), -len(right), left, right) for left, right in found)
    # A stable sort on the first three fields keeps vocabulary order among ties.
    splits.sort(key=lambda s: s[:3])
    return [(left, right) for *_, left, right in splits]


def _add_special(tokenizer: Tokenizer, tokens, types, keep) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain ones."""
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=True)
        if kind in (_CONTROL, _UNKNOWN) and keep(t)
    ]
    tokenizer.add_special_tokens(special)
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    plain = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=True)
        if kind == _USER_DEFINED and t in vocab
    ]
    tokenizer.add_tokens(plain)


def _set_post_processor(tokenizer, metadata, tokens, add_bos, add_eos, source) -> None:
    ends = []
    for flag, key in ((add_bos, "bos"), (add_eos, "eos")):
        if not flag:
            ends.append(None)
            continue
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is None or not 0 <= token_id < len(tokens):
            raise ValueError(
                f"{source}: tokenizer.ggml.add_{key}_token is set but "
                f"tokenizer.ggml.{key}_token_id is {token_id!r}"
            )
        ends.append((tokens[token_id], int(token_id)))
    bos, eos = ends
    if bos is None and eos is None:
        return
    head = [bos[0]] if bos else []
    tail = [eos[0]] if eos else []
    single = [*head, "$A", *tail]
    pair = [*head, "$A", *tail, *head, "$B:1", *tail]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[e for e in (bos, eos) if e is not None]
    )


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves,
    the others (controls, space, ...) for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in alphabet)
    for n, b in enumerate(shifted):
        alphabet[b] = chr(0x100 + n)
    return alphabet
