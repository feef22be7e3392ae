"""The choice among grammar units: one compiled unit per tool, stepped side by side until one is left.

A tool-call block is one call to one of the request's tools. Each tool's block is its own unit (a
CompiledGrammar of `{"name": "NAME", "arguments": ARGS}` with the format's text around it), compiled
and cached by its own text, so a request compiles only the tools it has not seen before and the
union of the tools is never one big index. `UnionMatcher` walks every live unit in lock step: a
token is allowed when some live unit allows it, a unit that refuses a token drops out. Every unit
spells its tool's name, so after the first few tokens (`{"name": "` is common to all) one unit is
left and the matcher delegates to it at no extra cost. A token that crosses from the name into the
arguments (`",`, `weather", "`) is inside one unit, so it stays allowed, as the tokenizer writes it.

While several units are live, the union of their masks is built from the units' memoised rows and
memoised itself per tuple of (unit, state) (`_UNION_CACHE`), so an agent that sends the same tools
again pays a dict lookup. Under a token budget only units that can still close within it take part;
a union narrowed by the budget is memoised there too, from its second ask on.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch

from grammars.match.grammar import CompiledGrammar
from grammars.errors import GrammarError
from grammars.masks.sparse_mask import SparseMask, allowed_sparse, changed, sparse_mask
from grammars.index.unit_index import NO_TOKEN

_UNION_CACHE: OrderedDict[tuple, tuple[torch.Tensor, SparseMask | None] | object] = OrderedDict()
_UNION_CACHE_SIZE = 1024  # rows (6 KB each on a 49k vocabulary, 32 KB on 262k)
_ASKED = object()  # a budget-narrowed union asked for once (UnionMatcher._narrowed)
_LOCK = threading.Lock()
_FORCED_LIMIT = 64


class UnitUnion:
    """The units one call block may follow (immutable; shared by the requests with the same tools)."""

    def __init__(self, units: list[CompiledGrammar]):
        if not units:
            raise GrammarError("a unit union needs at least one unit")
        self.units = tuple(units)
        self.vocabulary = units[0].vocabulary

    def matcher(self) -> "UnionMatcher":
        return UnionMatcher(self)

    def min_tokens(self) -> int:
        """Fewest tokens of a whole block (from the units' initial states)."""
        return min(unit.min_tokens(unit.initial_state) for unit in self.units)


class UnionMatcher:
    """Per-request cursor over a UnitUnion; the Matcher interface."""

    def __init__(self, union: UnitUnion):
        self.union = union
        self.vocabulary = union.vocabulary
        self._matchers = [unit.matcher() for unit in union.units]
        self._live: tuple[int, ...] = tuple(range(len(self._matchers)))
        self._history: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (live before, advanced)
        self._width = (self.vocabulary.size + 31) // 32
        self._budget_forced = False

    # -- one unit left: delegate --------------------------------------------------------------------
    @property
    def only(self):
        return self._matchers[self._live[0]] if len(self._live) == 1 else None

    @property
    def budget_forced(self) -> bool:
        """Whether a budget narrowed a mask here. Read at every step (ToolCallConstraint), so only
        the live units are asked: a unit's mask was narrowed while others were live only through
        this union's fill or _narrowed, which set the union's own flag."""
        live = self._live
        if len(live) == 1:  # most steps: one tool left (no generator to make)
            return self._budget_forced or self._matchers[live[0]].budget_forced
        return self._budget_forced or any(self._matchers[i].budget_forced for i in live)

    def fill(self, row: torch.Tensor, budget: int | None = None) -> None:
        """row: int32 [W]; the union of the live units' masks (under ``budget``, of the units that can
        still close within it, or else of the nearest)."""
        only = self.only
        if only is not None:
            only.fill(row, budget)
            return
        live = self._within(budget)
        if budget is None or not any(self._matchers[i].narrows(budget) for i in live):
            if len(live) < len(self._live):
                self._budget_forced = True
            row.copy_(self._union(live, row=True)[0])
            return
        self._budget_forced = True
        scratch = torch.empty_like(row)  # [W]; rare: only where the budget narrows a unit's mask
        row.zero_()
        for i in live:
            self._matchers[i].fill(scratch, budget)
            row.bitwise_or_(scratch)

    def sparse_mask(self, budget: int | None = None) -> SparseMask | None:
        """The union's memoised SparseMask, or None (then fill): both sides are long, or a budget
        narrows a live unit's mask and this narrowed union is asked for the first time."""
        if len(self._live) == 1:  # as ``only``, without the property's call
            return self._matchers[self._live[0]].sparse_mask(budget)
        live = self._within(budget)
        if budget is not None and any(self._matchers[i].narrows(budget) for i in live):
            return self._narrowed(live, budget)
        self._budget_forced |= len(live) < len(self._live)
        return self._union(live)[1]

    def _merged(self, live: tuple[int, ...]) -> SparseMask | None:
        """The live units' union as a SparseMask made from their states' id lists, no rows: the
        allowed lists joined; or the banned lists' common ids less every allowed id. None where a
        unit has no list or the union's short side is not the side merged here (then rows)."""
        parts = [self._matchers[i].sparse_mask() for i in live]
        if any(part is None for part in parts):
            return None
        allowed = [part.array for part in parts if part.allowed]
        banned = [part.array for part in parts if not part.allowed]
        if not banned:
            return allowed_sparse(np.concatenate(allowed), self.vocabulary.size)
        common = banned[0]
        for ids in banned[1:]:
            common = np.intersect1d(common, ids, assume_unique=True)
        return changed(SparseMask(False, common, self.vocabulary.size), np.concatenate(allowed) if allowed else (), ())

    def _within(self, budget: int | None) -> tuple[int, ...]:
        """The live units that can close within ``budget`` (all when none can: the nearest)."""
        if budget is None:
            return self._live
        need = {i: self._matchers[i].min_tokens() for i in self._live}
        fits = tuple(i for i in self._live if need[i] <= budget)
        if fits:
            return fits
        nearest = min(need.values())
        return tuple(i for i in self._live if need[i] == nearest)

    def _union(self, live: tuple[int, ...], row: bool = False) -> tuple[torch.Tensor | None, SparseMask | None]:
        """(int32 [W] row, SparseMask or None) of the live units' states, memoised; the row None where
        the SparseMask was merged from the units' id lists (_merged) and ``row`` is not asked for."""
        return self._cached(tuple((self.union.units[i].key, self._matchers[i].state) for i in live), live, row=row)

    def _narrowed(self, live: tuple[int, ...], budget: int) -> SparseMask | None:
        """fill(row, budget)'s union of the live units' narrowed masks as a SparseMask, memoised as
        the union is: on the first ask where every unit's is a short allowed list (merged, no row),
        else from the second ask on (as grammars/masks/second_ask.py); None on that first ask."""
        key = ("budget", budget) + tuple((self.union.units[i].key, self._matchers[i].state) for i in live)
        with _LOCK:
            first = key not in _UNION_CACHE
            if first:
                _UNION_CACHE[key] = _ASKED
                self._trim()
        if first:  # from the units' id lists where all are short allowed lists (no row), else None
            parts = [self._matchers[i].sparse_mask(budget) for i in live]
            if not all(part is not None and part.allowed for part in parts):
                return None
            got = allowed_sparse(np.concatenate([part.array for part in parts]), self.vocabulary.size)
            if got is not None:
                with _LOCK:
                    _UNION_CACHE[key] = (None, got)
                self._budget_forced = True
            return got
        self._budget_forced = True
        return self._cached(key, live, budget)[1]

    def _cached(self, key: tuple, live: tuple[int, ...], budget: int | None = None, row: bool = False):
        """_UNION_CACHE's (int32 [W] row, SparseMask or None) under ``key``: the union of the live
        units' rows (narrowed by ``budget`` if given), made if absent. Without a budget and unless
        ``row``, first merged from the units' id lists (row None then): a union's first visit built
        each unit's row, ORed them and read the ids back (up to 440 us in mask_bench's cold replay)."""
        with _LOCK:
            hit = _UNION_CACHE.get(key)
            if hit is not None and hit is not _ASKED and (hit[0] is not None or not row):
                _UNION_CACHE.move_to_end(key)
                return hit
        merged = self._merged(live) if budget is None and not row and hit is None else None
        if merged is not None:
            entry = (None, merged)
        else:
            with torch.inference_mode(False):  # read both inside and outside the engine's step
                union = torch.zeros(self._width, dtype=torch.int32)  # [W]
                scratch = None if budget is None else torch.empty_like(union)  # [W]
                for i in live:
                    if budget is None:
                        union.bitwise_or_(self._matchers[i].row())
                    else:
                        self._matchers[i].fill(scratch, budget)
                        union.bitwise_or_(scratch)
                if hit is not None and hit is not _ASKED:  # merged before; only the row was missing
                    entry = (union, hit[1])
                else:
                    entry = (union, sparse_mask(union, self.vocabulary.size))
        with _LOCK:
            _UNION_CACHE[key] = entry
            _UNION_CACHE.move_to_end(key)
            self._trim()
        return entry

    @staticmethod
    def _trim() -> None:
        while len(_UNION_CACHE) > _UNION_CACHE_SIZE:
            _UNION_CACHE.popitem(last=False)

    # -- stepping -----------------------------------------------------------------------------------
    def accepts(self, token_id: int) -> bool:
        return any(self._matchers[i].accepts(token_id) for i in self._live)

    def advance(self, token_id: int) -> None:
        only = self.only
        if only is not None:
            only.advance(token_id)
            self._history.append((self._live, self._live))
            return
        taken = tuple(i for i in self._live if self._matchers[i].accepts(token_id))
        if not taken:
            raise GrammarError(f"token {token_id} is allowed by none of the tools' grammars here; "
                               "apply the bitmask before sampling")
        for i in taken:
            self._matchers[i].advance(token_id)
        self._history.append((self._live, taken))
        self._live = taken

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} were consumed")
        for _ in range(n):
            before, advanced = self._history.pop()
            for i in advanced:
                self._matchers[i].rollback(1)
            self._live = before

    def forced(self) -> list[int]:
        """Tokens that must come next: the one token every live unit allows alone."""
        only = self.only
        if only is not None:
            return only.forced()
        out: list[int] = []
        while len(out) < _FORCED_LIMIT and self.only is None:
            singles = {self._matchers[i].single() for i in self._live}
            if len(singles) != 1 or NO_TOKEN in singles:
                break
            token = singles.pop()
            self.advance(token)
            out.append(token)
        tail = self.only.forced() if out and self.only is not None else []
        self.rollback(len(out))
        return out + tail

    def min_tokens(self) -> int:
        return min(self._matchers[i].min_tokens() for i in self._live)

    def min_tokens_after(self, token_id: int) -> int | None:
        after = [self._matchers[i].min_tokens_after(token_id) for i in self._live]
        after = [a for a in after if a is not None]
        return min(after) if after else None

    def finished(self) -> bool:
        return any(self._matchers[i].finished() for i in self._live)

    def closed(self) -> bool:
        return self.finished()

    def is_terminated(self) -> bool:
        return all(self._matchers[i].is_terminated() for i in self._live)

    def free_text(self) -> bool:
        return False

    def ready(self) -> bool:
        """Always: its units are compiled before it exists."""
        return True
