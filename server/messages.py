"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API over the one generation path."""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import replace
from typing import AsyncIterator

from server.anthropic_protocol import MessagesRequest
from server.answer_blocks import Block, BlockBuilder, Close, Delta, Open, collect_blocks
from server.errors import ANTHROPIC_TYPES
from server.generation import Fields, GenerationRequest, prepare, prompt_ids_of, start
from server.output_stream import Finish, failure, steps
from server.state import ServerState
from server.structured_output import OutputFormat

FIELDS = Fields(tool_schema="tools[{i}].input_schema", tool_name="tool_choice.name")
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                "stop_sequence": "stop_sequence"}


def _job(state: ServerState, body: MessagesRequest, counting: bool = False) -> GenerationRequest:
    state.require_model(body.model)
    choice, parallel = body.choice()
    output_format, where = body.structured_output()
    if output_format is not None:
        output_format = OutputFormat("json_schema", output_format.schema_)
    fields = replace(FIELDS, format=where, format_schema=f"{where}.schema")
    return GenerationRequest(prompt=body.chat_messages(), sampling=body.sampling_params(),
                             max_tokens=None if counting else body.max_tokens, tools=body.function_tools(),
                             tool_choice=choice, parallel_tool_calls=parallel, output_format=output_format,
                             template_kwargs=body.template_kwargs(), fields=fields)


def usage(finish: Finish) -> dict:
    return {"input_tokens": finish.prompt_tokens - finish.cached_tokens, "output_tokens": finish.completion_tokens,
            "cache_read_input_tokens": finish.cached_tokens, "cache_creation_input_tokens": 0}


def _message_head(state: ServerState) -> dict:
    return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "model": state.model_name}


def _tool_id() -> str:
    return f"toolu_{secrets.token_hex(12)}"


def _content_block(block: Block, tool_id: str | None = None) -> dict:
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": block.text, "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    return {"type": "tool_use", "id": tool_id, "name": block.name, "input": _input(block.text)}


def _input(arguments: str):
    """The call's arguments as an object. They are valid by construction unless the output was cut
    (stop_reason max_tokens); then what was written is kept under `_partial_json`."""
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"_partial_json": arguments}


async def count_tokens(state: ServerState, body: MessagesRequest) -> dict:
    job = _job(state, body, counting=True)
    ids, _ = await asyncio.to_thread(prompt_ids_of, state, job)
    return {"input_tokens": len(ids)}


async def complete(state: ServerState, body: MessagesRequest) -> dict:
    prepared = await prepare(state, _job(state, body))
    [events] = await start(state, prepared)
    blocks, finish = await collect_blocks(steps(state, prepared, events))
    return {**_message_head(state), "content": [_content_block(b, _tool_id()) for b in blocks],
            "stop_reason": STOP_REASONS.get(finish.reason, finish.reason), "stop_sequence": finish.stop_string,
            "usage": usage(finish)}


async def stream(state: ServerState, body: MessagesRequest) -> AsyncIterator[dict]:
    """SSE events ({"event", "data"}) in the API's order; validation happens before the first."""
    prepared = await prepare(state, _job(state, body))
    [events] = await start(state, prepared)
    head = _message_head(state)

    def sse(kind: str, **data) -> dict:
        return {"event": kind, "data": json.dumps({"type": kind, **data})}

    async def payloads() -> AsyncIterator[dict]:
        builder, kinds, started = BlockBuilder(), {}, False
        async for step in steps(state, prepared, events):
            if not started:  # the first step carries the prompt's counts
                start_usage = {"input_tokens": len(prepared.request.prompt_ids), "output_tokens": 0,
                               "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
                yield sse("message_start", message={**head, "content": [], "stop_reason": None,
                                                    "stop_sequence": None, "usage": start_usage})
                yield sse("ping")
                started = True
            finish = step.finish
            if finish is not None and finish.reason == "error":
                error = failure(finish)
                yield sse("error", error={"type": ANTHROPIC_TYPES[error.status], "message": error.message})
                return
            for event in builder.feed(step.parts) + (builder.finish() if finish else []):
                for payload in _block_events(event, kinds, sse):
                    yield payload
            if finish is not None:
                yield sse("message_delta", delta={"stop_reason": STOP_REASONS.get(finish.reason, finish.reason),
                                                  "stop_sequence": finish.stop_string}, usage=usage(finish))
                yield sse("message_stop")

    return payloads()


def _block_events(event, kinds: dict, sse) -> list[dict]:
    if isinstance(event, Open):
        kinds[event.index] = event.kind
        if event.kind == "reasoning":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        elif event.kind == "text":
            block = {"type": "text", "text": ""}
        else:
            block = {"type": "tool_use", "id": _tool_id(), "name": event.name, "input": {}}
        return [sse("content_block_start", index=event.index, content_block=block)]
    if isinstance(event, Delta):
        kind = kinds[event.index]
        delta = {"type": "thinking_delta", "thinking": event.text} if kind == "reasoning" else \
            {"type": "text_delta", "text": event.text} if kind == "text" else \
            {"type": "input_json_delta", "partial_json": event.text}
        return [sse("content_block_delta", index=event.index, delta=delta)]
    if isinstance(event, Close):
        out = []
        if kinds[event.index] == "reasoning":
            out.append(sse("content_block_delta", index=event.index, delta={"type": "signature_delta", "signature": ""}))
        return out + [sse("content_block_stop", index=event.index)]
    return []
