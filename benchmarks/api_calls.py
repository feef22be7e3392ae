"""One tool-call request through the official anthropic or openai SDK, and what came back (api_bench).

Each call returns (answer, stream problems, raw inputs): answer = {"stop_reason", "blocks": [(type,
name, input / arguments / text)]}, ids left out; stream problems = where the streamed pieces do not
join to the final input; raw inputs = each call's JSON as written (a Responses item's arguments,
the joined input_json_delta pieces of a streamed Messages block; none for a non-streamed Messages
answer, whose input arrives parsed).
"""

from __future__ import annotations

import json
import re

import anthropic
import openai

SEED = 7


def anthropic_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_\-]", "_", name)[:128]


def call_messages(client: anthropic.Anthropic, model: str, functions: dict[str, dict], mode: dict,
                  max_tokens: int, parallel: bool):
    """POST /v1/messages; blocks are (type, name, input or text)."""
    first = next(iter(functions))
    choice = {"type": "any"} if mode["choice"] == "any" else {"type": "tool", "name": anthropic_name(first)}
    if not parallel:
        choice["disable_parallel_tool_use"] = True
    kwargs = dict(model=model, max_tokens=max_tokens, tool_choice=choice,
                  messages=[{"role": "user", "content": f"Call {first} with sensible arguments."}],
                  tools=[{"name": anthropic_name(n), "input_schema": p} for n, p in functions.items()],
                  # this SDK's create()/stream() take no temperature; maskd's MessagesRequest does (default 1.0)
                  extra_body={"temperature": mode["temperature"]})
    if mode["temperature"]:
        kwargs["extra_body"]["seed"] = SEED
    problems, raw = [], []  # raw: each call's input as written (the joined deltas; none when not streamed)
    if not mode["stream"]:
        message = client.messages.create(**kwargs)
    else:
        pieces: dict[int, list[str]] = {}
        with client.messages.stream(**kwargs) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    pieces.setdefault(event.index, []).append(event.delta.partial_json)
            message = stream.get_final_message()
        for index, block in enumerate(message.content):
            if block.type != "tool_use":
                continue
            joined = "".join(pieces.get(index, []))
            raw.append(joined)
            try:
                parsed = json.loads(joined) if joined else {}
            except ValueError as exc:
                problems.append(f"block {index}: input_json_delta pieces do not parse ({exc}): {joined[:200]!r}")
                continue
            if parsed != block.input:
                problems.append(f"block {index}: input_json_delta pieces parse to {parsed!r}, final input is "
                                f"{block.input!r}")
    blocks = []
    for block in message.content:
        if block.type == "tool_use":
            blocks.append(("tool_use", block.name, block.input))
        elif block.type == "text":
            blocks.append(("text", None, block.text))
        else:
            blocks.append((block.type, None, None))
    return {"stop_reason": message.stop_reason, "blocks": blocks}, problems, raw


def call_responses(client: openai.OpenAI, model: str, functions: dict[str, dict], mode: dict, max_tokens: int,
                   parallel: bool):
    """POST /v1/responses; stop_reason is the response's status, blocks are (type, name, arguments or text)."""
    first = next(iter(functions))
    kwargs = dict(model=model, max_output_tokens=max_tokens, temperature=mode["temperature"], tool_choice="required",
                  parallel_tool_calls=parallel, input=f"Call {first} with sensible arguments.",
                  tools=[{"type": "function", "name": n, "parameters": p, "strict": False}
                         for n, p in functions.items()])
    if mode["temperature"]:
        kwargs["extra_body"] = {"seed": SEED}
    problems = []
    if not mode["stream"]:
        response = client.responses.create(**kwargs)
        output = [item.model_dump() for item in response.output]
        status = response.status
    else:
        deltas: dict[str, list[str]] = {}
        done: dict[str, str] = {}
        final = None
        kinds = []
        for event in client.responses.create(stream=True, **kwargs):
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                deltas.setdefault(event.item_id, []).append(event.delta)
            elif event.type == "response.function_call_arguments.done":
                done[event.item_id] = event.arguments
            elif event.type in ("response.completed", "response.incomplete", "response.failed"):
                final = event.response
        if final is None:
            raise RuntimeError(f"stream ended without response.completed/incomplete/failed; events: {kinds[-5:]}")
        output = [item.model_dump() for item in final.output]
        status = final.status
        for index, item in enumerate(output):
            if item["type"] != "function_call":
                continue
            joined = "".join(deltas.get(item["id"], []))
            if item["id"] not in done:
                problems.append(f"item {index}: no function_call_arguments.done event")
            elif not (joined == done[item["id"]] == item["arguments"]):
                problems.append(f"item {index}: deltas {joined[:200]!r} / done {done[item['id']][:200]!r} / "
                                f"item {item['arguments'][:200]!r} differ")
    blocks = []
    for item in output:
        if item["type"] == "function_call":
            blocks.append(("function_call", item["name"], item["arguments"]))
        elif item["type"] == "message":
            blocks.append(("message", None, "".join(part.get("text") or "" for part in item["content"])))
        else:
            blocks.append((item["type"], None, None))
    return {"stop_reason": status, "blocks": blocks}, problems, [b[2] for b in blocks if b[0] == "function_call"]
