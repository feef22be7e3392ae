"""The FastAPI application: routes, error handlers, and the engine's lifetime."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sse_starlette.sse import EventSourceResponse

from server import chat, completions
from server.completions import CompletionRequest
from server.errors import install_error_handlers
from server.protocol import ChatCompletionRequest
from server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.engine.start()
        yield
        state.engine.shutdown()

    app = FastAPI(title="maskd", lifespan=lifespan)
    app.state.maskd = state
    started = int(time.time())
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": state.model_name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": started, "owned_by": "maskd",
            "context_length": state.context_length, "tool_format": state.tool_format}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        if not body.stream:
            return await chat.complete(state, body)
        payloads = await chat.stream(state, body)
        return EventSourceResponse(_as_sse(payloads), ping=15)

    @app.post("/v1/completions")
    async def text_completions(body: CompletionRequest):
        if not body.stream:
            return await completions.complete_text(state, body)
        return EventSourceResponse(_as_sse(await completions.stream_text(state, body)), ping=15)

    return app


async def _as_sse(payloads):
    async for payload in payloads:
        yield {"data": payload}
