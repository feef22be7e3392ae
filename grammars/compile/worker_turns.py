"""Who gets the next free compile worker: lowest priority number first, then in order of asking.

NOW (-1): a request waits on this compile right now (its tool was chosen, grammars/tools/name_stage.py).
NEEDED (0, 1): a request waits for it before its first token (schema -> regex first, then units).
BACKGROUND (2): a unit a request may never need (the tools it did not call yet): it starts only
while ``idle()`` says the engine has nothing to compute, so that speculative compiles never take
the cores from a prefill or a decode step. ``prefer(key, priority)`` moves a waiting compile up.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from grammars.errors import GrammarError

NOW, SCHEMA, NEEDED, BACKGROUND = -1, 0, 1, 2
_IDLE_POLL_S = 0.05  # how often a background compile looks at the engine again


class WorkerTurns:
    def __init__(self, workers: list, idle: Callable[[], bool] | None = None) -> None:
        self._idle = list(workers)
        self._waiting: list[list] = []  # heap of [priority, ticket, key]
        self._tickets = itertools.count()
        self._wanted: dict[str, int] = {}  # key -> priority asked by prefer() before the compile queued
        self._turn = threading.Condition()
        self.engine_idle = idle or (lambda: True)
        self._closed = False

    def take(self, priority: int, key: str | None = None):
        with self._turn:
            entry = [min(priority, self._wanted.pop(key, priority)), next(self._tickets), key]
            heapq.heappush(self._waiting, entry)
            while not (self._idle and self._waiting[0] is entry and (entry[0] < BACKGROUND or self.engine_idle())):
                if self._closed:  # its thread ends (a thread left waiting here would hold up the exit)
                    self._waiting.remove(entry)
                    heapq.heapify(self._waiting)
                    raise GrammarError("the grammar compiler was closed")
                self._turn.wait(timeout=_IDLE_POLL_S if self._waiting[0] is entry else None)
            heapq.heappop(self._waiting)
            self._turn.notify_all()  # the next in line may find another idle worker
            return self._idle.pop()

    def close(self) -> None:
        """Every compile still waiting for a worker ends with a GrammarError."""
        with self._turn:
            self._closed = True
            self._turn.notify_all()

    def give(self, worker) -> None:
        with self._turn:
            self._idle.append(worker)
            self._turn.notify_all()

    def prefer(self, key: str, priority: int = NOW) -> None:
        with self._turn:
            queued = False
            for entry in self._waiting:
                if entry[2] == key:
                    entry[0], queued = min(entry[0], priority), True
            if not queued:  # not waiting yet (or already running): its turn, when it asks, is this one
                if len(self._wanted) > 4096:  # keys preferred while running, never asked again
                    self._wanted.clear()
                self._wanted[key] = min(priority, self._wanted.get(key, priority))
            heapq.heapify(self._waiting)
            self._turn.notify_all()
