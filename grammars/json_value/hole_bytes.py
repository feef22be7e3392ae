"""The byte facts of a vocabulary that free-value holes need (grammars/json_value/hole_tables.py), once per vocabulary:
the sentinel's token, the one-byte tokens, and the tokens that may leave or enter a value by what they hold.
"""

from __future__ import annotations

from typing import NamedTuple

from grammars.errors import GrammarError
from grammars.schema.free_values import HOLE


class BytesView(NamedTuple):
    sentinel: int  # the one-byte token of HOLE
    sentinel_ids: list[int]  # every token that starts with HOLE (never offered)
    byte_ids: dict[int, int]  # byte -> a one-byte token of it
    longest: int  # bytes of the longest token
    leaving: dict[int, list[int]]  # first byte -> ids of the tokens holding `,`, `}` or `]`
    entering: dict[int, list[int]]  # first byte -> ids of the tokens holding `:`, `,` or `[`
    closers: dict[int, int]  # token -> how many `}` and `]` it holds (of the leaving tokens)
    quotes: dict[int, int]  # token -> how many `"` it holds (of the leaving tokens)


_VIEWS: dict[str, BytesView] = {}


def bytes_view(vocabulary) -> BytesView:
    """The byte facts of a vocabulary the holes need (once per vocabulary)."""
    view = _VIEWS.get(vocabulary.fingerprint)
    if view is None:
        pieces = vocabulary.token_bytes
        sentinel = next((t for t, b in pieces.items() if b == HOLE.encode()), None)
        if sentinel is None:
            raise GrammarError("the vocabulary has no one-byte token for the free-value sentinel \\x01; "
                               "compile this schema without free_values")
        byte_ids: dict[int, int] = {}
        for token, piece in pieces.items():
            if len(piece) == 1:
                byte_ids.setdefault(piece[0], token)
        view = _VIEWS.setdefault(vocabulary.fingerprint, BytesView(
            sentinel, [t for t, b in pieces.items() if b.startswith(HOLE.encode())], byte_ids,
            max(len(piece) for piece in pieces.values()),
            _by_first_byte(pieces, lambda p: b"," in p or b"}" in p or b"]" in p),
            _by_first_byte(pieces, lambda p: b":" in p or b"," in p or b"[" in p),
            {t: p.count(b"}") + p.count(b"]") for t, p in pieces.items() if b"," in p or b"}" in p or b"]" in p},
            {t: p.count(b'"') for t, p in pieces.items() if b"," in p or b"}" in p or b"]" in p}))
    return view


def _by_first_byte(pieces: dict[int, bytes], keep) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for token, piece in pieces.items():
        if keep(piece):
            out.setdefault(piece[0], []).append(token)
    return out
