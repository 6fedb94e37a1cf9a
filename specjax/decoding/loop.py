"""The decode loop, as pure functions: one step, and the ``lax.while_loop`` that runs it.

A step (`_decode_step`) reads its `~specjax.decoding.stages.StepContext` once, then
runs its stages (`specjax.decoding.stages`) on a chain of γ drafts per row or on the
drafter's tree: propose, score the pending token and the drafts in one target call,
verify them exactly; `specjax.decoding.commit` writes the emitted tokens and advances
the models. `run_loop`
repeats it, with a refill of finished slots (`specjax.decoding.refill`) after every
step, until every row is done or a step budget runs out.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from specjax.core.validation import INT32_MAX
from specjax.decoding.commit import commit
from specjax.decoding.decoder import Decoder
from specjax.decoding.refill import refill
from specjax.decoding.stages import ChainStep, StepContext, StepPlan, TreeStep
from specjax.decoding.state import DecodeState


def _body(decoder: Decoder, state: DecodeState, gamma: int) -> DecodeState:
    """One loop iteration: a decode step with ``gamma`` drafts, then refills."""
    return refill(decoder, _decode_step(decoder, state, gamma))


def _table_index(decoder: Decoder, state: DecodeState) -> jax.Array:
    """The ``gamma_table`` entry for the number of active rows now."""
    table = decoder.gamma_table
    max_rows = jnp.asarray([rows for rows, _ in table], jnp.int32)
    active = jnp.sum(~state.done, dtype=jnp.int32)
    return jnp.minimum(jnp.searchsorted(max_rows, active), len(table) - 1)


def _decode_step(decoder: Decoder, state: DecodeState, gamma: int) -> DecodeState:
    """One decode step with γ = ``gamma`` drafts (at most the drafter's own γ), or a tree:
    propose, score in one target forward, verify exactly, commit."""
    ctx = StepContext.of(decoder, state, StepPlan.of(decoder, gamma))
    stage = ChainStep(ctx) if decoder.drafter.tree is None else TreeStep(ctx)
    drafted = stage.propose()
    scored = stage.score(drafted)
    verified = stage.verify(drafted, scored)
    return commit(decoder, state, verified, stage.models(drafted, scored, verified))


def step(decoder: Decoder, state: DecodeState, gamma: int | None = None) -> DecodeState:
    """One step of the loop, without the refill of finished slots that follows it.

    The unit a decode's time is made of: `specjax.chips` compiles it alone to predict
    what it costs on a chip. ``gamma``: drafts (default the drafter's own γ).
    """
    return _decode_step(decoder, state, decoder.drafter.num_draft if gamma is None else gamma)


def run_loop(decoder: Decoder, state: DecodeState, num_steps=None) -> DecodeState:
    """Runs the loop until every row is done, or for at most ``num_steps`` iterations.

    With a ``gamma_table``, one ``while_loop`` per entry runs in turn, from the most
    active rows to the fewest, each with its own γ. That is the table exactly: the
    number of active rows never grows (refill keeps every slot busy until the prompts
    run out, and then rows only finish), so the entry only ever moves down. Choosing
    the variant per step with ``lax.switch`` instead makes XLA:CPU copy the loop state
    (caches included) into the branch every step, which slows every step down.
    """
    if num_steps is None:
        running = lambda s: ~jnp.all(s.done)  # noqa: E731
    else:
        # Clamped so that the limit never wraps around int32.
        room = jnp.int32(INT32_MAX) - state.step
        limit = state.step + jnp.clip(jnp.asarray(num_steps, jnp.int32), 0, room)
        running = lambda s: ~jnp.all(s.done) & (s.step < limit)  # noqa: E731
    table = decoder.gamma_table
    if not table:
        body = partial(_body, decoder, gamma=decoder.drafter.num_draft)
        return jax.lax.while_loop(running, body, state)
    for index in reversed(range(len(table))):
        # ">=": the last loop (entry 0) runs to the end whatever the count.
        def cond(s, index=index):
            return running(s) & (_table_index(decoder, s) >= index)

        state = jax.lax.while_loop(cond, partial(_body, decoder, gamma=table[index][1]), state)
    return state
