"""Decoding: one on-device loop for plain and speculative decoding, closed or open.

Plain decoding is speculative decoding's degenerate case: the null drafter
(`~specjax.drafters.NoDraft`, γ = 0) proposes nothing, and each step emits the
target's own sample. Both therefore run the same ``lax.while_loop`` body.

The loop keeps one invariant: a row's cache holds every token of the row except the
newest one, which is "pending" and fed at the start of the next step. Slot ``s`` of
the token buffer and of every cache holds position ``s``, so rolling a cache back is
only a change of per-row lengths.

Two ways to run it:

* closed: `generate` and `speculative_generate` run prefill, the loop to the end and
  the output gather as one jitted program (callable inside a user's ``jax.jit``);
* open, in the style of gemma and tunix: `init` builds a `DecodeState`, `step` runs a
  jitted chunk of the same loop (the state is donated), `result` reads the output at
  any point, and `stream` yields the new tokens chunk by chunk.

All randomness is keyed by row seed and position (`specjax.noise`), so a row's output
does not depend on the rest of the batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import noise
from specjax.drafters import (
    Drafter,
    NoDraft,
    cache_bytes,
    init_drafter,
    lookahead,
    prefill,
    score,
    update_drafter,
)
from specjax.models.cache import TreeMask
from specjax.sampling import (
    SamplingConfig,
    check_sampling_config,
    mask_vocab,
    per_row,
    probs_from_logits,
)
from specjax.slots import PromptOutputs, PromptQueue, insert_row, serving_order
from specjax.tree import Tree, compact_path, path_nodes_with_root, tree_verify
from specjax.validation import (
    INT32_MAX,
    as_prng_key,
    check_fits_memory,
    check_int,
    check_int_array,
    is_concrete,
)
from specjax.verify import coupled_verify, rejection_sample, rejection_sample_onehot
from specjax.vocab import check_drafter_vocab, pad_to_vocab, resolve_vocab_limit

__all__ = [
    "CACHE_BUCKET",
    "PROMPT_BUCKET",
    "DecodeState",
    "GenerationResult",
    "GenerationStats",
    "check_drafter",
    "generate",
    "init",
    "pad_prompts",
    "resolve_cache_len",
    "result",
    "speculative_generate",
    "step",
    "stream",
]

# Default cache lengths are rounded up to this multiple, so that nearby values
# of max_new_tokens (or prompt lengths) share one compiled program.
CACHE_BUCKET = 64
# Prompt widths are padded up to this multiple, for the same reason; the padding is
# written to cache slots that are overwritten before they are read.
PROMPT_BUCKET = 16
# eos ids are padded with -1 (never a token) to a multiple of this, so that None, one
# id and a few ids are one compiled program.
EOS_BUCKET = 8
VERIFICATIONS = ("rejection", "coupled")


@struct.dataclass
class GenerationStats:
    """Counters of one decoding run.

    Attributes:
        target_calls: ``int32[]`` target forward calls in the loop (iterations).
        row_target_calls: ``int32[N]`` iterations in which each prompt was active
            (per slot, ``[B]``, inside a `DecodeState`).
        drafted: ``int32[N]`` tokens drafted (proposed) for each prompt.
        accepted: ``int32[N]`` drafted tokens the verifier accepted per prompt.
        accepted_hist: ``int32[γ+1]`` how often 0..γ drafts were accepted in
            one step (over active rows); one bin for plain decoding.
    """

    target_calls: jax.Array
    row_target_calls: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    accepted_hist: jax.Array

    @property
    def acceptance_rate(self) -> jax.Array:
        """Accepted / drafted tokens over the whole batch."""
        return jnp.sum(self.accepted) / jnp.maximum(jnp.sum(self.drafted), 1)


@struct.dataclass
class GenerationResult:
    """Output of :func:`generate`, :func:`speculative_generate` and :func:`result`.

    Attributes:
        tokens: ``int32[N, W]`` generated tokens of the N prompts, in prompt order
            (W = the largest ``max_new_tokens``, or fewer when the cache cannot hold
            that many); slots at or after a row's length hold ``-1``.
        lengths: ``int32[N]`` tokens generated per prompt, EOS included.
        from_draft: ``bool[N, W]`` which tokens were accepted drafts (the rest
            came from the target: corrections and bonus tokens).
        logprobs: ``float32[N, W]`` the target's log-probability of each token under
            the processed distribution it was sampled from (0 for greedy rows, whose
            distribution is one-hot); ``0`` after a row's length.
        truncated: ``bool[N]`` rows stopped because their cache was full before
            reaching EOS or ``max_new_tokens``.
        invalid: ``bool[N]`` rows stopped because the target's logits were NaN or all
            ``-inf`` at the next position (a broken model or input); nothing is
            emitted for that position.
        stats: :class:`GenerationStats`.
    """

    tokens: jax.Array
    lengths: jax.Array
    from_draft: jax.Array
    logprobs: jax.Array
    truncated: jax.Array
    invalid: jax.Array
    stats: GenerationStats

    @property
    def tokens_per_call(self) -> jax.Array:
        """Mean tokens emitted per target call per row (1.0 for plain decoding)."""
        return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.stats.row_target_calls), 1)

    def to_lists(self) -> list[list[int]]:
        """Each row's generated tokens as a Python list (a host transfer)."""
        tokens, lengths = jax.device_get((self.tokens, self.lengths))
        return [row[:n].tolist() for row, n in zip(tokens, lengths, strict=True)]


@struct.dataclass(kw_only=True)
class DecodeState:
    """Everything needed to continue decoding: the loop's carry plus its models.

    Build it with :func:`init`, advance it with :func:`step`, read it with
    :func:`result`. `step` donates the state's buffers: use the state it returns,
    not the one passed in.

    Attributes:
        target: the target model (model contract).
        drafter: the `Drafter`; `~specjax.drafters.NoDraft` for plain decoding.
        verification: ``"rejection"`` or ``"coupled"`` (static).
        seq: ``int32[B, S]`` prompt then generated tokens; slot == position.
        seq_lengths: ``int32[B]`` valid tokens per row (prompt + generated).
        prompt_lengths: ``int32[B]``.
        from_draft: ``bool[B, S]`` slot holds an accepted draft token.
        logprobs: ``float32[B, S]`` log-probability of each generated token.
        done: ``bool[B]`` row has stopped.
        truncated: ``bool[B]`` row stopped on a full cache.
        invalid: ``bool[B]`` row stopped on a NaN or empty target distribution.
        target_cache: the target's cache.
        drafter_state: whatever the drafter carries (e.g. its cache).
        row_keys: ``key[B]`` ``fold_in(key, seed_b)``: each row's own randomness.
        sampling: `SamplingConfig` with ``[B]`` leaves (``vocab_limit`` resolved).
        max_new_tokens: ``int32[B]`` each row's token budget.
        eos_ids: ``int32[K]`` ids that end a row (``-1`` pads).
        stats: :class:`GenerationStats` (per slot; finished prompts' counts are in
            ``outputs``).
        queue: the `~specjax.slots.PromptQueue` of all N prompts (the fields above
            are per slot, ``[B]``).
        outputs: the `~specjax.slots.PromptOutputs` of the prompts handed on so far.
        gamma_table: static ``((max_active_rows, γ), ...)`` pairs, ascending: a step
            with ``a`` active rows drafts the γ of the first pair with
            ``a <= max_active_rows`` (the last pair beyond). Empty: always the
            drafter's γ.
        draft_confidence: ``float32[]`` τ, or ``None``: a row stops proposing after
            its first draft whose own probability is below τ.
    """

    target: object
    drafter: object
    verification: str = struct.field(pytree_node=False)
    seq: jax.Array
    seq_lengths: jax.Array
    prompt_lengths: jax.Array
    from_draft: jax.Array
    logprobs: jax.Array
    done: jax.Array
    truncated: jax.Array
    invalid: jax.Array
    target_cache: object
    drafter_state: object
    row_keys: jax.Array
    sampling: SamplingConfig
    max_new_tokens: jax.Array
    eos_ids: jax.Array
    stats: GenerationStats
    queue: PromptQueue
    outputs: PromptOutputs
    gamma_table: tuple[tuple[int, int], ...] = struct.field(pytree_node=False, default=())
    draft_confidence: jax.Array | None = None

    @property
    def num_generated(self) -> jax.Array:
        """``int32[B]`` tokens generated so far per row."""
        return self.seq_lengths - self.prompt_lengths

    @property
    def lookahead(self) -> int:
        """Slots one step may write past a row's length (γ + 1, or N + 1 for a tree)."""
        return lookahead(self.drafter)


