"""A `maskd serve` subprocess on a free loopback port, for the benchmarks that go through HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the directory holding this `server` package


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_server(*flags: str, timeout: float = 300, models: str | None = None):
    """Yields (base_url, process); the server runs with this checkout's code and the given flags
    (``models``: a registry path, passed before the subcommand)."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="maskd-serve-", suffix=".log", delete=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    registry = ["--models", models] if models else []
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", *registry, "serve", "--port", str(port),
                             "--log-level", "warning", *flags], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"maskd serve exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"maskd serve did not come up in {timeout}s; see {log.name}")
            time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def metric(url: str, name: str) -> float:
    """One sample's value from /metrics (the first line that starts with `name `)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(f"{name} not in /metrics")
