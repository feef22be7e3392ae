"""JsonValueDistance: the fewest tokens from any (q, stack) of the JSON value automaton to a complete value.

Completing a value means finishing the current lexeme, then closing every open container; one
token may do several of these at once (``"}``, ``}}]``) and which tokens apply depends on the
types of the containers they close. ``D(q, stack)`` is the fewest tokens over completions made of
*closing* tokens: tokens that open no container they do not close themselves and never rise above
the current depth (a completion never needs to open a container; ``{}``-style tokens are left out
of the count, so ``D`` is an exact minimum among closing completions and always achievable, also at
the depth cap). By a dynamic programme over depth, the row ``R_d`` (``D`` of every lexical state
at depth ``d``) follows from the rows of the ``K`` depths below (``K``: the most containers one
closing token closes) and the types of the innermost ``M`` containers (``M``: the longest stack
pattern a closing token reads); within a row, tokens that close nothing (``0``, ``"abc"``) are
relaxed to a fixpoint.

A *profile* holds exactly what the next row needs: the innermost ``M`` types and the last ``K``
rows, relative to ``R_d[AFTER]`` (the cost of closing everything from right after a value).
Profiles are interned: pushing a container onto a stack of profile ``p`` gives a new profile and
the rise of ``R[AFTER]`` (``push``, memoised), so following a stack costs one dict lookup per
container, and a real stack reaches only a handful of profiles.
"""

from __future__ import annotations

import threading

import numpy as np

from grammars.errors import GrammarError
from grammars.json_value.json_value_lexer import (
    AFTER, ARRAY, ARRAY_FIRST, COLON, COMPLETE, K_BODY, KEY, NUM_STATES, OBJECT, OBJECT_FIRST, S_BODY, VALUE,
)
from grammars.json_value.json_value_tables import JsonValueTables

INF = 1 << 30  # no completion


class JsonValueDistance:
    """Interned stack profiles and their distance rows for one vocabulary's tables."""

    def __init__(self, tables: JsonValueTables) -> None:
        closing: set[tuple[tuple, int, int, int]] = set()  # (pattern, pops, q, q2)
        for q in range(NUM_STATES):
            for res in np.unique(tables.res[tables.off[q]:tables.off[q + 1]]).tolist():
                for alt in tables.alt_of[tables.res_off[res]:tables.res_off[res + 1]].tolist():
                    pattern, pops, pushes, q2, rise = tables.alternative(alt)
                    if not pushes and rise <= 0:
                        closing.add((pattern, pops, q, q2))
        self._down = sorted(e for e in closing if e[1] > 0)  # across rows
        self._same = sorted((p, q, q2) for p, k, q, q2 in closing if k == 0)  # within a row
        self.max_pops = max((k for _, k, _, _ in closing), default=0)  # K
        self.max_read = max((len(p) for p, _, _, _ in closing), default=0)  # M
        self._profiles: list[tuple[tuple, tuple]] = []  # pid -> (types innermost first, rows)
        self._ids: dict[tuple, int] = {}
        self._push: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, type) -> (pid, rise of R[AFTER])
        self._lock = threading.Lock()
        row0 = self._row((), ())
        self.root = self._intern((), (tuple(row0),))
        self._check()

    def row(self, pid: int) -> tuple[int, ...]:
        """D of every lexical state at the profile's depth, relative to its R[AFTER]."""
        return self._profiles[pid][1][0]

    def push(self, pid: int, kind: int) -> tuple[int, int]:
        """(profile, rise of R[AFTER]) after opening a container of type ``kind`` on profile ``pid``."""
        got = self._push.get((pid, kind))
        if got is None:
            types, rows = self._profiles[pid]
            new_types = ((kind,) + types)[:self.max_read]
            row = self._row(new_types, rows)
            base = row[AFTER] if row[AFTER] < INF else 0
            shifted = tuple(tuple(v - base if v < INF else INF for v in r) for r in (row,) + rows)
            rows = shifted[:max(self.max_pops, 1)]
            with self._lock:
                got = self._push.setdefault((pid, kind), (self._intern(new_types, rows), base))
        return got

    def _intern(self, types: tuple, rows: tuple) -> int:
        key = (types, rows)
        pid = self._ids.get(key)
        if pid is None:
            pid = self._ids[key] = len(self._profiles)
            self._profiles.append(key)
        return pid

    def _row(self, types: tuple, below: tuple) -> list[int]:
        """R at a depth whose innermost types are ``types`` (all of them when shallower than M);
        ``below``: the rows of the depths below, nearest first (relative to one common base)."""
        row = [INF] * NUM_STATES
        if not types:
            for q in COMPLETE:
                row[q] = 0
        n = len(types)
        for pattern, pops, q, q2 in self._down:
            if len(pattern) <= n and types[:len(pattern)] == pattern and pops <= len(below):
                cost = below[pops - 1][q2]
                if cost + 1 < row[q]:
                    row[q] = cost + 1
        changed = True
        while changed:
            changed = False
            for pattern, q, q2 in self._same:
                if row[q2] + 1 < row[q] and len(pattern) <= n and types[:len(pattern)] == pattern:
                    row[q] = row[q2] + 1
                    changed = True
        return row

    def _check(self) -> None:
        """Every lexical state a value can be in must be completable with this vocabulary (TOP_OBJECT
        is not a closing state: its distance is one more than that of OBJECT_FIRST in an object)."""
        needed = {None: (VALUE, S_BODY, AFTER),
                  OBJECT: (OBJECT_FIRST, KEY, K_BODY, COLON, VALUE, S_BODY, AFTER),
                  ARRAY: (ARRAY_FIRST, VALUE, S_BODY, AFTER)}
        for kind, states in needed.items():
            row = self.row(self.root if kind is None else self.push(self.root, kind)[0])
            stuck = [q for q in states if row[q] >= INF]
            if stuck:
                raise GrammarError(
                    f"this vocabulary cannot complete a JSON value from lexical states {stuck} "
                    f"(inside {'nothing' if kind is None else ('an object' if kind == OBJECT else 'an array')}): "
                    f"it lacks tokens such as '}}', ']', '\"', ':' or digits; use a tokenizer whose "
                    f"vocabulary covers every single byte (byte-level BPE or SentencePiece with byte fallback)"
                )