# ----------------------------------------------------------------------------
# Input handling (host side, before anything is compiled).


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_prompts(prompts) -> tuple[jax.Array, jax.Array]:
    """Normalises prompts to right-padded ``int32[B, P]`` plus ``int32[B]`` lengths.

    Args:
        prompts: an integer array ``[B, P]`` (every row a full prompt) or a
            sequence of token-id sequences of possibly different lengths.

    Raises:
        ValueError / TypeError naming ``prompts`` on empty or malformed input, or on
        ids that do not fit in int32 (they are refused, never wrapped).
    """
    if isinstance(prompts, (jax.Array, np.ndarray)):
        arr = check_int_array("prompts", prompts, ndim=2)
        b, p = arr.shape
        if b < 1 or p < 1:
            raise ValueError(
                f"prompts must have at least one row and one token, got shape {list(arr.shape)}"
            )
        return jnp.asarray(arr, jnp.int32), jnp.full((b,), p, jnp.int32)
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise TypeError(
            "prompts must be an int array [B, P] or a list of token-id lists, "
            f"got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("prompts is empty: need at least one prompt")
    rows = []
    for i, row in enumerate(prompts):
        try:
            ndim = -1 if isinstance(row, (str, bytes)) else np.ndim(row)
        except ValueError:  # numpy refuses ragged nesting such as [[3], 4]
            raise ValueError(
                f"prompts[{i}] must be a flat list of int token ids (a 1-D array), "
                f"got a nested {row!r:.60}"
            ) from None
        if isinstance(row, (str, bytes)) or ndim != 1 or len(row) == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {row!r:.60}")
        rows.append(check_int_array(f"prompts[{i}]", row, ndim=1))
    lengths = np.array([len(r) for r in rows], np.int32)
    padded = np.zeros((len(rows), lengths.max()), np.int32)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    return jnp.asarray(padded), jnp.asarray(lengths)


def _check_tokens_in_vocab(prompts_BP, lengths_B, vocab_size: int, whose: str = "model's"):
    if is_concrete(prompts_BP):
        prompts, lengths = np.asarray(prompts_BP), np.asarray(lengths_B)
        real = np.arange(prompts.shape[1])[None] < lengths[:, None]
        lo, hi = int(prompts[real].min()), int(prompts[real].max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"prompts hold token ids in [{lo}, {hi}], outside the {whose} vocabulary "
                f"[0, {vocab_size})"
            )


def resolve_cache_len(cache_len, max_prompt_len: int, max_new_tokens, lookahead: int) -> int:
    """The static cache length a decoder uses: ``cache_len`` checked, or the default.

    The default is ``max_prompt_len + max(max_new_tokens) + lookahead`` rounded up to a
    multiple of ``CACHE_BUCKET`` (``lookahead`` is 1 for plain decoding, γ + 1 for
    speculative decoding).
    """
    if cache_len is None:
        if not is_concrete(max_new_tokens):
            raise ValueError(
                "cache_len must be given explicitly when max_new_tokens is traced "
                "(it fixes the static cache shape)"
            )
        needed = max_prompt_len + int(np.max(max_new_tokens)) + lookahead
        return _round_up(needed, CACHE_BUCKET)
    cache_len = check_int("cache_len", cache_len, lo=1)
    if max_prompt_len + lookahead > cache_len:
        raise ValueError(
            f"the longest prompt ({max_prompt_len} tokens) plus the {lookahead} slots one "
            f"step needs does not fit in cache_len={cache_len}"
        )
    return cache_len


def _check_max_new_tokens(max_new_tokens, batch_size: int):
    """``int32[B]`` budgets from an int or a ``[B]`` array; traced values pass unchecked."""
    if not is_concrete(max_new_tokens):
        value = jnp.asarray(max_new_tokens)
        if not jnp.issubdtype(value.dtype, jnp.integer) or value.shape not in ((), (batch_size,)):
            raise ValueError(
                f"max_new_tokens must be an int or int[{batch_size}], got a traced "
                f"{value.dtype}{list(value.shape)}"
            )
        return jnp.broadcast_to(value.astype(jnp.int32), (batch_size,))
    if np.ndim(max_new_tokens) == 0:
        value = np.full((batch_size,), check_int("max_new_tokens", max_new_tokens, lo=1))
    else:
        value = check_int_array("max_new_tokens", max_new_tokens, lo=1, ndim=1)
        if value.shape != (batch_size,):
            raise ValueError(
                f"max_new_tokens must be an int or one per prompt, [{batch_size}]; got shape "
                f"{list(value.shape)}"
            )
    return value.astype(np.int32)


def _eos_array(eos_id, vocab_size: int) -> jax.Array:
    """``int32[K]`` ids, K a multiple of ``EOS_BUCKET``, padded with ``-1`` (never a token)."""
    if eos_id is None:
        ids = np.zeros((0,), np.int32)
    elif np.ndim(eos_id) == 0 and not isinstance(eos_id, (jax.Array, np.ndarray)):
        ids = np.array([check_int("eos_id", eos_id, lo=0, hi=vocab_size - 1)], np.int32)
    else:
        ids = np.reshape(check_int_array("eos_id", eos_id, lo=0, hi=vocab_size - 1), -1)
        if np.ndim(eos_id) > 1:
            raise ValueError(
                f"eos_id must be an int or a list of ids [K], got shape {list(np.shape(eos_id))}"
            )
    width = max(EOS_BUCKET, _round_up(len(ids), EOS_BUCKET))
    return jnp.asarray(np.pad(ids, (0, width - len(ids)), constant_values=-1))


def _check_seeds(seeds, batch_size: int) -> jax.Array:
    if seeds is None:
        return jnp.arange(batch_size, dtype=jnp.int32)
    if is_concrete(seeds) and np.ndim(seeds) == 0:
        raise ValueError(
            f"seeds must hold one int per prompt, [{batch_size}], got the scalar {seeds!r}"
        )
    value = check_int_array("seeds", seeds, lo=0, ndim=1)
    if value.shape != (batch_size,):
        raise ValueError(
            f"seeds must hold one int per prompt, [{batch_size}]; got shape {list(value.shape)}"
        )
    return jnp.asarray(value, jnp.int32)


def _check_num_slots(num_slots, num_prompts: int) -> int:
    """B: the rows decoded at once, in ``[1, N]``; default one per prompt."""
    if num_slots is None:
        return num_prompts
    num_slots = check_int("num_slots", num_slots, lo=1)
    if num_slots > num_prompts:
        raise ValueError(
            f"num_slots={num_slots} is more than the {num_prompts} prompts: a slot would "
            "never hold a prompt (use at most one slot per prompt)"
        )
    return num_slots


def _check_gamma_table(table, max_gamma: int) -> tuple[tuple[int, int], ...]:
    """``gamma_by_active_rows`` as sorted static ``((max_active_rows, γ), ...)`` pairs."""
    if table is None:
        return ()
    name = "gamma_by_active_rows"
    pairs = list(table.items()) if isinstance(table, dict) else table
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
        raise ValueError(
            f"{name} must be a non-empty dict {{max_active_rows: γ}} or list of "
            f"(max_active_rows, γ) pairs, got {table!r:.80}"
        )
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"{name}[{i}] must be a (max_active_rows, γ) pair, got {pair!r:.60}")
        rows = check_int(f"{name}[{i}] max_active_rows", pair[0], lo=1)
        gamma = check_int(f"{name}[{i}] γ", pair[1], lo=0, hi=max_gamma)
        out.append((rows, gamma))
    out.sort()
    if len({rows for rows, _ in out}) != len(out):
        raise ValueError(f"{name} names one max_active_rows twice: {out}")
    return tuple(out)


