"""Startup and memory for `maskd bench --suite speed`: `maskd serve` until /health answers and its
resident memory after one request, the float32 eager engine of before, and a llama-cpp-python
process holding the same GGUF."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server.bench.context import BenchContext


def serve(ctx: BenchContext, extra: list[str], registry: str | None) -> dict:
    """Starts `maskd serve`, times it until /health answers, reads its resident memory, stops it."""
    import httpx

    from server.bench.live_server import _free_port

    port = _free_port()
    command = [sys.executable, "-m", "server.cli", *(["--models", registry] if registry else []), "serve",
               "--port", str(port), "--log-level", "warning", *(["--model", ctx.model] if ctx.model else []), *extra]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < 1800:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        seconds = time.perf_counter() - started
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=600,
                   json={"prompt": "Hello", "max_tokens": 16, "temperature": 0})
        return {"seconds": seconds, "rss_mb": _rss_mb(proc.pid)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def llama_rss_mb(gguf: str) -> float:
    from engine.omp_team import cores

    code = (f"import llama_cpp, pathlib; m = llama_cpp.Llama({gguf!r}, n_ctx=4096, n_threads={cores()}, verbose=False); "
            "m.create_completion('Hello', max_tokens=16, temperature=0); "
            "[print(l.split()[1]) for l in pathlib.Path('/proc/self/status').read_text().splitlines() if l.startswith('VmRSS:')]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    return int(out.stdout.split()[-1]) / 1024


def before_registry(ctx: BenchContext) -> str:
    """A registry whose model is the one benchmarked, at float32 and unquantized (the engine before)."""
    import yaml

    from engine.registry import load_registry

    registry = load_registry(ctx.models)
    spec = registry.get(ctx.model)
    entry = {k: v for k, v in vars(spec).items() if v is not None}
    entry.update(dtype="float32", quantization="none")
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump({"default": spec.name, "models": [entry]}, handle)
    handle.close()
    return handle.name
