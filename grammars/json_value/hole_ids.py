"""A HoleMatcher's budget-narrowed masks made from id lists (no row): the value's or the unit's
memoised mask, changed by the few tokens a budget rules in or out (the leaving or entering tokens that
fit, EOS, the sentinel; grammars/masks/sparse_mask.py changed). HoleMatcher._narrowed asks them on a
state's first narrowed visit in the unit, and on a rung's first ask inside a value (grammars/json_value/value_rungs.py);
where one side of the mask is long, None (then the row: _fill_budget).
"""

from __future__ import annotations

import numpy as np

from grammars.json_value.hole_crossings import entering_fit, leaving_fit
from grammars.masks.sparse_mask import SparseMask, allowed_sparse, changed


def budget_ids(m, budget: int) -> SparseMask | None:
    """Inside a value, _fill_budget's mask made from id lists (the value's narrowed or whole mask,
    less EOS, and the leaving tokens that fit) where one side is short; else None."""
    if m.value is None:
        return _unit_budget_ids(m, budget)
    tables, value = m.tables, m.value
    after = tables.hole_after(m.hole)
    room = budget - m.grammar.min_tokens(after)
    fit = leaving_fit(tables, value.state, m.hole, budget - 1)
    own = tables.automaton.sparse_at(value.q, value.frame, room) if room >= 1 else None
    return value_ids(m, room, own, fit, m.grammar.is_final(after))


def value_ids(m, room: int, own: SparseMask | None, fit: np.ndarray, final: bool) -> SparseMask | None:
    """budget_ids' mask from its parts: the value's ``room``, the automaton's mask there (``own``), the
    leaving tokens that fit and whether the unit may end after the value (grammars/json_value/value_rungs.py
    passes those it holds)."""
    if room < 1:
        return allowed_sparse(fit, m.tables.size) if len(fit) else None
    # many budgets keep the same tokens; where no leaving token fits, the mask is ``own``'s alone, shared by the
    # value states and holes, of every grammar, that share ``own``. Keys hold ``own`` itself (hashed by identity),
    # never its address: a list that two threads made at once is dropped by its memo, and a freed address may
    # name another list
    if len(fit):
        return m.tables.kept(("narrowed", m.value.state, m.hole, own, len(fit)), lambda: _merged(m, own, fit, final))
    return m.tables.automaton.kept(("narrowed-own", own, final), lambda: _merged(m, own, fit, final))


def _merged(m, own: SparseMask | None, fit: np.ndarray, final: bool) -> SparseMask | None:
    clear = [] if final else list(m.tables.automaton.eos_token_ids)
    got = changed(own, fit, clear)
    return None if got is not None and got.allowed and not len(got.array) else got


def _unit_budget_ids(m, budget: int) -> SparseMask | None:
    """In the unit, _fill_budget's mask made from id lists (the unit's narrowed or whole mask less
    the sentinel, the entering tokens that fit and, at a hole, the value's first tokens that fit,
    EOS not among them) where one side is short; else None."""
    tables, automaton = m.tables, m.tables.automaton
    if m.unit.eos_taken:
        return None
    state = m.unit.state
    fit = []
    if tables.near_hole(state):
        fit = entering_fit(tables, state, budget - 1)
    own, start = m.unit.sparse_mask(budget), None
    if tables.is_hole(state):
        room = budget - m.grammar.min_tokens(tables.hole_after(state))
        q, frame = automaton.initial("value")
        first = automaton.sparse_at(q, frame, max(room, 1))
        start = (room < 1, first)
    # only a hole's state has an edge for the sentinel (its tokens start with it): elsewhere no merge clears it
    clear = tables.sentinel_ids if start is not None else []
    # many budgets keep the same tokens; the key holds the masks it names (see budget_ids)
    return tables.kept(("narrowed", state, own, len(fit), start),
                       lambda: _unit_merged(m, own, fit, start, clear))


def _unit_merged(m, own: SparseMask | None, fit: np.ndarray, start: tuple | None, clear) -> SparseMask | None:
    """_unit_budget_ids' mask from the unit's (narrowed) mask less the tokens ``clear``, the entering
    tokens that fit and, at a hole, (no value fits, the value's (narrowed) first tokens)."""
    got = changed(own, fit, clear)
    if got is None or start is None:
        return got
    if start[0] and (not got.allowed or len(got.array)):  # no value fits, and the unit's tokens are there
        return got
    first = changed(start[1], [], list(m.tables.automaton.eos_token_ids))
    return changed(got, first.array, []) if first is not None and first.allowed else None
