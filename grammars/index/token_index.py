"""A regex's token index by a pruned walk of the vocabulary's token trie (grammars/index/_token_index.c).

outlines-core walks every token from every state of the regex's automaton: states x vocabulary,
~1.3 s for one tool's unit on a 262k vocabulary. `TokenTrie.index` takes the automaton from
outlines-core as the index of `(R)\\x02` over the 256 single bytes (milliseconds), then finds each
state's tokens in one walk of the token trie that stops at the first byte the automaton refuses;
from a loop state (inside a JSON string) only the non-plain tokens are walked, in a trie of their
own. The result is a TokenIndex (grammars/index/unit_index.py). None where the C library is missing or
the regex uses the sentinel byte itself: the caller then builds the index with outlines-core.
"""

from __future__ import annotations

import ctypes

import numpy as np
import outlines_core

from grammars.index import native
from grammars.index.plain_tokens import PlainTokens
from grammars.index.unit_index import TokenIndex

SENTINEL = 0x02  # marks where the regex may end (no JSON text holds it)
UNSPLIT = 1 << 30  # split(): no tokens spell the text
_BYTES = outlines_core.Vocabulary(256, {bytes([b]): [b] for b in range(256)})


class _Trie(ctypes.Structure):
    _fields_ = [("n_nodes", ctypes.c_int64)] + [
        (name, ctypes.POINTER(kind)) for name, kind in (
            ("child", ctypes.c_int32), ("sibling", ctypes.c_int32), ("byte", ctypes.c_uint8),
            ("tok_at", ctypes.c_int32), ("tok_n", ctypes.c_int32), ("ids", ctypes.c_int32))]


class _Index(ctypes.Structure):
    _fields_ = [("n_states", ctypes.c_int64), ("n_trans", ctypes.c_int64)] + [
        (name, ctypes.POINTER(kind)) for name, kind in (
            ("final", ctypes.c_uint8), ("loop", ctypes.c_uint8), ("off", ctypes.c_int64), ("tok", ctypes.c_int32),
            ("nxt", ctypes.c_int32))]


class TokenTrie:
    """The vocabulary's text tokens as a trie in C (one per compile worker; ~0.5 s for 262k tokens).
    With ``plain`` (grammars/index/plain_tokens.py), also a trie of the non-plain tokens, for ``index``."""

    def __init__(self, token_bytes: dict[int, bytes], plain: PlainTokens | None = None):
        self.plain = plain
        self._lib = _declared(native.library())
        self._trie = self._other = None
        if self._lib is None:
            return
        self._trie = self._build(token_bytes)
        if plain is not None:
            self._other = self._build({t: b for t, b in token_bytes.items() if t not in plain})

    def _build(self, token_bytes: dict[int, bytes]):
        items = sorted(token_bytes.items(), key=lambda item: item[1])
        text = b"".join(piece for _, piece in items)
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(piece) for _, piece in items], out=offsets[1:])
        ids = np.array([token for token, _ in items], dtype=np.int32)
        trie = _Trie()
        if self._lib.trie_build(text, offsets.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(items), ctypes.byref(trie)) != 0:
            return None
        return trie

    def index(self, regex: str) -> TokenIndex | None:
        """The token index of ``regex``, or None (then build it with outlines-core)."""
        if self._trie is None or self._other is None:
            return None
        blob = outlines_core.Index(f"({regex}){chr(SENTINEL)}", _BYTES).__reduce__()[1][0]
        out = _Index()
        if self._lib.token_index(ctypes.byref(self._trie), ctypes.byref(self._other), blob, len(blob), SENTINEL,
                                 ctypes.byref(out)) != 0:
            return None
        try:
            s, t = out.n_states, out.n_trans
            return TokenIndex(native.copied(out.final, s, np.uint8), native.copied(out.loop, s, np.uint8),
                              native.copied(out.off, s + 1, np.int64), native.copied(out.tok, t, np.int32), native.copied(out.nxt, t, np.int32),
                              self.plain)
        finally:
            self._lib.token_index_free(ctypes.byref(out))

    def split(self, text: bytes, hole: int) -> list[int] | None:
        """[k] for k in 0..len(text): the fewest tokens spelling text[k:] (UNSPLIT where none do);
        a ``hole`` byte counts one token. None without the C library."""
        if self._trie is None:
            return None
        best = np.zeros(len(text) + 1, dtype=np.int32)
        self._lib.token_split(ctypes.byref(self._trie), text, len(text), hole,
                              best.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
        return best.tolist()

    def __del__(self) -> None:
        for trie in (self._trie, self._other):
            if trie is not None:
                self._lib.trie_free(ctypes.byref(trie))
        self._trie = self._other = None



def _declared(library):
    if library is not None and library.trie_build.argtypes is None:
        library.trie_build.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32),
                                       ctypes.c_int64, ctypes.POINTER(_Trie)]
        library.trie_free.argtypes = [ctypes.POINTER(_Trie)]
        library.trie_free.restype = None
        library.token_index.argtypes = [ctypes.POINTER(_Trie), ctypes.POINTER(_Trie), ctypes.c_char_p, ctypes.c_int64,
                                        ctypes.c_uint8, ctypes.POINTER(_Index)]
        library.token_index_free.argtypes = [ctypes.POINTER(_Index)]
        library.token_index_free.restype = None
        library.token_split.argtypes = [ctypes.POINTER(_Trie), ctypes.c_char_p, ctypes.c_int64, ctypes.c_uint8,
                                        ctypes.POINTER(ctypes.c_int32)]
        library.token_split.restype = None
    return library
