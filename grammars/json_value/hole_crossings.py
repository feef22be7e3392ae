"""The tokens that cross between a unit and its free values, with what each leaves to write.

A value's boundary is not a token boundary: `":{"` or `,[` walks the unit up to a hole and starts a
value (entering), `}}`, `"},` or `1,"` ends a value and goes on in the unit (leaving). Which tokens
do is read from the vocabulary's lists (grammars/json_value/value_exits.py) and walked in the unit's index
(``walk``, ``run``); each list is memoised in the grammar's HoleTables (grammars/json_value/hole_tables.py)
with the fewest tokens left after each token (``least``), which budget-narrowed masks read.
"""

from __future__ import annotations

import bisect

import numpy as np

from grammars.json_value.json_value_lexer import FIRST_BYTES, VALUE
from grammars.json_value.value_exits import EXIT_DEPTH, walk

NO_TOKENS = np.zeros(0, dtype=np.int64)
NO_TOKENS.flags.writeable = False
_FEW_EDGES = 8  # entering tokens are looked up by their first two bytes from a state with at most this many edges


def entering(tables, state: int) -> tuple[list[int], int]:
    """(the tokens that walk the unit from ``state`` into a value (`":`, `,"`, `[{`), the most
    tokens left after any of them); where a value starts here, also those that hold a whole value
    and go on (the value's own first tokens are not listed: JsonValueMatcher masks them). Memoised
    with their costs (``("enter-costs", state)``: HoleTables.entering_costs)."""
    key = ("enter", state)
    if key not in tables.memo:
        edges, walked = tables.edges.get(state, {}), []
        if len(edges) > _FEW_EDGES and not tables.is_hole(state):  # as in a string: the tokens long enough
            walked = walk(tables, state, tables.exits.longer(tables.near.get(state, 0)), whole=False)
        else:  # a token takes a unit byte first; by its first two bytes (one byte stays in the unit)
            for first, following in edges.items():
                by_second = tables.exits.entries(first)
                seconds = by_second if tables.is_hole(following) else by_second.keys() & tables.edges[following].keys()
                walked += [got for second in seconds for got in walk(tables, state, by_second[second], whole=False)]
        if tables.is_hole(state):  # a whole value and more: any first byte that may start a value
            walked += _starting(tables, state, edges)
        _keep(tables, key, ("enter-costs", state), walked)
    return tables.memo[key]


def _starting(tables, hole: int, edges: dict) -> list[tuple[int, tuple]]:
    """(token, run()'s end) of the tokens holding `,`, `}` or `]` that start a value at unit state
    ``hole`` (where the unit has an edge for a token's first byte, run() walks it)."""
    if any(b in edges for b in FIRST_BYTES[VALUE]):  # rare: the unit goes on by a value's first byte
        found = [(t, tables.run(hole, None, -1, tables.token_bytes[t]))
                 for b in FIRST_BYTES[VALUE] for t in tables.candidates.get(b, ())]
        return [(t, got[1]) for t, got in found
                if got is not None and (got[1][0] == "value" or tables.sentinel in got[0])]
    out = [(t, ("value", hole, state)) for _, t, state in tables.exits.starts()]
    return out + walk(tables, tables.hole_after(hole), tables.exits.exits(VALUE, ()), whole=True)


def leaving(tables, value_state, hole: int) -> tuple[list[int], int]:
    """(the tokens that complete the value from ``value_state`` and go on validly in the unit,
    the most tokens left after any of them): the vocabulary's exits of that value state whose rests
    walk in the unit after the value. Memoised with their costs (HoleTables.leaving_costs)."""
    if len(value_state[1]) > EXIT_DEPTH:
        return [], 0
    memo, key = tables.memo, ("leave", value_state, hole)
    if key not in memo:
        # what the unit makes of a list depends on the list and the hole alone: walked once per list
        # (ValueExits.exits shares one object among the states with the same tokens; it holds every list)
        rests = tables.exits.exits(*value_state)
        shared, costs = ("leave", id(rests), hole), ("leave-costs", id(rests), hole)
        if shared not in memo:
            _keep(tables, shared, costs, walk(tables, tables.hole_after(hole), rests, whole=True))
        # this state's keys read the list's entries; the others first, as in _keep
        memo[("fits",) + key] = memo[("fits",) + shared]
        memo[("leave-costs", value_state, hole)] = memo[costs]
        memo[key] = memo[shared]
    return memo[key]


