"""What stands between the network and the handlers: the API key, the body size limit, and the
watch that cancels a non-streamed request whose client has gone.

- `--api-key KEY`: every route but /health and /metrics needs `Authorization: Bearer KEY` (OpenAI
  clients) or `x-api-key: KEY` (Anthropic clients); otherwise a 401 in the API's error shape.
- `--max-body-mb`: a body larger than this is a 413 before it is parsed (counted as it arrives, so
  a chunked body without a Content-Length is bounded too).
- A non-streamed request runs as a task beside a watch on the connection: a client that hangs up
  cancels it, and with it the engine request (streamed ones are cancelled when the stream closes).
"""

from __future__ import annotations

import asyncio
import hmac
import json

from fastapi import Request
from fastapi.responses import JSONResponse

from server.errors import error_body

OPEN_PATHS = ("/health", "/metrics")


class Guard:
    """Pure ASGI middleware: the API key and the body limit, checked before any handler runs."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and not path.startswith(OPEN_PATHS) and scope["method"] != "OPTIONS" \
                and not self._authorized(headers):
            return await _reply(send, path, 401, "authentication_error", "invalid or missing API key: send "
                                "`Authorization: Bearer <key>` or `x-api-key: <key>`")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await _reply(send, path, 413, "invalid_request_error", self._too_large())
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):  # chunked: read it here, bounded
            chunks, size, more = [], 0, True  # joined once: `body += chunk` copied the body per chunk
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                more = message.get("more_body", False)
                if size > self.max_body_bytes:
                    return await _reply(send, path, 413, "invalid_request_error", self._too_large())
            receive = _replay(b"".join(chunks), receive)
        await self.app(scope, receive, send)

    def _authorized(self, headers: dict) -> bool:
        given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), self.api_key.encode())

    def _too_large(self) -> str:
        return f"the request body exceeds {self.max_body_bytes} bytes (--max-body-mb); send a smaller one"


def _replay(body: bytes, receive):
    """A receive() that hands over the already-read body once, then defers to the connection."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


async def _reply(send, path: str, status: int, kind: str, message: str) -> None:
    body = error_body(message, kind)
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": kind if status != 413 else "request_too_large", "message": message}}
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def unless_gone(request: Request, work):
    """Awaits the coroutine `work`; if the client disconnects first, cancels it and answers 499
    (nobody reads it: the status is for the access log)."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
            return JSONResponse(error_body("the client closed the request", "invalid_request_error"),
                                status_code=499)
