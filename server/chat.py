"""POST /v1/chat/completions: a request becomes an engine request; events become one response or SSE chunks."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

from grammars.tool_formats import Content
from engine.sequence import Event, Request
from server.errors import APIError, error_body
from server.prompt import message_dicts, render_chat
from server.protocol import (ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice,
                             ChunkChoice, Delta, ResponseMessage, Usage)
from server.state import ServerState
from server.structured_output import build_format_constraint
from server.tool_calls import (PendingTools, ToolCallReader, build_tool_constraint, resolve_tool_choice,
                               tool_format_of)

FINGERPRINT = "maskd-0.1"


@dataclass
class Prepared:
    request: Request
    reads_tools: bool  # whether the output is read for tool calls
    budget: int | None = None  # max_tokens asked for, if any
    room: int = 0  # context left after the prompt
    pending: PendingTools | None = None  # tool units still compiling

    async def settle(self) -> None:
        """Waits for the tool units (attaching them to the constraint) and checks the budget against
        the shortest valid output; raises APIError (a 400) where either fails."""
        if self.pending is not None:
            await self.pending.wait()
            self.pending = None
            _check_budget(self.request.constraint, self.budget, self.room)


async def prepare(state: ServerState, body: ChatCompletionRequest) -> Prepared:
    """Validates the request, renders the prompt and builds its constraint; raises APIError."""
    state.require_model(body.model)
    choice = resolve_tool_choice(body)
    if choice.mode != "none" and body.response_format and body.response_format.type != "text":
        raise APIError("response_format cannot be combined with tool calls; send tool_choice 'none' "
                       "or drop response_format", param="response_format")
    fmt = tool_format_of(state)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    template = state.tokenizer.chat_template or ""
    messages, template_tools = fmt.prepare_messages(message_dicts(body.messages), tools, "tools" in template,
                                                    chat_template=template)
    prompt_ids = render_chat(state.tokenizer, messages, template_tools)
    room = state.context_length - len(prompt_ids)
    if room <= 0:
        raise APIError(f"the prompt is {len(prompt_ids)} tokens, the model's context is {state.context_length}; "
                       "shorten the messages", param="messages", code="context_length_exceeded")
    budget = body.output_budget()
    if budget is not None and budget > room:
        raise APIError(f"max_tokens {budget} + prompt {len(prompt_ids)} tokens exceed the context of "
                       f"{state.context_length}; ask for at most {room}", param="max_tokens",
                       code="context_length_exceeded")
    keep: frozenset[int] = frozenset()
    pending = None
    if choice.mode == "none":
        constraint = await build_format_constraint(state, body)
        _check_budget(constraint, budget, room)
    else:
        pending, keep = await build_tool_constraint(state, body, choice)
        constraint = pending.constraint
    params = body.sampling_params(budget or room, state.vocabulary.size)
    request = Request(prompt_ids=prompt_ids, params=params, constraint=constraint, keep_special_ids=keep)
    return Prepared(request, reads_tools=choice.mode != "none", budget=budget, room=room, pending=pending)


async def start(state: ServerState, prepared: Prepared) -> AsyncIterator[Event]:
    """Submits the request (its prompt is prefilled while its units compile), then waits for the
    units: a unit that fails, or a budget below the minimum, cancels the request and raises the 400."""
    generated = state.engine.generate(prepared.request)  # a full queue is a 429 here
    try:
        await prepared.settle()
    except BaseException:
        state.engine.cancel(prepared.request.request_id)
        raise
    state.engine.wake()
    return generated


def _check_budget(constraint, budget: int | None, room: int) -> None:
    """A budget below the constraint's shortest valid output is a 400 stating that minimum."""
    if constraint is None:
        return
    minimum = constraint.min_tokens()
    if budget is not None and budget < minimum:
        raise APIError(f"max_tokens is {budget}, but the shortest output valid under this request's "
                       f"tool_choice/response_format is {minimum} tokens; ask for at least {minimum}",
                       param="max_tokens", code="budget_too_small")
    if budget is None and room < minimum:
        raise APIError(f"the context leaves {room} tokens after the prompt, but the shortest output valid "
                       f"under this request's tool_choice/response_format is {minimum} tokens; shorten "
                       "the messages", param="messages", code="context_length_exceeded")