def least(tables, end) -> int:
    """min_tokens() at an end of run(): in the unit, or in a value and the unit after it."""
    if end[0] == "unit":
        return tables.grammar.min_tokens(end[1])
    _, hole, (q, stack) = end
    return tables.automaton.min_tokens(q, tables.frame(stack)) + tables.grammar.min_tokens(tables.hole_after(hole))


def _keep(tables, key: tuple, costs_key: tuple, walked: list) -> None:
    """Memoise (tokens, the most left after any) at ``key``, (int64 tokens, int64 the fewest left after
    each), both read-only and ordered by that fewest, at ``costs_key``, and for fit (that fewest as a
    list, the tokens, and the slices made of them) at ``("fits",) + key``; the others first, as
    readers of ``key`` then read them."""
    left = [least(tables, end) for _, end in walked]
    ordered = sorted(zip(left, (t for t, _ in walked)))
    tokens = np.asarray([t for _, t in ordered], dtype=np.int64)
    costs = np.asarray([c for c, _ in ordered], dtype=np.int64)
    tokens.flags.writeable = costs.flags.writeable = False
    tables.memo[("fits",) + key] = ([c for c, _ in ordered], tokens, {})
    tables.memo[costs_key] = (tokens, costs)
    tables.memo[key] = ([t for t, _ in walked], max(left, default=0))


def entering_fit(tables, state: int, limit: int) -> np.ndarray:
    """int64: HoleTables.entering_costs' tokens after which at most ``limit`` tokens are left (memoised: fit)."""
    fits = tables.memo.get(("fits", "enter", state))
    if fits is None:
        tables.entering(state)
        fits = tables.memo[("fits", "enter", state)]
    return fit(fits, limit)


def leaving_fit(tables, value_state, hole: int, limit: int) -> np.ndarray:
    """int64: HoleTables.leaving_costs' tokens after which at most ``limit`` tokens are left (memoised: fit)."""
    return fit(leaving_fits(tables, value_state, hole), limit)


def leaving_fits(tables, value_state, hole: int) -> tuple:
    """_keep's fits of leaving(value_state, hole) (the fewest left after each token, ascending; the
    tokens in that order; the slices made), for fit(); none deeper than EXIT_DEPTH."""
    fits = tables.memo.get(("fits", "leave", value_state, hole))
    if fits is None:
        tables.leaving(value_state, hole)
        fits = tables.memo.get(("fits", "leave", value_state, hole), NO_FITS)
    return fits


def fit(fits: tuple, limit: int) -> np.ndarray:
    """The tokens of _keep's ``fits`` (the fewest left after each, ascending; the tokens in that order;
    the slices made) after which at most ``limit`` are left: a leading slice, memoised per how many
    tokens it keeps (a budget falls by one a step and keeps the same tokens over many steps; inside a
    string the value's state stays too). The slice's end is found by bisecting the Python list: a
    boolean index and the distinct costs of numpy arrays cost 20-60 us at a budget-narrowed first ask
    (cold, on Gemma's lists). One memo entry holds all three: each lookup costs µs at a first
    narrowed visit, its caches cold after a forward pass."""
    levels, tokens, made = fits
    if not len(tokens):
        return NO_TOKENS
    count = bisect.bisect_right(levels, limit)
    got = made.get(count)
    if got is None:
        got = tokens[:count]
        got.flags.writeable = False  # shared by every ask that keeps these tokens
        got = made.setdefault(count, got)
    return got


NO_FITS = ([], NO_TOKENS, {})  # no leaving tokens: fit() keeps none (read only: its slices dict is never added to)
