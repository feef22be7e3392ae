"""SIGTERM drains: a stream running when the server is told to stop finishes, then the process exits 0.

Its own short-lived `maskd serve` (the session's server must outlive this test)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import MODEL, ROOT, free_port


@pytest.fixture
def own_server(tmp_path):
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--log-level", "info"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 1800
    while proc.poll() is None and time.time() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"maskd serve did not come up:\n{log_path.read_text()[-3000:]}")
    yield url, proc, log_path
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_lets_running_requests_finish_then_exits_0(own_server):
    url, proc, log_path = own_server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 40, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    plain = {}  # a non-streamed request beside the stream, in flight when the signal comes
    thread = threading.Thread(target=lambda: plain.update(reply=httpx.post(
        f"{url}/v1/chat/completions", json={**body, "stream": False}, timeout=1800)))
    thread.start()
    payloads = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data:"):
                continue
            payloads.append(line.removeprefix("data:").strip())
            if len(payloads) == 3:  # the role chunk and two tokens: well inside the stream
                proc.send_signal(signal.SIGTERM)
    assert payloads[-1] == "[DONE]", f"the stream was cut: {payloads[-3:]}\n{log_path.read_text()[-2000:]}"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    thread.join(timeout=1800)
    assert plain["reply"].status_code == 200 and plain["reply"].json()["usage"]["completion_tokens"] == 40
    assert proc.wait(timeout=1800) == 0, log_path.read_text()[-2000:]
