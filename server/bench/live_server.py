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
def ready_process(command: list[str], url: str, ready_path: str, name: str, timeout: float, **popen):
    """Starts ``command`` (output to a temporary log) and yields its process once GET url+ready_path
    answers 200; raises, naming the log, if it exits or is not ready within ``timeout`` seconds.
    Terminated (then killed) on exit."""
    log = tempfile.NamedTemporaryFile("w+", prefix=f"{name.replace(' ', '-')}-", suffix=".log", delete=False)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{url}{ready_path}", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{name} was not ready in {timeout}s; see {log.name}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextmanager
def live_server(*flags: str, timeout: float = 300, models: str | None = None):
    """Yields (base_url, process); the server runs with this checkout's code and the given flags
    (``models``: a registry path, passed before the subcommand)."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    registry = ["--models", models] if models else []
    command = [sys.executable, "-m", "server.cli", *registry, "serve", "--port", str(port), "--log-level", "warning",
               *flags]
    url = f"http://127.0.0.1:{port}"
    with ready_process(command, url, "/health", "maskd serve", timeout, cwd=ROOT, env=env) as proc:
        yield url, proc


def metric(url: str, name: str) -> float:
    """One sample's value from /metrics (the first line that starts with `name `)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(f"{name} not in /metrics")
