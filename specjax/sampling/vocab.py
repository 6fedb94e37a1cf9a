"""Vocabularies: padded embedding rows, the real vocabulary, and smaller drafters.

Model families pad their embedding matrices past their tokenizer: Qwen2.5-0.5B has
151,936 rows and Qwen2.5-7B 152,064, with one tokenizer of 151,665 tokens. Two things
follow, and this module handles both.

* **Padded rows are never tokens.** `SamplingConfig.vocab_limit` masks the logits of
  ids ``>= vocab_limit`` inside `specjax.sampling.probs_from_logits`, which processes the
  target's and the draft's logits alike, so a padded id is neither sampled nor chosen
  greedily by either. The decoders default it to `default_vocab_limit` (the target's
  tokenizer size where it is known and smaller than V).
* **A draft model of the family may have fewer rows than the target** (V_d < V). It
  can draft when the two share their ids: every id the target may emit is one the
  draft has (``vocab_limit <= V_d``), and where both have tokenizers they agree on the
  ids below V_d. Its distributions ``q [B, γ, V_d]`` are then zero-padded to the
  target's V (`pad_to_vocab`). That is exact: the drafter never proposes an id
  ``>= V_d``, so q is 0 there in truth, and rejection sampling with the padded q is
  rejection sampling with the drafter's actual distribution. The acceptance test reads
  q only at drafted ids, and the residual ``max(0, p - q)`` is ``p`` at the padded
  ids, as it is at any id the drafter never proposes.

Everything else (a drafter with a larger V, tokenizers that disagree, a limit beyond
either vocabulary) is refused on the host with an error naming both sizes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.validation import is_concrete
from specjax.sampling.settings import SamplingConfig

__all__ = [
    "check_drafter_vocab",
    "default_vocab_limit",
    "frequent_ids",
    "pad_to_vocab",
    "resolve_vocab_limit",
    "tokenizer_of",
]


def tokenizer_of(obj):
    """The ``tokenizers.Tokenizer`` of a model or of a drafter's model, or ``None``."""
    for owner in (obj, getattr(obj, "model", None)):
        tokenizer = getattr(owner, "tokenizer", None)
        if tokenizer is not None and hasattr(tokenizer, "get_vocab_size"):
            return tokenizer
    return None


def default_vocab_limit(model) -> int:
    """The real vocabulary of ``model``: its tokenizer's size if smaller than V, else V.

    The size counts added tokens (``get_vocab_size(with_added_tokens=True)``), which
    are real tokens (chat markup, end-of-turn ids).
    """
    vocab = int(model.vocab_size)
    tokenizer = tokenizer_of(model)
    if tokenizer is None:
        return vocab
    return min(vocab, int(tokenizer.get_vocab_size(with_added_tokens=True)))


def _drafter_vocab(drafter) -> int | None:
    return getattr(drafter, "vocab_size", None)


def check_drafter_vocab(target, drafter) -> None:
    """Refuses a drafter whose vocabulary does not share the target's ids.

    Accepted: a drafter with no vocabulary of its own (``vocab_size is None``), or one
    of ``V_d <= V`` ids whose tokenizer, where both have one, gives the same token
    string as the target's for every id below ``V_d`` that both know.

    Raises:
        ValueError: naming both sizes (a larger drafter), or the first id on which the
            tokenizers differ.
    """
    v_draft, v_target = _drafter_vocab(drafter), int(target.vocab_size)
    if v_draft is None:
        return
    if v_draft > v_target:
        raise ValueError(
            f"drafter vocabulary size {v_draft} is larger than the target's {v_target}: a "
            "drafter must share the target's ids, with at most its V (a smaller one is "
            "zero-padded)"
        )
    ours, theirs = tokenizer_of(target), tokenizer_of(drafter)
    if ours is None or theirs is None or ours is theirs:
        return
    mismatch = _first_mismatch(ours, theirs, v_draft)
    if mismatch is not None:
        i, a, b, count = mismatch
        raise ValueError(
            f"the drafter's tokenizer disagrees with the target's on the ids they share "
            f"(below the drafter's vocabulary size {v_draft}; the target has {v_target}): "
            f"id {i} is {a!r} for the target and {b!r} for the drafter ({count} ids differ)"
        )


# Verdicts of `_first_mismatch` by the pair of tokenizer objects (which the entry keeps
# alive, so their ids are not reused): comparing 150k token strings takes ~0.2 s, and
# the decoders check every call.
_MISMATCH_CACHE: dict[tuple[int, int, int], tuple] = {}
_MISMATCH_CACHE_SIZE = 8


def _first_mismatch(ours, theirs, num_ids: int):
    """``(id, target token, drafter token, count)`` of the first differing id, or None."""
    key = (id(ours), id(theirs), num_ids)
    if key in _MISMATCH_CACHE:
        return _MISMATCH_CACHE[key][2]
    verdict = None
    if ours.to_str() != theirs.to_str():
        a = [ours.id_to_token(i) for i in range(num_ids)]
        b = [theirs.id_to_token(i) for i in range(num_ids)]
        bad = [i for i in range(num_ids) if None not in (a[i], b[i]) and a[i] != b[i]]
        if bad:
            verdict = (bad[0], a[bad[0]], b[bad[0]], len(bad))
    if len(_MISMATCH_CACHE) >= _MISMATCH_CACHE_SIZE:
        _MISMATCH_CACHE.pop(next(iter(_MISMATCH_CACHE)))
    _MISMATCH_CACHE[key] = (ours, theirs, verdict)
    return verdict


