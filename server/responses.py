"""POST /v1/responses (and GET /v1/responses/{id}): the OpenAI Responses API over the one generation path.

Responses are kept (unless `store: false`) in a bounded in-memory store, least recently used first
out, so that `previous_response_id` continues a conversation: its input items and output are put
before the new input. An id not (or no longer) kept is a 400 saying so.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from typing import AsyncIterator

from server.answer_blocks import Block, BlockBuilder, Close, Delta, Open, collect_blocks
from server.errors import APIError
from server.generation import Fields, GenerationRequest, prepare, start
from server.output_stream import Finish, failure, steps
from server.responses_protocol import ResponsesRequest, chat_messages
from server.state import ServerState

FIELDS = Fields(messages="input", max_tokens="max_output_tokens", tool_schema="tools[{i}].parameters",
                tool_name="tool_choice.name", format="text.format", format_schema="text.format.schema")


class ResponseStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()  # id -> (response, its whole input)

    def put(self, response: dict, items: list[dict]) -> None:
        if self.capacity <= 0:
            return
        self._kept[response["id"]] = (response, items)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, response_id: str, param: str = "previous_response_id") -> tuple[dict, list[dict]]:
        if response_id not in self._kept:
            raise APIError(f"response {response_id!r} is not kept here (store: false, or one of the "
                           f"{self.capacity} most recent responses it is not); send the whole conversation "
                           "as input instead", param=param, status=404 if param == "response_id" else 400,
                           type="not_found_error" if param == "response_id" else "invalid_request_error")
        self._kept.move_to_end(response_id)
        return self._kept[response_id]


def _items(state: ServerState, body: ResponsesRequest) -> list[dict]:
    """The conversation so far: the previous response's input and output, then this input."""
    items = body.items()
    if body.previous_response_id:
        previous, before = state.responses.get(body.previous_response_id)
        items = before + previous["output"] + items
    return items


def _job(state: ServerState, body: ResponsesRequest, items: list[dict]) -> GenerationRequest:
    state.require_model(body.model)
    return GenerationRequest(prompt=chat_messages(body.instructions, items), sampling=body.sampling_params(),
                             max_tokens=body.max_output_tokens, tools=body.function_tools(), tool_choice=body.choice(),
                             parallel_tool_calls=body.parallel_tool_calls is not False,
                             output_format=body.output_format(), fields=FIELDS)


def _response(state: ServerState, body: ResponsesRequest, rid: str, status: str, output: list[dict],
              finish: Finish | None = None) -> dict:
    out = {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "model": state.model_name,
           "output": output, "error": None, "incomplete_details": None, "instructions": body.instructions,
           "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls is not False,
           "temperature": body.temperature, "top_p": body.top_p, "max_output_tokens": body.max_output_tokens,
           "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
           "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
           "text": body.text.model_dump(exclude_none=True, by_alias=True) if body.text else {"format": {"type": "text"}},
           "previous_response_id": body.previous_response_id, "store": body.store is not False,
           "truncation": "disabled", "usage": None}
    if finish is not None:
        out["usage"] = {"input_tokens": finish.prompt_tokens, "output_tokens": finish.completion_tokens,
                        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
                        "input_tokens_details": {"cached_tokens": finish.cached_tokens},
                        "output_tokens_details": {"reasoning_tokens": 0}}
        if finish.reason == "length":
            out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            if output:  # the item the budget cut
                out["output"] = output[:-1] + [{**output[-1], "status": "incomplete"}]
    return out


def _item(block: Block, item_id: str, status: str = "completed") -> dict:
    if block.kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": block.text}]}
    if block.kind == "text":
        return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": block.text, "annotations": [], "logprobs": []}]}
    return {"type": "function_call", "id": item_id, "call_id": f"call_{secrets.token_hex(12)}", "name": block.name,
            "arguments": block.text or "{}", "status": status}


def _item_id(kind: str) -> str:
    return {"reasoning": "rs_", "text": "msg_", "call": "fc_"}[kind] + secrets.token_hex(12)


