"""The per-request matcher of a tool-call turn: free text or forced delimiters, then calls under a grammar.

Phases: TEXT (auto mode: anything, but the trigger arms the call grammar and is never overrun),
FORCED (delimiter tokens written one by one: OPEN, CLOSE, SEPARATOR+OPEN, END), CALL (a block: the
tools' units, unit_union.py), AFTER (parallel: end the turn or start another block), DONE (only
EOS). A Constraint (engine/constraint.py). The units may still be compiling when the request
starts: `attach(units)` gives them later; until then `ready()` is false and the engine holds the
row before its first token (the prompt is prefilled meanwhile). With a name stage (`attach_stage`,
name_stage.py) a block starts before its units are compiled: the tool's literal opening is written
meanwhile, and only a row whose chosen tool's unit is not compiled yet is held, where its literal ends.
"""

from __future__ import annotations

import torch

from grammars.errors import GrammarError
from grammars.masks.sparse_mask import few_allowed
from grammars.tools.tool_grammar import ToolGrammar, ToolTokens, tool_tokens
from grammars.masks.trigger_mask import TriggerMasks
from grammars.match.unit_union import UnitUnion

TEXT, FORCED, CALL, AFTER, DONE = "text", "forced", "call", "after", "done"


class ToolCallConstraint:
    def __init__(self, tokens: ToolTokens, required: bool, vocabulary,
                 trigger: TriggerMasks | None = None, bare_object_at_start: bool = False,
                 units: UnitUnion | None = None, later_units: UnitUnion | None = None):
        if not required and trigger is None:
            raise GrammarError("an auto-mode tool constraint needs trigger masks for its opening delimiter")
        self.tokens = tokens
        self._tail_tokens = len(tokens.close) + len(tokens.end)  # forced after the open block: its close, the list's end
        self.trigger = trigger
        self.vocabulary = vocabulary
        self.eos = vocabulary.eos_token_ids
        self._bare_start = bare_object_at_start and not required
        self._units: UnitUnion | None = None
        self._later: UnitUnion | None = None
        self._stage = None  # grammars/name_stage.NameStage: blocks begin before the units are compiled
        self._matcher = None
        self._history: list[tuple] = []
        self._eos_seen = False
        self.calls_opened = 0
        self._budget_forced = False
        if required:
            self._set_forced(tokens.open, then=CALL)
        else:
            self._phase, self._kmp, self._at_start = TEXT, 0, True
        if units is not None:
            self.attach(units, later_units)

    def attach(self, units: UnitUnion, later_units: UnitUnion | None = None) -> None:
        """The compiled units of a first block and of later ones (default: the same); once per request."""
        self._later = later_units or units
        tail = len(self.tokens.close) + len(self.tokens.end)
        self._call_min = units.min_tokens() + tail  # a first block, its close and the end
        self._next_min = self._later.min_tokens() + tail
        if self._matcher is None and self._phase in (TEXT, CALL):
            self._matcher = units.matcher()
        self._units = units  # last: ready() reads it from the engine thread

    def attach_stage(self, stage, budget: int | None, room: int) -> bool:
        """Lets blocks begin in ``stage`` while the units compile, where every tool surely closes
        within the budget (else False: wait for the units, whose exact minimum the budget is checked
        against)."""
        tail = self._tail_tokens
        need = len(self.tokens.open) + stage.most_tokens() + tail
        if (budget is not None and budget < need) or room < need or self._phase == TEXT:
            return False
        self._call_min = self._next_min = stage.fewest_tokens() + tail  # attach() makes them exact
        self._stage = stage
        if self._phase == CALL and self._matcher is None:
            self._matcher = stage.matcher()
        return True

    def ready(self) -> bool:
        """Whether a token may be asked for: the units are attached, or a name stage lets the block go
        on (grammars/tools/name_stage.py)."""
        if self._units is not None:
            return True
        if self._stage is None:
            return False
        return self._phase != CALL or self._matcher.ready()

    # -- state ----------------------------------------------------------------------------------
    def _snapshot(self) -> tuple:
        return (self._phase, getattr(self, "_kmp", 0), getattr(self, "_at_start", False),
                getattr(self, "_pending", ()), getattr(self, "_then", DONE), self._matcher,
                self.calls_opened, self._eos_seen)

    def _restore(self, snap: tuple) -> None:
        (self._phase, self._kmp, self._at_start, self._pending, self._then, self._matcher,
         self.calls_opened, self._eos_seen) = snap

    def _set_forced(self, ids: tuple[int, ...], then: str) -> None:
        if not ids:
            self._enter(then)
            return
        self._phase, self._pending, self._then = FORCED, tuple(ids), then

    def _enter(self, phase: str) -> None:
        if phase == CALL:
            units = self._units if self.calls_opened == 0 else self._later
            if units is not None:
                self._matcher = units.matcher()
            else:  # attach() makes it, unless a name stage begins the block now
                self._matcher = self._stage.matcher() if self._stage is not None else None
            self.calls_opened += 1
        self._phase = phase

    def _block_done(self) -> None:
        if self.tokens.close:
            self._set_forced(self.tokens.close, then=AFTER if self.tokens.separator else DONE)
        else:
            self._enter(AFTER if self.tokens.separator else DONE)

    # -- interface ------------------------------------------------------------------------------
    def fill(self, row: torch.Tensor, budget: int | None = None) -> None:
        """row: int32 [W]; bit i set = token i allowed. ``budget``: tokens left, this one included;
        a call is only opened, and only continued, the way that closes it within the budget."""
        left = None if budget is None else budget - 1  # tokens after this one
        if self._phase == CALL:
            self._matcher.fill(row, None if budget is None else budget - self._tail_tokens)
            self._budget_forced |= self._matcher.budget_forced
            return
        if self._phase == TEXT:
            row.copy_(self.trigger.masks[self._kmp])
            no_room = left is not None and left < self._call_min
            if no_room:  # never open a call that could not close
                for token in self.trigger.arming(self._kmp):
                    row[token >> 5] &= ~_bit(token & 31)
            if self._at_start and self._bare_start:
                self._mask_bare_start(row, left)
            return
        row.zero_()
        for token in self._few(left):
            row[token >> 5] |= _bit(token & 31)

    def _few(self, left: int | None) -> list[int]:
        """The tokens allowed in FORCED, AFTER and DONE (``left``: tokens after this one)."""
        if self._phase == FORCED:
            return [self._pending[0]]
        if self._phase == DONE:
            return list(self.eos)
        allowed = [self.tokens.end[0]] if self.tokens.end else list(self.eos)
        if left is None or left >= len(self.tokens.separator) - 1 + self._next_min:
            allowed.append(self.tokens.separator[0])
        else:
            self._budget_forced = True  # no room for another call: the turn ends here
        return allowed

    def sparse_mask(self, budget: int | None = None):
        """The tokens ``fill(row, budget)`` would allow as a SparseMask, with no fill needed; or None
        (then fill and use the row): where the budget narrows a call's mask and that narrowed mask is
        asked for the first time (SecondAsk), and in TEXT where it rules out a call or at a
        bare-object start (``fill`` checks `{` tokens there)."""
        if self._phase == CALL:
            sparse = self._matcher.sparse_mask(None if budget is None else budget - self._tail_tokens)
            self._budget_forced |= self._matcher.budget_forced
            return sparse
        if self._phase == TEXT:
            no_room = budget is not None and budget - 1 < self._call_min
            if not no_room and not (self._at_start and self._bare_start):
                return self.trigger.sparse[self._kmp]
            return None
        return few_allowed(tuple(self._few(None if budget is None else budget - 1)), self.vocabulary.size)

    def _mask_bare_start(self, row: torch.Tensor, left: int | None) -> None:
        """At the reply's start, a token opening with `{` must be the start of a valid call (that
        fits in the ``left`` tokens after it, if given)."""
        close = self._tail_tokens
        for token in _brace_tokens(self.vocabulary):
            after = self._matcher.min_tokens_after(token)
            if after is None or (left is not None and after + close > left):
                row[token >> 5] &= ~_bit(token & 31)

    def min_tokens(self) -> int:
        """Fewest tokens that end the turn validly from here (0 where free text may simply stop)."""
        if self._phase == FORCED:
            block = self._call_min if self.calls_opened == 0 else self._next_min
            end = len(self.tokens.end) if self._then == AFTER else 0
            return len(self._pending) + (block if self._then == CALL else end)
        if self._phase == CALL:
            return self._matcher.min_tokens() + self._tail_tokens
        if self._phase == AFTER:
            return len(self.tokens.end)
        return 0

    @property
    def budget_forced(self) -> bool:
        """Whether a token budget narrowed a mask of a call (or ruled out a further call)."""
        return self._budget_forced

    def advance(self, token_id: int) -> None:
        snap = self._snapshot()
        try:
            self._advance(token_id)
        except BaseException:  # a refused token changes nothing, history included (rollback counts on it)
            self._restore(snap)
            raise
        self._history.append(snap)

    def _advance(self, token_id: int) -> None:
        if token_id in self.eos and (self._phase in (TEXT, DONE) or (self._phase == AFTER and not self.tokens.end)):
            self._eos_seen = True
            self._phase = DONE
            return
        if self._phase == TEXT:
            self._advance_text(token_id)
        elif self._phase == FORCED:
            if token_id != self._pending[0]:
                raise GrammarError(f"token {token_id} is not the forced delimiter token {self._pending[0]}; "
                                   "apply the bitmask before sampling")
            self._pending = self._pending[1:]
            if not self._pending:
                self._enter(self._then)
        elif self._phase == CALL:
            self._matcher.advance(token_id)
            if self._matcher.is_terminated():
                self._block_done()
        elif self._phase == AFTER and token_id == self.tokens.separator[0]:
            self._set_forced(self.tokens.separator[1:], then=CALL)
        elif self._phase == AFTER and self.tokens.end and token_id == self.tokens.end[0]:
            self._set_forced(self.tokens.end[1:], then=DONE)
        else:
            raise GrammarError(f"token {token_id} is not allowed after the tool calls; only EOS may follow")

    def _advance_text(self, token_id: int) -> None:
        piece = self.vocabulary.token_bytes.get(token_id, b"")
        if self._at_start and self._bare_start and piece.startswith(b"{"):
            self._enter(CALL)
            self._matcher.advance(token_id)
            return
        if self._at_start and piece.strip():
            self._at_start = False
        self._kmp, armed = self.trigger.step(self._kmp, token_id)
        if armed:
            self._enter(CALL)

    def forced(self) -> list[int]:
        if self._phase == FORCED:
            return list(self._pending)
        if self._phase == CALL:
            return self._matcher.forced()
        return []

    def free_text(self) -> bool:
        """Whether the output is free text here (auto mode before a call): stop strings apply there
        only, so a stop string inside a call never cuts it."""
        return self._phase == TEXT

    def finished(self) -> bool:
        return self._phase in (TEXT, DONE) or self.closed()

    def closed(self) -> bool:
        """Whether stopping now leaves nothing cut: every opened call is closed and at least one was
        made (free text before any call may be cut, so TEXT is not closed)."""
        return self._phase == DONE or (self._phase == AFTER and not self.tokens.end)

    def is_terminated(self) -> bool:
        return self._eos_seen or self._phase == DONE

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} were consumed")
        for _ in range(n):
            snap = self._history.pop()
            self._restore(snap)
            if snap[0] == CALL and self._matcher is not None:  # that token advanced this very matcher
                self._matcher.rollback(1)


