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

One mechanism per module, each importing only those above it:

* `~specjax.decoding.slots`: the continuous-batching containers (`PromptQueue`,
  `PromptOutputs`), the serving order and `insert_row`;
* `~specjax.decoding.state`: the constants and the pytrees the loop carries and
  returns (`DecodeState`, `GenerationResult`, `GenerationStats`);
* `~specjax.decoding.checks`: every check of the decoders' inputs, on the host,
  before anything compiles (`_prepare` and the ``_check_*`` functions);
* `~specjax.decoding.refill`: filling the slots, by the first prefill and by handing
  a finished slot on to the next prompt, on device;
* `~specjax.decoding.loop`: one decode step (draft, score, verify a chain or a tree,
  commit) and the ``lax.while_loop`` that runs it;
* `~specjax.decoding.api`: the jitted programs and the public `init`, `step`,
  `result`, `stream`, `generate` and `speculative_generate`.
"""

from specjax.decoding.api import generate as generate
from specjax.decoding.api import init as init
from specjax.decoding.api import result as result
from specjax.decoding.api import speculative_generate as speculative_generate
from specjax.decoding.api import step as step
from specjax.decoding.api import stream as stream
from specjax.decoding.checks import check_drafter as check_drafter
from specjax.decoding.checks import pad_prompts as pad_prompts
from specjax.decoding.checks import resolve_cache_len as resolve_cache_len
from specjax.decoding.state import CACHE_BUCKET as CACHE_BUCKET
from specjax.decoding.state import EOS_BUCKET as EOS_BUCKET
from specjax.decoding.state import PROMPT_BUCKET as PROMPT_BUCKET
from specjax.decoding.state import VERIFICATIONS as VERIFICATIONS
from specjax.decoding.state import DecodeState as DecodeState
from specjax.decoding.state import GenerationResult as GenerationResult
from specjax.decoding.state import GenerationStats as GenerationStats

__all__ = [
    "CACHE_BUCKET",
    "EOS_BUCKET",
    "PROMPT_BUCKET",
    "VERIFICATIONS",
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
