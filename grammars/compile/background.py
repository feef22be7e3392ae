"""Background: the work a compile leaves for later, which nothing waits on (the unit's disk write,
warming its hole tables' masks, freeing the grammars the memory cache dropped), on one thread of its
own.

Warm-ups pause between masks while the engine computes (``pause``): its Python between torch ops
needs the GIL, and decoding beside them would share it. A disk write (~2 ms of np.savez's Python a
unit) waits for the engine's idle time too (``wait_idle``). ``close`` finishes what is queued (disk
writes, at once: a fresh compiler may read them next) but stops warm-ups at their next pause.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

log = logging.getLogger("maskd.grammars")


class _Closed(Exception):
    """A background warm-up stopped because its compiler closed."""


class Background:
    """One thread for after-compile work; ``engine_idle()``: whether the engine has nothing to compute."""

    def __init__(self, engine_idle) -> None:
        self._engine_idle = engine_idle
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="maskd-after")
        self._closing = threading.Event()

    def later(self, task, *args) -> None:
        """Run ``task`` on the thread; a failure is logged (nothing waits on it)."""
        def run():
            try:
                task(*args)
            except _Closed:
                pass
            except Exception:  # noqa: BLE001 - a cache write or a warm-up lost, never a request
                log.exception("background grammar task %s failed", getattr(task, "__qualname__", task))
        try:
            self._thread.submit(run)
        except RuntimeError:  # closed meanwhile: the disk write or warm-up is skipped
            pass

    def wait_idle(self) -> None:
        """Wait while the engine computes (not once closing)."""
        while not self._engine_idle() and not self._closing.is_set():
            time.sleep(0.005)

    def pause(self) -> None:
        """Between two pieces of a warm-up: wait while the engine computes, then let it take the GIL
        first; _Closed once closing."""
        self.wait_idle()
        if self._closing.is_set():
            raise _Closed
        time.sleep(0)

    def drain(self) -> None:
        """Wait until the work queued so far is done (benchmarks time each compile alone)."""
        try:
            self._thread.submit(lambda: None).result()
        except RuntimeError:  # closed
            pass

    def close(self) -> None:
        self._closing.set()
        self._thread.shutdown(wait=True)