def _keep(state: ServerState, body: ResponsesRequest, response: dict, items: list[dict]) -> None:
    if body.store is not False:
        state.responses.put(response, items)


async def complete(state: ServerState, body: ResponsesRequest) -> dict:
    items = _items(state, body)
    prepared = await prepare(state, _job(state, body, items))
    [events] = await start(state, prepared)
    blocks, finish = await collect_blocks(steps(state, prepared, events))
    response = _response(state, body, f"resp_{secrets.token_hex(12)}", "completed",
                         [_item(b, _item_id(b.kind)) for b in blocks], finish)
    _keep(state, body, response, items)
    return response


async def stream(state: ServerState, body: ResponsesRequest) -> AsyncIterator[dict]:
    """SSE events in the API's order (response.created ... response.completed)."""
    items = _items(state, body)
    prepared = await prepare(state, _job(state, body, items))
    [events] = await start(state, prepared)
    rid = f"resp_{secrets.token_hex(12)}"
    sequence = iter(range(1 << 62))

    def sse(kind: str, **data) -> dict:
        return {"event": kind, "data": json.dumps({"type": kind, "sequence_number": next(sequence), **data})}

    async def payloads() -> AsyncIterator[dict]:
        yield sse("response.created", response=_response(state, body, rid, "in_progress", []))
        yield sse("response.in_progress", response=_response(state, body, rid, "in_progress", []))
        builder, open_items, output = BlockBuilder(), {}, []
        async for step in steps(state, prepared, events):
            finish = step.finish
            if finish is not None and finish.reason == "error":
                error = failure(finish)
                code = error.code or error.type
                yield sse("error", code=code, message=error.message, param=None)
                failed = _response(state, body, rid, "failed", output)
                failed["error"] = {"code": code, "message": error.message}
                yield sse("response.failed", response=failed)
                return
            for event in builder.feed(step.parts) + (builder.finish() if finish else []):
                for payload in _item_events(event, open_items, output, sse):
                    yield payload
            if finish is not None:
                response = _response(state, body, rid, "completed", output, finish)
                _keep(state, body, response, items)
                kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
                yield sse(kind, response=response)

    return payloads()


def _item_events(event, open_items: dict, output: list[dict], sse) -> list[dict]:
    """The Responses stream events of one block event; `output` collects the finished items."""
    if isinstance(event, Open):
        block = Block(event.kind, event.name)
        item = _item(block, _item_id(event.kind), status="in_progress")
        open_items[event.index] = (block, item)
        out = [sse("response.output_item.added", output_index=event.index, item=item)]
        if event.kind == "text":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(sse("response.content_part.added", item_id=item["id"], output_index=event.index,
                           content_index=0, part=part))
        return out
    block, item = open_items[event.index]
    where = dict(item_id=item["id"], output_index=event.index)
    if isinstance(event, Delta):
        block.pieces.append(event.text)
        if block.kind == "call":
            return [sse("response.function_call_arguments.delta", **where, delta=event.text)]
        kind = "response.output_text.delta" if block.kind == "text" else "response.reasoning_text.delta"
        return [sse(kind, **where, content_index=0, delta=event.text, logprobs=[])]
    if isinstance(event, Close):
        done = {**_item(block, item["id"]), **({"call_id": item["call_id"]} if block.kind == "call" else {})}
        output.append(done)
        if block.kind == "call":
            out = [sse("response.function_call_arguments.done", **where, name=block.name, arguments=done["arguments"])]
        elif block.kind == "text":
            out = [sse("response.output_text.done", **where, content_index=0, text=block.text, logprobs=[]),
                   sse("response.content_part.done", **where, content_index=0, part=done["content"][0])]
        else:
            out = [sse("response.reasoning_text.done", **where, content_index=0, text=block.text)]
        return out + [sse("response.output_item.done", output_index=event.index, item=done)]
    return []


def retrieve(state: ServerState, response_id: str) -> dict:
    response, _ = state.responses.get(response_id, param="response_id")
    return response
