"""StepCompiler: compiles the DecodeStep's group of layers (torch.compile, inductor) before the engine serves.

`run()` drives the step over scratch KV tensors (never the engine's) in each shape class a real pass
can take: one row or several, one slot allocated or several. Dimensions are dynamic, so each class
compiles once. Inductor's caches live on disk (``cache_dir``, default ~/.cache/maskd/inductor), so a
restart reads the kernels instead of compiling them again (SmolLM2: about 20 s cold, less warm).

Compiled at startup, not in the background while requests are served eagerly: the compiled and
the eager step round differently (bfloat16 matmuls amplify it), and a greedy request must give
the same tokens whenever it comes; a compile beside a running step also changed that step's tokens.

A ready step runs with torch's "fail_on_recompile" stance: a shape no class covers raises instead
of compiling on the request path, and the runner then runs that pass eagerly (`failed`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
import types
from pathlib import Path

import torch

from engine.decode_step import DecodeStep
from engine.omp_team import engine_threads

log = logging.getLogger("maskd.engine")

DEFAULT_CACHE = Path.home() / ".cache" / "maskd" / "inductor"
SCRATCH_COLUMNS = 40  # columns of the scratch KV the warm-up passes write
# (rows, slots allocated, attending over every column): one and several of each, and a pass whose
# width is the whole capacity (its slice is the whole tensor: another graph)
CLASSES = ((1, 1, False), (1, 2, False), (2, 2, False), (1, 2, True), (2, 2, True))


class StepCompiler:
    def __init__(self, step: DecodeStep, kv_heads: tuple[int, ...], head_dims: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device, cache_dir: str | Path | None = None):
        self.step, self.kv_heads, self.head_dims = step, kv_heads, head_dims
        self.dtype, self.device = dtype, device
        self.cache_dir = Path(cache_dir) if cache_dir else DEFAULT_CACHE
        self.group = None  # the compiled DecodeStep.run_group
        self.compiled = None  # the step running it (a callable as DecodeStep's), once every class is compiled
        self.seconds: float | None = None  # how long the compile took, once done
        self.error: str | None = None
        self.fallbacks = 0  # passes the compiled step refused (a shape it was not compiled for)

    def run(self) -> None:
        """Compiles every class, on a thread computing on as many threads as the engine's will (the
        number is a guard of the graph). A failure leaves the eager step serving, and says why."""
        worker = threading.Thread(target=self._compile, name="maskd-compile")
        worker.start()  # its OpenMP team ends with it (engine/omp_team.py)
        worker.join()

    def _compile(self) -> None:
        engine_threads()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.cache_dir)
        started = time.perf_counter()
        try:
            # the layers' modules do not change once compiled: their guards are dropped (a step
            # checks ~250 parameters' guards otherwise, ~1.5 ms); so that no other model's layers
            # can match them, this step's group has a code object (dynamo's cache) of its own
            self.group = torch.compile(_own_code(self.step.run_group), dynamic=True,
                                       options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                                "size_asserts": False})
            # no duck sizing: a scratch size equal to another (capacity and head_dim both 64, slots and
            # rows both 2) would be traced as one symbol, and the real shapes, which differ, recompile
            with torch.fx.experimental._config.patch(use_duck_shape=False):
                for rows, slots, full in CLASSES:
                    self._drive(rows, slots, full)
        except Exception as exc:  # the eager step keeps serving
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("compiling the decode step failed, decode stays eager: %s", self.error)
            print(f"maskd: compiling the decode step failed ({self.error}); decode stays eager",
                  file=sys.stderr, flush=True)
            return
        self.seconds = time.perf_counter() - started
        self.compiled = functools.partial(self._guarded, self.group)
        print(f"maskd: decode step compiled in {self.seconds:.1f}s (inductor cache {self.cache_dir})",
              file=sys.stderr, flush=True)

    def refused(self, exc: Exception) -> None:
        """A pass the compiled step refused (it runs eagerly); the first one is logged with its reason."""
        self.fallbacks += 1
        if self.fallbacks == 1:
            log.warning("a decode pass ran eagerly, the compiled step refused it: %s", exc)

    def _guarded(self, group, *args) -> torch.Tensor:
        with torch.compiler.set_stance("fail_on_recompile"):
            return self.step(*args, group_fn=group)

    @torch.inference_mode()
    def _drive(self, rows: int, slots: int, full: bool) -> None:
        keys = [torch.zeros(slots, h, SCRATCH_COLUMNS, d, dtype=self.dtype, device=self.device)
                for h, d in zip(self.kv_heads, self.head_dims)]
        values = [torch.zeros_like(k) for k in keys]
        ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        positions = torch.arange(rows, dtype=torch.long, device=self.device) + 3
        where = torch.arange(rows, dtype=torch.long, device=self.device) % slots
        width = SCRATCH_COLUMNS if full else SCRATCH_COLUMNS // 2
        self.step(ids, positions, where, keys, values, width, group_fn=self.group)


def _own_code(method):
    """A copy of a bound method whose function has a code object of its own."""
    fn = method.__func__
    fresh = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(fresh, method.__self__)
