"""One future per unit, shared by every request that asks for it, and the threads that settle it.

A compile waits on a thread for its turn at a worker process (grammars/compile/worker_turns.py); a
background one (a tool the request has not called yet) waits for the engine's idle time as well.
While all threads of one pool waited so, a compile that a request then needed (its tool chosen,
``prefer``) queued behind them for a thread and never reached its turn: with the engine busy, the
request waited for as long as others decoded. So background compiles run on threads of their own,
and a compile a request waits on always gets a thread of the needed pool: ``hurry`` starts one
there even if the same unit already waits in the background; whichever finishes first settles the
shared future, and the other finds the unit in the memory cache (the key lock keeps one compile).

A shared future is marked running at once, so that one client hanging up (asyncio's wrap_future
cancels what it waited on) cannot cancel it for the others.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

from grammars.errors import GrammarError
from grammars.compile.worker_turns import BACKGROUND


class CompileFutures:
    def __init__(self, needed: concurrent.futures.ThreadPoolExecutor, threads: int,
                 compile: Callable[[str, int], object], prefer: Callable[[str, int], None]) -> None:
        self._needed = needed  # shared with the schema -> regex steps
        self._background = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="maskd-background")
        self._compile, self._prefer = compile, prefer  # compile(regex, priority); prefer(key, priority)
        self._futures: dict[str, concurrent.futures.Future] = {}  # key -> the future its askers share
        self._hurried: set[str] = set()  # keys with a compile started on the needed pool
        self._lock = threading.Lock()

    def submit(self, key: str, regex: str, priority: int) -> concurrent.futures.Future:
        """The future of ``regex``'s compile, started if none is under way; a priority below
        BACKGROUND (a request needs it) hurries one under way in the background."""
        start = None
        with self._lock:
            future = self._futures.get(key)
            if future is None:
                future = self._futures[key] = concurrent.futures.Future()
                future.set_running_or_notify_cancel()
                start = self._background if priority >= BACKGROUND else self._needed
                if start is self._needed:
                    self._hurried.add(key)
        if start is not None:
            start.submit(self._settle, key, regex, future, priority)
        elif priority < BACKGROUND:
            self.hurry(key, regex, priority)
        return future

    def hurry(self, key: str, regex: str, priority: int) -> None:
        """A request waits on this unit now: its turn at a worker moves up, and if no thread of the
        needed pool compiles it yet, one starts (a no-op once the unit is settled)."""
        with self._lock:
            future = self._futures.get(key)
            start = future is not None and key not in self._hurried
            if start:
                self._hurried.add(key)
        if future is None:  # settled
            return
        self._prefer(key, priority)  # if it already waits for a worker
        if start:
            self._needed.submit(self._settle, key, regex, future, priority)

    def _settle(self, key: str, regex: str, future: concurrent.futures.Future, priority: int) -> None:
        try:
            result, error = self._compile(regex, priority), None
        except Exception as exc:  # noqa: BLE001 - handed to every asker
            result, error = None, exc
        with self._lock:  # the first to finish settles it; a later ask starts afresh (a miss again)
            first = self._futures.get(key) is future
            if first:
                del self._futures[key]
                self._hurried.discard(key)
        if first and error is None:
            future.set_result(result)
        elif first:
            future.set_exception(error)

    def close(self) -> None:
        """Stop the background threads; what is still unsettled fails (its askers get the error)."""
        self._background.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            pending, self._futures = list(self._futures.values()), {}
            self._hurried.clear()
        for future in pending:
            future.set_exception(GrammarError("the grammar compiler was closed"))
