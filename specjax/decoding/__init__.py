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
* open, in the style of gemma and tunix: `init` returns the call's `Decoder` (the
  models, options and features, which stay fixed) and its first `DecodeState` (what
  the loop carries); `run(decoder, state)` runs a jitted chunk of the same loop (the
  state is donated), `result(decoder, state)` reads the output at any point, and
  `stream(decoder, state)` yields the new tokens chunk by chunk.

All randomness is keyed by row seed and position (`specjax.sampling.noise`), so a row's output
does not depend on the rest of the batch.

The decoders' arguments, in full (`speculative_generate` takes them all; `generate`
all but the drafter's):

* ``max_new_tokens``: tokens to generate per row (>= 1), EOS included: an int or
  ``int[B]``.
* ``sampling``: a `SamplingConfig` applied identically to the target and the draft,
  each setting a scalar or ``[B]``; default: greedy (temperature 0), which needs no
  key (``key=None``); a row that samples needs one. Its ``vocab_limit`` masks
  ids ``>=`` it in both distributions (an int in ``[1, V]``, traced); default: the
  target's tokenizer size where that is smaller than V (padded embedding rows), else
  V. With a drafter of a smaller vocabulary ``V_d`` it must be at most ``V_d``.
* ``eos_id``: optional id, or ``[K]`` ids, that end a row; the EOS token is emitted and
  drafts after it are discarded.
* ``seeds``: optional ``int[B]`` per-row seeds (default: the row index).
* ``cache_len``: static cache length S; default ``P + max_new_tokens + γ + 1`` rounded
  up to a multiple of 64. A row that would overflow it stops and is flagged in
  ``truncated``.
* ``verification``: ``"block"`` (the default for a chain) judges the chain as a whole:
  on average it keeps at least as many drafts as any exact verifier
  (`specjax.verification.block`). ``"rejection"`` (the default for a tree) accepts draft
  by draft with probability ``min(1, p/q)``, each at rate ``1 - TV(p, q)``. Both give
  exactly `generate`'s distribution (token for token at temperature 0), but not its
  sample for one key. ``"coupled"``: the drafter draws with
  the noise the target samples each position with, and a draft is accepted iff it
  equals the target's sample; the output then *equals* `generate`'s for the same key
  and seeds, at any setting and with any drafter, and acceptance falls to the
  coupling probability (at least ``(1 - TV) / (1 + TV)``).
* ``num_slots``: rows decoded at once, B (default: one per prompt). With fewer slots
  than prompts, a finished row's slot is prefilled with the next prompt inside the
  same on-device loop (continuous batching), serving the longest budgets first;
  settings, seeds and budgets follow the prompt, and outputs come back in prompt order.
* ``gamma_by_active_rows``: optional table choosing each step's γ by the number of
  active rows, ``{max_active_rows: γ}`` or ``(max_active_rows, γ)`` pairs, each γ in
  ``[0, drafter.num_draft]``, e.g. ``{1: 4, 8: 2, 64: 0}``; γ = 0 is a plain step. Each
  entry is its own ``while_loop``, run in turn on device as rows finish. Exact; with
  rejection verification a row's sample then depends on how many rows are active.
* ``draft_confidence``: optional τ in ``[0, 1]``: a row stops proposing after its first
  draft whose own probability ``q(x)`` is below τ (that draft is still verified), and
  the verify forward covers only as many positions as the longest active row
  proposed. Exact: whether a position is proposed depends only on the drafts before
  it. Needs a drafter that returns q.
* ``top_logprobs``: static k >= 0: the k most probable ids at each emitted position and
  their log-probabilities (``GenerationResult.top_ids``, ``.top_logprobs``), from the
  processed distribution the token was drawn from.
* ``raw_logprobs``: static: those from the raw logits' log-softmax (before the
  vocabulary limit, penalties, temperature and filters).
* ``stop``: a list of strings (every prompt) or one list per prompt, spelled with
  ``target.tokenizer``, or a `specjax.StopStrings`. A row ends with the token that
  completes one of its stop strings in the generated text (split across tokens too);
  that token is kept, and no token past it is emitted (`specjax.sampling.stops`).