def _check_confidence(threshold):
    """τ as a traced ``float32[]`` (or None): a probability in ``[0, 1]``."""
    if threshold is None:
        return None
    if is_concrete(threshold):
        if np.ndim(threshold) != 0 or isinstance(threshold, bool):
            raise ValueError(f"draft_confidence must be a float in [0, 1], got {threshold!r:.60}")
        value = float(threshold)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"draft_confidence must be a float in [0, 1], got {value}")
    return jnp.asarray(threshold, jnp.float32)


def _check_model(name: str, model) -> int:
    """The model contract's static members, checked; returns V."""
    missing = [m for m in ("vocab_size", "init_cache") if not hasattr(model, m)]
    if missing or not callable(model):
        raise TypeError(
            f"{name} must follow the model contract (callable, with vocab_size and "
            f"init_cache), e.g. a specjax.Model; got {type(model).__name__}"
        )
    return check_int(f"{name}.vocab_size", model.vocab_size, lo=1)


def check_drafter(target, drafter: Drafter):
    """Raises ValueError/TypeError if ``drafter`` cannot serve ``target``."""
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a specjax Drafter, got {type(drafter).__name__}")
    gamma = drafter.num_draft
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)):
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    if gamma < 1 and not isinstance(drafter, NoDraft):
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    for role, model in drafter.own_models().items():
        _check_model(role, model)
    check_drafter_vocab(target, drafter)
    if drafter.target_layers:
        _check_features(target, drafter)
    drafter.check()  # e.g. BlockDrafter, EagleDrafter: γ, mode, layers, tree
    if getattr(drafter, "tree", None) is not None:
        _check_tree(target, drafter)


def _check_tree(target, drafter: Drafter) -> None:
    """A tree drafter needs models that take ``tree=`` and a tree that fits them."""
    tree, name = drafter.tree, type(drafter).__name__
    if not isinstance(tree, Tree):
        raise TypeError(f"drafter.tree must be a specjax.tree.Tree, got {type(tree).__name__}")
    if drafter.num_draft != tree.depth:
        raise ValueError(
            f"drafter.num_draft (γ) must be the tree's depth {tree.depth}, got "
            f"{drafter.num_draft}: use drafter.with_tree(tree) to set both"
        )
    for role, model in {"target": target, **drafter.own_models()}.items():
        if not getattr(model, "supports_tree", False):
            raise TypeError(
                f"{role} ({type(model).__name__}) does not support tree attention (no "
                f"supports_tree = True and tree= argument), and the {name} proposes a "
                f"{tree!r}: see the README's 'Bring your own model', or use a chain"
            )
        windows = [w for w in getattr(getattr(model, "config", None), "layer_windows", ()) if w]
        # Tree keys are masked by slot, which is >= their position; that is exact as long
        # as the whole tree fits in the window (depth < window).
        if windows and min(windows) <= tree.depth:
            raise ValueError(
                f"{role} has a sliding window of {min(windows)} tokens, not deeper than the "
                f"depth {tree.depth} of the {tree!r}: use a shallower tree"
            )


def _check_features(target, drafter: Drafter) -> None:
    """A drafter that reads target layers needs a target that can return them."""
    layers = drafter.target_layers
    name = type(drafter).__name__
    try:
        params = inspect.signature(target.__call__).parameters
    except (TypeError, ValueError):
        params = {}
    takes = "feature_layers" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    if not takes:
        raise TypeError(
            f"target ({type(target).__name__}) cannot return hidden-state features: its "
            f"__call__ takes no feature_layers= argument, and the {name} reads target "
            f"layers {layers} (see the README's 'Bring your own model')"
        )
    num_layers = getattr(target, "num_layers", None)
    if num_layers is None:
        num_layers = getattr(getattr(target, "config", None), "num_layers", None)
    if not isinstance(layers, tuple) or not all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers
    ):
        raise TypeError(f"drafter.target_layers must be a tuple of ints, got {layers!r}")
    if num_layers is not None and not all(0 <= i < num_layers for i in layers):
        raise ValueError(
            f"drafter.target_layers {layers} must be layer indices in [0, {num_layers}) of "
            f"the {num_layers}-layer target"
        )
    own = getattr(drafter, "target", None)
    width = lambda m: getattr(getattr(m, "config", None), "hidden_size", None)  # noqa: E731
    if own is not None and width(own) is not None and width(own) != width(target):
        raise ValueError(
            f"the {name} was built for a target of width {width(own)}, but target has "
            f"hidden_size {width(target)}: its features would not fit the drafter"
        )


def _prepare(
    key, target, drafter, prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
    verification, num_slots=None, gamma_by_active_rows=None, draft_confidence=None,
):  # fmt: skip
    """Validates a decoder's inputs on the host, before anything compiles.

    Returns:
        ``(traced, static, width)``: the traced arguments of `_init_state`, its static
        keyword arguments, and the output width N.
    """
    key = as_prng_key("key", key)
    vocab = _check_model("target", target)
    check_drafter(target, drafter)
    if drafter.tree is not None and (
        gamma_by_active_rows is not None or draft_confidence is not None
    ):
        raise ValueError(
            "gamma_by_active_rows and draft_confidence adapt a chain's γ; they cannot be "
            f"used with a tree drafter ({drafter.tree!r})"
        )
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {verification!r}")
    sampling = SamplingConfig() if sampling is None else sampling
    prompts_BP, lengths_B = pad_prompts(prompts)
    b, p = prompts_BP.shape
    _check_tokens_in_vocab(prompts_BP, lengths_B, vocab)
    if drafter.vocab_size is not None and drafter.vocab_size < vocab:
        _check_tokens_in_vocab(prompts_BP, lengths_B, drafter.vocab_size, "drafter's")
    context = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and p > context:
        raise ValueError(
            f"prompts: the longest prompt has {p} tokens, beyond the target's context of "
            f"{context} (config.max_position_embeddings)"
        )
    max_new_B = _check_max_new_tokens(max_new_tokens, b)
    check_sampling_config(sampling, b)
    sampling_B = per_row(resolve_vocab_limit(sampling, target, drafter), b)
    num_prompts = b
    b = _check_num_slots(num_slots, num_prompts)
    resolved = resolve_cache_len(cache_len, p, max_new_B, lookahead(drafter))
    name = (
        "cache_len" if cache_len is not None else "max_new_tokens (through the default cache_len)"
    )
    if resolved > INT32_MAX // 2:
        raise ValueError(f"{name}: a cache of {resolved} slots does not fit int32 positions")
    # + seq, logprobs and flags per slot, and the same per prompt for the outputs.
    nbytes = cache_bytes(target, b, resolved) + (b + num_prompts) * resolved * 9
    nbytes += drafter.state_bytes(b, resolved)
    check_fits_memory(name, nbytes, f"caches of {resolved} slots for {b} rows")
    # Bucket the prompt width like the cache, capped by the cache itself.
    width = min(_round_up(p, PROMPT_BUCKET), resolved)
    prompts_BP = jnp.pad(prompts_BP, [(0, 0), (0, width - p)])
    traced = (
        key, target, drafter, prompts_BP, lengths_B, jnp.asarray(max_new_B), sampling_B,
        _eos_array(eos_id, vocab), _check_seeds(seeds, num_prompts),
        _check_confidence(draft_confidence),
    )  # fmt: skip
    static = dict(
        cache_len=resolved, verification=verification, num_slots=b,
        gamma_table=_check_gamma_table(gamma_by_active_rows, drafter.num_draft),
    )  # fmt: skip
    # From host values (inside a user's jit the arrays above are already traced).
    host_lengths = np.asarray(lengths_B) if is_concrete(lengths_B) else np.full((num_prompts,), p)
    return traced, static, _output_width(max_new_B, host_lengths, resolved)


# ----------------------------------------------------------------------------
# The loop, as pure functions.


