"""StepCompiler: compiles the DecodeStep's layer (torch.compile, inductor) off the request path.

`start()` compiles on a background thread, driving the step over scratch KV tensors (never the
engine's) in each shape class a real pass can take: one row or several, one slot allocated or
several. Dimensions are dynamic, so each class compiles once; until every class is ready,
`ready()` answers None and the runner uses the eager step. Inductor's caches live on disk
(``cache_dir``, default ~/.cache/maskd/inductor), so a restart reads the kernels instead of
compiling them again.

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
from pathlib import Path

import torch

from engine.decode_step import DecodeStep
from engine.omp_team import engine_threads

log = logging.getLogger("maskd.engine")

DEFAULT_CACHE = Path.home() / ".cache" / "maskd" / "inductor"
SCRATCH_COLUMNS = 40  # columns of the scratch KV the warm-up passes write
CLASSES = ((1, 1), (1, 2), (2, 2))  # (rows, slots allocated): one and several of each


class StepCompiler:
    def __init__(self, step: DecodeStep, kv_heads: tuple[int, ...], head_dims: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device, cache_dir: str | Path | None = None):
        self.step, self.kv_heads, self.head_dims = step, kv_heads, head_dims
        self.dtype, self.device = dtype, device
        self.cache_dir = Path(cache_dir) if cache_dir else DEFAULT_CACHE
        self.layer = None  # the compiled DecodeStep._layer
        self.compiled = None  # the step running it, once every class is compiled
        self.seconds: float | None = None  # how long the compile took, once done
        self.error: str | None = None
        self.fallbacks = 0  # passes a ready step refused (a shape it was not compiled for)
        self._thread: threading.Thread | None = None

    def ready(self, rows: int, slots: int):
        """The compiled step (a callable as DecodeStep's) once it is compiled, else None."""
        return self.compiled

    def start(self) -> None:
        """Compiles in the background; the log says when it is ready (or why it failed)."""
        self._thread = threading.Thread(target=self.run, name="maskd-compile", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        engine_threads()  # compiled for the engine thread's number of threads (a guard of the graph)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.cache_dir))
        started = time.perf_counter()
        try:
            # the layer's modules do not change once compiled: their guards are dropped (a step
            # checks ~250 parameters' guards otherwise, ~1.5 ms)
            self.layer = torch.compile(self.step._layer, dynamic=True,
                                       options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                                "size_asserts": False})
            # no duck sizing: a scratch size equal to another (capacity and head_dim both 64, slots and
            # rows both 2) would be traced as one symbol, and the real shapes, which differ, recompile
            with torch.fx.experimental._config.patch(use_duck_shape=False):
                for rows, slots in CLASSES:
                    self._drive(rows, slots)
        except Exception as exc:  # the eager step keeps serving
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("compiling the decode step failed, decode stays eager: %s", self.error)
            print(f"maskd: compiling the decode step failed ({self.error}); decode stays eager",
                  file=sys.stderr, flush=True)
            return
        self.seconds = time.perf_counter() - started
        self.compiled = functools.partial(self._guarded, self.layer)
        print(f"maskd: decode step compiled in {self.seconds:.1f}s (inductor cache {self.cache_dir})",
              file=sys.stderr, flush=True)

    def _guarded(self, layer, *args) -> torch.Tensor:
        with torch.compiler.set_stance("fail_on_recompile"):
            return self.step(*args, layer_fn=layer)

    @torch.inference_mode()
    def _drive(self, rows: int, slots: int) -> None:
        keys = [torch.zeros(slots, h, SCRATCH_COLUMNS, d, dtype=self.dtype, device=self.device)
                for h, d in zip(self.kv_heads, self.head_dims)]
        values = [torch.zeros_like(k) for k in keys]
        ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        positions = torch.arange(rows, dtype=torch.long, device=self.device) + 3
        where = torch.arange(rows, dtype=torch.long, device=self.device) % slots
        self.step(ids, positions, where, keys, values, SCRATCH_COLUMNS // 2, layer_fn=self.layer)
