"""The per-request matcher of a tool-call turn: free text or forced delimiters, then calls under a grammar.

Phases: TEXT (auto mode: anything, but the trigger arms the call grammar and is never overrun),
FORCED (delimiter tokens written one by one: OPEN, CLOSE, SEPARATOR+OPEN), CALL (the compiled
block grammar), AFTER (parallel: end the turn or start another block), DONE (only EOS).
Same interface as Matcher: fill / sparse_mask / advance / forced / finished / is_terminated / rollback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grammars.compiled_grammar import CompiledGrammar
from grammars.errors import GrammarError
from grammars.trigger_mask import TriggerMasks

TEXT, FORCED, CALL, AFTER, DONE = "text", "forced", "call", "after", "done"


@dataclass(frozen=True)
class ToolTokens:
    """The delimiters of a tool grammar as token ids of this tokenizer."""
    open: tuple[int, ...]
    close: tuple[int, ...]
    separator: tuple[int, ...] | None  # SEPARATOR + OPEN; None: one block only


class ToolCallConstraint:
    def __init__(self, block: CompiledGrammar, tokens: ToolTokens, required: bool,
                 trigger: TriggerMasks | None = None, bare_object_at_start: bool = False):
        if not required and trigger is None:
            raise GrammarError("an auto-mode tool constraint needs trigger masks for its opening delimiter")
        self.block = block
        self.tokens = tokens
        self.trigger = trigger
        self.eos = block.vocabulary.eos_token_ids
        self._bare_start = bare_object_at_start and not required
        self._matcher = block.matcher()
        self._history: list[tuple] = []
        self._eos_seen = False
        self.calls_opened = 0
        self._call_min = block.min_tokens(block.initial_state) + len(tokens.close)  # a block and its close
        self._budget_forced = False
        if required:
            self._set_forced(tokens.open, then=CALL)
        else:
            self._phase, self._kmp, self._at_start = TEXT, 0, True

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
            self._matcher = self.block.matcher()
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
            self._matcher.fill(row, None if budget is None else budget - len(self.tokens.close))
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
        allowed = list(self.eos) if self._phase in (AFTER, DONE) else []
        if self._phase == FORCED:
            allowed = [self._pending[0]]
        elif self._phase == AFTER:
            if left is None or left >= len(self.tokens.separator) - 1 + self._call_min:
                allowed.append(self.tokens.separator[0])
            else:
                self._budget_forced = True  # no room for another call: the turn ends here
        for token in allowed:
            row[token >> 5] |= _bit(token & 31)

    def sparse_mask(self, budget: int | None = None):
        """The tokens ``fill(row, budget)`` would allow as a memoised SparseMask, with no fill needed;
        or None (then fill and use the row): where the budget narrows the mask, and in TEXT at a
        bare-object start (``fill`` checks `{` tokens there) and in FORCED / AFTER / DONE."""
        if self._phase == CALL:
            return self._matcher.sparse_mask(None if budget is None else budget - len(self.tokens.close))
        if self._phase == TEXT:
            no_room = budget is not None and budget - 1 < self._call_min
            if not no_room and not (self._at_start and self._bare_start):
                return self.trigger.sparse[self._kmp]
        return None

    def _mask_bare_start(self, row: torch.Tensor, left: int | None) -> None:
        """At the reply's start, a token opening with `{` must be the start of a valid call (that
        fits in the ``left`` tokens after it, if given)."""
        close = len(self.tokens.close)
        for token in _brace_tokens(self.block.vocabulary):
            after = self._matcher.min_tokens_after(token)
            if after is None or (left is not None and after + close > left):
                row[token >> 5] &= ~_bit(token & 31)

    def min_tokens(self) -> int:
        """Fewest tokens that end the turn validly from here (0 where free text may simply stop)."""
        if self._phase == FORCED:
            return len(self._pending) + (self._call_min if self._then == CALL else 0)
        if self._phase == CALL:
            return self._matcher.min_tokens() + len(self.tokens.close)
        return 0

    @property
    def budget_forced(self) -> bool:
        """Whether a token budget narrowed a mask of a call (or ruled out a further call)."""
        return self._budget_forced

    def advance(self, token_id: int) -> None:
        self._history.append(self._snapshot())
        if token_id in self.eos and self._phase in (TEXT, AFTER, DONE):
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
        else:
            raise GrammarError(f"token {token_id} is not allowed after the tool calls; only EOS may follow")

    def _advance_text(self, token_id: int) -> None:
        piece = self.block.vocabulary.token_bytes.get(token_id, b"")
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

    def finished(self) -> bool:
        return self._phase in (TEXT, AFTER, DONE)

    def closed(self) -> bool:
        """Whether stopping now leaves nothing cut: every opened call is closed and at least one was
        made (free text before any call may be cut, so TEXT is not closed)."""
        return self._phase in (AFTER, DONE)

    def is_terminated(self) -> bool:
        return self._eos_seen or self._phase == DONE

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} were consumed")
        for _ in range(n):
            snap = self._history.pop()
            self._restore(snap)
            if snap[0] == CALL:  # that token advanced this very matcher
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


def tool_tokens(tokenizer, open_text: str, close_text: str, separator: str | None) -> ToolTokens:
    """The delimiters as this tokenizer writes them (an added token such as `<tool_call>` stays whole)."""
    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()
    return ToolTokens(open=encode(open_text), close=encode(close_text),
                      separator=encode(separator + open_text) if separator is not None else None)