def _init_state(
    key, target, drafter, prompts_NP, prompt_lengths_N, max_new_N, sampling_N, eos_K, seeds_N,
    draft_confidence, *, cache_len, verification, num_slots, gamma_table,
) -> DecodeState:  # fmt: skip
    """Prefills the first ``num_slots`` prompts into the slots (one batched forward)."""
    b = num_slots
    num_prompts, p = prompts_NP.shape
    order_N = serving_order(max_new_N, b)
    first = lambda x: x[order_N[:b]]  # noqa: E731
    prompts_BP, prompt_lengths_B, max_new_B = map(first, (prompts_NP, prompt_lengths_N, max_new_N))
    row_keys_N = noise.row_keys(key, seeds_N)
    _, target_cache, features = prefill(
        target, prompts_BP, prompt_lengths_B, cache_len, drafter.target_layers
    )
    drafter_state = init_drafter(drafter, prompts_BP, prompt_lengths_B, cache_len, features)
    zeros = jnp.zeros((b,), jnp.int32)
    done, truncated = _starts_done(prompt_lengths_B, max_new_B, lookahead(drafter), cache_len)
    state = DecodeState(
        target=target,
        drafter=drafter,
        verification=verification,
        seq=jnp.zeros((b, cache_len), jnp.int32).at[:, :p].set(prompts_BP[:, :cache_len]),
        seq_lengths=prompt_lengths_B,
        prompt_lengths=prompt_lengths_B,
        from_draft=jnp.zeros((b, cache_len), bool),
        logprobs=jnp.zeros((b, cache_len), jnp.float32),
        done=done,
        truncated=truncated,
        invalid=jnp.zeros((b,), bool),
        target_cache=target_cache,
        drafter_state=drafter_state,
        row_keys=first(row_keys_N),
        sampling=jax.tree.map(first, sampling_N),
        max_new_tokens=max_new_B,
        eos_ids=eos_K,
        stats=GenerationStats(
            target_calls=jnp.zeros((), jnp.int32),
            row_target_calls=zeros,
            drafted=zeros,
            accepted=zeros,
            accepted_hist=jnp.zeros((drafter.num_draft + 1,), jnp.int32),
        ),
        queue=PromptQueue(
            prompts=prompts_NP,
            prompt_lengths=prompt_lengths_N,
            max_new_tokens=max_new_N,
            sampling=sampling_N,
            row_keys=row_keys_N,
            order=order_N,
            next_prompt=jnp.asarray(b, jnp.int32),
            slot_prompt=order_N[:b],
        ),
        outputs=PromptOutputs.empty(num_prompts, cache_len),
        gamma_table=gamma_table,
        draft_confidence=draft_confidence,
    )
    # Slots whose first prompt is done before it starts are handed on at once.
    return _refill(state)


def _starts_done(prompt_lengths, max_new_tokens, step_slots: int, cache_len: int):
    """``(done, truncated)`` of rows before their first step.

    A traced budget <= 0 gives the row no tokens (the host refuses concrete ones); a
    prompt with no room for one step is truncated.
    """
    no_budget = max_new_tokens <= 0
    no_room = prompt_lengths + step_slots > cache_len
    return no_budget | no_room, no_room & ~no_budget


# ----------------------------------------------------------------------------
# Continuous batching: handing a finished slot on to the next prompt.


def _slot_outputs(state: DecodeState, slots_M) -> PromptOutputs:
    """Slots ``slots_M``' generated tokens gathered to ``[M, S]`` (padded with -1), with flags.

    The full width keeps the output shape static per cache length, so that budgets of
    any size share the compiled program; `_output_width` then says how much to keep.
    """
    width = state.seq.shape[1]
    take = lambda x_B: x_B[slots_M]  # noqa: E731
    lengths = take(state.num_generated)
    idx = take(state.prompt_lengths)[:, None] + jnp.arange(width)[None]
    valid = jnp.arange(width)[None] < lengths[:, None]
    idx = jnp.minimum(idx, width - 1)
    gather = lambda buffer: jnp.take_along_axis(take(buffer), idx, axis=1)  # noqa: E731
    stats = state.stats
    return PromptOutputs(
        tokens=jnp.where(valid, gather(state.seq), -1),
        from_draft=valid & gather(state.from_draft),
        logprobs=jnp.where(valid, gather(state.logprobs), 0.0),
        lengths=lengths,
        truncated=take(state.truncated),
        invalid=take(state.invalid),
        row_target_calls=take(stats.row_target_calls),
        drafted=take(stats.drafted),
        accepted=take(stats.accepted),
    )


def _hand_on(state: DecodeState, slots_M) -> PromptOutputs:
    """The outputs with the prompts in slots ``slots_M`` (``int32[M]``) written out.

    Only those M rows are gathered: a refill hands on one slot, and must not cost a
    pass over every slot's buffers.
    """
    rows = state.queue.slot_prompt[slots_M]
    return state.outputs.write(rows, _slot_outputs(state, slots_M))


def _load(state: DecodeState, slot) -> DecodeState:
    """Prefills the next prompt served into slot ``slot`` (a one-row forward), resetting it.

    The slot's cache lengths, drafter state, token buffer, flags, counters, budget,
    sampling settings and row key all come from the prompt, so its output is the one
    it would get in a slot of its own.
    """
    target, drafter, q = state.target, state.drafter, state.queue
    b, cache_len = state.seq.shape
    prompt = q.order[q.next_prompt]
    take = lambda x_N: jax.lax.dynamic_index_in_dim(x_N, prompt, keepdims=False)  # noqa: E731
    prompt_1P = jax.lax.dynamic_slice_in_dim(q.prompts, prompt, 1)
    length_1 = jax.lax.dynamic_slice_in_dim(q.prompt_lengths, prompt, 1)
    _, cache_1, features = prefill(target, prompt_1P, length_1, cache_len, drafter.target_layers)
    drafter_1 = init_drafter(drafter, prompt_1P, length_1, cache_len, features)
    length, max_new = length_1[0], take(q.max_new_tokens)
    done, truncated = _starts_done(length, max_new, lookahead(drafter), cache_len)
    row = jnp.zeros((cache_len,), jnp.int32).at[: prompt_1P.shape[1]].set(prompt_1P[0, :cache_len])
    put = lambda x_B, value: x_B.at[slot].set(value)  # noqa: E731
    stats = state.stats
    return state.replace(
        seq=put(state.seq, row),
        seq_lengths=put(state.seq_lengths, length),
        prompt_lengths=put(state.prompt_lengths, length),
        from_draft=put(state.from_draft, False),
        logprobs=put(state.logprobs, 0.0),
        done=put(state.done, done),
        truncated=put(state.truncated, truncated),
        invalid=put(state.invalid, False),
        target_cache=insert_row(state.target_cache, cache_1, slot, b),
        drafter_state=insert_row(state.drafter_state, drafter_1, slot, b),
        row_keys=put(state.row_keys, take(q.row_keys)),
        sampling=jax.tree.map(lambda x_B, x_N: put(x_B, take(x_N)), state.sampling, q.sampling),
        max_new_tokens=put(state.max_new_tokens, max_new),
        stats=stats.replace(
            row_target_calls=put(stats.row_target_calls, 0),
            drafted=put(stats.drafted, 0),
            accepted=put(stats.accepted, 0),
        ),
        queue=q.replace(next_prompt=q.next_prompt + 1, slot_prompt=put(q.slot_prompt, prompt)),
    )


def _refill(state: DecodeState) -> DecodeState:
    """Hands every finished slot on to the next waiting prompt, on device.

    A slot whose new prompt is done at once (no budget, or no room) is handed on again
    in the same call. With one slot per prompt (N == B) nothing is compiled here.
    """
    b = state.seq.shape[0]
    if state.queue.num_prompts == b:
        return state

    def waiting(s):
        return jnp.any(s.done) & (s.queue.next_prompt < s.queue.num_prompts)

    def hand_on(s):
        slot = jnp.argmax(s.done)
        s = s.replace(outputs=_hand_on(s, slot[None]))
        return _load(s, slot)

    return jax.lax.while_loop(waiting, hand_on, state)


