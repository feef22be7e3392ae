"""HoleTables: what a unit with free-value holes needs at run time, memoised per grammar.

A unit compiled from a schema with free-form values (grammars/schema/free_values.py) steps over each value
with one sentinel token; HoleMatcher (grammars/match/hole_matcher.py) runs the value with the shared
JSON-value automaton instead. Tokens that cross a boundary stay allowed where the text they spell is
valid, decided against the automaton's stack (as xgrammar's context-dependent tokens):
- leaving: `}}`, `"},` or `1,"` end the value and go on in the unit (the rest is walked in the
  unit's index byte by byte, through the vocabulary's one-byte tokens; `run`);
- entering: `":{"`, `:"` or `,[` walk the unit up to a hole and start a value
(both listed, with their costs, by grammars/json_value/hole_crossings.py).
The masks at unit states near a hole (made in ``prepare``, with the grammar) and at value states near
their end (at most four containers open) are memoised here, shared by every request of the grammar;
deeper in a value the automaton's own masks apply. Only tokens that hold `,`, `}` or `]` can leave a
value (that is what follows one in a unit), and only tokens that hold `:`, `,` or `[` can walk into
one from elsewhere; which do, is read from the vocabulary's lists in grammars/json_value/value_exits.py.
"""

from __future__ import annotations

import numpy as np
import torch

from grammars.masks.bitmask import words_off
from grammars.schema.free_values import HOLE
from grammars.json_value.hole_bytes import bytes_view
from grammars.json_value.hole_crossings import NO_TOKENS, entering, leaving, least
from grammars.json_value.json_value_lexer import (AFTER, ARRAY, ARRAY_FIRST, K_BODY, L_E, L_L, N_EXP_DIGITS, N_FRAC,
                                                  N_INT, N_ZERO, OBJECT, OBJECT_FIRST, S_BODY, VALUE)
from grammars.json_value.json_value_matcher import JsonValueMatcher
from grammars.masks.second_ask import SecondAsk
from grammars.masks.sparse_mask import SparseMask, changed, sparse_mask
from grammars.json_value.value_exits import EXIT_DEPTH, NEAR, run, value_exits

HOLE_BYTE = HOLE.encode()[0]
# lexical states where a value (or its innermost container's item) often ends, or that a model often
# passes through inside one: their masks are made with the grammar
_ENDINGS = (AFTER, N_ZERO, N_INT, N_FRAC, N_EXP_DIGITS, S_BODY, L_E, L_L, VALUE, OBJECT_FIRST, ARRAY_FIRST, K_BODY)
_STACKS = ((), (OBJECT,), (ARRAY,), (OBJECT, OBJECT))  # and objects in objects: a model's nesting


