"""Token ids to text as they arrive, for `specjax.Sampler` and ``specjax generate``."""

from __future__ import annotations

__all__ = ["TextStream"]


class TextStream:
    """Turns token ids into text pieces as they arrive, keeping multi-byte characters whole.

    A byte-level BPE can split one character over several tokens; until the last one
    arrives the decoded text ends in U+FFFD, which is held back rather than shown. The
    pieces join to the decoded text of every id fed (less ``hide``), special tokens
    written out.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (``decode``).
        hide: ids that are dropped, not shown (the stop ids that end a row).

    Examples:
        >>> from specjax.testing import tiny_tokenizer
        >>> from specjax.text.stream import TextStream
        >>> stream = TextStream(tiny_tokenizer())
        >>> stream.feed([1, 2]) + stream.feed([3]) + stream.flush()
        'w1 w2 w3'
    """

    def __init__(self, tokenizer, hide=()):
        self.tokenizer, self.hide = tokenizer, frozenset(int(i) for i in hide)
        self.ids: list[int] = []
        self.shown = ""

    def pieces(self, ids) -> list[str]:
        """The new text of each id fed, in order (``""`` for a hidden or held-back id)."""
        out = []
        for token in ids:
            token = int(token)
            if token in self.hide:
                out.append("")
                continue
            self.ids.append(token)
            text = self.tokenizer.decode(self.ids, skip_special_tokens=False).rstrip("\ufffd")
            piece = ""
            if text.startswith(self.shown):
                piece, self.shown = text[len(self.shown) :], text
            out.append(piece)
        return out

    def feed(self, ids) -> str:
        """The new text of ``ids``."""
        return "".join(self.pieces(ids))

    def text(self) -> str:
        """The decoded text of every id fed so far."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=False)

    def flush(self) -> str:
        """What `text` holds beyond the pieces given so far (a held-back character)."""
        text = self.text()
        rest = text[len(self.shown) :] if text.startswith(self.shown) else ""
        self.shown = text
        return rest