def budget_forced(event: Event, constrained: bool) -> bool | None:
    return event.budget_forced if constrained else None


def usage_of(event: Event) -> Usage:
    return Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                 total_tokens=event.prompt_tokens + event.completion_tokens,
                 prompt_tokens_details={"cached_tokens": event.cached_tokens})


def finish_reason(event: Event, has_calls: bool) -> str:
    return "tool_calls" if has_calls and event.finish_reason == "stop" else event.finish_reason


async def complete(state: ServerState, body: ChatCompletionRequest) -> ChatCompletion:
    prepared = await prepare(state, body)
    pieces, last = [], None
    async for event in await start(state, prepared):
        pieces.append(event.text)
        last = event
    if last.finish_reason == "error":
        raise APIError(f"generation failed: {last.error}", status=500, type="server_error")
    text, calls = "".join(pieces), None
    if prepared.reads_tools:
        reader = ToolCallReader(tool_format_of(state))
        reader.feed(text, final=True)
        text, calls = "".join(reader.content), reader.tool_calls() or None
    message = ResponseMessage(content=text if text or not calls else None, tool_calls=calls)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
        system_fingerprint=FINGERPRINT, usage=usage_of(last),
        choices=[Choice(message=message, finish_reason=finish_reason(last, bool(calls)),
                        maskd_budget_forced=budget_forced(last, prepared.request.constraint is not None))])


async def stream(state: ServerState, body: ChatCompletionRequest) -> AsyncIterator[str]:
    """SSE `data:` payloads, the last one `[DONE]`. Validation happens before the first chunk."""
    prepared = await prepare(state, body)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    reader = ToolCallReader(tool_format_of(state)) if prepared.reads_tools else None
    head = dict(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=state.model_name,
                system_fingerprint=FINGERPRINT)

    def chunk(delta: Delta, finish: str | None = None, forced: bool | None = None) -> str:
        choice = ChunkChoice(delta=delta, finish_reason=finish, maskd_budget_forced=forced)
        return ChatCompletionChunk(**head, choices=[choice]).model_dump_json(exclude_none=True)

    def deltas(text: str, final: bool) -> list[Delta]:
        if reader is None:
            return [Delta(content=text)] if text else []
        out = []
        for event in reader.feed(text, final=final):
            call = reader.delta(event)
            if call is not None:
                out.append(Delta(tool_calls=[call]))
            elif isinstance(event, Content) and event.text:
                out.append(Delta(content=event.text))
        return out

    generated = await start(state, prepared)  # submits now: a full queue is a 429, not a broken stream

    async def events() -> AsyncIterator[str]:
        yield chunk(Delta(role="assistant", content=""))
        async for event in generated:
            if event.finish_reason == "error":
                yield json.dumps(error_body(f"generation failed: {event.error}", "server_error"))
                break
            for delta in deltas(event.text, final=event.finish_reason is not None):
                yield chunk(delta)
            if event.finish_reason:
                yield chunk(Delta(), finish_reason(event, bool(reader and reader.names)),
                            budget_forced(event, prepared.request.constraint is not None))
                if include_usage:
                    yield ChatCompletionChunk(**head, choices=[], usage=usage_of(event)).model_dump_json()
        yield "[DONE]"

    return _cancel_on_exit(events(), state, prepared.request.request_id)


async def _cancel_on_exit(payloads: AsyncIterator[str], state: ServerState, request_id: int) -> AsyncIterator[str]:
    """A client gone before the first engine event never started the engine's iterator, whose own
    cancel-on-close thus never runs: cancel here (a no-op once the request finished)."""
    try:
        async for payload in payloads:
            yield payload
    finally:
        state.engine.cancel(request_id)
