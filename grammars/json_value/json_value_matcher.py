"""JsonValueMatcher: the per-request cursor over the shared JsonValueAutomaton (grammars/json_value/json_value.py).

The same interface as grammars/match/matcher.py's Matcher, so the engine cannot tell them apart:
``fill`` copies the memoised mask of the current state into a bitmask row (under a token budget,
only tokens after which the value can still be completed in time), ``sparse_mask`` gives the
same tokens as a SparseMask, ``advance`` consumes a token, ``forced`` lists tokens that must come
next, ``rollback`` undoes steps.  ``top="object"``: the output is one JSON object (OpenAI's
``json_object``); ``top="value"``: any JSON value (the schemas ``{}`` and ``true``).

The state is (q, frame), both immutable: a step pushes the previous one on a bounded history, so
rollback and forced()'s look-ahead copy nothing.
"""

from __future__ import annotations

from collections import deque

import torch

from grammars.errors import GrammarError
from grammars.json_value.json_value import JsonValueAutomaton
from grammars.json_value.json_value_lexer import NAMES
from grammars.masks.sparse_mask import SparseMask

_FORCED_LIMIT = 256


class JsonValueMatcher:
    """Per-request state over a JsonValueAutomaton; cheap to create, not thread-safe."""

    __slots__ = ("automaton", "top", "q", "frame", "_terminated", "_history", "_steps", "_max_rollback",
                 "budget_forced", "_here")

    def __init__(self, automaton: JsonValueAutomaton, top: str = "object", max_rollback: int = 4096) -> None:
        if top not in ("object", "value"):
            raise GrammarError(f"top must be 'object' (one JSON object) or 'value' (any JSON value), got {top!r}")
        self.automaton = automaton
        self.top = top
        self._max_rollback = max_rollback
        self.budget_forced = False  # a token budget narrowed a mask at least once
        self._here = (-1, None, 0, None)  # (q, frame, safe budget, its SparseMask) last asked: see sparse_mask
        self.reset()

    @property
    def state(self) -> tuple[int, tuple[int, ...]]:
        """(lexical state, open containers outermost first): the value JsonValueAutomaton.scan takes."""
        return self.q, self.frame.kinds

    def fill(self, bitmask_row: torch.Tensor, budget: int | None = None) -> None:
        """Write allowed tokens into ``bitmask_row`` (int32 [ceil(size/32)]; bit i = token i).

        ``budget``: tokens that may still be generated, this one included. Only tokens after which
        a complete value fits in the rest are allowed (if none fits, those that get nearest).
        """
        if self._terminated:
            bitmask_row.zero_()
            return
        narrowed = None if budget is None else self.automaton.budget_row(self.q, self.frame, budget)
        if narrowed is not None:
            self.budget_forced = True
            bitmask_row.copy_(narrowed)
            return
        bitmask_row.copy_(self.automaton.entry(self.q, self.frame).row)

    def sparse_mask(self, budget: int | None = None) -> SparseMask | None:
        """The tokens ``fill(row, budget)`` would allow as a SparseMask, or None (then fill): both sides
        of the mask are long, or the budget narrows it and this narrowed mask is asked for the first
        time (JsonValueAutomaton.budget_sparse). The state's safe budget and whole mask are kept from
        the last ask (``_here``): inside a string or number the next ask is made where it was, and the
        automaton's memo keys (tuples cut from the frame, looked up in tables shared by every request)
        cost more than the mask, cache-cold after a forward pass."""
        if self._terminated:
            return self.automaton.nothing_allowed
        q, frame, here = self.q, self.frame, self._here
        if here[0] != q or here[1] is not frame:  # 69% of json_object's steps ask where the last one did
            here = self._here = (q, frame, self.automaton.safe_budget(q, frame), self.automaton.entry(q, frame).sparse)
        if budget is not None and budget < here[2]:
            sparse = self.automaton.budget_sparse(q, frame, budget)  # None on a first ask
            self.budget_forced |= sparse is not None
            return sparse
        return here[3]

    def accepts(self, token_id: int) -> bool:
        """Whether ``token_id`` may come next."""
        if self._terminated:
            return False
        if token_id in self.automaton.eos_token_ids:
            return self.automaton.is_final(self.q, self.frame)
        return self.automaton.step(self.q, self.frame, token_id) is not None

    def advance(self, token_id: int) -> None:
        """Consume one token; raises GrammarError if the automaton does not allow it."""
        if self._terminated:
            raise GrammarError(
                f"token {token_id} arrived after the JSON output ended with EOS; stop decoding this "
                f"request when is_terminated() is true"
            )
        if token_id in self.automaton.eos_token_ids:
            if not self.automaton.is_final(self.q, self.frame):
                raise GrammarError(
                    f"EOS token {token_id} is not allowed: the JSON value is incomplete (state "
                    f"{NAMES[self.q]}, {self.frame.depth} open containers); apply the bitmask before sampling"
                )
            self._push_history()
            self._terminated = True
            return
        following = self.automaton.step(self.q, self.frame, token_id)
        if following is None:
            raise GrammarError(
                f"token {token_id} is not allowed in the JSON value here (state {NAMES[self.q]}, "
                f"{self.frame.depth} open containers); apply the bitmask before sampling"
            )
        self._push_history()
        self.q, self.frame = following

    def _push_history(self) -> None:
        self._history.append((self.q, self.frame, self._terminated))
        self._steps += 1

    def forced(self) -> list[int]:
        """Tokens that must come next (the single-allowed-token chain; [] if none)."""
        if self._terminated:
            return []
        out: list[int] = []
        q, frame = self.q, self.frame
        while len(out) < _FORCED_LIMIT:
            single = self.automaton.entry(q, frame).single
            if single < 0:
                break
            out.append(single)
            q, frame = self.automaton.step(q, frame, single)
        return out

    def place(self, q: int, frame) -> None:
        """Start from lexical state ``q`` with the open containers ``frame`` (a value entered mid-token
        by HoleMatcher); the history is cleared."""
        self.reset()
        self.q, self.frame = q, frame

    def free_text(self) -> bool:
        """Never: the whole output is the JSON value (stop strings do not apply inside it)."""
        return False

    def ready(self) -> bool:
        """Always: its automaton is built before it exists."""
        return True

    def finished(self) -> bool:
        """Whether the output so far is a complete value (EOS would be accepted)."""
        return self._terminated or self.automaton.is_final(self.q, self.frame)

    def closed(self) -> bool:
        """Whether stopping now leaves nothing cut (here: finished())."""
        return self.finished()

    def is_terminated(self) -> bool:
        """EOS consumed, or the value is complete and nothing but EOS can come next."""
        if self._terminated:
            return True
        entry = self.automaton.entry(self.q, self.frame)
        return entry.final and entry.count == 0

    def min_tokens(self) -> int:
        """Fewest tokens that complete the value from here (EOS not counted; 0 once finished)."""
        if self._terminated:
            return 0
        return self.automaton.min_tokens(self.q, self.frame)

    def min_tokens_after(self, token_id: int) -> int | None:
        """min_tokens() after ``token_id`` (not consumed), or None if the token is not allowed."""
        if self._terminated:
            return None
        if token_id in self.automaton.eos_token_ids:
            return 0 if self.automaton.is_final(self.q, self.frame) else None
        following = self.automaton.step(self.q, self.frame, token_id)
        return None if following is None else self.automaton.min_tokens(*following)

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (EOS included)."""
        limit = min(self._steps, len(self._history))
        if n < 0 or n > limit:
            raise GrammarError(
                f"cannot roll back {n} tokens: only {limit} can be undone; raise max_rollback when "
                f"creating the matcher (JsonValueMatcher(..., max_rollback=...))"
            )
        for _ in range(n):
            self.q, self.frame, self._terminated = self._history.pop()
        self._steps -= n

    def reset(self) -> None:
        """Back to the initial state."""
        self.q, self.frame = self.automaton.initial(self.top)
        self._terminated = False
        self._history: deque = deque(maxlen=self._max_rollback)
        self._steps = 0
