"""The FastAPI application: routes, error handlers, and the engine's lifetime."""

from __future__ import annotations

import math
import time
from contextlib import asynccontextmanager

import asyncio

from fastapi import FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse

from server import chat, completions, messages, output_check, responses
from server.anthropic_protocol import CountTokensRequest, MessagesRequest
from server.completions import CompletionRequest
from server.errors import install_error_handlers
from server.grammar_metrics import grammar_metrics_text
from server.guards import Guard, unless_gone
from server.protocol import ChatCompletionRequest
from server.responses import ResponseStore
from server.responses_protocol import ResponsesRequest
from server.router_metrics import router_metrics_text
from server.state import ServerState
from server.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize


def create_app(state: ServerState, api_key: str | None = None, max_body_bytes: int = 32 << 20,
               cors_origins: tuple[str, ...] = ()) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.engine.start()
        yield
        state.engine.shutdown()

    if state.responses is None:
        state.responses = ResponseStore(1000)
    app = FastAPI(title="maskd", lifespan=lifespan)
    app.state.maskd = state
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes)
    if cors_origins:  # outermost: preflight requests are answered before the key is asked for
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    started = int(time.time())
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": state.model_name}

    @app.get("/metrics")
    async def metrics():
        body = state.engine.metrics.render() + grammar_metrics_text(state.compiler) + \
            generate_latest(output_check.REGISTRY) + router_metrics_text(state.engine, state.model_name)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/server_info")
    async def server_info():
        """What sglang-router (smg) asks a worker when it registers it: the model it serves."""
        return {"served_model_name": state.model_name, "max_running_requests": state.engine.scheduler.max_batch,
                "context_length": state.context_length, "version": "maskd"}

    @app.get("/debug/integrity")
    async def integrity():
        """Runs the scheduler's and prefix cache's check_integrity() on the engine thread."""
        scheduler = state.engine.scheduler

        def check() -> tuple[int, int]:  # counted on the engine thread, between steps: a request being
            scheduler.check_integrity()  # admitted is in no list for a moment, and read from here was 0
            return scheduler.num_running, len(scheduler.waiting)
        try:
            running, waiting = await asyncio.wrap_future(state.engine.call(check))
        except AssertionError as exc:
            return JSONResponse({"ok": False, "error": f"check_integrity failed: {exc}"}, status_code=500)
        cache = scheduler.prefix_cache
        return {"ok": True, "running": running, "waiting": waiting,
                "prefix_cache_bytes": cache.size_bytes if cache else 0,
                "prefix_cache_budget_bytes": cache.budget_bytes if cache else 0}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": started, "owned_by": "maskd",
            "context_length": state.context_length, "tool_format": state.tool_format}]}

    async def answer(request: Request, body, complete, stream, data_only: bool):
        """One generation route: a full queue answers 429 before any prompt is rendered; a plain
        answer is cancelled if its client goes; a stream is SSE (OpenAI's chat and completions send
        `data:` lines only, Messages and Responses name each event)."""
        state.engine.check_room()
        if not body.stream:
            return await unless_gone(request, complete(state, body))
        payloads = await stream(state, body)
        # sse-starlette ends every stream the moment uvicorn gets SIGTERM; a running stream should
        # finish instead (uvicorn waits for it), which the request's own deadline bounds
        return EventSourceResponse(_as_sse(payloads) if data_only else payloads, ping=15,
                                   shutdown_grace_period=state.request_timeout or math.inf)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await answer(request, body, chat.complete, chat.stream, data_only=True)

    @app.post("/v1/completions")
    async def text_completions(body: CompletionRequest, request: Request):
        return await answer(request, body, completions.complete_text, completions.stream_text, data_only=True)

    @app.post("/v1/messages")
    async def anthropic_messages(body: MessagesRequest, request: Request):
        return await answer(request, body, messages.complete, messages.stream, data_only=False)

    @app.post("/v1/messages/count_tokens")
    async def anthropic_count_tokens(body: CountTokensRequest):
        return await messages.count_tokens(state, body)

    @app.post("/v1/responses")
    async def openai_responses(body: ResponsesRequest, request: Request):
        return await answer(request, body, responses.complete, responses.stream, data_only=False)

    @app.get("/v1/responses/{response_id}")
    async def openai_response(response_id: str):
        return responses.retrieve(state, response_id)

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest):
        return await tokenize(state, body)

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest):
        return await detokenize(state, body)

    return app


async def _as_sse(payloads):
    async for payload in payloads:
        yield {"data": payload}
