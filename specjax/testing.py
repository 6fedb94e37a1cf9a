"""Tiny models and exactness checks that users can run on their own setups.

Example: check that speculative sampling with your drafter has exactly the
target's distribution over the first two generated tokens::

    exact = exact_sequence_probs(target, prompt, num_tokens=2, sampling=cfg)
    counts = empirical_sequence_counts(sample_fn, keys, num_tokens=2, vocab_size=V)
    assert chi_square_pvalue(counts.ravel(), exact.ravel()) > 1e-4
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models import Model, ModelConfig
from specjax.sampling import SamplingConfig, probs_from_logits


def tiny_config(vocab_size: int = 64, **overrides) -> ModelConfig:
    """A 2-layer Llama config small enough for unit tests (about 30k params)."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=512,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_model(
    seed: int = 0, vocab_size: int = 64, *, init_scale: float = 1.0, **overrides
) -> Model:
    """A randomly initialised tiny model.

    Args:
        seed: initialisation seed.
        vocab_size: V.
        init_scale: multiplies every weight matrix, so that the untrained
            model's next-token distributions are far from uniform (scale ~20
            gives peaked, input-dependent distributions).
        **overrides: other :class:`ModelConfig` fields.
    """
    model = Model.random(tiny_config(vocab_size, **overrides), seed=seed)
    if init_scale != 1.0:
        params = jax.tree.map(lambda p: p * init_scale if p.ndim == 2 else p, model.params)
        model = model.replace(params=params)
    return model


def tiny_tokenizer(vocab_size: int = 64):
    """A word-level ``tokenizers.Tokenizer`` over the words ``w0 .. w{V-1}`` (id i is ``wi``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


def perturbed(model, seed: int = 0):
    """``model`` with every parameter redrawn so that logits are O(1).

    Kernels get fan-in-scaled normal weights, norm scales ``1 + 0.3·N(0, 1)``
    and biases ``0.3·N(0, 1)``: unlike a fresh initialisation (unit norms, zero
    biases), every parameter matters, so a wrongly loaded one shows up in the
    logits.
    """
    flat = list(nnx.to_flat_state(model.params))
    keys = jax.random.split(jax.random.key(seed), len(flat))
    leaves = []
    for key, (path, var) in zip(keys, flat, strict=True):
        x = var.get_value()
        noise = jax.random.normal(key, x.shape, jnp.float32)
        # A scanned model stacks every layer's leaves [L, ...]; that axis does not count.
        rank = x.ndim - (model.config.scan_layers and path[0] == "layers")
        if rank == 2:  # weights [out, in] and the embedding [V, E]: contracted on the last axis
            value = noise / np.sqrt(x.shape[-1])
        elif path[-1] == "weight":  # RMSNorm scales
            value = 1 + 0.3 * noise
        else:  # biases
            value = 0.3 * noise
        leaves.append((path, var.replace(value.astype(x.dtype))))
    return model.replace(params=nnx.from_flat_state(leaves))


def exact_sequence_probs(model, prompt, num_tokens: int, sampling: SamplingConfig) -> np.ndarray:
    """Exact probability of every continuation of ``prompt`` of ``num_tokens`` tokens.

    Enumerates all ``V ** num_tokens`` continuations (keep V and num_tokens
    tiny) and multiplies the processed next-token probabilities
    ``probs_from_logits(logits, sampling)`` along each, in float64.

    Returns:
        ``float64[V, ..., V]`` (``num_tokens`` axes) summing to 1.
    """
    v = model.vocab_size
    prompt = np.asarray(prompt, np.int32)
    conts = np.array(list(itertools.product(range(v), repeat=num_tokens)), np.int32)
    seqs = np.concatenate([np.broadcast_to(prompt, (len(conts), len(prompt))), conts], axis=1)
    b, t = seqs.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits = jax.jit(lambda m, s: m(s, positions, m.init_cache(b, t)).logits)(
        model, jnp.asarray(seqs)
    )
    probs = np.asarray(probs_from_logits(logits, sampling), np.float64)  # [N, T, V]
    p0 = len(prompt) - 1
    total = np.ones(len(conts))
    for i in range(num_tokens):
        total *= probs[np.arange(len(conts)), p0 + i, conts[:, i]]
    return total.reshape((v,) * num_tokens)


def continuation_logits(model, prompt, num_tokens: int) -> np.ndarray:
    """Float64 logits ``[V**K, P+K, V]`` of every K-token continuation of ``prompt``.

    Row ``r`` is ``prompt`` followed by the continuation ``np.unravel_index(r, (V,) * K)``
    (lexicographic order), scored in one full forward: the reference that enumerated
    laws of the first K tokens are computed from.
    """
    v = model.vocab_size
    conts = np.array(list(itertools.product(range(v), repeat=num_tokens)), np.int32)
    seqs = np.concatenate([np.broadcast_to(prompt, (len(conts), len(prompt))), conts], axis=1)
    b, t = seqs.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits = jax.jit(lambda m, x: m(x, positions, m.init_cache(b, t)).logits)(model, seqs)
    return np.asarray(logits, np.float64)


def sequence_counts(tokens_NK: np.ndarray, vocab_size: int) -> np.ndarray:
    """Histogram of ``N`` sampled ``K``-token sequences as an array ``[V] * K``."""
    tokens_NK = np.asarray(tokens_NK)
    flat = np.ravel_multi_index(tokens_NK.T, (vocab_size,) * tokens_NK.shape[1])
    counts = np.bincount(flat, minlength=vocab_size ** tokens_NK.shape[1])
    return counts.reshape((vocab_size,) * tokens_NK.shape[1])


def _pooled_cells(probs, n: float, min_expected: float) -> np.ndarray:
    """``[C, V^K]`` 0/1 matrix of :func:`chi_square_pvalue`'s cells (rare ones pooled)."""
    expected = np.asarray(probs, np.float64).ravel() * n
    big = expected >= min_expected
    kept = np.flatnonzero(big)
    cells = np.zeros((len(kept), len(expected)))
    cells[np.arange(len(kept)), kept] = 1.0  # one row per kept cell, not an identity per cell
    if (~big).any() and expected[~big].sum() > 0:
        cells = np.vstack([cells, (~big).astype(np.float64)[None]])
    return cells


