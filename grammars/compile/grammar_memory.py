"""What the compiler remembers in memory: its grammars (GrammarLRU) and its recent failures (FailureMemory).

Grammars hold ~100 KB to tens of MB (held_bytes: the index, its tables and the per-state masks
memoised so far, which grow as requests visit states), so the bound counts bytes, not only entries.
A hit is a dict lookup (~1 us) and moves its grammar to the newest end.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from grammars.match.grammar import CompiledGrammar
from grammars.errors import GrammarError

FAILURE_MEMORY_S = 60.0  # how long a failed compile is answered from memory, not tried again


class GrammarLRU:
    """At most ``size`` grammars and ``max_bytes``, but always the newest; safe to call from many threads."""

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.hits = 0
        self._grammars: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> CompiledGrammar | None:
        with self._lock:
            grammar = self._grammars.get(key)
            if grammar is not None:
                self._grammars.move_to_end(key)
                self.hits += 1
            return grammar

    def put(self, key: str, grammar: CompiledGrammar) -> list[CompiledGrammar]:
        """Keeps ``grammar`` as the newest; drops the oldest while over either bound, and returns
        them: their memory is freed where the caller lets them go (a grammar a request decoded with
        holds thousands of memoised masks, ~0.7 ms to free on Gemma 3's vocabulary)."""
        with self._lock:
            self._grammars.pop(key, None)
            self._grammars[key] = grammar
            held = [g.held_bytes() for g in self._grammars.values()]
            total, dropped = sum(held), []
            while len(self._grammars) > 1 and (len(self._grammars) > self.size or total > self.max_bytes):
                dropped.append(self._grammars.popitem(last=False)[1])
                total -= held[len(dropped) - 1]
        return dropped

    def report(self) -> dict:
        """Grammars held and the bytes they hold now (for /metrics)."""
        with self._lock:
            grammars = list(self._grammars.values())
        return {"grammars": len(grammars), "bytes": sum(g.held_bytes() for g in grammars),
                "budget_bytes": self.max_bytes}


class FailureMemory:
    """Why a key's compile failed (past the limit, or refused), answered for FAILURE_MEMORY_S so that a
    request retrying it fails at once; then forgotten (a limit hit on a machine busy for a while, or a
    worker lost, is tried again). At most ``size`` keys, the oldest dropped; safe from many threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._failed: OrderedDict[str, tuple[GrammarError, float]] = OrderedDict()  # key -> (why, when)
        self._lock = threading.Lock()

    def get(self, key: str) -> GrammarError | None:
        with self._lock:
            entry = self._failed.get(key)
            if entry is not None and time.monotonic() - entry[1] > FAILURE_MEMORY_S:
                del self._failed[key]
                entry = None
        return None if entry is None else entry[0]

    def put(self, key: str, error: GrammarError) -> None:
        with self._lock:
            self._failed[key] = (error, time.monotonic())
            while len(self._failed) > self.size:
                self._failed.popitem(last=False)
