"""`ChatSampler`: turns of a conversation, in the model's chat template."""

from __future__ import annotations

import types

from specjax.core.deprecation import moved
from specjax.io.chat import apply_chat_template
from specjax.text import sampler
from specjax.text.sampler import Sampler

__all__ = ["ChatSampler"]


class ChatSampler(Sampler):
    """Chats with an instruct model: each `chat` call is a turn, answered in its template.

    The conversation so far (`turns`) is rendered with the model's chat template
    (`specjax.apply_chat_template`) and the answer stops at the end of the assistant's
    turn (`specjax.io.chat.end_of_turn_ids`) or at EOS. Each turn decodes the whole
    conversation again; keep conversations short, or `reset` between topics.

    Args:
        target: an instruct model with a chat template (``chat_template.jinja``, the
            ``chat_template`` of ``tokenizer_config.json``, or a GGUF's).
        system: a system message put first in every rendering (``None``: none).
        multi_turn: keep earlier turns in the conversation (default); ``False``
            answers every message on its own.
        chat_template: a Jinja template to use instead of the model's.
        **kwargs: the arguments of `Sampler` (``options``, ``tokenizer``, and the
            fields of `specjax.GenerationOptions`: ``drafter``, ``sampling``, ...).

    Raises:
        ValueError: the model has no chat template, or a `Sampler` argument is bad.

    Examples:
        >>> import specjax
        >>> from specjax.testing import tiny_model, tiny_tokenizer
        >>> template = (
        ...     "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
        ...     "{% if add_generation_prompt %}w9:{% endif %}"
        ... )
        >>> model = tiny_model().replace(tokenizer=tiny_tokenizer(), chat_template=template)
        >>> chat = specjax.ChatSampler(model, drafter=None, max_new_tokens=4)
        >>> answer = chat.chat("w1 w2")
        >>> [turn["role"] for turn in chat.turns]
        ['user', 'assistant']
    """

    def __init__(
        self,
        target,
        options=None,
        *,
        system: str | None = None,
        multi_turn: bool = True,
        chat_template: str | None = None,
        **kwargs,
    ):
        template = chat_template or getattr(target, "chat_template", None)
        if template is None:
            raise ValueError(
                "ChatSampler needs a chat template: the model has no chat template (it is "
                "read from chat_template.jinja, tokenizer_config.json or a GGUF file); pass "
                "chat_template=, or use specjax.Sampler to complete text"
            )
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a str or None, got {type(system).__name__}")
        self.chat_template, self.system, self.multi_turn = template, system, bool(multi_turn)
        self.turns: list[dict[str, str]] = []
        super().__init__(target, options, **kwargs)

    def _chat_template(self) -> str:
        return self.chat_template

    def render(self, message: str) -> str:
        """The prompt the model sees for ``message``: the system message, the turns so
        far (with ``multi_turn``) and ``message``, in the chat template.

        Raises:
            TypeError, ValueError: a message that is not a non-empty string, a template
                that refuses the conversation.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        if not message.strip():
            raise ValueError("message is empty: give the user's turn")
        history = self.turns if self.multi_turn else []
        user = {"role": "user", "content": message}
        system = [{"role": "system", "content": self.system}] if self.system else []
        return self._render([*system, *history, user])

    def _render(self, messages) -> str:
        view = types.SimpleNamespace(
            config=getattr(self.target, "config", None),
            tokenizer=self.tokenizer,
            chat_template=self.chat_template,
        )
        return apply_chat_template(view, messages)

    def chat(self, message: str, *, stream: bool = False, **kwargs):
        """The model's answer to ``message``, added to `turns` with it.

        Args:
            message: the user's turn.
            stream: return an iterator of text pieces; the turn is recorded once it
                has been read to the end.
            **kwargs: the other arguments of `Sampler.sample` (``max_new_tokens``,
                ``sampling``, ``key``, ``stop``, ``regex``, ``json_schema``,
                ``return_result``).

        Returns:
            the answer (``str``), ``(answer, result)`` with ``return_result``, or an
            iterator of its pieces with ``stream``.

        Raises:
            TypeError, ValueError: a message that is not a non-empty string, a template
                that refuses the conversation.
        """
        prompt = self.render(message)
        user = {"role": "user", "content": message}
        answer = self.sample(prompt, stream=stream, **kwargs)
        if not stream:
            text = answer[0] if kwargs.get("return_result") else answer
            self._record(user, text)
            return answer

        def pieces():
            parts = []
            for piece in answer:
                parts.append(piece)
                yield piece
            self._record(user, "".join(parts))

        return pieces()

    def _record(self, user, answer: str) -> None:
        if self.multi_turn:
            self.turns += [user, {"role": "assistant", "content": answer}]
        else:
            self.turns = [user, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        """Forgets the conversation (`turns`); the system message stays."""
        self.turns = []


moved(sampler, "ChatSampler", ChatSampler, "specjax.ChatSampler (specjax.text.chat.ChatSampler)")
