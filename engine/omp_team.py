"""One OpenMP team per process, the engine thread's.

libgomp keeps a pool of worker threads for every thread that has run a parallel region, for as
long as that thread lives. Once the threads of all pools outnumber the cores, every worker waits
for the next region by sleeping instead of spinning, and each of the ~1,000 parallel regions of a
decode step then pays a wake-up (measured: 210 int4 matmuls of SmolLM2 took 18 ms from the engine
thread after the main thread had used two threads, 5 ms without that). So a process that steps an
Engine on its own thread computes on one thread everywhere else: `single_main()` first thing (before
any torch op: the model load then runs on one core), and the engine thread takes the cores back
with `engine_threads()`.
"""

from __future__ import annotations

import torch

_cores: int | None = None


def single_main() -> None:
    """This thread (and every other but the engine's) computes on one thread from now on."""
    global _cores
    if _cores is None:
        _cores = torch.get_num_threads()
    torch.set_num_threads(1)


def engine_threads() -> None:
    """Called on the engine thread: it computes on every core single_main() found (or as many as
    torch uses now, where single_main() was not called)."""
    if _cores is not None:
        torch.set_num_threads(_cores)


def cores() -> int:
    """The threads the engine computes on (what a peer measured beside it should get too)."""
    return _cores if _cores is not None else torch.get_num_threads()