def _draft_probs(proposal, drafter, batch: int, gamma: int, vocab: int):
    """The proposal's q as ``[B, γ, V]`` (or None), after a trace-time check of its shapes.

    A clear error, not a RoPE one, for a drafter with the wrong shapes. The q of a
    drafter with a smaller vocabulary (``[B, γ, V_d]``) is zero-padded to the target's
    V, which is exact (`specjax.vocab`).
    """
    tokens = proposal.tokens
    if tuple(tokens.shape) != (batch, gamma) or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"drafter.propose must return integer tokens [B, γ] = [{batch}, {gamma}], got "
            f"{tokens.dtype}{list(tokens.shape)}"
        )
    if proposal.probs is None:
        return None
    widths = {vocab, drafter.vocab_size or vocab}
    shape = tuple(proposal.probs.shape)
    if shape[:2] != (batch, gamma) or len(shape) != 3 or shape[2] not in widths:
        expected = " or ".join(f"[{batch}, {gamma}, {w}]" for w in sorted(widths))
        raise ValueError(
            f"drafter.propose must return probs [B, γ, V] = {expected} or None, got {list(shape)}"
        )
    return pad_to_vocab(proposal.probs, vocab)


def _write(buffer_BS, values_BT, start_B, count_B):
    """``buffer[b, start[b] + t] = values[b, t]`` for ``t < count[b]``; nothing else changes."""
    b, t = values_BT.shape
    rows = jnp.arange(b)[:, None]
    slots = start_B[:, None] + jnp.arange(t)[None]
    keep = jnp.arange(t)[None] < count_B[:, None]
    old = buffer_BS[rows, jnp.minimum(slots, buffer_BS.shape[1] - 1)]
    # mode="drop": a slot past the end of the buffer is never written (or clamped).
    return buffer_BS.at[rows, slots].set(jnp.where(keep, values_BT, old), mode="drop")


def _num_leading_true(flags_BT):
    return jnp.sum(jnp.cumprod(flags_BT.astype(jnp.int32), axis=1), axis=1, dtype=jnp.int32)


def _body(state: DecodeState, gamma: int) -> DecodeState:
    """One loop iteration: a decode step with ``gamma`` drafts, then refills."""
    return _refill(_decode_step(state, gamma))


def _table_index(state: DecodeState) -> jax.Array:
    """The ``gamma_table`` entry for the number of active rows now."""
    table = state.gamma_table
    max_rows = jnp.asarray([rows for rows, _ in table], jnp.int32)
    active = jnp.sum(~state.done, dtype=jnp.int32)
    return jnp.minimum(jnp.searchsorted(max_rows, active), len(table) - 1)


def _confident_drafts(draft_tokens_BG, draft_probs_BGV, threshold):
    """``int32[B]`` drafts each row proposes: up to and including its first below τ.

    A row stops proposing after the first draft whose own probability ``q_i(x_i)`` is
    below τ, as HF's ``assistant_confidence_threshold`` does. That draft is still
    proposed: whether position i is proposed must depend only on the drafts before
    it. Cutting *at* the unconfident draft would make the proposal at i ``q_i``
    restricted to confident tokens while the verifier divides by ``q_i``, which is not
    exact (``tests/test_verify.py`` has that bug as a control, rejected).
    """
    gamma = draft_tokens_BG.shape[1]
    q_at_BG = jnp.take_along_axis(draft_probs_BGV, draft_tokens_BG[..., None], axis=-1)[..., 0]
    return jnp.minimum(_num_leading_true(q_at_BG >= threshold) + 1, gamma)


def _score_drafted(target, drafter, tokens_BG1, positions_BG1, cache, width_index):
    """The verify forward over only the ``width_index + 1`` leading positions.

    One precompiled forward per width, picked on device by ``lax.switch``; logits
    (and features) are padded back to ``γ + 1`` columns. The padding is never read:
    no row drafted that far, so nothing there can be accepted or emitted.
    """
    g1 = tokens_BG1.shape[1]

    def forward(width):
        def run(cache):
            logits, cache, features = score(
                target, tokens_BG1[:, :width], positions_BG1[:, :width], cache,
                drafter.target_layers,
            )  # fmt: skip
            pad = [(0, 0), (0, g1 - width), (0, 0)]
            if features is not None:
                # Positions stay real, so padded features land only in stale slots.
                features = features.replace(
                    hidden=jnp.pad(features.hidden, pad), positions=positions_BG1
                )
            return jnp.pad(logits, pad), cache, features

        return run

    return jax.lax.switch(width_index, [forward(w) for w in range(1, g1 + 1)], cache)


@struct.dataclass
class _Verified:
    """What one step's verification decided, before it is committed (`_commit`).

    Attributes:
        drafter: the drafter as it ran this step (γ may differ from the state's).
        drafter_state: the proposal's drafter state.
        block: ``int32[B, G]`` the chain layout: accepted drafts, the target's token, -1.
        num_accepted: ``int32[B]``.
        num_drafted: ``int32[B]`` drafts the row proposed (the statistics' count).
        probs: ``float32[B, G, V]`` the target's p that decided each emitted position.
        usable: ``bool[B, G]`` that p is a distribution (not NaN / all masked).
        target_cache: the target's cache, slot == position for the emitted positions.
        features: the drafter's `TargetFeatures` at the G emitted positions, or None.
    """

    drafter: object
    drafter_state: object
    block: jax.Array
    num_accepted: jax.Array
    num_drafted: jax.Array
    probs: jax.Array
    usable: jax.Array
    target_cache: object
    features: object


def _usable(logits_BTV, sampling) -> jax.Array:
    """``bool[B, T]``: the logits give a distribution (not NaN or all -inf below the limit).

    One reduction: max propagates NaN, and NaN > -inf is False.
    """
    return jnp.max(mask_vocab(logits_BTV, sampling.vocab_limit), axis=-1) > -jnp.inf


def _step_keys(state: DecodeState, width: int):
    """``(positions_BW, keys_BW)``: input i scores position ``length + i`` with its keys."""
    positions_BW = (state.seq_lengths - 1)[:, None] + jnp.arange(width)[None]
    return positions_BW, noise.position_keys(state.row_keys, positions_BW + 1)


def _draft_keys(state: DecodeState, keys_BG1, gamma: int):
    draft_stream = noise.SAMPLE if state.verification == "coupled" else noise.DRAFT
    return noise.stream(keys_BG1[:, :gamma], draft_stream)


