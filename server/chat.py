"""POST /v1/chat/completions: a request becomes an engine request; events become one response or SSE chunks."""

from __future__ import annotations

import json
import time
import uuid
from typing import AsyncIterator

from engine.sampling import SamplingParams
from engine.sequence import Event, Request
from server.errors import APIError, error_body
from server.prompt import message_dicts, render_chat
from server.protocol import (ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice,
                             ChunkChoice, Delta, ResponseMessage, Usage)
from server.state import ServerState

FINGERPRINT = "maskd-0.1"


def build_request(state: ServerState, body: ChatCompletionRequest) -> Request:
    if body.model != state.model_name:
        raise APIError(f"model {body.model!r} is not served here; this server serves {state.model_name!r}",
                       status=404, param="model", code="model_not_found", type="not_found_error")
    if body.tools and body.tool_choice != "none":
        raise APIError("tool calling is not available yet; send tool_choice 'none' or no tools",
                       param="tools", code="unsupported")
    if body.response_format and body.response_format.type != "text":
        raise APIError("response_format json_object/json_schema is not available yet",
                       param="response_format", code="unsupported")
    prompt_ids = render_chat(state.tokenizer, message_dicts(body.messages))
    room = state.context_length - len(prompt_ids)
    if room <= 0:
        raise APIError(f"the prompt is {len(prompt_ids)} tokens, the model's context is {state.context_length}; "
                       "shorten the messages", param="messages", code="context_length_exceeded")
    budget = body.output_budget()
    if budget is not None and budget > room:
        raise APIError(f"max_tokens {budget} + prompt {len(prompt_ids)} tokens exceed the context of "
                       f"{state.context_length}; ask for at most {room}", param="max_tokens",
                       code="context_length_exceeded")
    params = SamplingParams(max_tokens=budget or room, temperature=body.temperature, top_p=body.top_p,
                            top_k=body.top_k, seed=body.seed, stop=body.stop or [], ignore_eos=body.ignore_eos)
    return Request(prompt_ids=prompt_ids, params=params)


def usage_of(event: Event) -> Usage:
    return Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                 total_tokens=event.prompt_tokens + event.completion_tokens,
                 prompt_tokens_details={"cached_tokens": event.cached_tokens})


def _raise_engine_error(event: Event) -> None:
    if event.finish_reason == "error":
        raise APIError(f"generation failed: {event.error}", status=500, type="server_error")


async def complete(state: ServerState, body: ChatCompletionRequest) -> ChatCompletion:
    request = build_request(state, body)
    text, last = [], None
    async for event in state.engine.generate(request):
        text.append(event.text)
        last = event
    _raise_engine_error(last)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
        system_fingerprint=FINGERPRINT,
        choices=[Choice(message=ResponseMessage(content="".join(text)), finish_reason=last.finish_reason)],
        usage=usage_of(last))


async def stream(state: ServerState, body: ChatCompletionRequest) -> AsyncIterator[str]:
    """SSE `data:` payloads, the last one `[DONE]`. Validation happens before the first chunk."""
    request = build_request(state, body)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    head = dict(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
                system_fingerprint=FINGERPRINT)

    def chunk(delta: Delta, finish: str | None = None) -> str:
        choice = ChunkChoice(delta=delta, finish_reason=finish)
        return ChatCompletionChunk(**head, choices=[choice]).model_dump_json(exclude_none=True)

    generated = state.engine.generate(request)  # submits now: a full queue is a 429, not a broken stream

    async def events() -> AsyncIterator[str]:
        yield chunk(Delta(role="assistant", content=""))
        async for event in generated:
            if event.finish_reason == "error":
                yield json.dumps(error_body(f"generation failed: {event.error}", "server_error"))
                break
            if event.text:
                yield chunk(Delta(content=event.text))
            if event.finish_reason:
                yield chunk(Delta(), event.finish_reason)
                if include_usage:
                    yield ChatCompletionChunk(**head, choices=[], usage=usage_of(event)).model_dump_json()
        yield "[DONE]"

    return _cancel_on_exit(events(), state, request.request_id)


async def _cancel_on_exit(payloads: AsyncIterator[str], state: ServerState, request_id: int) -> AsyncIterator[str]:
    """A client gone before the first engine event never started the engine's iterator, whose own
    cancel-on-close thus never runs: cancel here (a no-op once the request finished)."""
    try:
        async for payload in payloads:
            yield payload
    finally:
        state.engine.cancel(request_id)
