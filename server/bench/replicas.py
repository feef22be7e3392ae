"""maskd replicas behind sglang-router (the SGLang Model Gateway), all on 127.0.0.1, for the router
test and benchmark. maskd runs no router of its own: this starts the `sglang-router` package's
launcher (`python -m sglang_router.launch_router`) in front of `maskd serve` subprocesses.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack, contextmanager

from server.bench.live_server import _free_port, live_server, ready_process


def router_command(worker_urls: list[str], port: int, policy: str, prometheus_port: int) -> list[str]:
    """The router's command line: the README's recipe, on loopback ports of its own."""
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(prometheus_port), "--log-level", "warn"]


@contextmanager
def sglang_router(worker_urls: list[str], policy: str = "cache_aware", timeout: float = 120):
    """Yields the router's base URL once it reports ready (its workers registered and healthy)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with ready_process(router_command(worker_urls, port, policy, _free_port()), url, "/readiness", "sglang-router",
                       timeout):
        yield url


@contextmanager
def replicas(n: int, *flags: str, timeout: float = 600):
    """Yields the base URLs of n `maskd serve` replicas (started one after another: on a small CPU
    machine loading them side by side is no faster)."""
    with ExitStack() as stack:
        yield [stack.enter_context(live_server(*flags, timeout=timeout))[0] for _ in range(n)]
