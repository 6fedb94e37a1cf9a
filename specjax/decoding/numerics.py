"""One numerics for plain and speculative decoding: the forward width.

**Why it is needed.** Speculative decoding is exact in distribution whatever the
numerics (`specjax.verification.chain`). Emitting plain decoding's very tokens asks more: the
logits that decide a position must be the same bits in both decoders. A plain step
scores one token per row and a verify γ + 1, and XLA picks its kernels by shape (on a
CPU a one-row product is a matrix–vector kernel; on a TPU under the default precision
a matrix–vector product is computed in float32 and a matrix–matrix one in bfloat16
passes), so the same token's logits differ in their last bits between the two: on the
bundled pair up to 4e-6 in float32, 8e-5 with int8 activations and 0.06 in bfloat16.
At a near-tie a greedy decode then takes the other token, and from there the texts
part.

**The fix: every target forward of the loop scores the same number of columns, W.**
``forward_width=W`` (`specjax.generate`, `specjax.speculative_generate`,
`specjax.decoding.init`, the CLI's ``--forward-width``) pads every target forward to
W columns:

* plain decoding scores its token at column 0, followed by W − 1 padding columns;
* speculative decoding scores the pending token and its γ drafts, followed by
  W − γ − 1 padding columns (a tree: its N + 1 nodes, then padding). Its chain is
  padded with drafts that were never proposed, which every verifier rejects, so each
  step is one verification over W columns, and plain decoding is that same step with
  no draft proposed (coupled verification of an empty chain: its token is the
  target's sample, drawn as coupled verification draws it);
* padding sits at later positions and cache slots than any real token of the step.
  No real token attends to it, and its cache entries are overwritten before anything
  can (slot == position, rolled back after the step);
* the probabilities, the samples and the verification are computed over all W
  columns in both decoders, so no shape differs anywhere in the step;
* XLA may not narrow the forward: the logits of unread columns would let it shrink the
  last layer's and the head's products to fewer rows, another kernel. An
  ``optimization_barrier`` on the forward's outputs keeps every product W rows wide.

Column j of a W-wide forward is then computed by the same kernels as column 0 of
another, and its bits depend only on the row's own tokens: padding next to it, other
rows' prompts or which column it sits in change nothing (measured bit for bit on
XLA:CPU in float32, bfloat16 and both int8 modes; ``tests/test_accelerator.py``
checks a GPU or TPU).

**The guarantee.** For one target (float32, bfloat16, int8 weights, or int8 weights
and activations), one batch size, one prompt width and cache length, and one W:

* greedy rows: ``speculative_generate(..., forward_width=W)`` emits
  ``generate(..., forward_width=W)``'s tokens, token for token, with any verification;
* with ``verification="coupled"``, every row, at any temperature, top-k, top-p, min-p,
  for the same key and seeds;
* for every drafter: chains of at most W − 1 drafts and trees of at most W nodes (root
  included), adaptive γ (``gamma_by_active_rows``), ``draft_confidence``, penalties,
  constraints, stop strings and refill (fewer slots than prompts);
* with ``verification="block"`` or ``"rejection"`` at a temperature above 0 the output
  is exact in distribution; its sample for one key is another one than plain
  decoding's.

``tests/test_numerics.py`` checks all of it at jax's default flags, with a negative
control (a plain step narrower than the verify is caught).

**Defaults.** ``forward_width=None`` scores what each step needs: one column for plain
decoding (the fastest), the step's verify for speculative decoding (γ + 1, a tree's
N + 1; with ``draft_confidence`` only the longest proposed chain, with
``gamma_by_active_rows`` that entry's γ + 1). Speculative decoding with a fixed γ and
neither option therefore scores γ + 1 columns either way, and equals plain decoding at
``forward_width=γ + 1``. A plain step W wide costs more than a one-column step
(BENCHMARKS.md, "What one forward width costs").

**Rows and batches.** At one batch size a row's tokens do not depend on the other
rows: not on their prompts, their lengths, the prompt width they pad to, or the cache
length (measured bit for bit on XLA:CPU). They may depend on the batch size itself: a
product of B · W rows runs another kernel than one of B' · W rows. On XLA:CPU the rows
of batches of 1 and 2 differ in their last bits from those of 4 and more in float32
(where small products run weight-first, `specjax.models.matmul`) and with int8
activations; bfloat16 rows were equal at every batch size measured.
"""

from __future__ import annotations

from specjax.core.validation import check_int
from specjax.drafters.base import Drafter, lookahead


def check_forward_width(forward_width, drafter: Drafter) -> int | None:
    """``forward_width`` checked: ``None``, or an int W at least one verify forward wide.

    Args:
        forward_width: ``None`` (each forward as wide as its step needs) or W.
        drafter: the decoder's drafter (`specjax.drafters.NoDraft` for plain decoding).

    Returns:
        ``None`` or W, an int.

    Raises:
        ValueError: W is not an int >= 1, or narrower than the drafter's verify forward
            (γ + 1 columns, or a tree's N + 1 nodes).
    """
    if forward_width is None:
        return None
    width = check_int("forward_width", forward_width, lo=1)
    needed = lookahead(drafter)
    if width < needed:
        tree = getattr(drafter, "tree", None)
        what = (
            f"the {tree!r}'s {needed} nodes (root included)"
            if tree is not None
            else f"γ + 1 = {needed} columns (the pending token and γ = {drafter.num_draft} drafts)"
        )
        raise ValueError(
            f"forward_width={width} is narrower than one verify forward of the "
            f"{type(drafter).__name__}, which scores {what}: use forward_width >= "
            f"{needed}, or None for the narrowest forward each step"
        )
    return width
