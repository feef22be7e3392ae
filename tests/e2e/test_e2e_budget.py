"""End to end: with a tight max_tokens, tool calls and JSON outputs close validly inside the budget."""

import json
import re

import jsonschema
import openai
import pytest

from test_e2e_tools import ASK, MODEL, SCHEMAS, TOOLS, streamed, valid_calls

NOTE = {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["title", "body", "tags"], "additionalProperties": False}


def minimum_of(client, **kwargs) -> int:
    """The shortest valid output, as the server's 400 for max_tokens=1 states it."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, max_tokens=1, **kwargs)
    body = info.value.body
    assert body["param"] == "max_tokens" and body["code"] == "budget_too_small"
    return int(re.search(r"is (\d+) tokens", body["message"]).group(1))


@pytest.mark.parametrize("slack", [0, 5])
def test_required_call_closes_inside_a_tight_budget(client, slack):
    kwargs = dict(messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0)
    minimum = minimum_of(client, **kwargs)
    reply = client.chat.completions.create(model=MODEL, max_tokens=minimum + slack, **kwargs)
    choice = reply.choices[0]
    valid_calls(choice.message)
    assert choice.finish_reason == "tool_calls"
    assert reply.usage.completion_tokens <= minimum + slack
    assert choice.model_extra["maskd_budget_forced"] is True or slack > 0


def test_budget_below_the_minimum_is_a_400_stating_it(client):
    kwargs = dict(messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    minimum = minimum_of(client, **kwargs)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, max_tokens=minimum - 1, **kwargs)
    assert f"is {minimum} tokens" in info.value.body["message"]
    reply = client.chat.completions.create(model=MODEL, max_tokens=minimum, temperature=0, **kwargs)
    assert [c.function.name for c in valid_calls(reply.choices[0].message)] == ["add"]


def test_streamed_budget_close_equals_non_streamed(client):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
                  temperature=0.8, seed=5)
    minimum = minimum_of(client, **{k: v for k, v in kwargs.items() if k != "model"})
    reply = client.chat.completions.create(max_tokens=minimum + 2, **kwargs)
    content, calls, finish = streamed(client, max_tokens=minimum + 2, **kwargs)
    expected = [(c.function.name, c.function.arguments) for c in valid_calls(reply.choices[0].message)]
    assert [(name, args) for _, name, args in calls.values()] == expected
    assert finish == reply.choices[0].finish_reason == "tool_calls"
    for name, args in expected:
        jsonschema.validate(json.loads(args), SCHEMAS[name])


def test_json_schema_response_closes_inside_the_budget(client):
    kwargs = dict(messages=[{"role": "user", "content": "Write a long note about the sea."}],
                  response_format={"type": "json_schema", "json_schema": {"name": "note", "schema": NOTE}})
    minimum = minimum_of(client, **kwargs)
    for slack in (0, 10):
        reply = client.chat.completions.create(model=MODEL, max_tokens=minimum + slack, temperature=0.7, seed=1,
                                               **kwargs)
        jsonschema.validate(json.loads(reply.choices[0].message.content), NOTE)
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens <= minimum + slack


def test_unconstrained_reply_carries_no_budget_flag_and_stops_at_length(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].model_extra.get("maskd_budget_forced") is None