def _verify_chain(state: DecodeState, gamma: int) -> _Verified:
    """Drafts a chain of ``gamma`` tokens, scores it in one target call, verifies it."""
    target = state.target
    drafter = state.drafter
    if gamma != drafter.num_draft:
        drafter = drafter.replace(num_draft=gamma)
    b = state.seq.shape[0]
    rows = jnp.arange(b)
    lengths = state.seq_lengths
    offsets = jnp.arange(gamma + 1)
    positions_BG1, keys_BG1 = _step_keys(state, gamma + 1)
    proposal = drafter.propose(
        _draft_keys(state, keys_BG1, gamma), state.drafter_state, state.seq, lengths,
        state.sampling,
    )  # fmt: skip
    draft_probs = _draft_probs(proposal, drafter, b, gamma, target.vocab_size)
    draft_tokens_BG = proposal.tokens.astype(jnp.int32)
    active = ~state.done

    # Score the pending token and the γ drafts in one target call.
    pending_B = state.seq[rows, lengths - 1]
    tokens_in = jnp.concatenate([pending_B[:, None], draft_tokens_BG], axis=1)
    # A drafter's features come out of this same forward: no second target call.
    if state.draft_confidence is not None and draft_probs is None and gamma > 0:
        raise ValueError(
            f"draft_confidence needs a drafter that returns its q, and the "
            f"{type(drafter).__name__} proposes one-hot drafts (probs=None): use a "
            "DraftModel without greedy_draft, or BlockDrafter(mode='sample')"
        )
    if state.draft_confidence is None or gamma == 0:
        num_drafted = jnp.full((b,), gamma, jnp.int32)
        logits_BG1V, target_cache, features = score(
            target, tokens_in, positions_BG1, state.target_cache, drafter.target_layers
        )
    else:
        num_drafted = _confident_drafts(draft_tokens_BG, draft_probs, state.draft_confidence)
        # A draft that was not proposed reads as out of vocabulary (-1): every verifier
        # rejects it with q := 0, so the row's next token comes from p itself, exactly.
        draft_tokens_BG = jnp.where(
            offsets[None, :gamma] < num_drafted[:, None], draft_tokens_BG, -1
        )
        width_index = jnp.max(jnp.where(active, num_drafted, 0))
        logits_BG1V, target_cache, features = _score_drafted(
            target, drafter, tokens_in, positions_BG1, state.target_cache, width_index
        )
    target_probs = probs_from_logits(logits_BG1V, state.sampling)
    if state.verification == "coupled":
        block_BG1, num_accepted = coupled_verify(keys_BG1, draft_tokens_BG, target_probs)
    elif draft_probs is None:
        block_BG1, num_accepted = rejection_sample_onehot(keys_BG1, draft_tokens_BG, target_probs)
    else:
        block_BG1, num_accepted = rejection_sample(
            keys_BG1, draft_tokens_BG, draft_probs, target_probs
        )
    return _Verified(
        drafter=drafter, drafter_state=proposal.state, block=block_BG1,
        num_accepted=num_accepted, num_drafted=num_drafted, probs=target_probs,
        usable=_usable(logits_BG1V, state.sampling), target_cache=target_cache,
        features=features,
    )  # fmt: skip


def _verify_tree(state: DecodeState) -> _Verified:
    """Drafts the drafter's tree, scores all N + 1 nodes in one target call, verifies it.

    The root (the pending token) is at slot ``last`` and node j at slot ``last + j``,
    each at position ``last + depth``, attending to its ancestors only. After the
    exact walk (`specjax.tree.tree_verify`) the accepted path is moved to consecutive
    slots, and the path's probabilities and features are what the commit reads.
    """
    target, drafter = state.target, state.drafter
    tree = drafter.tree
    b = state.seq.shape[0]
    rows = jnp.arange(b)
    last = state.seq_lengths - 1
    depth, n1 = tree.depth, tree.num_nodes + 1
    _, keys_BD1 = _step_keys(state, depth + 1)
    proposal = drafter.propose(
        _draft_keys(state, keys_BD1, depth), state.drafter_state, state.seq,
        state.seq_lengths, state.sampling,
    )  # fmt: skip
    node_tokens = proposal.tokens
    if tuple(node_tokens.shape) != (b, tree.num_nodes) or proposal.probs is not None:
        raise ValueError(
            f"a tree drafter's propose must return tokens [B, N] = [{b}, {tree.num_nodes}] "
            f"and probs=None; got tokens{list(node_tokens.shape)}, probs "
            f"{None if proposal.probs is None else list(proposal.probs.shape)}"
        )
    node_tokens = node_tokens.astype(jnp.int32)
    tokens_in = jnp.concatenate([state.seq[rows, last][:, None], node_tokens], axis=1)
    mask = TreeMask(
        start=last, slots=last[:, None] + jnp.arange(n1)[None],
        visible=jnp.asarray(tree.ancestors),
    )  # fmt: skip
    logits_BN1V, target_cache, features = score(
        target, tokens_in, last[:, None] + jnp.asarray(tree.depths)[None], state.target_cache,
        drafter.target_layers, tree=mask,
    )  # fmt: skip
    # Logits in: only the D + 1 nodes on the path become distributions.
    block_BD1, num_accepted, path_BD, probs_BD1V = tree_verify(
        keys_BD1, node_tokens, logits_BN1V, tree, state.sampling
    )
    nodes_BD1 = path_nodes_with_root(path_BD)
    along = lambda x_BN1: jnp.take_along_axis(  # noqa: E731
        x_BN1, nodes_BD1.reshape(b, depth + 1, *([1] * (x_BN1.ndim - 2))), axis=1
    )
    if features is not None:
        features = features.replace(
            hidden=along(features.hidden), positions=last[:, None] + jnp.arange(depth + 1)[None]
        )
    return _Verified(
        drafter=drafter, drafter_state=proposal.state, block=block_BD1,
        num_accepted=num_accepted, num_drafted=jnp.full((b,), depth, jnp.int32),
        probs=probs_BD1V, usable=_usable(along(logits_BN1V), state.sampling),
        target_cache=compact_path(target_cache, last, path_BD), features=features,
    )  # fmt: skip


def _decode_step(state: DecodeState, gamma: int) -> DecodeState:
    """One decode step with γ = ``gamma`` drafts (at most the drafter's own γ), or a tree."""
    if state.drafter.tree is not None:
        return _commit(state, _verify_tree(state))
    return _commit(state, _verify_chain(state, gamma))


def _commit(state: DecodeState, verified: _Verified) -> DecodeState:
    """Emits the verified tokens, cut at EOS and budgets, and advances every row."""
    max_gamma = state.drafter.num_draft
    block_BG1, num_accepted = verified.block, verified.num_accepted
    offsets = jnp.arange(block_BG1.shape[1])
    lengths = state.seq_lengths
    active = ~state.done
    # A position with no distribution (NaN or all -inf logits): emit nothing from it on,
    # and flag the row when it is the next position.
    num_usable = _num_leading_true(verified.usable)

    # Emit accepted drafts + the correction/bonus token, cut after EOS and
    # at the row's token budget; finished rows emit nothing.
    is_eos_BG1 = jnp.any(block_BG1[..., None] == state.eos_ids[None, None], axis=-1)
    is_eos_BG1 &= offsets[None] <= num_accepted[:, None]
    eos_cut = jnp.where(
        jnp.any(is_eos_BG1, axis=1), jnp.argmax(is_eos_BG1, axis=1) + 1, block_BG1.shape[1]
    )
    budget = state.max_new_tokens - state.num_generated
    num_emit = jnp.minimum(jnp.minimum(num_accepted + 1, eos_cut), jnp.minimum(budget, num_usable))
    num_emit = jnp.where(active, jnp.maximum(num_emit, 0), 0)
    block_BG1 = jnp.maximum(block_BG1, 0)
    logprobs_BG1 = jnp.log(jnp.take_along_axis(verified.probs, block_BG1[..., None], -1)[..., 0])

    new_lengths = lengths + num_emit
    active_i = active.astype(jnp.int32)
    accepted_one_hot = jax.nn.one_hot(num_accepted, max_gamma + 1, dtype=jnp.int32)
    accepted_one_hot *= active_i[:, None]
    stats = state.stats
    state = state.replace(
        seq=_write(state.seq, block_BG1, lengths, num_emit),
        from_draft=_write(
            state.from_draft, offsets[None] < num_accepted[:, None], lengths, num_emit
        ),
        logprobs=_write(state.logprobs, logprobs_BG1, lengths, num_emit),
        seq_lengths=new_lengths,
        target_cache=verified.target_cache.rollback(new_lengths - 1),
        drafter_state=update_drafter(
            verified.drafter, verified.drafter_state, new_lengths, verified.features
        ),
        stats=stats.replace(
            target_calls=stats.target_calls + 1,
            row_target_calls=stats.row_target_calls + active_i,
            drafted=stats.drafted + verified.num_drafted * active_i,
            accepted=stats.accepted + num_accepted * active_i,
            accepted_hist=stats.accepted_hist + jnp.sum(accepted_one_hot, axis=0),
        ),
    )

    emitted_BG1 = offsets[None] < num_emit[:, None]
    hit_eos = jnp.any(emitted_BG1 & is_eos_BG1, axis=1)
    finished = hit_eos | (state.num_generated >= state.max_new_tokens)
    invalid = active & (num_usable == 0)
    # Judged by the largest step, so that whether a row is truncated never depends on
    # which γ variant ran.
    cache_full = new_lengths + state.lookahead > state.seq.shape[1]
    state = state.replace(
        done=state.done | (active & (finished | cache_full | invalid)),
        truncated=state.truncated | (active & cache_full & ~finished & ~invalid),
        invalid=state.invalid | invalid,
    )
    return state


