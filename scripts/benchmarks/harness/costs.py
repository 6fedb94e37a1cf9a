"""What one speculative step costs, measured, and the speedup those costs predict.

Each cost is the median time of a jitted loop of ``inner`` calls (so host dispatch
does not count), timed by `specjax.core.timing.time_fn`; the formulas are
Leviathan et al.'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.core.timing import time_fn
from specjax.models.forward import TargetHidden, prefill, score


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Leviathan et al.: E[tokens per target call] = (1 - α^(γ+1)) / (1 - α)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(
    alpha: float, gamma: int, cost_step: float, cost_verify: float, cost_draft: float
) -> float:
    """Speedup of speculative over plain decoding that the measured costs allow.

    ``E(α, γ) · cost(T=1) / (cost(draft) + cost(T=γ+1))``: tokens per step over
    the time of one step, relative to one token per plain step. It ignores the
    loop's own work (acceptance, bookkeeping), so realized / predicted measures
    what that machinery costs.
    """
    return expected_tokens_per_step(alpha, gamma) * cost_step / (cost_draft + cost_verify)


def alpha_from_hist(accepted_hist) -> float:
    """Per-token acceptance probability α (MLE under i.i.d. acceptances).

    A step that accepted ``n < γ`` drafts evaluated ``n + 1`` drafts (one
    rejected); a step that accepted all γ evaluated γ with no rejection.
    """
    hist = [int(h) for h in accepted_hist]
    gamma = len(hist) - 1
    accepted = sum(n * h for n, h in enumerate(hist))
    rejections = sum(hist[:gamma])
    return accepted / max(accepted + rejections, 1)


def forward_costs(
    model,
    batch_size: int,
    context: int,
    widths,
    *,
    repeats: int = 10,
    inner: int = 10,
    cache_len: int | None = None,
    feature_layers: tuple[int, ...] = (),
) -> dict:
    """Median seconds of one forward of ``T`` tokens against a cache of ``context`` tokens.

    Attention reads every allocated cache slot, so pass the ``cache_len`` the
    decode loop being predicted uses (default: just big enough). With
    ``feature_layers`` (a feature drafter's ``target_layers``) every forward also
    returns those layers' hidden states, as the decoder's verify forward does for
    such a drafter, and the loop reads them all so they are not optimised away.

    Returns ``{T: seconds}`` for each ``T`` in ``widths``.
    """
    costs = {}
    for t in widths:
        run, args = forward_loop(
            model, batch_size, context, t, inner=inner,
            cache_len=cache_len or context + max(widths) + 1, feature_layers=feature_layers,
        )  # fmt: skip
        timing, _ = time_fn(run, *args, repeats=repeats)
        costs[t] = timing.median_s / inner
    return costs


def forward_loop(
    model,
    batch_size: int,
    context: int,
    width: int,
    *,
    inner: int = 10,
    cache_len: int | None = None,
    feature_layers: tuple[int, ...] = (),
):
    """``(fn, args)``: ``fn(*args)`` runs ``inner`` forwards of ``width`` tokens.

    The forwards run back to back in one ``fori_loop`` against a cache holding
    ``context`` tokens: inside the decode loop nothing is dispatched from the host,
    so per-call dispatch overhead must not count. Each forward's tokens depend on
    the previous logits, so XLA cannot hoist it out of the loop, and the cache is
    carried, as in the decode loop, so that its update is in place rather than a
    copy per call. `forward_costs` times it; ``scripts/benchmarks/profile_decode.py
    --method forward`` profiles it op by op (``fn.lower(*args)`` gives the HLO).
    """
    cache_len = cache_len or context + width + 1
    prompts = jnp.ones((batch_size, context), jnp.int32)
    cache, _ = jax.jit(prefill, static_argnums=3)(
        model, prompts, jnp.full((batch_size,), context, jnp.int32), cache_len
    )

    def run(m, tokens, positions, cache):
        def body(_, carry):
            tokens, cache = carry
            logits, cache, features = score(m, tokens, positions, cache, feature_layers)
            tokens = jnp.minimum(tokens, jnp.argmax(logits, -1).astype(jnp.int32))
            if features is not None:  # never true; it makes the features a live output
                tokens += (jnp.sum(features.states, -1) > 3e38).astype(jnp.int32)
            return tokens, cache.rollback(positions[:, 0])

        return jax.lax.fori_loop(0, inner, body, (tokens, cache))[0]

    tokens = jnp.ones((batch_size, width), jnp.int32)
    offsets = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch_size, width))
    return jax.jit(run), (model, tokens, (context - 1) + offsets, cache)


def _drafter_at_context(drafter, batch_size: int, context: int, cache_len: int, target=None):
    """``(lengths, seq, state)``: rows of ``context`` tokens in a ``cache_len`` buffer, and
    the drafter's state after them.

    A drafter that reads target features (non-empty ``target_layers``) is initialised,
    as the decoder does, with the features of ``target``'s prefill of those tokens.
    """
    lengths = jnp.full((batch_size,), context, jnp.int32)
    seq = jnp.ones((batch_size, cache_len), jnp.int32)
    layers = tuple(drafter.target_layers)
    if not layers:
        init = jax.jit(lambda d, p, n: d.init(p, n, cache_len, None))
        return lengths, seq, init(drafter, seq[:, :context], lengths)
    if target is None:
        raise ValueError(
            f"target: the {type(drafter).__name__} reads target layers {layers}, so its "
            "state needs the target's features; pass target="
        )

    def init(m, d, p, n):
        _, features = prefill(m, p, n, cache_len, layers)
        return d.init(p, n, cache_len, features)

    return lengths, seq, jax.jit(init)(target, drafter, seq[:, :context], lengths)


def _features_like(target, drafter, batch_size: int, width: int):
    """Placeholder `TargetHidden` of ``width`` tokens, as a verify forward hands over."""
    layers = tuple(drafter.target_layers)
    shape = (batch_size, width, len(layers) * target.config.hidden_size)
    return jnp.full(shape, 0.01, target.dtype)


def _draft_keys(key, i, batch_size: int, gamma: int):
    """Keys ``[B, γ]`` for the i-th proposal, as the decoder passes them."""
    return jax.random.split(jax.random.fold_in(key, i), (batch_size, gamma))


def draft_cost(
    drafter,
    batch_size: int,
    context: int,
    sampling,
    *,
    repeats: int = 10,
    inner: int = 10,
    cache_len: int | None = None,
    target=None,
) -> float:
    """Median seconds of one ``drafter.propose`` (all γ draft tokens) at ``context``.

    A drafter that reads target features (non-empty ``target_layers``, e.g.
    `specjax.BlockDrafter`) needs ``target`` to build its state from a prefill, and
    its cost also includes the ``drafter.update`` with the γ+1 tokens' features that
    follows every verify forward (for such a drafter that update is real work: it
    projects the features into its context cache); the features themselves come
    out of the verify forward (:func:`forward_costs` with ``feature_layers``).
    """
    cache_len = cache_len or context + drafter.num_draft + 2
    lengths, seq, state = _drafter_at_context(drafter, batch_size, context, cache_len, target)
    layers = tuple(drafter.target_layers)

    if layers:
        gamma = drafter.num_draft
        positions = (context - 1) + jnp.broadcast_to(
            jnp.arange(gamma + 1, dtype=jnp.int32), (batch_size, gamma + 1)
        )
        hidden = _features_like(target, drafter, batch_size, gamma + 1)

    # As in forward_costs: `inner` proposals in one loop, each fed the last.
    def run(d, key, state, seq, lengths, sampling):
        def body(i, seq):
            keys = _draft_keys(key, i, batch_size, d.num_draft)
            tokens = d.propose(keys, state, seq, lengths, sampling).tokens
            return seq.at[:, : tokens.shape[1]].set(tokens)

        def body_with_update(i, carry):
            seq, state = carry
            keys = _draft_keys(key, i, batch_size, d.num_draft)
            proposal = d.propose(keys, state, seq, lengths, sampling)
            # Features that depend on the proposal, so the update is not hoisted.
            shift = proposal.tokens[:, :1, None].astype(hidden.dtype) * 1e-6
            features = TargetHidden(states=hidden + shift, positions=positions)
            state = d.update(proposal.state, lengths, features)
            return seq.at[:, : proposal.tokens.shape[1]].set(proposal.tokens), state

        if layers:
            return jax.lax.fori_loop(0, inner, body_with_update, (seq, state))[0]
        return jax.lax.fori_loop(0, inner, body, seq)

    timing, _ = time_fn(
        jax.jit(run), drafter, jax.random.key(0), state, seq, lengths, sampling, repeats=repeats
    )
    return timing.median_s / inner


def interleaved_cost(
    target,
    drafter,
    batch_size: int,
    context: int,
    sampling,
    *,
    repeats: int = 10,
    inner: int = 10,
    cache_len: int | None = None,
) -> float:
    """Median seconds of one proposal followed by its verification forward, back to back.

    The same two calls as :func:`draft_cost` and :func:`forward_costs` (T = γ+1),
    alternating in one loop as they do in the decoder, without the decoder's
    acceptance and bookkeeping. Compared with the sum of the separate costs, it
    shows what the two models cost each other (on a CPU: caches they evict). For a
    drafter that reads target features, the verify forward returns them and the
    drafter's update consumes them, as in the decoder.
    """
    gamma = drafter.num_draft
    layers = tuple(drafter.target_layers)
    cache_len = cache_len or context + gamma + 2
    lengths, seq, state = _drafter_at_context(drafter, batch_size, context, cache_len, target)
    target_cache, _ = jax.jit(prefill, static_argnums=3)(
        target, seq[:, :context], lengths, cache_len
    )
    positions = (context - 1) + jnp.broadcast_to(jnp.arange(gamma + 1), (batch_size, gamma + 1))

    def run(m, d, key, carry, sampling):
        def body(i, carry):
            seq, target_cache, state = carry
            keys = _draft_keys(key, i, batch_size, gamma)
            proposal = d.propose(keys, state, seq, lengths, sampling)
            tokens = jnp.concatenate([seq[:, :1], proposal.tokens], axis=1)
            logits, target_cache, features = score(m, tokens, positions, target_cache, layers)
            new_state = d.update(proposal.state, lengths, features)
            tokens = jnp.minimum(tokens, jnp.argmax(logits, -1).astype(jnp.int32))
            return (
                seq.at[:, : gamma + 1].set(tokens),
                target_cache.rollback(lengths - 1),
                new_state,
            )

        return jax.lax.fori_loop(0, inner, body, carry)[0]

    timing, _ = time_fn(
        jax.jit(run),
        target,
        drafter,
        jax.random.key(0),
        (seq, target_cache, state),
        sampling,
        repeats=repeats,
    )
    return timing.median_s / inner


def peak_matmul_flops(size: int = 1024, *, repeats: int = 5, inner: int = 10) -> float:
    """Float32 FLOP/s of a square ``size`` matmul on the default device: a compute ceiling.

    Every forward of ``N`` parameters costs at least ``2·N`` FLOPs per token, so
    tokens/s can never exceed ``peak / (2·N)`` per token computed.
    """
    a = jnp.full((size, size), 1.0 / size, jnp.float32)

    def run(a):
        return jax.lax.fori_loop(0, inner, lambda _, x: x @ a, a)

    timing, _ = time_fn(jax.jit(run), a, repeats=repeats)
    return 2 * size**3 * inner / timing.median_s


def speculative_prediction(
    target,
    drafter,
    batch_size: int,
    context: int,
    sampling,
    alpha: float,
    *,
    repeats: int = 10,
    cache_len: int | None = None,
) -> dict:
    """Measures the three costs of one speculative step and the speedup they predict.

    Args:
        target: the target model.
        drafter: the :class:`~specjax.drafters.Drafter` (γ = ``drafter.num_draft``).
        batch_size: B.
        context: tokens already in the cache (e.g. prompt + half the new tokens).
        sampling: the :class:`~specjax.SamplingConfig` the drafter samples with.
        alpha: the measured per-token acceptance probability (:func:`alpha_from_hist`).
        repeats: timing repeats of each cost.
        cache_len: the cache length of the decode loop being predicted.

    Returns:
        ``{"cost_step_ms", "cost_verify_ms", "cost_draft_ms", "predicted_speedup"}``.
    """
    gamma = drafter.num_draft
    kw = dict(repeats=repeats, cache_len=cache_len)
    layers = tuple(drafter.target_layers)
    if layers:  # the verify forward also returns the drafter's features
        costs = forward_costs(target, batch_size, context, [1], **kw)
        width = [gamma + 1]
        costs |= forward_costs(target, batch_size, context, width, feature_layers=layers, **kw)
    else:
        costs = forward_costs(target, batch_size, context, sorted({1, gamma + 1}), **kw)
    c_draft = draft_cost(drafter, batch_size, context, sampling, target=target, **kw)
    return {
        "cost_step_ms": costs[1] * 1e3,
        "cost_verify_ms": costs[gamma + 1] * 1e3,
        "cost_draft_ms": c_draft * 1e3,
        "predicted_speedup": predicted_speedup(alpha, gamma, costs[1], costs[gamma + 1], c_draft),
    }
