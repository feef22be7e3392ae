"""CompiledGrammar: a unit's GrammarCore (grammars/match/compiled_grammar.py) that makes its own per-request
matchers: a Matcher (grammars/match/matcher.py), or a HoleMatcher (grammars/match/hole_matcher.py) where the
regex has holes for free-form values, filled by the vocabulary's JSON-value automaton."""

from __future__ import annotations

from grammars.match.compiled_grammar import GrammarCore
from grammars.match.hole_matcher import HoleMatcher
from grammars.match.matcher import Matcher


class CompiledGrammar(GrammarCore):
    """Index + regex + vocabulary; call ``matcher()`` for a per-request matcher."""

    __slots__ = ()

    def matcher(self, max_rollback: int = 4096) -> Matcher:
        """A fresh per-request matcher at the initial state."""
        if not self.has_holes:
            return Matcher(self, max_rollback=max_rollback)
        return HoleMatcher(self, self.hole_tables(), max_rollback=max_rollback)