def _run(state: DecodeState, num_steps=None) -> DecodeState:
    """Runs the loop until every row is done, or for at most ``num_steps`` iterations.

    With a ``gamma_table``, one ``while_loop`` per entry runs in turn, from the most
    active rows to the fewest, each with its own γ. That is the table exactly: the
    number of active rows never grows (refill keeps every slot busy until the prompts
    run out, and then rows only finish), so the entry only ever moves down. Choosing
    the variant per step with ``lax.switch`` instead made XLA:CPU copy the loop state
    (caches included) into the branch every step: 2.2x slower at one slot.
    """
    if num_steps is None:
        running = lambda s: ~jnp.all(s.done)  # noqa: E731
    else:
        limit = state.stats.target_calls + jnp.maximum(jnp.asarray(num_steps, jnp.int32), 0)
        running = lambda s: ~jnp.all(s.done) & (s.stats.target_calls < limit)  # noqa: E731
    table = state.gamma_table
    if not table:
        return jax.lax.while_loop(running, partial(_body, gamma=state.drafter.num_draft), state)
    for index in reversed(range(len(table))):
        # ">=": the last loop (entry 0) runs to the end whatever the count.
        def cond(s, index=index):
            return running(s) & (_table_index(s) >= index)

        state = jax.lax.while_loop(cond, partial(_body, gamma=table[index][1]), state)
    return state


def _result(state: DecodeState) -> GenerationResult:
    """Every prompt's output in prompt order: those handed on, plus those still in a slot.

    ``tokens`` etc. are ``[N, S]`` (padded with -1); `_output_width` says how much of
    the width to keep.
    """
    out = _hand_on(state, jnp.arange(state.seq.shape[0]))
    return GenerationResult(
        tokens=out.tokens,
        lengths=out.lengths,
        from_draft=out.from_draft,
        logprobs=out.logprobs,
        truncated=out.truncated,
        invalid=out.invalid,
        stats=state.stats.replace(
            row_target_calls=out.row_target_calls, drafted=out.drafted, accepted=out.accepted
        ),
    )


def _output_width(max_new_B, prompt_lengths_B, cache_len: int) -> int:
    """N: the largest budget, or the most a row can hold, whichever is smaller.

    Never a ``[B, 10**9]`` buffer for a 64-slot cache. With traced budgets or prompt
    lengths (inside a user's jit) it is the cache length.
    """
    if not (is_concrete(max_new_B) and is_concrete(prompt_lengths_B)):
        return cache_len
    room = cache_len - int(np.min(prompt_lengths_B))
    return max(0, min(int(np.max(max_new_B)), room))


def _trim(out: GenerationResult, width: int) -> GenerationResult:
    return out.replace(
        tokens=out.tokens[:, :width],
        from_draft=out.from_draft[:, :width],
        logprobs=out.logprobs[:, :width],
    )


_STATIC = ("cache_len", "verification", "num_slots", "gamma_table")
_decode_jit = jax.jit(lambda *a, **k: _result(_run(_init_state(*a, **k))), static_argnames=_STATIC)
_init_jit = jax.jit(_init_state, static_argnames=_STATIC)
_result_jit = jax.jit(_result)


def _decode(traced, static, width: int) -> GenerationResult:
    return _trim(_decode_jit(*traced, **static), width)


def _step_loop(models, loop_state: DecodeState, num_steps) -> DecodeState:
    target, drafter = models
    out = _run(loop_state.replace(target=target, drafter=drafter), num_steps)
    return out.replace(target=None, drafter=None)


# The loop state is donated (its caches and buffers are updated in place, so a chunk
# needs no second copy of them: without donation peak memory doubles); the models are
# not, since the caller still holds them.
_step_jit = jax.jit(_step_loop, donate_argnums=(1,))


# ----------------------------------------------------------------------------
# The open loop.


def init(
    key: jax.Array,
    target,
    prompts,
    *,
    drafter: Drafter | None = None,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id=None,
    seeds=None,
    cache_len: int | None = None,
    verification: str = "rejection",
    num_slots: int | None = None,
    gamma_by_active_rows=None,
    draft_confidence: float | None = None,
) -> DecodeState:
    """Prefills the prompts and returns the `DecodeState` that `step` advances.

    Takes the arguments of `speculative_generate` (``drafter=None`` decodes plainly)
    and validates them the same way, before anything compiles; ``sampling``'s
    ``vocab_limit`` is resolved as there and travels (traced) in the state.

    Example:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> state = specjax.decode.init(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=8)
        >>> state = specjax.decode.step(state, 3)   # three steps
        >>> state = specjax.decode.step(state, 100)  # the rest (stops when done)
        >>> specjax.decode.result(state).tokens.shape
        (1, 8)
    """
    drafter = NoDraft() if drafter is None else drafter
    traced, static, width = _prepare(
        key, target, drafter, prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
        verification, num_slots, gamma_by_active_rows, draft_confidence,
    )  # fmt: skip
    return _init_jit(*traced, **static)


def step(state: DecodeState, num_steps=1) -> DecodeState:
    """Runs up to ``num_steps`` iterations of the decode loop (fewer if every row is done).

    One jitted chunk of the same ``lax.while_loop`` that `generate` runs, with no host
    sync inside. ``num_steps`` is traced, so chunks of any size share one compiled
    program. The state's buffers are donated: use the returned state.

    Args:
        state: from `init` or a previous `step`.
        num_steps: iterations to run (an int >= 0; each emits 1 to γ+1 tokens per
            active row).

    Returns:
        the advanced `DecodeState`.
    """
    if not isinstance(state, DecodeState):
        raise TypeError(
            f"state must be a DecodeState from specjax.decode.init, got {type(state).__name__}"
        )
    if is_concrete(num_steps):
        num_steps = check_int("num_steps", num_steps, lo=0)
    models = (state.target, state.drafter)
    out = _step_jit(models, state.replace(target=None, drafter=None), jnp.int32(num_steps))
    return out.replace(target=state.target, drafter=state.drafter)


def result(state: DecodeState) -> GenerationResult:
    """The output so far: every prompt's generated tokens, lengths, flags and stats.

    Rows are prompts, in prompt order (also with fewer slots than prompts); a prompt
    not started yet has length 0. ``tokens`` has width ``max(max_new_tokens)`` (or
    what the cache can hold).
    """
    q = state.queue
    width = _output_width(q.max_new_tokens, q.prompt_lengths, state.seq.shape[1])
    return _trim(_result_jit(state), width)


def stream(
    state: DecodeState, steps_per_chunk: int = 4
) -> Iterator[tuple[DecodeState, list[list[int]]]]:
    """Runs `step` chunk by chunk until every row is done, yielding the new tokens.

    Each iteration syncs with the host once (to read the new tokens), between chunks,
    never inside one.

    Args:
        state: from `init`; it is donated to the first chunk.
        steps_per_chunk: loop iterations per chunk.

    Yields:
        ``(state, new_tokens)``: the state after the chunk, and per prompt (in prompt
        order) the list of token ids generated in it (possibly empty). Use the last
        yielded state (e.g. with `result`); earlier ones are donated to the next chunk.

    Example:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> state = specjax.decode.init(jax.random.key(0), model, [[1, 2]], max_new_tokens=6)
        >>> chunks = [new for _, new in specjax.decode.stream(state, steps_per_chunk=2)]
        >>> sum(len(new[0]) for new in chunks)
        6
    """
    steps_per_chunk = check_int("steps_per_chunk", steps_per_chunk, lo=1)
    seen = np.asarray(_result_jit(state).lengths)
    while True:
        state = step(state, steps_per_chunk)
        out = _result_jit(state)
        tokens, lengths, done = jax.device_get((out.tokens, out.lengths, state.done))
        new = [row[s:e].tolist() for row, s, e in zip(tokens, seen, lengths, strict=True)]
        seen = lengths
        yield state, new
        # Refilling keeps every slot busy while prompts wait, so all slots done means
        # every prompt is.
        if done.all():
            return


