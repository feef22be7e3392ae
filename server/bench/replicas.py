"""maskd replicas behind sglang-router (the SGLang Model Gateway), all on 127.0.0.1, for the router
test and benchmark. maskd runs no router of its own: this starts the `sglang-router` package's
launcher (`python -m sglang_router.launch_router`) in front of `maskd serve` subprocesses.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager

import httpx

from server.bench.live_server import _free_port, live_server


def router_command(worker_urls: list[str], port: int, policy: str, prometheus_port: int) -> list[str]:
    """The router's command line: the README's recipe, on loopback ports of its own."""
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(prometheus_port), "--log-level", "warn"]


@contextmanager
def sglang_router(worker_urls: list[str], policy: str = "cache_aware", timeout: float = 120):
    """Yields the router's base URL once it reports ready (its workers registered and healthy)."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="sglang-router-", suffix=".log", delete=False)
    proc = subprocess.Popen(router_command(worker_urls, port, policy, _free_port()),
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{url}/readiness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"sglang-router was not ready in {timeout}s; see {log.name}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextmanager
def replicas(n: int, *flags: str, timeout: float = 600):
    """Yields the base URLs of n `maskd serve` replicas (started one after another: on a small CPU
    machine loading them side by side is no faster)."""
    with ExitStack() as stack:
        yield [stack.enter_context(live_server(*flags, timeout=timeout))[0] for _ in range(n)]
