"""End to end: an agent's tool list of a dozen real (BFCL) tools, compiled as one unit per tool."""

import gzip
import json
import re
import uuid
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from grammars import GrammarError, schema_to_regex
from test_e2e_tools import streamed

MODEL = "smollm2-135m-instruct"
BFCL = Path(__file__).resolve().parents[3] / "shared" / "data" / "maskbench" / "BFCL.jsonl.gz"


def bfcl_tools(count: int) -> list[dict]:
    """The first `count` single-function BFCL rows whose schema maskd enforces, as OpenAI tools."""
    tools = []
    for line in gzip.open(BFCL, "rt"):
        schema = json.loads(line)["schema"]
        if "anyOf" in schema or len(schema.get("properties", {})) != 1:
            continue
        name, parameters = next(iter(schema["properties"].items()))
        try:
            schema_to_regex(parameters)
        except GrammarError:
            continue
        tools.append({"type": "function", "function": {"name": re.sub(r"[^A-Za-z0-9_-]", "_", name),
                                                       "parameters": parameters}})
        if len(tools) == count:
            return tools
    raise AssertionError(f"fewer than {count} usable BFCL rows in {BFCL}")


def grammar_counters(server_url) -> dict[str, float]:
    text = httpx.get(f"{server_url}/metrics").text
    values = {}
    for name in ("maskd_grammar_compiles_total", 'maskd_grammar_cache_hits_total{tier="disk"}', "maskd_grammar_units"):
        found = re.search(re.escape(name) + r" ([0-9.e+]+)", text)
        assert found, f"/metrics has no {name}"
        values[name] = float(found.group(1))
    return values


def misses(counters) -> float:
    """Units not found in memory: compiled now, or read from the disk cache."""
    return counters["maskd_grammar_compiles_total"] + counters['maskd_grammar_cache_hits_total{tier="disk"}']


pytestmark = pytest.mark.skipif(not BFCL.is_file(), reason=f"MaskBench data not present at {BFCL}")
TOOLS = bfcl_tools(12) if BFCL.is_file() else []
ASK = [{"role": "user", "content": "Use one of the tools."}]


def test_a_dozen_tools_required_gives_valid_calls_streamed_equal(client):
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_tokens=160, temperature=0)
    message = client.chat.completions.create(**kwargs).choices[0].message
    assert message.tool_calls and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    _, calls, finish = streamed(client, **kwargs)
    assert finish == "tool_calls" and [(c[1], c[2]) for c in calls.values()] == [
        (call.function.name, call.function.arguments)]


def test_changing_one_tool_compiles_one_unit(client, server_url):
    """The tools already used cost nothing; a changed tool is the only unit not found in memory,
    and reordering the list or naming a tool in tool_choice finds every unit in memory."""
    kwargs = dict(model=MODEL, messages=ASK, tool_choice="required", max_tokens=160, temperature=0)
    client.chat.completions.create(tools=TOOLS, **kwargs)
    # the tools it did not call compile in the idle time after it: an auto request waits for them all
    client.chat.completions.create(tools=TOOLS, **{**kwargs, "tool_choice": "auto", "max_tokens": 1})
    before = grammar_counters(server_url)
    assert before["maskd_grammar_units"] >= len(TOOLS)
    extra = {"type": "object", "properties": {f"k{uuid.uuid4().hex[:8]}": {"type": "integer"}}}
    changed = TOOLS[:5] + [{"type": "function", "function": {"name": "fresh_tool", "parameters": extra}}] + TOOLS[6:]
    client.chat.completions.create(tools=changed, **kwargs)
    # the changed tool's unit compiles beside that request, which need not wait for it (its call may
    # name another tool); a request naming it does wait, so the count is read after one
    named = {"type": "function", "function": {"name": "fresh_tool"}}
    reply = client.chat.completions.create(tools=changed, **{**kwargs, "tool_choice": named})
    assert reply.choices[0].message.tool_calls[0].function.name == "fresh_tool"
    assert misses(grammar_counters(server_url)) == misses(before) + 1
    client.chat.completions.create(tools=list(reversed(changed)), **kwargs)
    assert misses(grammar_counters(server_url)) == misses(before) + 1


def test_a_tool_whose_grammar_exceeds_the_limit_is_a_400_naming_it(client):
    """The compile limit applies per unit: the 400 names the tool and the limit, and a request that
    sends the tool again fails at once (the failure is remembered); the server serves on."""
    slow = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(a|b)*a(a|b){18}"}},
            "required": ["code"]}
    tools = TOOLS[:3] + [{"type": "function", "function": {"name": "slow_tool", "parameters": slow}}]
    named = {"type": "function", "function": {"name": "slow_tool"}}
    for choice in (named, "required"):  # required: known bad, so no call is started with it
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice=choice, max_tokens=40)
        error = info.value.body
        assert error["code"] == "grammar_compilation_failed" and error["param"] == "tools[3].function.parameters"
        assert "slow_tool" in error["message"] and "limit" in error["message"]
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS[:3], tool_choice="required",
                                           max_tokens=160, temperature=0)
    assert reply.choices[0].finish_reason == "tool_calls"


FREE = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 20},
                                         "metadata": {"type": "object", "additionalProperties": True},
                                         "tags": {"type": "array", "items": {}}},
        "required": ["query", "metadata"], "additionalProperties": False}


def test_free_form_parameters_are_written_by_the_json_automaton(client, server_url):
    """A free-form object parameter compiles as a small unit (no regex expansion), the call is
    valid, streamed equal to non-streamed; the same schema as response_format gives valid JSON."""
    before = grammar_counters(server_url)
    tools = [{"type": "function", "function": {"name": f"search_{uuid.uuid4().hex[:6]}", "parameters": FREE}}]
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Search for cats, with metadata."}],
                  tools=tools, tool_choice="required", max_tokens=40, temperature=0)
    reply = client.chat.completions.create(**kwargs)
    call = reply.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), FREE)
    assert misses(grammar_counters(server_url)) == misses(before) + 1
    _, calls, finish = streamed(client, **kwargs)
    assert (calls[0][1], calls[0][2]) == (call.function.name, call.function.arguments)
    assert finish == reply.choices[0].finish_reason
    for schema in (FREE, {}):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Describe a cat in JSON."}], max_tokens=30,
            temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
