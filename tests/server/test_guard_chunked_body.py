"""A chunked request body (no Content-Length) is read by the Guard in time linear in its size.

The Guard reads such a body itself to bound it (--max-body-mb). It grew it with `body += chunk`, which
copies the whole body at every chunk: a 30 MiB body sent in 64 KiB chunks took 0.6-1.6 s on the event
loop and a /health poll beside it 150 ms (79 ms with a Content-Length). Here 1024 chunks of 32 KiB
pass through it: quadratic, that is 17 GB of copying (seconds); linear, 32 MiB.
"""

from __future__ import annotations

import asyncio
import time

from server.guards import Guard

CHUNK, CHUNKS = b"x" * (32 << 10), 1024


def test_a_chunked_body_is_joined_once_and_handed_over_whole():
    seen = {}

    async def app(scope, receive, send):
        message = await receive()
        seen["body"], seen["more"] = message["body"], message["more_body"]

    messages = [{"type": "http.request", "body": CHUNK, "more_body": i > 0} for i in range(CHUNKS)]  # pop(): last first

    async def receive():
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message):
        raise AssertionError(f"the guard answered by itself: {message}")

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    started = time.perf_counter()
    asyncio.run(Guard(app, api_key=None, max_body_bytes=64 << 20)(scope, receive, send))
    took = time.perf_counter() - started
    assert seen["body"] == CHUNK * CHUNKS and seen["more"] is False
    assert took < 0.5, f"reading a 32 MiB chunked body took {took:.2f} s"


def test_a_chunked_body_over_the_limit_is_a_413_before_the_handler():
    sent = []

    async def app(scope, receive, send):
        raise AssertionError("the handler ran")

    messages = [{"type": "http.request", "body": CHUNK, "more_body": True} for _ in range(40)]

    async def receive():
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    asyncio.run(Guard(app, api_key=None, max_body_bytes=1 << 20)(scope, receive, send))
    assert sent[0]["status"] == 413