_BRACE_TOKENS: dict[str, tuple[int, ...]] = {}


def _brace_tokens(vocabulary) -> tuple[int, ...]:
    """The tokens whose text starts with `{` (built once per vocabulary)."""
    tokens = _BRACE_TOKENS.get(vocabulary.fingerprint)
    if tokens is None:
        tokens = tuple(t for t, piece in vocabulary.token_bytes.items() if piece.startswith(b"{"))
        _BRACE_TOKENS[vocabulary.fingerprint] = tokens
    return tokens


def _bit(position: int) -> int:
    """The int32 value with only bit `position` set (bit 31 is the sign bit)."""
    return (1 << position) - (1 << 32 if position == 31 else 0)


def compile_tool_constraint(grammar: ToolGrammar, compiler, tokenizer, required: bool, trigger=None):
    """A ready ToolCallConstraint for ``grammar``, its units compiled now (tests, benchmarks; the
    server submits the units and attaches them when they are done, see server/tool_calls.py)."""
    units = UnitUnion([compiler.compile_regex(regex) for regex in grammar.units])
    later = UnitUnion([compiler.compile_regex(regex) for regex in grammar.next_units]) \
        if grammar.next_units != grammar.units else None
    tokens = tool_tokens(tokenizer, grammar.open, grammar.close, grammar.separator, grammar.end)
    return ToolCallConstraint(tokens, required, compiler.vocabulary, trigger=trigger,
                              bare_object_at_start=grammar.bare_object_at_start, units=units, later_units=later)
