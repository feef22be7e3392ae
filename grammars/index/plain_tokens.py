"""Plain tokens: those that spell only characters of JSON string content.

A token is plain when its bytes are strict UTF-8 and none of its characters is `"`, `\\`, U+0000-U+001F
or U+007F-U+009F (what a JSON string's regex excludes). From a state that every such character leads
back to (a *loop state*: inside a string), every plain token leads back too; a token index stores
that as one flag per state instead of a transition per token (grammars/index/_token_index.c,
grammars/index/unit_index.py). Nearly every token is plain: 48,463 of SmolLM2's 49,135 text tokens,
254,197 of Gemma 3's 255,823.

This module imports numpy alone (the compile worker loads it).
"""

from __future__ import annotations

import numpy as np

_EXCLUDED = frozenset('"\\') | frozenset(map(chr, range(0x20))) | frozenset(map(chr, range(0x7F, 0xA0)))


def is_plain(piece: bytes) -> bool:
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text) and _EXCLUDED.isdisjoint(text)


class PlainTokens:
    """The plain token ids of a vocabulary (``token_bytes``: id -> bytes) over ``size`` logits."""

    __slots__ = ("ids", "member", "words", "size")

    def __init__(self, token_bytes: dict[int, bytes], size: int) -> None:
        ids = sorted(token for token, piece in token_bytes.items() if is_plain(piece))
        self.ids = np.asarray(ids, dtype=np.int32)  # [P] ascending
        member = bytearray(max(token_bytes, default=-1) + 1)
        for token in ids:
            member[token] = 1
        self.member = bytes(member)  # member[token]: 1 if plain (indexing bytes is the fastest test)
        self.size = size
        inside = self.ids[self.ids < size].astype(np.int64)
        words = np.zeros((size + 31) // 32, dtype=np.uint32)
        np.bitwise_or.at(words, inside >> 5, np.left_shift(np.uint32(1), (inside & 31).astype(np.uint32)))
        self.words = words  # [ceil(size / 32)] the plain tokens below size as a packed bitmask

    def __contains__(self, token: int) -> bool:
        return 0 <= token < len(self.member) and self.member[token] == 1


_OF: dict[str, PlainTokens] = {}


def plain_tokens(vocabulary) -> PlainTokens:
    """The vocabulary's PlainTokens over its logits width (once per vocabulary)."""
    found = _OF.get(vocabulary.fingerprint)
    if found is None:
        found = _OF.setdefault(vocabulary.fingerprint, PlainTokens(vocabulary.token_bytes, vocabulary.size))
    return found
