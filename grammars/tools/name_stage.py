"""Name first: a call's opening text is written while its tools' units still compile.

Every tool's unit starts with a literal: `\\n{"name": "get_weather", "arguments": {"city":"`. The model
chooses the tool in the first few tokens of that literal, so a request with many new tools need not
wait for all of their units: `NameFirstMatcher` allows exactly the tokens that keep the output a
prefix of some tool's literal (no compile needed, the literals are text) and, as soon as the units
of every tool still possible are compiled, replays its tokens into their union
(grammars/match/unit_union.py) and hands over. Where the chosen tool's literal is written up to where a
token could reach past its end and its unit is not compiled yet, `ready()` is False: the engine holds
that row (engine/scheduler.py) and `prefer` moves that unit's compile ahead of the others'.

Budgets stay exact in what they promise: `bounds[k]` is a number of tokens that surely closes the
unit after k bytes of its literal (a shortest text of its regex, split into the fewest vocabulary
tokens), and a token is allowed only where some tool can still close within the budget that way.
A request whose budget might not cover every tool's bound does not use this stage at all (the
server waits for the units, server/tool_calls.py). Tokens that cross from the literal into the
arguments (`": {"` past the literal's end) wait for the unit; the unit allows them.
"""

from __future__ import annotations

import concurrent.futures
from bisect import bisect_left
from collections.abc import Callable

import numpy as np
import torch

from grammars.masks.bitmask import set_token_bits
from grammars.errors import GrammarError
from grammars.schema.free_values import HOLE
from grammars.tools.regex_text import unit_texts
from grammars.masks.sparse_mask import allowed_sparse
from grammars.index.token_index import UNSPLIT, TokenTrie
from grammars.match.unit_union import UnitUnion


