"""POST /v1/completions: a raw prompt (text or token ids) continued, plain or streamed."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator

from pydantic import BaseModel, Field, field_validator

from server.chat import usage_of
from server.constraint_fields import asked_formats, one_format
from server.generation import Fields, GenerationRequest, prepare, start
from server.logprob_format import completion_logprobs
from server.output_stream import collect, failure, merged, steps
from server.protocol import SamplingRequest, Usage
from server.state import ServerState


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)

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
    logprobs: dict | None = None


class Completion(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


FIELDS = Fields(messages="prompt")


def _job(state: ServerState, body: CompletionRequest) -> GenerationRequest:
    state.require_model(body.model)
    output_format, fields = one_format(asked_formats(body), FIELDS)
    return GenerationRequest(prompt=body.prompt, sampling=body.sampling_params(body.logprobs),
                             max_tokens=body.max_tokens, n=body.n, output_format=output_format, fields=fields)


def _reason(reason: str) -> str:
    return "stop" if reason == "stop_sequence" else reason


async def complete_text(state: ServerState, body: CompletionRequest) -> Completion:
    prepared = await prepare(state, _job(state, body))
    generated = await start(state, prepared)
    answers = await asyncio.gather(*(collect(steps(state, prepared, events, row))
                                     for row, events in enumerate(generated)))
    choices = [CompletionChoice(index=row, text=a.content, finish_reason=_reason(a.finish.reason),
                                logprobs=completion_logprobs(state, a.logprobs, body.logprobs)
                                if body.logprobs is not None else None) for row, a in enumerate(answers)]
    return Completion(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
                      choices=choices, usage=usage_of([a.finish for a in answers]))


async def stream_text(state: ServerState, body: CompletionRequest) -> AsyncIterator[str]:
    prepared = await prepare(state, _job(state, body))
    head = dict(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    rows = [steps(state, prepared, events, row) for row, events in enumerate(await start(state, prepared))]

    async def payloads() -> AsyncIterator[str]:
        finishes, offsets = [None] * len(rows), [0] * len(rows)
        async for row, step in merged(rows):
            if step.finish is not None and step.finish.reason == "error":
                yield json.dumps(failure(step.finish).body())
                break
            text = "".join(part.text for part in step.parts)
            logprobs = completion_logprobs(state, step.logprobs, body.logprobs, offsets[row]) \
                if body.logprobs is not None and step.logprobs else None
            offsets[row] += len(text)
            if text or step.finish or logprobs:
                choice = CompletionChoice(index=row, text=text, logprobs=logprobs,
                                          finish_reason=_reason(step.finish.reason) if step.finish else None)
                yield Completion(**head, choices=[choice]).model_dump_json(exclude_none=True)
            if step.finish is not None:
                finishes[row] = step.finish
        if include_usage and all(finishes):
            yield Completion(**head, choices=[], usage=usage_of(finishes)).model_dump_json()
        yield "[DONE]"

    return payloads()