class HoleTables:
    """Per grammar with holes: the sentinel, byte walks and memoised masks (shared, thread-safe)."""

    def __init__(self, grammar, automaton) -> None:
        vocabulary = grammar.vocabulary
        self.grammar, self.automaton, self.index = grammar, automaton, grammar.index
        view = bytes_view(vocabulary)
        self.sentinel, self.sentinel_ids, self.byte_ids = view.sentinel, view.sentinel_ids, view.byte_ids
        self.candidates = view.leaving
        self.token_bytes = vocabulary.token_bytes
        self.width = grammar.width
        self.size = vocabulary.size
        # read and filled by hole_crossings.py, value_rungs.py and narrowed_ahead.py too:
        self.memo: dict[tuple, object] = {}  # idempotent entries: a race computes one twice
        self.edges: dict[int, dict[int, int]] = {}  # unit state -> {byte: next state}
        self.holes: dict[int, int] = {}  # unit state where a value starts -> the state after it
        self.near: dict[int, int] = {}  # unit state within NEAR bytes of a hole -> how many bytes
        self.exits = value_exits(vocabulary)  # the vocabulary's leaving tokens by value state
        self.narrowed = SecondAsk(self.size)  # (HoleMatcher.state, budget) -> its narrowed SparseMask
        self._held: tuple = (None, 0)  # (the memos' sizes, held_bytes) at the last count

    # -- the unit's side ------------------------------------------------------------------------------
    def hole_after(self, state: int) -> int | None:
        """The unit's state after a value that starts at ``state`` (None: no value starts there)."""
        return self.holes.get(state)

    def is_hole(self, state: int) -> bool:
        return self.hole_after(state) is not None

    def prepare(self) -> None:
        """Once per grammar, before its first matcher (GrammarCompiler does it in the compile thread,
        beside the request's prefill): the one-byte edges of every unit state, where values start,
        which states lie within NEAR bytes of a hole, and their masks (3-6 ms for 20-90 states on
        SmolLM2; at a first visit each cost 50-400 us on the request path), and the value masks where
        values most often end or pass (the lexical states _ENDINGS, in the stacks _STACKS: 4-20 ms
        per grammar on SmolLM2 and Gemma 3); the other value masks are made on first use."""
        states = range(self.index.n_states)
        labels = {t: b for b, t in self.byte_ids.items() if b != HOLE_BYTE}
        labels[self.sentinel] = 256  # one pass over the transitions for both (no byte is 256)
        edges = self.index.successors(labels)
        self.holes = {state: out.pop(256) for state, out in edges.items() if 256 in out}
        into: dict[int, set[int]] = {}  # state -> the states with a one-byte edge into it
        for state, out in edges.items():
            for following in out.values():
                into.setdefault(following, set()).add(state)
        near = {state: 0 for state in states if self.is_hole(state)}
        frontier = set(near)
        for far in range(1, NEAR + 1):  # backwards from the holes, one byte at a time
            frontier = {s for n in frontier for s in into.get(n, ()) if s not in near}
            if not frontier:
                break
            near.update(dict.fromkeys(frontier, far))
        self.edges, self.near = edges, near
        for state in sorted(near):
            self.unit_mask(state)
            self.unit_safe(state)
        for hole in sorted(self.holes):  # 2-10 ms per hole; each as its first visit would make it
            for q in _ENDINGS:
                for stack in _STACKS:
                    self.value_entry(value_at(self, q, stack), hole, now=True)

    def near_hole(self, state: int) -> bool:
        """Whether a hole is at most NEAR bytes away from ``state``."""
        return state in self.near

    def unit_mask(self, state: int) -> tuple[torch.Tensor, SparseMask | None] | None:
        """(row, sparse) at a unit state from which a value can be entered within one token; None
        where none can (then the unit's own masks apply unchanged)."""
        key = ("unit", state)
        if key not in self.memo:
            got = None
            if self.near_hole(state):
                got = self._row(self.grammar.state_mask_of(state), self.entering(state)[0], clear=self.sentinel_ids,
                                words=self.value_start() if self.is_hole(state) else None)
            self.memo[key] = got
        return self.memo[key]

    def unit_safe(self, state: int) -> int:
        """The least budget at which HoleMatcher.narrows is false at unit ``state``, and at every larger
        one (asked at every step): the unit's own, and near a hole also a value that must fit where one
        starts here (room of at least 1 and the value's safe budget) and the entering tokens' rests
        (memoised, made in prepare())."""
        if not self.near_hole(state):  # the unit's own (memoised by the budget table)
            return self.grammar.budget.safe_budget(state)
        key = ("safe", state)
        got = self.memo.get(key)
        if got is None:  # made in prepare()
            got = self.grammar.budget.safe_budget(state)
            if self.is_hole(state):
                start = self.automaton.safe_budget(*self.automaton.initial("value"))
                got = max(got, self.grammar.min_tokens(self.hole_after(state)) + max(1, start))
            got = self.memo[key] = max(got, self.entering(state)[1] + 1)
        return got

    def entering(self, state: int) -> tuple[list[int], int]:
        """grammars/json_value/hole_crossings.py entering() in this grammar (memoised here)."""
        return entering(self, state)

    def entering_costs(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(int64 entering(state)'s tokens, int64 the fewest tokens left after each): what a budget
        keeps of them, read without walking each token again at every narrowed step."""
        self.entering(state)
        return self.memo[("enter-costs", state)]

    def leaving_costs(self, value_state, hole: int) -> tuple[np.ndarray, np.ndarray]:
        """As entering_costs, for leaving(value_state, hole)'s tokens (made with them)."""
        if len(value_state[1]) > EXIT_DEPTH:
            return NO_TOKENS, NO_TOKENS
        self.leaving(value_state, hole)
        return self.memo[("leave-costs", value_state, hole)]

    def value_start(self) -> np.ndarray:
        """uint32 [W]: the packed tokens a value may start with (EOS not among them)."""
        key = ("start",)
        if key not in self.memo:
            row = torch.zeros(self.width, dtype=torch.int32)  # [W]
            JsonValueMatcher(self.automaton, top="value").fill(row)
            words = row.numpy().view(np.uint32)
            words_off(words, self.automaton.eos_token_ids)
            self.memo[key] = words
        return self.memo[key]

    def least(self, end) -> int:
        """grammars/json_value/hole_crossings.py least(): the fewest tokens left at an end of run()."""
        return least(self, end)

    def frame(self, stack: tuple[int, ...]):
        """The automaton's Frame of the open containers ``stack`` (outermost first)."""
        frame = self.automaton.root
        for kind in stack:
            frame = self.automaton.push(frame, kind)
        return frame

    # -- the value's side ------------------------------------------------------------------------------
    def run(self, unit_state: int, value_state, hole: int, data: bytes):
        """grammars/json_value/value_exits.py run() in this grammar's unit."""
        return run(self, unit_state, value_state, hole, data)

    def leaving(self, value_state, hole: int) -> tuple[list[int], int]:
        """grammars/json_value/hole_crossings.py leaving() in this grammar (memoised here)."""
        return leaving(self, value_state, hole)

    def kept(self, key: tuple, make):
        """The memo's entry at ``key``, made by ``make()`` on its first ask (one made meanwhile by another
        thread is the one kept and read)."""
        if key not in self.memo:
            self.memo.setdefault(key, make())
        return self.memo[key]

    def value_mask(self, value: JsonValueMatcher, hole: int) -> tuple[torch.Tensor, SparseMask | None]:
        """(row, sparse) inside the value that started at unit state ``hole``: its own tokens (EOS only
        where the unit may end after it) and the tokens that leave it; sparse None until value_entry
        has made it (not an ask itself)."""
        row, sparse, _ = self._value(value, hole, row=True)
        return row, (None if sparse is _LATER else sparse)

    def value_entry(self, value: JsonValueMatcher, hole: int, now: bool = False
                    ) -> tuple[torch.Tensor | None, SparseMask | None, int | None]:
        """value_mask's (row or None, sparse) and the least budget at which HoleMatcher.narrows is
        false, and at every larger one (None past EXIT_DEPTH, where the key does not hold the whole
        stack). An ask for the id list: where the automaton's mask here has one, it is the value
        mask's, changed by the few EOS and leaving tokens (no row is made); else the first ask gets
        None (it keeps the packed apply, and never pays the conversion, 20-50 us, if it is not
        visited again) and later ones (or ``now``) the row's conversion."""
        key = self._value_key(value, hole)
        got = self.memo.get(key)
        if got is None:
            got = self._value(value, hole, row=False, key=key)
            if got[1] is _LATER and not now:
                return got[0], None, got[2]
        if got[1] is _LATER:
            got = self.memo[key] = (got[0], sparse_mask(got[0], self.size), got[2])
        return got

    def _value_key(self, value: JsonValueMatcher, hole: int) -> tuple:
        if len(value.state[1]) <= EXIT_DEPTH:
            return ("value", value.state, hole)
        # no token leaves from this deep: the automaton's own mask, keyed as it keys it
        return ("deep", id(self.automaton.entry(value.q, value.frame)), self.grammar.is_final(self.hole_after(hole)))

    def _value(self, value: JsonValueMatcher, hole: int, row: bool, key: tuple | None = None) -> tuple:
        """The memo's (row or None, its SparseMask or _LATER, the least budget that never narrows);
        the row is made where ``row`` asks for it or no SparseMask could be made without it."""
        key = key or self._value_key(value, hole)  # value_entry passes the key it computed
        got = self.memo.get(key)
        if got is not None and (got[0] is not None or not row):
            return got
        state, after = value.state, self.hole_after(hole)
        entry = self.automaton.entry(value.q, value.frame)
        clear = [] if self.grammar.is_final(after) else list(self.automaton.eos_token_ids)
        leave, most = self.leaving(state, hole)
        if got is None:
            safe = None
            if key[0] == "value":  # narrows(): room < 1, the value's own budget row, a leaving token's rest
                rest = self.grammar.min_tokens(after)
                safe = max(rest + 1, rest + self.automaton.safe_budget(value.q, value.frame), most + 1)
            own = ("own", id(entry), bool(clear))  # the automaton's ids less EOS, shared by value states
            if own not in self.memo:
                self.memo[own] = changed(entry.sparse, [], clear)
            sparse = changed(self.memo[own], leave, [])
            got = (None, _LATER if sparse is None else sparse, safe)
        if row or got[1] is _LATER:  # value.fill's row, copied by _row
            got = (self._row(entry.row, leave, clear=clear, convert=False)[0], got[1], got[2])
        self.memo[key] = got
        return got

    def held_bytes(self) -> int:
        """Bytes of the memoised rows and token lists (counted in the grammar's memory bound; a list
        shared by several entries, once). Recounted only once entries were added since the last count
        (the compiler asks at every compile, for every grammar it keeps): an entry changed in place, such
        as a second ask's list, counts from the next addition on."""
        sizes = (len(self.memo), len(self.narrowed))
        if self._held[0] != sizes:
            self._held = (sizes, self._count_bytes())
        return self._held[1]

    def _count_bytes(self) -> int:
        counted: set[int] = set()
        total = self.narrowed.held_bytes(counted)
        for entry in list(self.memo.values()):
            for part in entry if isinstance(entry, tuple) else (entry,):
                if isinstance(part, torch.Tensor):
                    total += part.numel() * 4
                elif id(part) in counted:  # shared by several entries (a value state's leaving lists: leaving)
                    continue
                elif isinstance(part, SparseMask):
                    counted.add(id(part))
                    total += part.array.nbytes
                elif isinstance(part, np.ndarray):
                    counted.add(id(part))
                    total += part.nbytes
                elif isinstance(part, list):
                    counted.add(id(part))
                    total += 8 * len(part)
        return total

    def _row(self, base: torch.Tensor, add: list[int], clear, words: np.ndarray | None = None,
             convert: bool = True) -> tuple[torch.Tensor, SparseMask | None]:
        """(base's row less the tokens ``clear``, plus the tokens ``add`` and the packed ``words``, its
        SparseMask where ``convert``)."""
        with torch.inference_mode(False):
            row = base.clone()  # [W]
            out = row.numpy().view(np.uint32)
            words_off(out, clear)
            if add:
                ids = np.asarray(add, dtype=np.int64)
                np.bitwise_or.at(out, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
            if words is not None:
                out |= words
            return row, sparse_mask(row, self.size) if convert else None


_LATER = object()  # a value mask's SparseMask, made on its second ask


def value_at(tables: HoleTables, q: int, stack: tuple[int, ...]) -> JsonValueMatcher:
    """A JsonValueMatcher in lexical state ``q`` with the open containers ``stack`` (outermost first)."""
    value = JsonValueMatcher(tables.automaton, top="value")
    value.place(q, tables.frame(stack))
    return value
