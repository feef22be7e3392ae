"""A free value's budget-narrowed masks, memoised by rung rather than by budget (grammars/match/hole_matcher.py).

Near the end of max_tokens a budget narrows the mask inside a free value at every step, and by a
budget one less each step, so a memo keyed by (state, budget) is asked once per key: every such step
was a first visit through the layers that make the mask from id lists (grammars/json_value/hole_ids.py: the
leaving tokens that fit, the automaton's narrowed mask, their merge). Those layers' calls, with the
caches cold after a forward pass, took 75-140 µs of lookup ahead, most of mask_bench's free_form steps
over 100 µs (SmolLM2).

The mask depends on the budget only through two cuts, its *rung*: how many of the automaton's
distinct chunk costs the slack reaches (JsonValueAutomaton.budget_cuts; -1 where no room is left for
the value), and how many of the value's leaving tokens fit (hole_crossings.leaving_fits). A rung's
mask is memoised per position (the value's state and hole; deeper than EXIT_DEPTH, what the
automaton's mask there reads, whatever the depth) and shared by every request of the grammar, so a
later request there reads it at whatever budget lands on that rung; what a position reads is
memoised with it (position()), so a step there is one lookup, two bisects and one more lookup.
grammars/match/narrowed_ahead.py makes the rungs of the positions where values most often end or pass
ahead, with the grammar.
"""

from __future__ import annotations

from bisect import bisect_right

from grammars.json_value.hole_crossings import NO_FITS, fit, leaving_fits
from grammars.json_value.hole_ids import value_ids
from grammars.masks.sparse_mask import SparseMask
from grammars.json_value.value_exits import EXIT_DEPTH

NO_POSITION = (None, -1, None, -1, 0, 0, (), NO_FITS, None, False)


def position(m) -> tuple:
    """What the rungs of HoleMatcher ``m``'s value here read: (value, q, frame, hole, the fewest tokens
    the unit needs after the value, the value's own fewest, the automaton's cuts, the leaving tokens'
    fits (hole_crossings.fit), the rungs' masks {rung: SparseMask}, whether the unit may end after the
    value). All but the first four memoised per position in the grammar's HoleTables, and the masks
    shared through them: a position met before is one lookup (its parts cost 15-50 µs cache-cold)."""
    tables, value, hole = m.tables, m.value, m.hole
    q, frame = value.q, value.frame
    if frame.depth > EXIT_DEPTH:  # no token leaves; the record is this depth's, the masks shared by every depth
        return (value, q, frame, hole) + _deep(m, q, frame, hole)
    key = ("rungs", q, frame.kinds, hole)
    got = tables.memo.get(key) or tables.kept(key, lambda: _record(m, q, frame, hole))
    return (value, q, frame, hole) + got


def _record(m, q: int, frame, hole: int) -> tuple:
    tables = m.tables
    after = tables.hole_after(hole)
    cur, cuts, _ = tables.automaton.budget_cuts(q, frame)
    fits = leaving_fits(tables, m.value.state, hole)
    return m.grammar.min_tokens(after), cur, cuts, fits, {}, m.grammar.is_final(after)


def _deep(m, q: int, frame, hole: int) -> tuple:
    """position()'s record past EXIT_DEPTH: the masks keyed as HoleMatcher._deep_key keys them (what the
    automaton's mask reads, whatever the depth and the grammar: shared by every grammar through the
    automaton), the rest worked out here."""
    tables, automaton = m.tables, m.tables.automaton
    after = tables.hole_after(hole)
    final = m.grammar.is_final(after)
    cur, cuts, costs_key = automaton.budget_cuts(q, frame)
    masks = automaton.kept(("rungs-deep", costs_key, id(automaton.entry(q, frame)), final), dict)  # every grammar's
    return m.grammar.min_tokens(after), cur, cuts, NO_FITS, masks, final


def rung(here: tuple, budget: int) -> tuple[int, int]:
    """``budget``'s rung at ``here`` (a position()): (the automaton's cut, or -1 where the value has no
    room; how many leaving tokens fit)."""
    rest, cur, cuts, fits = here[4:8]
    room = budget - rest
    cut = -1 if room < 1 else bisect_right(cuts, max(room - 1, cur - 1) - cur)  # the slack, as JsonValueAutomaton._slack
    return cut, bisect_right(fits[0], budget - 1)


def rung_ids(m, here: tuple, budget: int) -> SparseMask | None:
    """The mask of ``budget``'s rung made from id lists (grammars/json_value/hole_ids.py budget_ids, from what
    ``here`` holds), or None where it cannot be."""
    _, q, frame, _, rest, _, _, fits, _, final = here
    room = budget - rest
    own = m.tables.automaton.sparse_at(q, frame, room) if room >= 1 else None
    return value_ids(m, room, own, fit(fits, budget - 1), final)
