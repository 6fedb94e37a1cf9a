"""Which ids end a generation: one rule for `specjax.Sampler`, `specjax.ChatSampler` and
``specjax generate``.

A completion ends at the model's end of sequence: every id of the config's
``eos_token_ids``, and the tokenizer's ``<|endoftext|>`` when it has one (a checkpoint
whose config names no EOS often still has it). A chat answer ends at the end of the
assistant's turn as well (`specjax.io.chat.end_of_turn_ids`: the template's markup, such
as ``<|im_end|>`` or ``<|eot_id|>``).
"""

from __future__ import annotations

import types

from specjax.io.chat import end_of_turn_ids
from specjax.training.tokenizer import EOS_TOKEN

__all__ = ["stop_ids"]


def stop_ids(model, tokenizer=None, *, chat: bool = False, chat_template=None) -> tuple[int, ...]:
    """The ids that end a row, to pass as the decoders' ``eos_id``.

    Args:
        model: the target (its ``config.eos_token_ids`` and ``vocab_size`` are read when
            it has them).
        tokenizer: the tokenizer the text goes through (default ``model.tokenizer``).
        chat: also end at the end of an assistant turn of the chat template.
        chat_template: the template to read for ``chat`` (default the model's).

    Returns:
        distinct ids, config's first, each below the model's vocabulary size (an id the
        logits cannot reach can never be emitted); empty when nothing names an EOS.

    Examples:
        >>> import specjax
        >>> from specjax.text.eos import stop_ids
        >>> target, _, tokenizer = specjax.default_pair()
        >>> stop_ids(target) == (tokenizer.token_to_id("<|endoftext|>"),)
        True
    """
    tokenizer = getattr(model, "tokenizer", None) if tokenizer is None else tokenizer
    config = getattr(model, "config", None)
    ids = [int(i) for i in (getattr(config, "eos_token_ids", ()) or ())]
    if chat:
        # end_of_turn_ids reads the tokenizer and template off its argument.
        view = types.SimpleNamespace(
            config=config,
            tokenizer=tokenizer,
            chat_template=chat_template or getattr(model, "chat_template", None),
        )
        ids += end_of_turn_ids(view)
    if tokenizer is not None and tokenizer.token_to_id(EOS_TOKEN) is not None:
        ids.append(int(tokenizer.token_to_id(EOS_TOKEN)))
    vocab = getattr(model, "vocab_size", None)
    return tuple(i for i in dict.fromkeys(ids) if vocab is None or 0 <= i < int(vocab))
