"""Matcher: the per-request cursor over a CompiledGrammar.

``fill`` writes the allowed tokens of the current state into a bitmask row (a copy of
the grammar's memoised per-state row: no allocation per token; under a token budget, only
tokens after which the match can still complete in time), ``sparse_mask`` gives
the same tokens as the state's SparseMask without a fill (for the CPU apply; None where a budget
narrows the mask), ``advance`` consumes a sampled token, ``forced`` lists tokens that must
come next, ``rollback`` undoes steps.
The state lives in an IndexCursor over the grammar's TokenIndex (grammars/index/unit_index.py): a list
of the states passed, so a rollback is a cut.

``forced()`` is token-level: it follows the chain of states in which exactly one token
is allowed.  (Character-level jump-forward over interegular's automaton is the design's
next step; it finds forced text that spans many tokenizations.)
"""

from __future__ import annotations

import torch

from grammars.match.compiled_grammar import GrammarCore
from grammars.errors import GrammarError
from grammars.masks.sparse_mask import SparseMask
from grammars.index.unit_index import NO_TOKEN, IndexCursor

_FORCED_LIMIT = 256


class Matcher:
    """Per-request automaton state; cheap to create, not thread-safe."""

    __slots__ = ("grammar", "_guide", "_eos", "eos_taken", "_steps", "_max_rollback", "budget_forced", "_here")

    def __init__(self, grammar: GrammarCore, max_rollback: int = 4096) -> None:
        self.grammar = grammar
        # headroom so forced() can walk ahead and come back
        self._guide = IndexCursor(grammar.index, max_rollback + _FORCED_LIMIT)
        self._eos = grammar.vocabulary.eos_token_ids
        self.eos_taken = False  # EOS consumed (the hole matcher reads it)
        self._steps = 0  # tokens consumed (EOS included)
        self._max_rollback = max_rollback
        self.budget_forced = False  # a token budget narrowed a mask at least once
        self._here = (None, 0, None)  # (state, safe budget, its SparseMask or None) last asked: see sparse_mask

    @property
    def state(self) -> int:
        return self._guide.get_state()

    def fill(self, bitmask_row: torch.Tensor, budget: int | None = None) -> None:
        """Write allowed tokens into ``bitmask_row`` (int32 [ceil(size/32)]; bit i = token i).

        ``budget``: tokens that may still be generated, this one included. Only tokens after which
        a complete match fits in the rest are allowed (if none fits, those that get nearest).
        """
        if self.eos_taken:
            bitmask_row.zero_()
            return
        mask = self._budget_mask(budget)
        self.budget_forced |= mask is not None
        bitmask_row.copy_(mask if mask is not None else self.grammar.state_mask(self._guide))

    def _budget_mask(self, budget: int | None) -> torch.Tensor | None:
        """The state's mask narrowed by ``budget`` (see fill), or None if the budget rules out nothing."""
        if budget is None:
            return None
        limit = max(budget - 1, self.min_tokens() - 1)
        return self.grammar.budget_mask(self._guide, limit)

    def row(self) -> torch.Tensor:
        """The state's memoised int32 [W] mask (no budget; read only)."""
        return self.grammar.state_mask(self._guide)

    def narrows(self, budget: int | None) -> bool:
        """Whether ``budget`` narrows the mask here (then fill, not row/sparse_mask): as
        ``_budget_mask(budget) is not None``, without making the narrowed row."""
        return budget is not None and budget < self.grammar.budget.safe_budget(self._guide.get_state())

    def single(self) -> int:
        """The only allowed token if exactly one (EOS counts), else NO_TOKEN."""
        return NO_TOKEN if self.eos_taken else self.grammar.single_token(self._guide)

    def min_tokens(self) -> int:
        """Fewest tokens that complete the match from here (EOS not counted; 0 once finished)."""
        if self.eos_taken:
            return 0
        return self.grammar.min_tokens(self._guide.get_state())

    def min_tokens_after(self, token_id: int) -> int | None:
        """min_tokens() after ``token_id`` (not consumed), or None if the token is not allowed."""
        if self.eos_taken:
            return None
        state = self._guide.get_state()
        if token_id in self._eos:
            return 0 if self.grammar.is_final(state) else None
        following = self.grammar.index.get_next_state(state, token_id)
        return None if following is None else self.grammar.min_tokens(following)

    def sparse_mask(self, budget: int | None = None) -> SparseMask | None:
        """The tokens ``fill(row, budget)`` would allow, as the state's memoised short id lists, with
        no fill needed; None if both sides are long, if not known yet (see
        CompiledGrammar.state_sparse_mask); where the budget narrows the mask, the narrowed mask's
        (None on its first ask: then fill; CompiledGrammar.budget_sparse)."""
        if self.eos_taken:
            return self.grammar.nothing_allowed
        state, here = self._guide.get_state(), self._here  # a state asked again (in a string) reads its last answer
        if here[0] != state:
            here = self._here = (state, self.grammar.budget.safe_budget(state), None)
        if budget is not None and budget < here[1]:
            # as _budget_mask(budget) is not None, read from one memo
            sparse = self.grammar.budget_sparse(self._guide, max(budget - 1, self.min_tokens() - 1))
            self.budget_forced |= sparse is not None
            return sparse
        if here[2] is None:  # None may turn into a list on a later ask (state_sparse_mask): kept once it has
            sparse = self.grammar.state_sparse_mask(self._guide)
            if sparse is not None:
                self._here = (state, here[1], sparse)
            return sparse
        return here[2]

    def accepts(self, token_id: int) -> bool:
        """Whether ``token_id`` may come next."""
        if self.eos_taken:
            return False
        if token_id in self._eos:
            return self.grammar.is_final(self._guide.get_state())
        return self.grammar.index.get_next_state(self._guide.get_state(), token_id) is not None

    def advance(self, token_id: int) -> None:
        """Consume one token; raises GrammarError if the grammar does not allow it."""
        if self.eos_taken:
            raise GrammarError(
                f"token {token_id} arrived after the constrained output ended with EOS; "
                f"stop decoding this request when is_terminated() is true"
            )
        if token_id in self._eos:
            if not self.grammar.is_final(self._guide.get_state()):
                raise GrammarError(
                    f"EOS token {token_id} is not allowed: the output is incomplete under the "
                    f"grammar; apply the bitmask before sampling"
                )
            self.eos_taken = True  # the guide stays put: EOS does not change the state
            self._steps += 1
            return
        try:
            self._guide.advance(token_id, False)
        except ValueError:
            text = self.grammar.vocabulary.token_bytes.get(token_id, b"<special>")
            raise GrammarError(
                f"token {token_id} ({text!r}) is not allowed by the grammar in state "
                f"{self._guide.get_state()}; apply the bitmask before sampling"
            ) from None
        self._steps += 1

    def forced(self) -> list[int]:
        """Tokens that must come next (the single-allowed-token chain; [] if none)."""
        if self.eos_taken:
            return []
        out: list[int] = []
        guide, single = self._guide, self.grammar.single_token
        while len(out) < _FORCED_LIMIT:
            token = single(guide)
            if token == NO_TOKEN:
                break
            out.append(token)
            guide.advance(token, False)
        if out:
            guide.rollback_state(len(out))
        return out

    def ready(self) -> bool:
        """Always: its grammar is compiled before the matcher exists."""
        return True

    def free_text(self) -> bool:
        """Never: the whole output is constrained (stop strings do not apply inside it)."""
        return False

    def finished(self) -> bool:
        """Whether the output so far is a complete match (EOS would be accepted)."""
        return self.eos_taken or self.grammar.is_final(self._guide.get_state())

    def closed(self) -> bool:
        """Whether stopping now leaves nothing cut (here: finished())."""
        return self.finished()

    def is_terminated(self) -> bool:
        """EOS consumed, or nothing but EOS can come next."""
        return self.eos_taken or (
            self.grammar.is_final(self._guide.get_state())
            and self.grammar.allowed_count(self._guide) == 0
        )

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (EOS included)."""
        limit = min(self._steps, self._max_rollback)
        if n < 0 or n > limit:
            raise GrammarError(
                f"cannot roll back {n} tokens: only {limit} can be undone; raise "
                f"max_rollback when creating the matcher (grammar.matcher(max_rollback=...))"
            )
        if n == 0:
            return
        self._steps -= n
        if self.eos_taken:
            self.eos_taken = False
            n -= 1
        if n:
            self._guide.rollback_state(n)

    def reset(self) -> None:
        """Back to the initial state."""
        self.place(self.grammar.initial_state)

    def place(self, state: int) -> None:
        """Start over at ``state``, as if it were the initial one (a probe of the grammar's masks there)."""
        self._guide.place(state)
        self.eos_taken = False  # EOS consumed (the hole matcher reads it)
        self._steps = 0
