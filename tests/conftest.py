"""Shared fixtures: one live `maskd serve` per test session, and the embedded model's tokenizer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see server/cli.py

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def server_url(tmp_path_factory):
    """Starts the real server on a free port and waits until /health answers."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 1800  # a busy machine may load slowly: only a dead server fails here
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"maskd serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"maskd serve did not come up in time:\n{log_path.read_text()[-3000:]}")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def client(server_url):
    from openai import OpenAI
    return OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=1800)


@pytest.fixture
def async_client(server_url):
    """Per test: an async client's connections belong to the event loop of the test that used it."""
    from openai import AsyncOpenAI
    return AsyncOpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=1800)


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The embedded model's tokenizer, read from its GGUF file (no network)."""
    from transformers import AutoTokenizer

    from engine.registry import load_registry
    where, gguf = load_registry().get(MODEL).locate()
    return AutoTokenizer.from_pretrained(where, gguf_file=gguf, local_files_only=True)
