"""ValueExits: once per vocabulary, how tokens cross into and out of a free value, so that a grammar's
first visit of a state near a hole walks only what depends on its unit.

HoleTables (grammars/json_value/hole_tables.py) asks, at a state (q, stack) of a value written in a hole, which
tokens complete the value and go on validly in the unit after it (`}}`, `"},"`, `1,"`), and at a
unit state near a hole, which tokens walk the unit into a value (`":{"`, `,"`). Where a value ends
inside a token depends only on the token and (q, stack), not on the grammar: it is scanned here
once per vocabulary and value state (``exits``), and a grammar walks only the tokens' rests through
its unit (``walk``). The tokens that may enter a value are held by their first two bytes (``entries``:
a unit state has an edge for few of them), and
those that start a value, with where their value part ends (``starts``). Every list of bytes is
sorted, with the length each shares with the one before, so ``walk`` reuses a shared prefix's unit
states and skips every one whose prefix already failed. ``warm`` makes every value state's exits
ahead (the compiler runs it in the background once the JSON automaton is loaded).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from grammars.json_value.hole_bytes import BytesView, bytes_view
from grammars.json_value.json_value_lexer import (AFTER, ARRAY, COMPLETE, FIRST_BYTES, NUM_STATES, OBJECT, S_BASE,
                                                  VALUE, scan)

EXIT_DEPTH = 4  # a token may leave a value from at most this many open containers
NEAR = 16  # a token may walk this many unit bytes into a value
DONE = (AFTER, ())  # scan's state once a top-level value is complete


class Rests(NamedTuple):
    """Tokens and the bytes of each a unit walks, sorted by those bytes."""
    tokens: tuple[int, ...]
    rests: tuple[bytes, ...]  # never empty
    shared: tuple[int, ...]  # how many leading bytes each rest shares with the one before (0 for the first)


def _rests(found: list[tuple[bytes, int]]) -> Rests:
    found.sort()
    shared = [0] + [len(os.path.commonprefix((a[0], b[0]))) for a, b in zip(found, found[1:])]
    return Rests(tuple(t for _, t in found), tuple(r for r, _ in found), tuple(shared))


class ValueExits:
    """Per vocabulary: the lists, each made on first use or by ``warm`` and memoised (thread-safe: a
    race makes one twice, the same)."""

    def __init__(self, view: BytesView, token_bytes: dict[int, bytes]) -> None:
        self.view, self.token_bytes = view, token_bytes
        self._memo: dict[object, object] = {}
        self._lists: dict[Rests, Rests] = {}  # each distinct list, once: see exits

    def exits(self, q: int, stack: tuple[int, ...]) -> Rests:
        """The tokens that may leave a value from state (q, stack) (stack at most EXIT_DEPTH deep) and
        whose value part ends inside them, with the bytes after its end. States whose lists are equal
        share one list object, so that what a unit makes of a list is memoised per list
        (hole_crossings.leaving): over mask_bench's free_form and tools requests (SmolLM2) the unit walks
        of leaving lists fell from 659 to 130."""
        key = (q, stack)
        got = self._memo.get(key)
        if got is None:
            found = self._scan(q, stack)
            got = self._memo.setdefault(key, self._lists.setdefault(found, found))
        return got

    def _scan(self, q: int, stack: tuple[int, ...]) -> Rests:
        view, depth = self.view, len(stack)
        need = 1 if q >= S_BASE else 0  # in a string (or a key) a leaving token closes it too
        # a complete top-level value may end before any byte (the unit's), else at one the state takes
        firsts = range(256) if not stack and q in COMPLETE else FIRST_BYTES[q]
        found = []
        for b in firsts:
            for token in view.leaving.get(b, ()):
                if view.closers[token] < depth or view.quotes.get(token, 0) < need:
                    continue
                data = self.token_bytes[token]
                state, used = scan((q, stack), data)
                if state == DONE and used < len(data):
                    found.append((data[used:], token))
        return _rests(found)

    def entries(self, first: int) -> dict[int, Rests]:
        """The tokens of two bytes or more that start with byte ``first`` and hold `:`, `,` or `[` (those
        that may walk a unit into a value), with all their bytes, by their second byte."""
        key = ("enter", first)
        got = self._memo.get(key)
        if got is None:
            by_second: dict[int, list] = {}
            for token in self.view.entering.get(first, ()):
                data = self.token_bytes[token]
                if len(data) > 1:
                    by_second.setdefault(data[1], []).append((data, token))
            got = self._memo.setdefault(key, {second: _rests(found) for second, found in by_second.items()})
        return got

    def longer(self, than: int) -> Rests:
        """The tokens longer than ``than`` bytes that hold `:`, `,` or `[`, with all their bytes: those
        that may walk ``than`` unit bytes into a value (from a unit state with many edges, such as in
        a string, the few long enough to reach the hole)."""
        key = ("longer", than)
        got = self._memo.get(key)
        if got is None:
            found = [(self.token_bytes[t], t) for tokens in self.view.entering.values() for t in tokens
                     if len(self.token_bytes[t]) > than]
            got = self._memo.setdefault(key, _rests(found))
        return got

    def starts(self) -> tuple[tuple[int, int, tuple], ...]:
        """(first byte, token, the value state after it) of each token that holds `,`, `}` or `]`, may
        start a value and ends inside it (those that end it too are ``exits(VALUE, ())``)."""
        got = self._memo.get("starts")
        if got is None:
            found = []
            for b in FIRST_BYTES[VALUE]:
                for token in self.view.leaving.get(b, ()):
                    data = self.token_bytes[token]
                    state, used = scan((VALUE, ()), data)
                    if state is not None and not (state == DONE and used < len(data)):
                        found.append((b, token, state))
            got = self._memo.setdefault("starts", tuple(found))
        return got

    def warm(self, pause=lambda: None) -> None:
        """Every list made ahead; ``pause()`` runs between two."""
        self.starts()
        for first in range(256):
            pause()
            self.entries(first)
        for than in range(NEAR + 1):
            pause()
            self.longer(than)
        level, stacks = [()], [()]
        for _ in range(EXIT_DEPTH):
            level = [stack + (kind,) for stack in level for kind in (OBJECT, ARRAY)]
            stacks += level
        for stack in stacks:
            for q in range(NUM_STATES):
                pause()
                self.exits(q, stack)


def run(tables, unit_state: int, value_state, hole: int, data: bytes):
    """Walk ``data`` in ``tables``' unit (a HoleTables) from a unit state (``value_state`` None) or from
    inside the value that started at unit state ``hole``: leaving a value where it completes and the
    unit goes on, entering one where the unit reaches a hole. Returns (the unit's tokens to take:
    one-byte tokens and sentinels, the end: ("unit", state) or ("value", hole, (q, stack))), or None
    if invalid."""
    steps, pos = [], 0
    while True:
        if value_state is not None:
            state, used = scan(value_state, data[pos:])
            if state is None:
                return None
            if state == DONE and pos + used < len(data):  # the value ends inside: the unit goes on
                unit_state = tables.hole_after(hole)
                steps.append(tables.sentinel)
                value_state, pos = None, pos + used
                continue
            return steps, ("value", hole, state)
        if pos == len(data):
            return steps, ("unit", unit_state)
        following = tables.edges[unit_state].get(data[pos])  # HOLE_BYTE has no edge
        if following is not None:
            steps.append(tables.byte_ids[data[pos]])
            unit_state, pos = following, pos + 1
        elif tables.hole_after(unit_state) is not None:  # a value starts here
            hole, value_state = unit_state, (VALUE, ())
        else:
            return None


def walk(tables, start: int, rests: Rests, whole: bool) -> list[tuple[int, tuple]]:
    """(token, the end HoleTables.run gives) of each of ``rests``' tokens whose bytes walk validly in
    ``tables``' unit from state ``start``, as run() walks them: byte edges first, a value where a
    hole has no edge for the byte (``run`` walks the rest from there). ``whole``: a rest that ends in
    the unit counts (leaving a value), else only one that reaches a value does (entering one).
    Sorted rests: one that shares the byte where the last walked one stopped stops there too."""
    out, edges = [], tables.edges
    states, good, at_hole = [start], 0, False  # the last walked rest's unit states, where it stopped
    for token, rest, common in zip(rests.tokens, rests.rests, rests.shared):
        # sorted: what it shares with the one before, it shares with the last walked up to its stop
        if common > good:  # it holds the byte where that rest stopped
            found = tables.run(states[good], None, -1, rest[good:]) if at_hole else None
            if found is not None:
                out.append((token, found[1]))
            continue
        del states[common + 1:]
        state, k = states[-1], common
        while k < len(rest):
            following = edges[state].get(rest[k])
            if following is None:
                break
            states.append(following)
            state, k = following, k + 1
        good, at_hole = k, k < len(rest) and tables.hole_after(state) is not None
        if k == len(rest):
            found = ([], ("unit", state)) if whole else None
        else:
            found = tables.run(state, None, -1, rest[k:]) if at_hole else None
        if found is not None:
            out.append((token, found[1]))
    return out


_EXITS: dict[str, ValueExits] = {}


def value_exits(vocabulary) -> ValueExits:
    """The one ValueExits of ``vocabulary``."""
    got = _EXITS.get(vocabulary.fingerprint)
    if got is None:
        got = _EXITS.setdefault(vocabulary.fingerprint, ValueExits(bytes_view(vocabulary), vocabulary.token_bytes))
    return got
