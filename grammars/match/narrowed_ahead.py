"""Budget-narrowed masks made ahead, for a grammar with free-value holes (GrammarCompiler queues it
after the compile, on its background thread, which works while the engine idles).

Near the end of a token budget nearly every step narrows its state's mask, and each (state, budget)
is asked for the first time: the narrowed id list is merged from the state's lists on the request
path, 50-250 us cold on SmolLM2, the bulk of the mask time's tail (benchmarks/mask_bench.py). A unit
with holes has few states (30-140 on mask_bench's grammars), so its narrowed lists, and those of the
value states whose whole masks HoleTables.prepare() makes, can all be made ahead: 5-30 ms per grammar,
too long for the compile itself (grammar_bench's cold compile p50 rose 15-20%), so an agent's next turn,
which reuses the units, is what gains. Every unit makes the merged lists of its budget cuts the same
way (``warm_budget_cuts``).
"""

from __future__ import annotations

from grammars.json_value.hole_ids import budget_ids
from grammars.match.hole_matcher import HoleMatcher
from grammars.json_value.hole_tables import _ENDINGS, _STACKS, value_at
from grammars.index.unit_index import IndexCursor


def warm_budget_cuts(grammar, pause=lambda: None) -> int:
    """Make ahead CompiledGrammar._budget_ids' merged id lists of every state at every cut a budget can
    make of its tokens (a state's distinct successor distances: a few per state, most states none), as
    their first narrowed visit near the end of a budget would (a merge there cost 50-200 us cold; here
    1.7 ms per BFCL unit at p50); ``pause()`` runs between states. Returns how many were made."""
    budget, cursor, made = grammar.budget, IndexCursor(grammar.index, 1), len(grammar._kept)
    for i, state in enumerate(budget.keys.tolist()):
        pause()
        lo, hi, far = budget.odd_off[i], budget.odd_off[i + 1], int(budget.far[i])
        least = int(budget.distance[i]) - 1  # a limit is never below it (Matcher._budget_mask)
        cuts = {int(d) for d in budget.odd_dist[lo:hi]} | {int(budget.mode[i]), least}
        cursor.place(state)
        for limit in sorted(cut for cut in cuts if least <= cut < far):
            grammar._budget_ids(cursor, limit)
    return len(grammar._kept) - made


def warm_narrowed(grammar, tables, most: int | None = None, pause=lambda: None) -> int:
    """Make ahead the budget-narrowed id lists of the unit's states near a hole, of the value states
    HoleTables.prepare() makes whole masks for (where values most often end or pass) and of the unit's
    other states, in that order, at every budget that narrows them and that the engine can leave there
    (no fewer than min_tokens: a call opens only where it can close): ``most`` (WARM_NARROWED) states
    and budgets in all; ``pause()`` runs between two states. Returns how many were left."""
    probe, left = HoleMatcher(grammar, tables), WARM_NARROWED if most is None else most
    near = sorted(tables.near)
    values = [(hole, q, stack) for hole in sorted(tables.holes) for q in _ENDINGS for stack in _STACKS]
    others = sorted(set(range(grammar.index.n_states)) - set(near))
    for place in [(state,) for state in near] + values + [(state,) for state in others]:
        pause()
        probe.unit.place(place[0])  # a unit state, or the hole a value state starts at
        if len(place) == 1:
            probe.value, probe.hole = None, -1
            safe = tables.unit_safe(place[0])
        else:
            probe.value, probe.hole = value_at(tables, *place[1:]), place[0]
            safe = tables.value_entry(probe.value, probe.hole)[2] or 0
        least = max(1, probe.min_tokens())  # the engine never leaves fewer: a call opens only where it can close
        for budget in range(least, min(safe, least + left)):
            if probe.value is not None:  # a value's narrowed masks are kept per rung
                probe.rung_mask(budget)
            else:
                tables.narrowed.put((probe.state, budget), lambda: budget_ids(probe, budget))
        left -= max(0, safe - least)
        if left <= 0:
            break
    return left


WARM_NARROWED = 6000  # states and budgets warm_narrowed makes per grammar at most (10-30 us each)
