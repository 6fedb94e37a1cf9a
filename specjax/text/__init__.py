"""Text in, text out: `Sampler` and `ChatSampler` over the functional decoders.

* `~specjax.text.options`: `GenerationOptions`, every generation setting, declared once;
* `~specjax.text.sampler`: `Sampler` (complete text, one prompt or a batch, streamed or
  not); `~specjax.text.chat`: `ChatSampler` (turns in the model's chat template);
* `~specjax.text.defaults`: `DEFAULTS`, the generation defaults the samplers and
  ``specjax generate`` share;
* `~specjax.text.eos`: `stop_ids`, which ids end a row;
* `~specjax.text.stream`: `TextStream`, token ids to text pieces as they arrive;
* `~specjax.text.loading`: models and drafters by path or name.

This layer sits above `specjax.training` and below the command line (``.importlinter``).
"""

from specjax.text.chat import ChatSampler as ChatSampler
from specjax.text.defaults import DEFAULTS as DEFAULTS
from specjax.text.eos import stop_ids as stop_ids
from specjax.text.options import GenerationOptions as GenerationOptions
from specjax.text.sampler import Sampler as Sampler
from specjax.text.stream import TextStream as TextStream

__all__ = ["DEFAULTS", "ChatSampler", "GenerationOptions", "Sampler", "TextStream", "stop_ids"]