def resolve_vocab_limit(sampling: SamplingConfig, target, drafter=None) -> SamplingConfig:
    """``sampling`` with its ``vocab_limit`` filled in (if ``None``) and checked.

    The default is `default_vocab_limit` of the target. A concrete limit must be an
    integer in ``[1, V]``, and at most the drafter's ``V_d`` when the drafter is
    smaller than the target (the target must not emit ids the draft has no embedding
    for). Traced limits are used as given.

    Raises:
        ValueError / TypeError: naming ``SamplingConfig.vocab_limit`` and the sizes.
    """
    vocab = int(target.vocab_size)
    if sampling.vocab_limit is None:
        sampling = sampling.replace(vocab_limit=np.int32(default_vocab_limit(target)))
    limit = sampling.vocab_limit
    if not jnp.issubdtype(jnp.result_type(limit), jnp.integer):
        raise TypeError(
            f"SamplingConfig.vocab_limit must be an integer (or one per row), got "
            f"{jnp.result_type(limit)}"
        )
    if not is_concrete(limit):
        return sampling
    values = np.asarray(limit)
    lo, hi = int(values.min()), int(values.max())
    if lo < 1 or hi > vocab:
        bad = lo if lo < 1 else hi
        raise ValueError(
            f"SamplingConfig.vocab_limit must be in [1, {vocab}] (the target's vocabulary "
            f"size V = {vocab}), got {bad}"
        )
    v_draft = _drafter_vocab(drafter) if drafter is not None else None
    if v_draft is not None and v_draft < vocab and hi > v_draft:
        raise ValueError(
            f"SamplingConfig.vocab_limit is {hi}, but the drafter's vocabulary size is "
            f"{v_draft} (the target's {vocab}): the target could emit ids "
            f"{v_draft}..{hi - 1}, which the drafter has no embedding for; pass "
            f"vocab_limit <= {v_draft} (the real vocabulary) or a drafter that covers it"
        )
    return sampling


def pad_to_vocab(probs_BGV: jax.Array, vocab_size: int) -> jax.Array:
    """A drafter's ``q [B, γ, V_d]`` zero-padded to ``[B, γ, V]`` (exact; see the module)."""
    missing = vocab_size - probs_BGV.shape[-1]
    if missing == 0:
        return probs_BGV
    return jnp.pad(probs_BGV, [(0, 0)] * (probs_BGV.ndim - 1) + [(0, missing)])


def frequent_ids(model, num_ids: int, texts=()) -> np.ndarray:
    """``num_ids`` ids a drafter's head should keep (`Model.with_head_ids`), sorted.

    First every added token of the model's tokenizer (chat markup and end-of-turn ids,
    which a drafter must be able to propose), then the ids seen in ``texts`` by count,
    then the lowest remaining ids: a BPE tokenizer numbers its merges in the order it
    learned them, most frequent pairs first, so low ids are the common tokens of its
    training text. Any choice keeps decoding exact; it only sets the acceptance.

    Args:
        model: a model (or drafter) with a ``tokenizers`` tokenizer, or with none (then
            only ``texts`` counted as token-id sequences, and the lowest ids).
        num_ids: K, how many ids to keep, ``1 <= K <= vocab_size``.
        texts: optional sample text, strings (encoded with the tokenizer) or id lists.

    Returns:
        ``int32[K]`` distinct ids below ``vocab_size``, ascending.
    """
    vocab = int(model.vocab_size)
    if not 1 <= int(num_ids) <= vocab:
        raise ValueError(f"num_ids must be in [1, {vocab}] (vocab_size), got {num_ids}")
    tokenizer = tokenizer_of(model)
    chosen: dict[int, None] = {}  # insertion-ordered set
    if tokenizer is not None:
        added = tokenizer.get_added_tokens_decoder()
        chosen.update((int(i), None) for i in sorted(added) if i < vocab)
    counts = np.zeros(vocab, np.int64)
    for text in texts:
        if isinstance(text, str):
            if tokenizer is None:
                raise ValueError(
                    "texts holds strings but the model has no tokenizer: pass token-id lists"
                )
            text = tokenizer.encode(text, add_special_tokens=False).ids
        ids = np.asarray(text, np.int64)
        np.add.at(counts, ids[(ids >= 0) & (ids < vocab)], 1)
    seen = np.nonzero(counts)[0]
    chosen.update((int(i), None) for i in seen[np.argsort(-counts[seen], kind="stable")])
    ranked = list(chosen)[: int(num_ids)]
    if len(ranked) < num_ids:
        rest = np.setdiff1d(np.arange(vocab), np.asarray(ranked, np.int64), assume_unique=True)
        ranked += rest[: int(num_ids) - len(ranked)].tolist()
    return np.sort(np.asarray(ranked, np.int32))
