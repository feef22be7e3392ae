"""POST /v1/chat/completions: an adapter from OpenAI chat to the one generation path, and back."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator

from grammars import ArgsDelta, CallStart, Content
from server.errors import APIError
from server.constraint_fields import asked_formats, one_format
from server.generation import Fields, GenerationRequest, Prepared, prepare as prepare_job, start as start_job
from server.logprob_format import chat_logprobs
from server.output_stream import Collected, Finish, Reasoning, collect, failure, merged, steps
from server.prompt import message_dicts
from server.protocol import (ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice, ChunkChoice,
                             Delta, FunctionCall, ResponseMessage, ToolCall, Usage)
from server.state import ServerState
from server.structured_output import OutputFormat
from server.tool_calls import ToolChoice, tool_format_of

FINGERPRINT = "maskd-0.1"


def resolve_tool_choice(body: ChatCompletionRequest) -> ToolChoice:
    choice, tools = body.tool_choice, body.tools or []
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice in ("none", "auto", "required"):
        return ToolChoice(choice)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return ToolChoice("named", choice["function"].get("name"))
    raise APIError("tool_choice must be 'none', 'auto', 'required' or "
                   "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")


def job_of(body: ChatCompletionRequest) -> GenerationRequest:
    fmt = body.response_format
    asked = asked_formats(body)
    if fmt is not None and fmt.type != "text":
        schema = fmt.json_schema.schema_ if fmt.json_schema else None
        asked.insert(0, ("response_format", OutputFormat(fmt.type, schema,
                                                         fmt.json_schema.strict if fmt.json_schema else None)))
    output_format, fields = one_format(asked, Fields())
    top = body.top_logprobs or 0
    return GenerationRequest(
        prompt=message_dicts(body.messages), sampling=body.sampling_params(top if body.logprobs else None),
        max_tokens=body.output_budget(), n=body.n, output_format=output_format,
        tools=[tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None,
        tool_choice=resolve_tool_choice(body), parallel_tool_calls=body.parallel_tool_calls is not False,
        template_kwargs=body.chat_template_kwargs or {}, fields=fields)


async def prepare(state: ServerState, body: ChatCompletionRequest) -> Prepared:
    state.require_model(body.model)
    if body.top_logprobs and not body.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    return await prepare_job(state, job_of(body))


async def start(state: ServerState, prepared: Prepared) -> AsyncIterator:
    """The engine events of the first row (benchmarks read them raw)."""
    return (await start_job(state, prepared))[0]


def usage_of(finishes: list[Finish]) -> Usage:
    """The prompt counts once, however many choices (n) share it."""
    first, completion = finishes[0], sum(f.completion_tokens for f in finishes)
    return Usage(prompt_tokens=first.prompt_tokens, completion_tokens=completion,
                 total_tokens=first.prompt_tokens + completion,
                 prompt_tokens_details={"cached_tokens": first.cached_tokens})


def finish_reason(finish: Finish) -> str:
    return "stop" if finish.reason == "stop_sequence" else finish.reason


def _choice(state: ServerState, index: int, answer: Collected, top: int | None) -> Choice:
    fmt = tool_format_of(state)
    calls = [ToolCall(id=fmt.new_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments_text))
             for c in answer.calls] or None
    message = ResponseMessage(content=answer.content if answer.content or not calls else None,
                              reasoning_content=answer.reasoning or None, tool_calls=calls)
    return Choice(index=index, message=message, finish_reason=finish_reason(answer.finish),
                  logprobs=chat_logprobs(state, answer.logprobs, top) if top is not None else None,
                  maskd_budget_forced=answer.finish.budget_forced)


async def complete(state: ServerState, body: ChatCompletionRequest) -> ChatCompletion:
    prepared = await prepare(state, body)
    generated = await start_job(state, prepared)
    answers = await asyncio.gather(*(collect(steps(state, prepared, events, row))
                                     for row, events in enumerate(generated)))
    top = (body.top_logprobs or 0) if body.logprobs else None
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
        system_fingerprint=FINGERPRINT, usage=usage_of([a.finish for a in answers]),
        choices=[_choice(state, row, answer, top) for row, answer in enumerate(answers)])


async def stream(state: ServerState, body: ChatCompletionRequest) -> AsyncIterator[str]:
    """SSE `data:` payloads, the last one `[DONE]`. Validation happens before the first chunk."""
    prepared = await prepare(state, body)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    top = (body.top_logprobs or 0) if body.logprobs else None
    fmt = tool_format_of(state)
    head = dict(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
                system_fingerprint=FINGERPRINT)

    def chunk(row: int, delta: Delta, **extra) -> str:
        return ChatCompletionChunk(**head, choices=[ChunkChoice(index=row, delta=delta, **extra)]) \
            .model_dump_json(exclude_none=True)

    generated = await start_job(state, prepared)  # submits now: a full queue is a 429, not a broken stream
    rows = [steps(state, prepared, events, row) for row, events in enumerate(generated)]

    async def payloads() -> AsyncIterator[str]:
        ids: dict[tuple[int, int], str] = {}
        finishes: list[Finish | None] = [None] * len(rows)
        for row in range(len(rows)):
            yield chunk(row, Delta(role="assistant", content=""))
        async for row, step in merged(rows):
            if step.finish is not None and step.finish.reason == "error":
                yield json.dumps(failure(step.finish).body())
                break
            deltas = [d for d in (_delta(part, row, ids, fmt) for part in step.parts) if d is not None]
            if top is not None and step.logprobs:
                deltas = deltas or [Delta(content="")]
            for i, delta in enumerate(deltas):
                logprobs = chat_logprobs(state, step.logprobs, top) if i == 0 and top is not None \
                    and step.logprobs else None
                yield chunk(row, delta, logprobs=logprobs)
            if step.finish is not None:
                finishes[row] = step.finish
                yield chunk(row, Delta(), finish_reason=finish_reason(step.finish),
                            maskd_budget_forced=step.finish.budget_forced)
        if include_usage and all(finishes):
            yield ChatCompletionChunk(**head, choices=[], usage=usage_of(finishes)).model_dump_json()
        yield "[DONE]"

    return payloads()


def _delta(part, row: int, ids: dict, fmt) -> Delta | None:
    if isinstance(part, Content):
        return Delta(content=part.text)
    if isinstance(part, Reasoning):
        return Delta(reasoning_content=part.text)
    if isinstance(part, CallStart):
        ids[row, part.index] = fmt.new_call_id()
        return Delta(tool_calls=[{"index": part.index, "id": ids[row, part.index], "type": "function",
                                  "function": {"name": part.name, "arguments": ""}}])
    if isinstance(part, ArgsDelta):
        return Delta(tool_calls=[{"index": part.index, "function": {"arguments": part.text}}])
    return None
