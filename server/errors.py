"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
import secrets

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine.scheduler import QueueFull

log = logging.getLogger("maskd.server")


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.type = message, status, param, code, type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   504: "timeout_error", 529: "overloaded_error"}


def shaped(request: Request, body: dict, status: int) -> JSONResponse:
    """OpenAI's error shape, or Anthropic's ({"type": "error", "error": {"type", "message"}}) on
    /v1/messages, whose clients read that one."""
    if request.url.path.startswith("/v1/messages"):
        error = body["error"]
        body = {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, error["type"]),
                                           "message": error["message"]}}
    return JSONResponse(body, status_code=status)


def _field_path(loc: tuple) -> str:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("tagged-union", "union")):
            continue
        else:
            path += ("." if path else "") + str(part)
    return path


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return shaped(request, exc.body(), exc.status)

    @app.exception_handler(QueueFull)
    async def _queue_full(request: Request, exc: QueueFull):
        response = shaped(request, error_body(str(exc), "rate_limit_error", None, "queue_full"), 429)
        response.headers["Retry-After"] = "1"  # clients (openai, anthropic SDKs) back off and retry
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        param = _field_path(tuple(first.get("loc", ()))) or None
        message = first.get("msg", "invalid request")
        if param:
            message = f"{param}: {message}"
        return shaped(request, error_body(message, "invalid_request_error", param, "invalid_value"), 400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return shaped(request, error_body(str(exc.detail), kind), exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        incident = secrets.token_hex(8)  # the log has the details; the client gets no internals
        log.exception("unhandled error, incident %s", incident)
        return shaped(request, error_body(f"internal error (incident {incident}); the server log has the "
                                          "details", "server_error"), 500)