class NameStage:
    """The literals and bounds of one request's units (a block's choice of tool), and their futures."""

    def __init__(self, vocabulary, literals: list[bytes], bounds: list[list[int]], regexes: list[str],
                 futures: list[concurrent.futures.Future], prefer: Callable[[str], None]):
        self.vocabulary = vocabulary
        self.literals, self.bounds, self.regexes, self.futures = literals, bounds, regexes, futures
        self.prefer = prefer
        self.pieces = _pieces(vocabulary)
        self.reach = _REACH[vocabulary.fingerprint]
        self.ordered = _ORDERED[vocabulary.fingerprint]
        self._at: dict[tuple[int, int], tuple] = {}  # (literal, k) -> tokens_at's answer
        self._inside: dict[tuple[int, int], bool] = {}  # (literal, k) -> inside's answer

    def tokens_at(self, i: int, k: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(end, ids) for each token text that is literal i's bytes [k:end], memoised. Only as far as
        the longest token that starts with the literal's two bytes at k: the name's first visits
        looked up every length up to the vocabulary's longest token (81 bytes on SmolLM2): ~200 dict
        lookups a step with four tools live, where the step's lookup ahead took 80-155 µs."""
        got = self._at.get((i, k))
        if got is None:
            literal, pieces = self.literals[i], self.pieces
            last = min(len(literal), k + self.reach.get(literal[k:k + 2], 1))
            got = self._at[(i, k)] = tuple((end, pieces[literal[k:end]]) for end in range(k + 1, last + 1)
                                           if literal[k:end] in pieces)
        return got

    def inside(self, i: int, k: int) -> bool:
        """Whether no token that may start at byte k of literal i reaches past its end: the rest of
        the literal is no token's proper prefix. In the sorted token texts, the text right after the
        rest (or after the rest itself) starts with it if any does. Memoised: ready() asks it of every
        live literal at each step of the stage."""
        got = self._inside.get((i, k))
        if got is None:
            rest = self.literals[i][k:]
            at = bisect_left(self.ordered, rest)
            got = self._inside[(i, k)] = bool(rest) and not any(
                len(p) > len(rest) and p.startswith(rest) for p in self.ordered[at:at + 2])
        return got

    def most_tokens(self) -> int:
        """Tokens that surely close a block, whichever tool it calls."""
        return max(b[0] for b in self.bounds)

    def fewest_tokens(self) -> int:
        """A bound on the shortest block: the tokens that surely close the cheapest tool's."""
        return min(b[0] for b in self.bounds)

    def matcher(self) -> "NameFirstMatcher":
        return NameFirstMatcher(self)


def name_stage(vocabulary, regexes: list[str], futures: list, prefer: Callable[[str], None]) -> NameStage | None:
    """The stage of these units, or None where it cannot tell the tools apart by their literals (a
    format whose call opens with a choice, as mistral's ` ?[`) or a regex is unreadable."""
    literals, bounds = [], []
    trie = _trie(vocabulary)
    for regex in regexes:
        texts = unit_texts(regex)
        if texts is None or not texts[0] or texts[1] is None:
            return None
        literals.append(texts[0].encode())
        text = texts[1].encode()
        split = trie.split(text, ord(HOLE)) if trie is not None else _bounds(text, _pieces(vocabulary))
        bounds.append(split[:len(literals[-1]) + 1])
    for i, a in enumerate(literals):  # a literal that is a prefix of another's: no tool is ever chosen
        if any(i != j and b.startswith(a) for j, b in enumerate(literals)):
            return None
    return NameStage(vocabulary, literals, bounds, regexes, futures, prefer)


_PIECES: dict[str, dict[bytes, tuple[int, ...]]] = {}
_REACH: dict[str, dict[bytes, int]] = {}  # two bytes -> the longest token text starting with them, in bytes
_ORDERED: dict[str, list[bytes]] = {}  # the distinct token texts, sorted (NameStage.inside)
_TRIES: dict[str, TokenTrie | None] = {}


def prepare(vocabulary) -> None:
    """Builds the vocabulary's tables now (the server calls it at startup: ~0.5 s on 262k tokens)."""
    _pieces(vocabulary)
    _trie(vocabulary)


def _trie(vocabulary) -> TokenTrie | None:
    """The vocabulary's token trie in C (for bounds), or None without the C library."""
    if vocabulary.fingerprint not in _TRIES:
        trie = TokenTrie(vocabulary.token_bytes)
        _TRIES[vocabulary.fingerprint] = trie if trie.split(b"", 0) is not None else None
    return _TRIES[vocabulary.fingerprint]


def _pieces(vocabulary) -> dict[bytes, tuple[int, ...]]:
    """Token text -> the text tokens spelling it (built once per vocabulary)."""
    pieces = _PIECES.get(vocabulary.fingerprint)
    if pieces is None:
        grouped: dict[bytes, list[int]] = {}
        for token, piece in vocabulary.token_bytes.items():
            if token < vocabulary.size:
                grouped.setdefault(piece, []).append(token)
        pieces = {p: tuple(ids) for p, ids in grouped.items()}
        reach: dict[bytes, int] = {}
        for piece in pieces:
            if len(piece) > reach.get(piece[:2], 0):
                reach[piece[:2]] = len(piece)
        _REACH[vocabulary.fingerprint] = reach
        _ORDERED[vocabulary.fingerprint] = sorted(pieces)
        _PIECES[vocabulary.fingerprint] = pieces
    return pieces


_BOUND_PIECE = 16  # longest token tried by the Python path (any split bounds; JSON text seldom takes longer ones)


def _bounds(text: bytes, pieces: dict[bytes, tuple[int, ...]]) -> list[int]:
    """TokenTrie.split without the C library: [k] the fewest tokens of at most _BOUND_PIECE bytes
    spelling text[k:] (a free value's HOLE byte is one token: the JSON-value automaton writes `0`)."""
    longest = min(_BOUND_PIECE, max(map(len, pieces)))
    best = [UNSPLIT] * len(text) + [0]
    for k in range(len(text) - 1, -1, -1):
        if text[k] == ord(HOLE):
            best[k] = best[k + 1] + 1
            continue
        for n in range(1, min(longest, len(text) - k) + 1):
            if text[k + n - 1] == ord(HOLE):
                break
            if text[k:k + n] in pieces and best[k + n] + 1 < best[k]:
                best[k] = best[k + n] + 1
    return best


class NameFirstMatcher:
    """Per block: the literals' prefix written so far; then the live units' union (the Matcher interface)."""

    def __init__(self, stage: NameStage):
        self.stage = stage
        self._done = 0  # literal bytes written
        self._live = tuple(range(len(stage.literals)))
        self._tokens: list[int] = []
        self._history: list[tuple[int, tuple[int, ...]]] = []
        self._union = None  # the UnionMatcher handed over to
        self._preferred: set[int] = set()
        self._budget_forced = False

    # -- handing over ----------------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether a token may be asked for: the units took over, or every live literal goes on and
        no token from here may reach past its end. Such a token crosses into the arguments (`{"` where
        the literal ends in `{`): only the unit allows it, so the row waits for the unit there rather
        than being offered the literal's own shorter split alone (a first request then wrote `{`
        where the same request with its unit compiled wrote `{"`)."""
        if self._hand_over():
            return True
        if all(self.stage.inside(i, self._done) for i in self._live):
            return True
        self._prefer()
        return False

    def _hand_over(self) -> bool:
        if self._union is not None:
            return True
        futures = [self.stage.futures[i] for i in self._live]
        if len(self._live) == 1:  # the tool is chosen: its unit goes first
            self._prefer()
        if not all(f.done() and f.exception() is None for f in futures):
            return False
        union = UnitUnion([f.result() for f in futures]).matcher()
        for token in self._tokens:
            union.advance(token)
        self._union = union
        return True

    def _prefer(self) -> None:
        for i in self._live:
            if i not in self._preferred and not self.stage.futures[i].done():
                self._preferred.add(i)
                self.stage.prefer(self.stage.regexes[i])

    # -- the Matcher interface -------------------------------------------------------------------
    @property
    def budget_forced(self) -> bool:
        return self._budget_forced or (self._union is not None and self._union.budget_forced)

    def fill(self, row: torch.Tensor, budget: int | None = None) -> None:
        """row: int32 [W]; ``budget``: tokens left for the block, this one included."""
        if self._hand_over():
            self._union.fill(row, budget)
            return
        row.zero_()
        set_token_bits(row, self._allowed(budget))

    def sparse_mask(self, budget: int | None = None):
        """The union's SparseMask once handed over; before, the literals' few next tokens as one."""
        if self._hand_over():
            return self._union.sparse_mask(budget)
        return allowed_sparse(np.fromiter(self._allowed(budget), dtype=np.int64), self.stage.vocabulary.size)

    def _allowed(self, budget: int | None) -> set[int]:
        left = None if budget is None else budget - 1
        allowed: set[int] = set()
        for i in self._live:
            bound = self.stage.bounds[i]
            for end, ids in self.stage.tokens_at(i, self._done):
                if left is not None and bound[end] > left:
                    self._budget_forced = True
                    continue
                allowed.update(ids)
        return allowed

    def advance(self, token_id: int) -> None:
        if self._union is not None:
            self._union.advance(token_id)
            return
        piece = self.stage.vocabulary.token_bytes.get(token_id, b"")
        end = self._done + len(piece)
        live = tuple(i for i in self._live if piece and self.stage.literals[i][self._done:end] == piece
                     and len(self.stage.literals[i]) >= end)
        if not live:
            raise GrammarError(f"token {token_id} starts no tool's call here; apply the bitmask before sampling")
        self._history.append((self._done, self._live))
        self._tokens.append(token_id)
        self._done, self._live = end, live

    def rollback(self, n: int) -> None:
        if self._union is not None:
            self._union.rollback(n)
            return
        if n < 0 or n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} were consumed")
        for _ in range(n):
            self._done, self._live = self._history.pop()
            self._tokens.pop()

    def forced(self) -> list[int]:
        return self._union.forced() if self._union is not None else []  # the engine's ForcedText walks literals

    def min_tokens(self) -> int:
        if self._union is not None:
            return self._union.min_tokens()
        return min(self.stage.bounds[i][self._done] for i in self._live)

    def finished(self) -> bool:
        return self._union is not None and self._union.finished()

    def closed(self) -> bool:
        return self.finished()

    def is_terminated(self) -> bool:
        return self._union is not None and self._union.is_terminated()

    def free_text(self) -> bool:
        return False

