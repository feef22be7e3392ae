"""Where the serving process collects garbage: never inside a step's masks and pick.

CPython's cyclic collector runs when the count of new container objects crosses a threshold
(700), wherever in the code that happens. Measured in maskd's process (SmolLM2, 2 cores):
- ~420k objects live from startup on (the model's modules, torch, transformers, the tokenizer,
  the JSON automaton's tables); a full collection walks them all: 265-320 ms.
- a young collection (700-1,400 objects, mostly the memo keys and masks of states visited for the
  first time) took 90-380 µs; replaying first visits, one started inside a step's mask or pick
  every ~400 steps (6 of ~54 collections in three cold passes of mask_bench's replay).

So, as vLLM freezes its heap after warm-up:
- ``freeze_startup()`` moves what startup made into the permanent generation, which no collection
  walks again (`maskd serve` calls it just before it listens; a full collection then took 0.01 ms);
- ``no_collection()`` is the engine's window over a step's masks and pick: a collection that falls
  due inside it runs at the next allocation after it, and CPython's thresholds and generations
  decide as before. None is skipped or added: on CPU the step costs the same; the masks are not
  stretched.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_LOCK = threading.Lock()
_open = 0  # windows open now (the engine's, and mask_bench's replay, which times the same part)
_restore = False  # whether the collector was enabled when the first of them opened


def freeze_startup() -> int:
    """Collect once, then freeze every object alive; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def no_collection():
    """No automatic collection while the block runs (in any thread; nests). One that falls due runs
    after the last window closes, at the next allocation; where the collector was disabled
    already, it stays so."""
    global _open, _restore
    with _LOCK:
        if _open == 0:
            _restore = gc.isenabled()
            gc.disable()
        _open += 1
    try:
        yield
    finally:
        with _LOCK:
            _open -= 1
            if _open == 0 and _restore:
                gc.enable()
