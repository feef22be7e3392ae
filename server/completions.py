"""POST /v1/completions: a raw prompt (text or token ids) continued, plain or streamed."""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from pydantic import BaseModel, Field, field_validator

from engine.sequence import Request
from server.chat import usage_of
from server.errors import APIError
from server.protocol import SamplingRequest, Usage
from server.state import ServerState


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value):
        if value:
            raise ValueError("echo is not supported by maskd; omit it or send false")
        return value

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError("send one prompt per request (a string or a list of token ids)")
            value = value[0]
        if isinstance(value, list) and not value:
            raise ValueError("the prompt is empty")
        return value


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


def _request(state: ServerState, body: CompletionRequest) -> Request:
    state.require_model(body.model)
    if isinstance(body.prompt, str):
        ids = state.tokenizer.encode(body.prompt, add_special_tokens=True)
    else:
        ids = list(body.prompt)
        if any(t < 0 or t >= state.vocabulary.size for t in ids):
            raise APIError(f"prompt token ids must lie in [0, {state.vocabulary.size})", param="prompt")
    room = state.context_length - len(ids)
    if body.max_tokens > room:
        raise APIError(f"max_tokens {body.max_tokens} + prompt {len(ids)} tokens exceed the context of "
                       f"{state.context_length}; ask for at most {max(room, 0)}", param="max_tokens",
                       code="context_length_exceeded")
    return Request(prompt_ids=ids, params=body.sampling_params(body.max_tokens, state.vocabulary.size))


async def complete_text(state: ServerState, body: CompletionRequest) -> Completion:
    request = _request(state, body)
    pieces, last = [], None
    async for last in state.engine.generate(request):
        pieces.append(last.text)
    if last.finish_reason == "error":
        raise APIError(f"generation failed: {last.error}", status=500, type="server_error")
    return Completion(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
                      choices=[CompletionChoice(text="".join(pieces), finish_reason=last.finish_reason)],
                      usage=usage_of(last))


async def stream_text(state: ServerState, body: CompletionRequest) -> AsyncIterator[str]:
    request = _request(state, body)
    head = dict(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events() -> AsyncIterator[str]:
        async for event in state.engine.generate(request):
            if event.text or event.finish_reason:
                choice = CompletionChoice(text=event.text, finish_reason=event.finish_reason)
                yield Completion(**head, choices=[choice]).model_dump_json(exclude_none=True)
            if event.finish_reason and include_usage:
                yield Completion(**head, choices=[], usage=usage_of(event)).model_dump_json()
        yield "[DONE]"

    return events()
