"""HoleMatcher: the Matcher of a unit whose regex has free-value holes (grammars/schema/free_values.py).

In the unit, it is the unit's Matcher, except where a value may start: there the sentinel is never
offered, and the value's first tokens (and the tokens that reach the hole through the unit's forced
text, such as `:{"`) are. Inside a value, a JsonValueMatcher runs it, and the tokens that end it and
go on in the unit are allowed too (`}}`, `"},"`, `1,"` even where `"` starts the next value); when a
token leaves a value, the unit takes the sentinel and the rest of the token (HoleTables.run). Masks
come memoised from HoleTables (grammars/json_value/hole_tables.py), budget-narrowed ones merged from id lists
where they can be (grammars/json_value/hole_ids.py); the interface is Matcher's, so the engine, UnitUnion and
the tool constraint use it unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from grammars.masks.bitmask import words_off, words_on
from grammars.errors import GrammarError
from grammars.json_value.hole_crossings import entering_fit, leaving_fit
from grammars.json_value.hole_ids import budget_ids
from grammars.json_value.hole_tables import value_at
from grammars.json_value.json_value_matcher import JsonValueMatcher
from grammars.match.matcher import Matcher
from grammars.masks.sparse_mask import SparseMask
from grammars.json_value.value_exits import EXIT_DEPTH
from grammars.json_value.value_rungs import NO_POSITION, position, rung, rung_ids


class HoleMatcher:
    """Per-request cursor: a unit Matcher, and the value being written (or None)."""

    def __init__(self, grammar, tables, max_rollback: int = 4096) -> None:
        self.grammar = grammar
        self.tables = tables
        self.unit = Matcher(grammar, max_rollback=max_rollback)
        self.value: JsonValueMatcher | None = None
        self.hole = -1  # the unit's state where the open value started
        self._history: list[tuple] = []  # per token: (unit steps, value before, hole before, value stepped)
        self.budget_forced = False
        self._here = (None, -1, None, None, None, 0)  # (value or None, its q, frame, hole or unit state, sparse, safe)
        # where the value's budget-narrowed masks were last asked (grammars/json_value/value_rungs.py)
        self._rungs = NO_POSITION

    @property
    def state(self):
        return (self.unit.state, self.value.state if self.value is not None else None, self.hole)

    # -- masks ----------------------------------------------------------------------------------------
    def _mask(self) -> tuple[torch.Tensor, SparseMask | None] | None:
        """(row, sparse) without a budget, or None where the unit's own masks apply."""
        if self.value is not None:
            return self.tables.value_mask(self.value, self.hole)
        if self.unit.eos_taken:
            return None
        return self.tables.unit_mask(self.unit.state)

    def row(self) -> torch.Tensor:
        """The memoised int32 [W] mask here (no budget; read only)."""
        mask = self._mask()
        return self.unit.row() if mask is None else mask[0]

    def narrows(self, budget: int | None) -> bool:
        """Whether ``budget`` rules out a token the mask allows (then fill, not row/sparse_mask)."""
        if budget is None:
            return False
        tables, grammar = self.tables, self.grammar
        if self.value is not None:
            room = budget - grammar.min_tokens(tables.hole_after(self.hole))
            return (room < 1 or room < tables.automaton.safe_budget(self.value.q, self.value.frame)
                    or tables.leaving(self.value.state, self.hole)[1] > budget - 1)
        return not self.unit.eos_taken and budget < tables.unit_safe(self.unit.state)

    def fill(self, row: torch.Tensor, budget: int | None = None) -> None:
        if self.narrows(budget):
            self._fill_budget(row, budget)
            return
        mask = self._mask()
        if mask is None:
            self.unit.fill(row)
        else:
            row.copy_(mask[0])

    def sparse_mask(self, budget: int | None = None) -> SparseMask | None:
        """The tokens fill(row, budget) would allow as a SparseMask, or None (then fill); narrowed by
        the budget, from the second ask of this state and budget on (``_narrowed``). The last state's
        whole mask and safe budget are kept (``_here``, as Matcher and JsonValueMatcher keep theirs):
        inside a string the next ask is made where the last one was."""
        value, here = self.value, self._here
        if value is not None:  # one memo lookup: the mask and the budget from which it is whole
            if here[0] is value and here[1] == value.q and here[2] is value.frame and here[3] == self.hole:
                sparse, safe = here[4], here[5]  # asked where the last ask was (in a string): its answer
            else:
                _, sparse, safe = self.tables.value_entry(value, self.hole)
                if safe is None:  # deeper than EXIT_DEPTH the entry serves every depth: this depth's safe budget
                    safe = self._deep_safe()
                if sparse is not None:  # a first ask's None may turn into a list later
                    self._here = (value, value.q, value.frame, self.hole, sparse, safe)
            if budget is not None and budget < safe:  # as narrows(budget)
                return self._narrowed(budget)
            return sparse
        if self.unit.eos_taken:
            return self.unit.sparse_mask()
        state = self.unit.state
        if here[0] is None and here[3] == state:  # in the unit where the last ask was
            sparse, safe = here[4], here[5]
        else:
            sparse, safe = None, self.tables.unit_safe(state)
        if budget is not None and budget < safe:  # as narrows(budget)
            return self._narrowed(budget)
        if sparse is None:
            mask = self.tables.unit_mask(state)
            sparse = self.unit.sparse_mask() if mask is None else mask[1]
            if sparse is not None:
                self._here = (None, -1, None, state, sparse, safe)
        return sparse

    def _deep_safe(self) -> int:
        """narrows()'s least budget deeper than EXIT_DEPTH, where no token leaves: the unit's rest after the
        value and the value's room, at least 1 and its own safe budget."""
        value = self.value
        rest = self.grammar.min_tokens(self.tables.hole_after(self.hole))
        return rest + max(1, self.tables.automaton.safe_budget(value.q, value.frame))

    def _narrowed(self, budget: int) -> SparseMask | None:
        """The mask _fill_budget makes here. Inside a value, memoised per rung (rung_mask). Elsewhere, and
        where no id list can be made, memoised per (state, budget) as a SparseMask from its second ask
        on (HoleTables.narrowed, a SecondAsk; from the first where made from id lists)."""
        masks = step = None
        if self.value is not None:
            sparse, masks, step = self.rung_mask(budget)
            if sparse is not None:
                self.budget_forced = True
                return sparse
        deep = self.value is not None and len(self.value.state[1]) > EXIT_DEPTH
        key = self._deep_key(budget) if deep else (self.state, budget)
        direct = None if masks is not None else lambda: budget_ids(self, budget)  # asked above inside a value
        sparse = self.tables.narrowed.get(key, lambda: self._budget_row(budget), direct)
        if sparse is not None:
            self.budget_forced = True
            if masks is not None:
                sparse = masks.setdefault(step, sparse)
        return sparse

    def rung_mask(self, budget: int) -> tuple[SparseMask | None, dict, tuple[int, int]]:
        """Inside a value: the narrowed mask of ``budget``'s rung (grammars/json_value/value_rungs.py), made from id
        lists on the rung's first ask (None where it cannot be), the rungs' masks and the rung. The
        position is kept from the last ask (``_rungs``): inside a string the next ask is made there."""
        here, value = self._rungs, self.value
        if here[0] is not value or here[1] != value.q or here[2] is not value.frame or here[3] != self.hole:
            here = self._rungs = position(self)
        masks, step = here[8], rung(here, budget)
        sparse = masks.get(step) or rung_ids(self, here, budget)
        if sparse is not None:
            sparse = masks.setdefault(step, sparse)  # one made meanwhile by another request is the one kept
        return sparse, masks, step

    def _deep_key(self, budget: int) -> tuple:
        """_narrowed's key deeper than EXIT_DEPTH, whatever the depth (SmolLM2 nests 4-18 deep): no token leaves,
        so the mask is the automaton's at max(room, 1) (0 fills as 1), less EOS where the unit may not end."""
        tables, value = self.tables, self.value
        after = tables.hole_after(self.hole)
        room = max(budget - self.grammar.min_tokens(after), 1)
        automaton = tables.automaton
        own = automaton.budget_key(value.q, value.frame, room) or id(automaton.entry(value.q, value.frame))
        return ("deep", self.grammar.is_final(after), own)

    def _budget_row(self, budget: int) -> torch.Tensor:
        row = torch.zeros(self.tables.width, dtype=torch.int32)  # [W]
        self._fill_budget(row, budget)
        return row

    def _fill_budget(self, row: torch.Tensor, budget: int) -> None:
        """Near the end of the budget: only tokens after which the output can still close in time
        (those of the unit's budget mask, and values entered or left only where they fit). The
        row's bits are set through a numpy view of its words (torch's per-element ops cost µs each)."""
        tables, grammar = self.tables, self.grammar
        words = row.numpy().view(np.uint32)  # [W], the row's memory
        if self.value is None:
            self.unit.fill(row, budget)
            words_off(words, tables.sentinel_ids)
            state = None if self.unit.eos_taken else self.unit.state
            if state is not None and tables.near_hole(state):  # tokens into a value that fit
                words_on(words, entering_fit(tables, state, budget - 1))
            if state is not None and tables.is_hole(state):  # a value may start here
                room = budget - grammar.min_tokens(tables.hole_after(self.unit.state))
                if room >= 1 or not words.any():  # else nothing fits (the budget was short already): the nearest
                    scratch = torch.zeros_like(row)
                    JsonValueMatcher(tables.automaton, top="value").fill(scratch, max(room, 1))
                    self._clear_eos(scratch, final=False)
                    words |= scratch.numpy().view(np.uint32)
        else:
            after = tables.hole_after(self.hole)
            room = budget - grammar.min_tokens(after)  # for the value, the unit's rest counted
            row.zero_()
            if room >= 1:
                self.value.fill(row, room)
                self._clear_eos(row, final=grammar.is_final(after))
            words_on(words, leaving_fit(tables, self.value.state, self.hole, budget - 1))
            if not words.any():  # nothing fits (the budget was short already): the nearest
                self.value.fill(row, 1)
                self._clear_eos(row, final=grammar.is_final(after))
        self.budget_forced = True

    def _clear_eos(self, row: torch.Tensor, final: bool) -> None:
        if not final:
            words_off(row.numpy().view(np.uint32), self.tables.automaton.eos_token_ids)

    # -- stepping -------------------------------------------------------------------------------------
    def accepts(self, token_id: int) -> bool:
        mask = self._mask()
        if mask is None:
            return self.unit.accepts(token_id)
        return bool(int(mask[0][token_id >> 5]) >> (token_id & 31) & 1)

    def advance(self, token_id: int) -> None:
        tables, value, hole = self.tables, self.value, self.hole
        if value is None and token_id not in tables.sentinel_ids and self.unit.accepts(token_id):
            self.unit.advance(token_id)
            self._history.append((1, None, hole, False))
            return
        if value is not None and token_id in tables.automaton.eos_token_ids:
            if not self.finished():
                raise GrammarError(f"EOS token {token_id} is not allowed: the output is incomplete")
            self.unit.advance(tables.sentinel)
            self.unit.advance(token_id)
            self.value = None
            self._history.append((2, value, hole, False))
            return
        if value is not None and value.accepts(token_id):
            value.advance(token_id)
            self._history.append((0, value, hole, True))
            return
        piece = tables.token_bytes.get(token_id)
        found = None if piece is None or self.unit.eos_taken else tables.run(
            self.unit.state, value.state if value is not None else None, hole, piece)
        if found is None or (value is None and not found[0] and found[1][0] == "unit"):
            raise GrammarError(f"token {token_id} is not allowed by the grammar here; apply the bitmask before sampling")
        steps, end = found
        for step in steps:
            self.unit.advance(step)
        self.value, self.hole = (None, -1) if end[0] == "unit" else (value_at(tables, *end[2]), end[1])
        self._history.append((len(steps), value, hole, False))

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} were consumed")
        for _ in range(n):
            steps, value, hole, stepped = self._history.pop()
            if steps:
                self.unit.rollback(steps)
            self.value, self.hole = value, hole
            if stepped:
                value.rollback(1)

    def forced(self) -> list[int]:
        """Tokens that must come next: the unit's chain up to a hole, or the value's own chain."""
        if self.value is not None:
            return self.value.forced()
        chain = self.unit.forced()
        sentinels = set(self.tables.sentinel_ids)
        return chain[:next((i for i, token in enumerate(chain) if token in sentinels), len(chain))]

    def single(self) -> int:
        forced = self.forced()
        return forced[0] if forced else -1

    def min_tokens(self) -> int:
        if self.value is None:
            return self.unit.min_tokens()
        return self.value.min_tokens() + self.grammar.min_tokens(self.tables.hole_after(self.hole))

    def min_tokens_after(self, token_id: int) -> int | None:
        if not self.accepts(token_id):
            return None
        self.advance(token_id)
        try:
            return self.min_tokens()
        finally:
            self.rollback(1)

    def finished(self) -> bool:
        if self.value is None:
            return self.unit.finished()
        return self.value.finished() and self.grammar.is_final(self.tables.hole_after(self.hole))

    def closed(self) -> bool:
        return self.finished()

    def is_terminated(self) -> bool:
        return self.value is None and self.unit.is_terminated()

    def free_text(self) -> bool:
        return False

    def ready(self) -> bool:
        """Always: its units are compiled before it exists."""
        return True