def chi_square_power(
    probs, alternative, n: int, false_alarm: float, min_expected: float = 5.0
) -> float:
    """Probability that :func:`chi_square_pvalue` rejects ``probs`` at ``false_alarm``
    when ``n`` samples come from ``alternative`` instead.

    The power calculation that sizes a statistical test: Pearson's statistic on
    ``n`` draws from ``alternative`` is approximately non-central chi-square with
    the test's degrees of freedom (cells, rare ones pooled as the test pools them,
    minus one) and non-centrality ``n * sum((a - p)^2 / p)`` over those cells.

    Args:
        probs: the null distribution the test checks against (any shape).
        alternative: the distribution a known-wrong variant samples from.
        n: sample size.
        false_alarm: the test's significance level.
        min_expected: the test's pooling threshold.

    Returns:
        The power, in [0, 1].
    """
    from scipy import stats  # test-only dependency

    p = np.asarray(probs, np.float64).ravel()
    a = np.asarray(alternative, np.float64).ravel()
    p, a = p / p.sum(), a / a.sum()
    if np.any(a[p == 0] > 0):  # the variant draws impossible outcomes: caught with prob 1-(1-m)^n
        return float(1 - (1 - a[p == 0].sum()) ** n)
    cells = _pooled_cells(p, n, min_expected)
    pc, ac = cells @ p, cells @ a
    df = len(pc) - 1
    if df < 1:
        return 0.0
    noncentrality = n * np.sum((ac - pc) ** 2 / pc)
    return float(stats.ncx2.sf(stats.chi2.isf(false_alarm, df), df, noncentrality))


def min_sample_size(
    probs, alternative, false_alarm: float, power: float, min_expected: float = 5.0
) -> int:
    """The smallest ``n`` at which :func:`chi_square_power` reaches ``power`` (bisection)."""
    lo, hi = 1, 2
    while chi_square_power(probs, alternative, hi, false_alarm, min_expected) < power:
        lo, hi = hi, hi * 2
        if hi > 10**9:
            raise ValueError("no sample size below 1e9 reaches that power")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if chi_square_power(probs, alternative, mid, false_alarm, min_expected) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def chi_square_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness-of-fit p-value of ``counts`` against ``probs``.

    Cells with expected count below ``min_expected`` are pooled into one cell
    so the chi-square approximation holds. A sample of a cell with probability
    exactly 0 makes the p-value 0 (an impossible outcome was drawn).
    """
    from scipy import stats  # test-only dependency

    counts = np.asarray(counts, np.float64).ravel()
    probs = np.asarray(probs, np.float64).ravel()
    probs = probs / probs.sum()
    n = counts.sum()
    if np.any(counts[probs == 0] > 0):
        return 0.0
    expected = probs * n
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)