# ----------------------------------------------------------------------------
# The closed loop.


def generate(
    key: jax.Array,
    model,
    prompts,
    *,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id=None,
    seeds=None,
    cache_len: int | None = None,
    num_slots: int | None = None,
) -> GenerationResult:
    """Plain autoregressive decoding: prefill, then one ``lax.while_loop``.

    The baseline speculative decoding must match. It is the same loop as
    `speculative_generate` with the null drafter (γ = 0): each step emits the
    target's sample at the row's next position t, drawn with
    ``fold_in(fold_in(key, seeds[b]), t)``. A row's tokens therefore depend on its
    key, seed and prompt only, not on the rest of the batch, and coupled speculative
    decoding reproduces them token for token.

    Compiles once per (model, batch size, prompt width bucket of 16, ``cache_len``):
    temperature, top-k/p, min-p (scalars or per row), ``max_new_tokens`` (within one
    cache bucket), ``eos_id`` (up to 8 ids), seeds and the prompt contents are traced.

    Args:
        key: one PRNG key (unused at temperature 0, but always required).
        model: a model following the contract (e.g. :class:`specjax.Model`).
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens to generate per row (>= 1), EOS included: an int, or
            ``int[B]`` for one budget per row.
        sampling: :class:`SamplingConfig`, each setting a scalar or ``[B]``; default
            samples at temperature 1. Its ``vocab_limit`` (ids ``>=`` it are never
            emitted; an int in ``[1, V]``, scalar or ``[B]``, traced) defaults to the
            model's real vocabulary: its tokenizer's size where that is smaller than
            V (padded embedding rows), else V.
        eos_id: optional id, or ``[K]`` ids, that end a row (it is emitted).
        seeds: optional ``int[B]`` per-row seeds (default: the row index).
        cache_len: static cache length S; default ``P + max_new_tokens + 1``
            rounded up to a multiple of 64.
        num_slots: rows decoded at once, B (default: one per prompt). With fewer
            slots than prompts, a finished row's slot is prefilled with the next prompt
            inside the same on-device loop (continuous batching), serving the longest
            budgets first so that the shortest fill the tail; settings, seeds and
            budgets follow the prompt, and outputs come back in prompt order.

    Returns:
        :class:`GenerationResult` with ``tokens int32[N, max(max_new_tokens)]``.

    Example:
        >>> import jax, specjax
        >>> model = specjax.testing.tiny_model(seed=0)
        >>> out = specjax.generate(jax.random.key(0), model, [[1, 2, 3]], max_new_tokens=5,
        ...                        sampling=specjax.SamplingConfig.greedy())
        >>> out.tokens.shape
        (1, 5)
    """
    traced, static, width = _prepare(
        key, model, NoDraft(), prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
        "rejection", num_slots,
    )  # fmt: skip
    return _decode(traced, static, width)


def speculative_generate(
    key: jax.Array,
    target,
    drafter: Drafter,
    prompts,
    *,
    max_new_tokens,
    sampling: SamplingConfig | None = None,
    eos_id=None,
    seeds=None,
    cache_len: int | None = None,
    verification: str = "rejection",
    num_slots: int | None = None,
    gamma_by_active_rows=None,
    draft_confidence: float | None = None,
) -> GenerationResult:
    """Speculative decoding in one jitted ``lax.while_loop``, exact in distribution.

    Every step the drafter proposes γ tokens per row, the target scores the
    row's pending token and the γ drafts in one forward, and the verifier keeps a
    prefix per row plus one target token. Rows accept different numbers of tokens
    and stop independently; the loop ends when every row is done. There is no host
    round trip inside.

    Verification:

    * ``"rejection"`` (default): speculative rejection sampling, accepting a draft
      with probability ``min(1, p/q)``; the acceptance rate is ``1 - TV(p, q)``, the
      most any exact verifier gets. The output has exactly the distribution of
      :func:`generate` (token for token at temperature 0), but not the same sample
      for one key: the drafter and γ decide how each position's randomness is used.
    * ``"coupled"``: the drafter draws with the same noise the target samples each
      position with, and a draft is accepted iff it equals the target's sample. The
      output then *equals* :func:`generate`'s for the same key and seeds, token for
      token, at any sampling setting and with any drafter; acceptance falls to the
      coupling probability (at least ``(1 - TV) / (1 + TV)`` for a flat race).

    Args:
        key: one PRNG key.
        target: the target model (model contract).
        drafter: a :class:`~specjax.drafters.Drafter` (e.g. ``DraftModel``,
            ``PromptLookup``) sharing the target's ids: its vocabulary size ``V_d`` is
            at most the target's V (its q is zero-padded, which is exact), and where
            both have tokenizers they agree on the ids below ``V_d``
            (`specjax.vocab`).
        prompts: ``int[B, P]`` or a list of token-id lists (ragged).
        max_new_tokens: tokens to generate per row (>= 1), EOS included: an int or
            ``int[B]``.
        sampling: :class:`SamplingConfig` applied identically to target and draft,
            each setting a scalar or ``[B]``. Its ``vocab_limit`` masks ids ``>=`` it
            in the target's and the draft's distributions alike (an int in ``[1, V]``,
            traced); default: the target's tokenizer size where that is smaller than
            V, else V. With a drafter of a smaller vocabulary ``V_d`` it must be at
            most ``V_d``.
        eos_id: optional id, or ``[K]`` ids, that end a row; drafts after it are
            discarded.
        seeds: optional ``int[B]`` per-row seeds (default: the row index).
        cache_len: static cache length S; default ``P + max_new_tokens + γ + 1``
            rounded up to a multiple of 64. A row that would overflow it stops
            and is flagged in ``truncated``.
        verification: ``"rejection"`` or ``"coupled"``.
        num_slots: rows decoded at once, B (default: one per prompt). With fewer
            slots than prompts, a finished row's slot is prefilled with the next prompt
            inside the same on-device loop (continuous batching), serving the longest
            budgets first so that the shortest fill the tail; settings, seeds and
            budgets follow the prompt, and outputs come back in prompt order.
        gamma_by_active_rows: optional table choosing each step's γ by the number of
            active rows, a dict ``{max_active_rows: γ}`` or ``(max_active_rows, γ)``
            pairs, each γ in ``[0, drafter.num_draft]``: a step with ``a`` active rows
            drafts the γ of the smallest ``max_active_rows >= a`` (the largest entry's
            beyond it), e.g. ``{1: 4, 8: 2, 64: 0}``; γ = 0 is a plain step, for batches
            where verifying costs more than speculation saves. Each entry is its own
            ``while_loop`` with its own γ, run in turn on device as rows finish (the
            active count never grows). Exact; with rejection verification a row's
            sample then depends on how many rows are active.
        draft_confidence: optional τ in ``[0, 1]``: a row stops proposing after its
            first draft whose own probability ``q(x)`` is below τ (that draft is
            still verified), and the verify forward covers only as many positions as
            the longest active row proposed. Exact: whether a position is proposed
            depends only on the drafts before it, and the drafts not proposed are
            never accepted. Needs a drafter that returns q.

    Returns:
        :class:`GenerationResult` with ``tokens int32[N, max(max_new_tokens)]``.

    Example:
        >>> import jax, specjax
        >>> target = specjax.testing.tiny_model(seed=0)
        >>> drafter = specjax.DraftModel(specjax.testing.tiny_model(seed=1), num_draft=3)
        >>> out = specjax.speculative_generate(jax.random.key(0), target, drafter, [[1, 2, 3]],
        ...                                    max_new_tokens=6)
        >>> out.tokens.shape
        (1, 6)
    """
    traced, static, width = _prepare(
        key, target, drafter, prompts, max_new_tokens, sampling, eos_id, seeds, cache_len,
        verification, num_slots, gamma_by_active_rows, draft_confidence,
    )  # fmt: skip
    return _decode(traced, static, width)
