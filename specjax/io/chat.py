"""Chat templates: turning messages into an instruct model's prompt, and where a turn ends.

An instruct checkpoint ships a Jinja template that writes a conversation in the markup
the model was trained on (`specjax.Model.chat_template`, read from
``chat_template.jinja``, ``tokenizer_config.json`` or a GGUF file). `apply_chat_template`
renders it as transformers does, so that a prompt is token for token the one the model
expects:

* a sandboxed, immutable Jinja environment (templates come from model repositories and
  are untrusted code) with ``trim_blocks`` and ``lstrip_blocks`` and the loop-controls
  extension (``{% break %}``, ``{% continue %}``);
* a ``tojson`` filter that does not escape HTML (``json.dumps``, ``ensure_ascii=False``),
  and the globals ``raise_exception(message)`` and ``strftime_now(format)``;
* the variables ``messages``, ``add_generation_prompt``, ``tools`` and ``documents``
  (``None``), ``bos_token`` and ``eos_token`` (the strings of the config's ids), and any
  extra variables given.

`end_of_turn_ids` gives the ids that end an assistant turn: the config's EOS ids plus the
template's end-of-turn markup token (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``,
``<|end|>``, ...). The decoders take several ``eos_id``, so chat generation stops there.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime

__all__ = ["END_OF_TURN_TOKENS", "apply_chat_template", "end_of_turn_ids"]

END_OF_TURN_TOKENS = (
    "<|im_end|>",  # ChatML: SmolLM2, Qwen
    "<|eot_id|>",  # Llama 3
    "<|eom_id|>",  # Llama 3.1, after a tool call
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3
    "<|END_OF_TURN_TOKEN|>",  # Command-R
)
"""End-of-turn markup tokens of common families, used when the template writes them."""

# What `end_of_turn_ids` puts in an assistant message to find the markup after it.
_PROBE_ANSWER = "specjax-probe-answer"
# Older jinja2 releases have known sandbox escapes, and templates are untrusted code.
_MIN_JINJA = (3, 1, 6)


def _jinja():
    """The ``jinja2`` module, imported on first use (only chat needs it)."""
    try:
        import jinja2
    except ImportError:
        raise ImportError("chat templates need jinja2: pip install 'jinja2>=3.1.6'") from None
    version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if version < _MIN_JINJA:
        raise ImportError(
            f"chat templates need jinja2 >= 3.1.6 (older versions have sandbox escapes), "
            f"found {jinja2.__version__}: pip install -U jinja2"
        )
    return jinja2


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    """The template compiled in transformers' environment (cached: templates are long)."""
    jinja2 = _jinja()
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes <, > and & for HTML, which would change the prompt.
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(
            f"chat_template is not a valid Jinja template: {e.message} (line {e.lineno})"
        ) from None