* ``constraint``: a `specjax.Constraint` (a regex or a JSON schema compiled for the
  tokenizer) for every prompt, or one Constraint or None per prompt. A constrained row
  only emits text of its language: ids the automaton does not allow get ``-inf``
  before the other transforms, in the target's p and a draft model's q alike, EOS ids
  only where the text is complete, and the row ends with the token that completes it
  when nothing can follow (`specjax.sampling.constraints`).
* ``forward_width``: static W >= γ + 1 (a tree: its nodes + 1): every target forward of
  the loop scores exactly W columns, padded after the drafts. Greedy rows, and with
  coupled verification every row, then equal plain decoding's at the same W in any
  precision (`specjax.decoding.numerics`). ``None`` (default): each forward is as wide
  as its step needs.
* ``features``: extra per-row parts (`specjax.decoding.features.RowFeature`); what they
  return is in ``GenerationResult.extras``.

One mechanism per module, each importing only those above it:

* `~specjax.decoding.slots`: the continuous-batching containers (`PromptQueue`,
  `PromptOutputs`), the serving order and `insert_row`;
* `~specjax.decoding.state`: the constants and the pytrees the loop carries and
  returns (`DecodeState`, `GenerationResult`, `GenerationStats`);
* `~specjax.decoding.decoder`: the `Decoder`, what stays fixed while a batch decodes,
  and the cache slots one step may write (`step_slots`);
* `~specjax.decoding.features`: the per-row features (statistics, draft flags,
  log-probabilities, penalties, stop strings, constraints), each one file behind the
  `RowFeature` protocol;
* `~specjax.decoding.refill`: filling the slots on device: one function starts rows
  (the first slots, and each refill of a finished slot with the next prompt);
* `~specjax.decoding.output`: a state read as every prompt's `GenerationResult`
  (`result`), and the width a call keeps;
* `~specjax.decoding.build`: a call's options (`DecodeOptions`) built into the
  `Decoder` (features, EOS ids, γ table), and the bytes its state will take;
* `~specjax.decoding.checks`: every check of the decoders' inputs, on the host,
  before anything compiles (`prepare`, which has the `Decoder` built; the drafter's
  own checks are `specjax.drafters.checks`);
* `~specjax.decoding.commit`: cutting a verified step and writing it;
* `~specjax.decoding.stages`: the stages of one decode step (its context read once,
  then propose, score and verify a chain or a tree);
* `~specjax.decoding.loop`: one decode step and the ``lax.while_loop`` that runs it;
* `~specjax.decoding.api`: the public `init`, `run`, `stream`, `generate` and
  `speculative_generate`.

Choosing γ for this machine (``gamma="auto"``) is `specjax.tuning`, above this package.
"""

from specjax.decoding.api import generate as generate
from specjax.decoding.api import init as init
from specjax.decoding.api import run as run
from specjax.decoding.api import speculative_generate as speculative_generate
from specjax.decoding.api import stream as stream
from specjax.decoding.checks import pad_prompts as pad_prompts
from specjax.decoding.checks import resolve_cache_len as resolve_cache_len
from specjax.decoding.decoder import Decoder as Decoder
from specjax.decoding.features import RowFeature as RowFeature
from specjax.decoding.output import result as result
from specjax.decoding.state import CACHE_BUCKET as CACHE_BUCKET
from specjax.decoding.state import EOS_BUCKET as EOS_BUCKET
from specjax.decoding.state import PROMPT_BUCKET as PROMPT_BUCKET
from specjax.decoding.state import VERIFICATIONS as VERIFICATIONS
from specjax.decoding.state import DecodeState as DecodeState
from specjax.decoding.state import GenerationResult as GenerationResult
from specjax.decoding.state import GenerationStats as GenerationStats
from specjax.drafters.checks import check_drafter as check_drafter

__all__ = [
    "CACHE_BUCKET",
    "EOS_BUCKET",
    "PROMPT_BUCKET",
    "RowFeature",
    "VERIFICATIONS",
    "DecodeState",
    "Decoder",
    "GenerationResult",
    "GenerationStats",
    "check_drafter",
    "generate",
    "init",
    "pad_prompts",
    "resolve_cache_len",
    "result",
    "run",
    "speculative_generate",
    "stream",
]
