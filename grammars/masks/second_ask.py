"""SecondAsk: budget-narrowed SparseMasks, memoised per key and made on the key's second ask.

A budget narrows a state's mask only near the end of max_tokens, and there by a different budget at
each step, so most narrowed masks are asked for once; converting a packed row into an id list costs
20-40 us, more than filling and applying the row once. The second ask of a key (the same state and
budget in a later request, or a row that many states share) pays the conversion, and every later
ask is masked from the id list (grammars/masks/sparse_mask.py).
"""

from __future__ import annotations

import threading

from grammars.masks.sparse_mask import SparseMask, sparse_mask

_MEMO_LOCK = threading.Lock()  # writes after a build: one object per key, whichever thread made it


class SecondAsk:
    """SparseMasks of budget-narrowed rows, memoised per key and built on the key's second ask: a
    narrowed mask asked for once (most are: the budget falls by one a token) keeps the fill and the
    packed apply and never pays for the conversion (20-40 us); one asked again (the same state and
    budget in a later request, or a row shared by many states) is masked from its id list from then
    on. Where the caller can make the id list without a row (``get``'s ``direct``: merged from
    memoised lists, grammars/masks/sparse_mask.py changed), the first ask gets it. Shared by a grammar's
    requests and the compiler's background thread; a race builds one twice, the same, and both
    callers read the one kept."""

    __slots__ = ("size", "_memo")

    def __init__(self, vocab_size: int) -> None:
        self.size = vocab_size
        self._memo: dict = {}  # key -> SparseMask | None | _ASKED

    def get(self, key, row, direct=None) -> SparseMask | None:
        """The SparseMask of ``row()`` (int32 [W], made only when needed) under ``key``; None on
        the first ask, and where both sides of the mask are long. ``direct()``, if given, may make
        the SparseMask on the first ask without a row (a short allowed-id list from memoised
        parts, a few µs); where it returns None the key takes the second-ask path."""
        got = self._memo.get(key, _UNASKED)
        if got is _UNASKED:
            got = None if direct is None else direct()
            held = self._memo.setdefault(key, _ASKED if got is None else got)  # one made meanwhile is read
            return got if held is _ASKED else held
        if got is _ASKED:
            made = sparse_mask(row(), self.size)
            with _MEMO_LOCK:  # where another thread made it meanwhile, both read one object (keys hold masks)
                got = self._memo[key]
                if got is _ASKED:
                    got = self._memo[key] = made
        return got

    def __len__(self) -> int:
        return len(self._memo)

    def put(self, key, direct) -> None:
        """Make ``key``'s SparseMask ahead where ``direct()`` can (its first ask then reads it); else
        leave the key unasked."""
        if key not in self._memo:
            got = direct()
            if got is not None:
                with _MEMO_LOCK:  # an ask made meanwhile keeps what it read
                    if self._memo.get(key, _ASKED) is _ASKED:
                        self._memo[key] = got

    def held_bytes(self, counted: set | None = None) -> int:
        """Bytes held: ~100 per key asked, and each id list once (many keys share one; ``counted``: the
        ids of the lists counted already, updated)."""
        counted = set() if counted is None else counted
        entries = list(self._memo.values())
        total = 100 * len(entries)
        for entry in entries:
            if isinstance(entry, SparseMask) and id(entry) not in counted:
                counted.add(id(entry))
                total += entry.array.nbytes
        return total


_UNASKED, _ASKED = object(), object()