def _check_messages(messages) -> list[dict]:
    """Plain dict copies of ``messages``, ``None`` values dropped (as transformers does)."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            "messages must be a list of {'role': ..., 'content': ...} dicts, got "
            f"{type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"messages[{i}] must be a dict with 'role' and 'content', got "
                f"{type(message).__name__}"
            )
        message = {k: v for k, v in message.items() if v is not None}
        if not isinstance(message.get("role"), str):
            raise ValueError(
                f"messages[{i}] needs a 'role' string ('system', 'user', 'assistant', ...), "
                f"got {message.get('role')!r}"
            )
        content = message.get("content")
        if content is None and "tool_calls" not in message:
            raise ValueError(f"messages[{i}] ({message['role']}) has no 'content'")
        if content is not None and not isinstance(content, (str, list)):
            raise TypeError(
                f"messages[{i}]['content'] must be a string (or a list of content parts), "
                f"got {type(content).__name__}"
            )
        out.append(message)
    return out


def _is_tokenizer(obj) -> bool:
    return hasattr(obj, "encode") and hasattr(obj, "id_to_token")


def _parts(tokenizer_or_model, chat_template):
    """``(tokenizer, template, special-token variables)`` of a model or a bare tokenizer."""
    if _is_tokenizer(tokenizer_or_model):
        if chat_template is None:
            raise ValueError(
                "a bare tokenizer has no chat template: pass chat_template=, or pass the "
                "model (specjax.Model.chat_template)"
            )
        return tokenizer_or_model, chat_template, {}
    tokenizer = getattr(tokenizer_or_model, "tokenizer", None)
    template = chat_template or getattr(tokenizer_or_model, "chat_template", None)
    if template is None:
        raise ValueError(
            f"the model has no chat template (it is read from chat_template.jinja, the "
            f"chat_template of tokenizer_config.json, or a GGUF's tokenizer.chat_template); "
            f"pass chat_template= ({type(tokenizer_or_model).__name__})"
        )
    variables = {}
    config = getattr(tokenizer_or_model, "config", None)
    if tokenizer is not None and config is not None:
        for name in ("bos_token", "eos_token"):
            token_id = getattr(config, f"{name}_id", None)
            token = tokenizer.id_to_token(token_id) if token_id is not None else None
            if token is not None:
                variables[name] = token
    return tokenizer, template, variables


def apply_chat_template(
    tokenizer_or_model,
    messages,
    *,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    tokenize: bool = False,
    **template_vars,
) -> str | list[int]:
    """Renders a conversation with a checkpoint's chat template, as transformers does.

    Args:
        tokenizer_or_model: a `specjax.Model` (its ``chat_template`` and ``tokenizer``;
            ``bos_token`` and ``eos_token`` are the strings of ``config.bos_token_id``
            and ``config.eos_token_id``), or a bare ``tokenizers.Tokenizer``, which
            needs ``chat_template``.
        messages: the conversation, a list of dicts with a ``role`` string and a
            ``content`` string (or list of parts); keys whose value is ``None`` are
            dropped, as transformers does.
        add_generation_prompt: end with the header of an assistant turn, so that the
            model's continuation is the answer (default; transformers defaults to
            False).
        chat_template: a Jinja template to use instead of the model's.
        tokenize: return token ids instead of text. The text is encoded without
            special tokens added: the template writes the BOS token if the model wants
            one, so it is never doubled.
        **template_vars: extra template variables (``tools``, ``documents``, or a
            template's own switches, e.g. ``enable_thinking=False``); they override the
            defaults, ``bos_token`` and ``eos_token`` included.

    Returns:
        the prompt text, or its ids (``list[int]``) with ``tokenize=True``.

    Raises:
        ValueError: no template, a template that is not valid Jinja or that refuses the
            messages (its ``raise_exception``), empty or malformed messages, or
            ``tokenize=True`` without a tokenizer.
        TypeError: messages that are not a list of dicts.

    Examples:
        >>> import specjax
        >>> from specjax.testing import tiny_tokenizer
        >>> template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}"
        >>> specjax.apply_chat_template(
        ...     tiny_tokenizer(), [{"role": "user", "content": "w1 w2"}], chat_template=template
        ... )
        'user: w1 w2\\n'
    """
    jinja2 = _jinja()
    tokenizer, template, variables = _parts(tokenizer_or_model, chat_template)
    if not isinstance(template, str):
        raise TypeError(f"chat_template must be a string, got {type(template).__name__}")
    if tokenize and tokenizer is None:
        raise ValueError("tokenize=True needs a tokenizer, and the model has none")
    variables = dict(
        variables,
        messages=_check_messages(messages),
        tools=None,
        documents=None,
        add_generation_prompt=bool(add_generation_prompt),
    )
    variables.update(template_vars)
    try:
        text = _compile(template).render(**variables)
    except jinja2.TemplateError as e:
        # raise_exception's message, an undefined name, a sandbox refusal, ...
        raise ValueError(f"the chat template refused the messages: {e}") from None
    if not tokenize:
        return text
    return tokenizer.encode(text, add_special_tokens=False).ids


def end_of_turn_ids(model, chat_template: str | None = None) -> tuple[int, ...]:
    """The ids that end an assistant turn, to pass as the decoders' ``eos_id``.

    They are ``model.config.eos_token_ids``, then the end-of-turn markup of the
    template: the added token it writes right after an assistant message (found by
    rendering a two-message probe), and any of `END_OF_TURN_TOKENS` that the template
    mentions and the tokenizer knows. Without a template or a tokenizer, the config's
    EOS ids alone.

    Args:
        model: a `specjax.Model` (``config``, ``tokenizer``, ``chat_template``).
        chat_template: a template to use instead of the model's.

    Returns:
        distinct ids, in that order.
    """
    config = getattr(model, "config", None)
    ids = list(getattr(config, "eos_token_ids", ()) or ())
    tokenizer = getattr(model, "tokenizer", None)
    template = chat_template or getattr(model, "chat_template", None)
    if tokenizer is not None and template is not None:
        ids += _token_after_answer(model, tokenizer, template)
        ids += [
            tokenizer.token_to_id(token)
            for token in END_OF_TURN_TOKENS
            if token in template and tokenizer.token_to_id(token) is not None
        ]
    return tuple(dict.fromkeys(int(i) for i in ids))


def _token_after_answer(model, tokenizer, template) -> list[int]:
    """The added token the template writes right after an assistant's content, if any."""
    probe = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": _PROBE_ANSWER},
    ]
    try:
        text = apply_chat_template(
            model, probe, add_generation_prompt=False, chat_template=template
        )
    except ValueError:  # a template with other rules for its conversations
        return []
    _, found, after = text.rpartition(_PROBE_ANSWER)
    if not found:
        return []
    ids = tokenizer.encode(after, add_special_tokens=False).ids
    added = tokenizer.get_added_tokens_decoder()
    return ids[:1] if ids and ids[0] in added else []
