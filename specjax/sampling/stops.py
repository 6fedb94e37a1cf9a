"""Stop strings, matched on device over the bytes the emitted tokens spell.

A row ends when its generated text contains one of its stop strings, for example
``"\\n\\n"`` or ``"```"``, even when the string is split across tokens. Text is bytes
here: every token id has the bytes it decodes to (`token_bytes`: byte-level BPE tokens
through GPT-2's byte table, SentencePiece pieces with ``▁`` as a space and ``<0xNN>``
byte pieces, special tokens as nothing), so the match needs no detokenizer inside the
loop. A `StopStrings` holds, as arrays that live on device, the table of every id's
bytes ``[V, L]``, the stop strings ``[S, M]`` and, per prompt, which of them apply
``[N, S]`` (rows of one batch may have different stops).

Each step, `first_stop` looks at the bytes of the row's last ``M - 1`` generated tokens
(at least the ``M - 1`` bytes a stop string could have begun in, unless some of those
tokens spell nothing) followed by the step's γ + 1 candidate tokens, and finds the
first candidate whose bytes complete a stop string. The decoder emits up to and
including that token and ends the row, so speculation never emits a token past a stop:
the cut is the same whichever drafts were accepted, as with EOS.

The stop string is **kept**: the row's tokens run through the one that completes it
(whose bytes may continue past it), as transformers' ``stop_strings`` does;
`trim_at_stop` cuts a decoded text at the first stop string for display, as the CLI
does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["StopStrings", "first_stop", "token_bytes", "trim_at_stop"]


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level table, inverted: the printable character standing for each byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _decoder_kinds(tokenizer) -> set[str]:
    """The ``type`` names of the tokenizer's decoder (and of a Sequence's members)."""
    import json

    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    kinds = {decoder.get("type", "")}
    for member in decoder.get("decoders", []) or []:
        kinds.add(member.get("type", ""))
    return kinds


def token_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """The bytes each id ``0..vocab_size-1`` decodes to (special and unknown ids: ``b""``).

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (byte-level BPE, SentencePiece-style, or
            another: then each id's ``decode([id])``).
        vocab_size: V, the model's vocabulary (ids past the tokenizer's spell nothing).
    """
    special = {
        i for i, t in tokenizer.get_added_tokens_decoder().items() if getattr(t, "special", False)
    }
    kinds = _decoder_kinds(tokenizer)
    to_byte = _unicode_to_byte()
    out = []
    for i in range(vocab_size):
        piece = tokenizer.id_to_token(i)
        if piece is None or i in special:
            out.append(b"")
        elif "ByteLevel" in kinds and all(c in to_byte for c in piece):
            out.append(bytes(to_byte[c] for c in piece))
        elif "ByteFallback" in kinds and len(piece) == 6 and piece.startswith("<0x"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif "Metaspace" in kinds or "Replace" in kinds:
            out.append(piece.replace("▁", " ").encode())
        else:
            out.append(tokenizer.decode([i], skip_special_tokens=True).encode())
    return out


@struct.dataclass
class StopStrings:
    """Stop strings and the byte table they are matched against, as device arrays.

    Build it with `StopStrings.build`. Attributes:
        token_bytes: ``uint8[V, L]`` each id's bytes, zero-padded.
        token_lengths: ``int32[V]``.
        stops: ``uint8[S, M]`` the stop strings' bytes, right-aligned, zero-padded on the
            left.
        stop_lengths: ``int32[S]``.
        active: ``bool[N, S]`` which stop strings apply to each prompt.
    """

    token_bytes: jax.Array
    token_lengths: jax.Array
    stops: jax.Array
    stop_lengths: jax.Array
    active: jax.Array

    @property
    def window(self) -> int:
        """M - 1: the generated tokens before a step that a stop string may start in."""
        return self.stops.shape[1] - 1

    @classmethod
    def build(cls, stop, tokenizer, vocab_size: int, num_prompts: int) -> StopStrings:
        """From ``stop``: a list of strings (every prompt) or one list per prompt.

        Raises:
            ValueError / TypeError naming ``stop``: an empty string, a non-string, a
                list per prompt of the wrong length, or a string no token can spell.
        """
        if isinstance(stop, str) or not isinstance(stop, (list, tuple)):
            raise TypeError(
                f"stop must be a list of strings, or one list per prompt, got {stop!r:.60}"
            )
        per_prompt = bool(stop) and all(isinstance(s, (list, tuple)) for s in stop)
        rows = [list(s) for s in stop] if per_prompt else [list(stop)] * num_prompts
        if len(rows) != num_prompts:
            raise ValueError(
                f"stop has {len(rows)} lists, but there are {num_prompts} prompts: give one "
                "list per prompt, or one list of strings for all"
            )
        for s in (s for row in rows for s in row):
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty str, got {s!r:.60}")
        strings = sorted({s for row in rows for s in row}, key=lambda s: (len(s), s))
        if tokenizer is None:
            raise ValueError(
                "stop strings need the target's tokenizer (target.tokenizer is None): pass "
                "specjax.StopStrings.build(stop, tokenizer, V, num_prompts) as stop="
            )
        table = token_bytes(tokenizer, vocab_size)
        alphabet = set(b"".join(table))
        for s in strings:
            missing = set(s.encode()) - alphabet
            if missing:
                raise ValueError(
                    f"stop string {s!r} cannot be spelled by the tokenizer: no token has the "
                    f"byte(s) {sorted(missing)}"
                )
        encoded = [s.encode() for s in strings] or [b"\x00"]
        width = max(len(b) for b in table) or 1
        token_bytes_VL = np.zeros((vocab_size, width), np.uint8)
        for i, b in enumerate(table):
            token_bytes_VL[i, : len(b)] = np.frombuffer(b, np.uint8)
        m = max(len(b) for b in encoded)
        stops_SM = np.zeros((len(encoded), m), np.uint8)
        for i, b in enumerate(encoded):  # right-aligned: a match ends at the window's end
            stops_SM[i, m - len(b) :] = np.frombuffer(b, np.uint8)
        index = {s: i for i, s in enumerate(strings)}
        active = np.zeros((num_prompts, len(encoded)), bool)
        for r, row in enumerate(rows):
            active[r, [index[s] for s in row]] = True
        return cls(
            token_bytes=jnp.asarray(token_bytes_VL),
            token_lengths=jnp.asarray([len(b) for b in table], jnp.int32),
            stops=jnp.asarray(stops_SM),
            stop_lengths=jnp.asarray([len(b) if strings else 0 for b in encoded], jnp.int32),
            active=jnp.asarray(active),
        )


def first_stop(
    stop: StopStrings, active_BS, seq_BS, prompt_lengths_B, seq_lengths_B, block_BG1
) -> tuple[jax.Array, jax.Array]:
    """``(int32[B], bool[B])``: how many of ``block``'s tokens to keep at most (1 + the
    index of the first that completes one of the row's stop strings, else G+1), and
    whether one does.

    Args:
        stop: the `StopStrings` (its ``active`` is per prompt; ``active_BS`` per slot).
        active_BS: ``bool[B, S]`` the stop strings of each slot's prompt.
        seq_BS: ``int32[B, S_buf]`` the token buffer; its generated part before
            ``seq_lengths_B`` is the text so far.
        prompt_lengths_B, seq_lengths_B: ``int32[B]``.
        block_BG1: ``int32[B, G+1]`` the step's candidate tokens, in order.
    """
    b, g1 = block_BG1.shape
    w = stop.window
    v, width = stop.token_bytes.shape
    # The last w generated tokens (fewer at the start: the prompt never counts).
    slots_BW = seq_lengths_B[:, None] - w + jnp.arange(w)[None]
    past_BW = (slots_BW >= prompt_lengths_B[:, None]) & (slots_BW >= 0)
    past_tokens_BW = seq_BS[jnp.arange(b)[:, None], jnp.clip(slots_BW, 0, seq_BS.shape[1] - 1)]
    tokens_BT = jnp.concatenate([past_tokens_BW, block_BG1], axis=1)
    counts_BT = jnp.concatenate([past_BW, jnp.ones((b, g1), bool)], axis=1)
    ids_BT = jnp.clip(tokens_BT, 0, v - 1)
    lengths_BT = jnp.where(counts_BT & (tokens_BT >= 0), stop.token_lengths[ids_BT], 0)
    # Lay the tokens' bytes end to end: byte c of token t goes to offset start[t] + c.
    starts_BT = jnp.cumsum(lengths_BT, axis=1) - lengths_BT
    total = (w + g1) * width
    text = jnp.zeros((b, total + 1), jnp.int32)  # +1: a sink for padding bytes
    c_L = jnp.arange(width)
    offsets_BTL = jnp.where(
        c_L[None, None] < lengths_BT[..., None], starts_BT[..., None] + c_L[None, None], total
    )
    text = text.at[jnp.arange(b)[:, None, None], offsets_BTL].set(
        stop.token_bytes[ids_BT].astype(jnp.int32)
    )[:, :total]
    text_len_B = jnp.sum(lengths_BT, axis=1)
    # ends_BE[b, e]: some active stop string ends at byte e (inclusive).
    m = stop.stops.shape[1]
    e_E = jnp.arange(total)
    padded = jnp.pad(text, ((0, 0), (m, 0)), constant_values=-1)  # text[e - k] for k < m
    k_M = jnp.arange(m)
    # window_BEM[b, e, k] = text[b, e - (M - 1) + k]: the M bytes that end at e.
    window_BEM = padded[:, e_E[:, None] + 1 + k_M[None]]
    stop_SM = stop.stops.astype(jnp.int32)
    start_S = m - stop.stop_lengths  # a stop of length n sits in the window's last n bytes
    relevant_SM = k_M[None] >= start_S[:, None]
    same_BESM = window_BEM[:, :, None, :] == stop_SM[None, None]
    match_BES = jnp.all(same_BESM | ~relevant_SM[None, None], axis=-1)
    match_BES &= active_BS[:, None, :] & (stop.stop_lengths > 0)[None, None]
    ends_BE = jnp.any(match_BES, axis=-1) & (e_E[None] < text_len_B[:, None])
    # Only the candidates' bytes count: a stop that ended before the step already ended
    # the row. The token holding byte e is the last whose start is <= e.
    first_new_byte_B = jnp.sum(lengths_BT[:, :w], axis=1)
    ends_BE &= e_E[None] >= first_new_byte_B[:, None]
    owner_BE = jnp.sum(starts_BT[:, None, w:] <= e_E[None, :, None], axis=-1) - 1  # in 0..G
    hit_BG1 = (
        jnp.zeros((b, g1), bool)
        .at[jnp.arange(b)[:, None], jnp.clip(owner_BE, 0, g1 - 1)]
        .max(ends_BE)
    )
    hit_B = jnp.any(hit_BG1, axis=1)
    return jnp.where(hit_B, jnp.argmax(hit_BG1, axis=1) + 1, g1), hit_B


def trim_at_stop(text: str, stops) -> str:
    """``text`` cut before the first occurrence of any of ``stops`` (unchanged if none)."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:cut]
