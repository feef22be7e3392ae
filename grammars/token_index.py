"""A regex's token index by a pruned walk of the vocabulary's token trie (grammars/_token_index.c).

outlines-core walks every token from every state of the regex's automaton: states x vocabulary,
~1.3 s for one tool's unit on a 262k vocabulary. `TokenTrie.index` takes the automaton from
outlines-core as the index of `(R)\\x02` over the 256 single bytes (milliseconds), then finds each
state's tokens in one walk of the token trie that stops at the first byte the automaton refuses.
The result is an outlines_core.Index (built from the same serialised form outlines-core writes), so
everything downstream is unchanged. None where the C library is missing or the regex uses the
sentinel byte itself: the caller then builds the index with outlines-core.
"""

from __future__ import annotations

import ctypes

import numpy as np
import outlines_core

from grammars import native

SENTINEL = 0x02  # marks where the regex may end (no JSON text holds it)
UNSPLIT = 1 << 30  # split(): no tokens spell the text
_BYTES = outlines_core.Vocabulary(256, {bytes([b]): [b] for b in range(256)})


class _Trie(ctypes.Structure):
    _fields_ = [("n_nodes", ctypes.c_int64)] + [
        (name, ctypes.POINTER(kind)) for name, kind in (
            ("child", ctypes.c_int32), ("sibling", ctypes.c_int32), ("byte", ctypes.c_uint8),
            ("tok_at", ctypes.c_int32), ("tok_n", ctypes.c_int32), ("ids", ctypes.c_int32))]


class TokenTrie:
    """The vocabulary's text tokens as a trie in C (one per compile worker; ~0.5 s for 262k tokens)."""

    def __init__(self, token_bytes: dict[int, bytes], eos_token_id: int, vocab_len: int):
        self.eos, self.vocab_len = eos_token_id, vocab_len
        self._lib = _declared(native.library())
        self._trie = None
        if self._lib is None:
            return
        items = sorted(token_bytes.items(), key=lambda item: item[1])
        text = b"".join(piece for _, piece in items)
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(piece) for _, piece in items], out=offsets[1:])
        ids = np.array([token for token, _ in items], dtype=np.int32)
        trie = _Trie()
        if self._lib.trie_build(text, offsets.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(items), ctypes.byref(trie)) == 0:
            self._trie = trie

    def index(self, regex: str) -> outlines_core.Index | None:
        """The token index of ``regex``, or None (then build it with outlines-core)."""
        if self._trie is None:
            return None
        blob = outlines_core.Index(f"({regex}){chr(SENTINEL)}", _BYTES).__reduce__()[1][0]
        out, size = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_int64()
        rc = self._lib.token_index(ctypes.byref(self._trie), blob, len(blob), SENTINEL, self.eos, self.vocab_len,
                                   ctypes.byref(out), ctypes.byref(size))
        if rc != 0:
            return None
        try:
            return outlines_core.Index.from_binary(ctypes.string_at(out, size.value))
        finally:
            self._lib.token_index_free(out)

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
        if self._trie is not None:
            self._lib.trie_free(ctypes.byref(self._trie))
            self._trie = None


def _declared(library):
    if library is not None and library.trie_build.argtypes is None:
        library.trie_build.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32),
                                       ctypes.c_int64, ctypes.POINTER(_Trie)]
        library.trie_free.argtypes = [ctypes.POINTER(_Trie)]
        library.trie_free.restype = None
        library.token_index.argtypes = [ctypes.POINTER(_Trie), ctypes.c_char_p, ctypes.c_int64, ctypes.c_uint8,
                                        ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)),
                                        ctypes.POINTER(ctypes.c_int64)]
        library.token_index_free.argtypes = [ctypes.POINTER(ctypes.c_uint8)]
        library.token_index_free.restype = None
        library.token_split.argtypes = [ctypes.POINTER(_Trie), ctypes.c_char_p, ctypes.c_int64, ctypes.c_uint8,
                                        ctypes.POINTER(ctypes.c_int32)]
        library.token_split.restype = None
    return library
