"""Training decoder LMs: next-token pre-training and draft distillation.

One jitted, donated step function does everything on device: it samples the
step's batch from the token stream with ``fold_in(key, step)``, computes the
loss in float32, and applies AdamW (warmup + cosine learning rate, global-norm
clipping). Because the batch is a function of the step and the state holds the
step, a run resumed from a checkpoint produces bit-identical losses and
parameters to an uninterrupted one.

Two objectives:

* **Language modelling**: cross-entropy of the next token.
* **Distillation** (``teacher=...``): the draft ``q`` is trained towards the
  frozen target's distribution ``p`` at temperature 1 with forward
  ``KL(p || q)`` and, optionally, the total-variation distance
  ``TV(p, q) = 1/2 sum |p - q|``, whose complement ``1 - TV`` is exactly the
  per-token acceptance probability of speculative sampling (DistillSpec, Zhou
  et al. 2024). Teacher logits are computed on the fly inside the same jit.

Drafters that read the target's hidden states are trained the same way, the frozen
target scoring each batch inside the step, by `train_drafter` with their objective
(`~specjax.training.objectives`): DFlash's anchored blocks for a `specjax.BlockDrafter`
(`~specjax.training.block`), EAGLE-3's training-time test for a `specjax.EagleDrafter`
(`~specjax.training.eagle`).

Checkpoints are Hugging Face folders (``save_pretrained``: ``config.json``,
``model.safetensors``, ``tokenizer.json``) in the training dtype, plus
``train_state.safetensors`` holding the optimizer state, step, data key and
loss history. Nothing is pickled. Each checkpoint is written to a temporary
directory, flushed to disk and renamed into place (:mod:`specjax.io.atomic`), so a
crash never leaves a half-written checkpoint that ``resume=True`` would pick up.

Garbage is refused, not trained on: :class:`TrainConfig` checks every field when
it is built, :func:`train` checks the token ids against the vocabulary before
the first step, and a non-finite loss or gradient stops the run with a
``FloatingPointError`` naming the step, before any checkpoint of it is written.

One mechanism per module, each importing only those above it:

* `~specjax.training.config`: the hyper-parameters (`TrainConfig` and the drafters'
  subclasses);
* `~specjax.training.losses`: the language-model objectives and `evaluate`;
* `~specjax.training.block`, `~specjax.training.eagle`: the drafters' objectives, and
  `~specjax.training.objectives`, which drafter each trains;
* `~specjax.training.step`: the optimizer and the jitted step;
* `~specjax.training.checkpoints`: atomic, resumable checkpoints and `cast_params`;
* `~specjax.training.loop`: `train`, with every check of its inputs;
* `~specjax.training.drafter`: `train_drafter`.
"""

from specjax.training.checkpoints import TRAIN_STATE_FILE as TRAIN_STATE_FILE
from specjax.training.checkpoints import cast_params as cast_params
from specjax.training.checkpoints import list_checkpoints as list_checkpoints
from specjax.training.checkpoints import load_checkpoint as load_checkpoint
from specjax.training.checkpoints import save_checkpoint as save_checkpoint
from specjax.training.config import BlockTrainConfig as BlockTrainConfig
from specjax.training.config import EagleTrainConfig as EagleTrainConfig
from specjax.training.config import TrainConfig as TrainConfig
from specjax.training.drafter import train_drafter as train_drafter
from specjax.training.loop import TrainResult as TrainResult
from specjax.training.loop import train as train
from specjax.training.losses import cross_entropy as cross_entropy
from specjax.training.losses import distill_losses as distill_losses
from specjax.training.losses import evaluate as evaluate
from specjax.training.losses import forward as forward
from specjax.training.step import TrainState as TrainState
from specjax.training.step import init_train_state as init_train_state
from specjax.training.step import make_optimizer as make_optimizer
from specjax.training.step import train_step as train_step
