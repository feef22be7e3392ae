"""End to end: the Anthropic Messages API on the live server, through the official anthropic SDK."""

import json

import anthropic
import httpx
import jsonschema
import pytest

from test_e2e_tools import ADD, WEATHER

MODEL = "smollm2-135m-instruct"
TOOLS = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER},
         {"name": "add", "description": "Add two integers", "input_schema": ADD}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the current SDK no longer sends sampling fields; other clients do


@pytest.fixture(scope="module")
def claude(server_url):
    return anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0, timeout=1800)


def tool_uses(message):
    uses = [block for block in message.content if block.type == "tool_use"]
    for use in uses:
        assert use.id.startswith("toolu_")
        jsonschema.validate(use.input, SCHEMAS[use.name])
    assert len({use.id for use in uses}) == len(uses)
    return uses


def test_any_gives_valid_tool_use_blocks(claude):
    message = claude.messages.create(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS,
                                     tool_choice={"type": "any"}, extra_body=GREEDY)
    assert tool_uses(message) and message.stop_reason == "tool_use"
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
    assert message.usage.output_tokens > 0


def test_named_tool_is_exactly_one_call_of_it(claude):
    message = claude.messages.create(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS,
                                     tool_choice={"type": "tool", "name": "add"}, extra_body=GREEDY)
    assert [use.name for use in tool_uses(message)] == ["add"]


def test_streamed_final_message_equals_the_non_streamed_one(claude):
    common = dict(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS, tool_choice={"type": "any"},
                  extra_body={"temperature": 0.8, "seed": 11})
    plain = claude.messages.create(**common)
    with claude.messages.stream(**common) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == \
        [(b.type, b.name, b.input) for b in plain.content if b.type == "tool_use"]
    assert final.stop_reason == plain.stop_reason == "tool_use"
    tool_uses(final)


def test_stream_events_follow_the_api(server_url):
    """message_start, ping, block start/delta/stop per block, message_delta, message_stop; the
    partial_json pieces of a tool_use block join into exactly its input."""
    body = dict(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS, tool_choice={"type": "any"},
                temperature=0, stream=True)
    events = []
    with httpx.stream("POST", f"{server_url}/v1/messages", json=body, timeout=1800) as response:
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == kind
                events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] > 0
    blocks, pieces = {}, {}
    for event in events:
        if event["type"] == "content_block_start":
            assert event["index"] == len(blocks)
            blocks[event["index"]] = event["content_block"]
            pieces[event["index"]] = []
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            pieces[event["index"]].append(delta.get("partial_json", delta.get("text")))
    uses = [i for i, block in blocks.items() if block["type"] == "tool_use"]
    assert uses
    plain = httpx.post(f"{server_url}/v1/messages", json={**body, "stream": False}, timeout=1800).json()
    inputs = [b["input"] for b in plain["content"] if b["type"] == "tool_use"]
    assert [json.loads("".join(pieces[i])) for i in uses] == inputs
    assert kinds.count("content_block_start") == kinds.count("content_block_stop")


def test_a_conversation_with_tool_results_and_text(claude):
    first = claude.messages.create(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    [use] = tool_uses(first)
    history = ASK + [{"role": "assistant", "content": first.content},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": use.id, "content": "21 C and sunny"},
                         {"type": "text", "text": "Answer in one sentence."}]}]
    reply = claude.messages.create(model=MODEL, max_tokens=20, messages=history, tools=TOOLS,
                                   tool_choice={"type": "none"}, extra_body=GREEDY,
                                   system=[{"type": "text", "text": "You are terse."}])
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens")
    error_result = history[:-1] + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "is_error": True,
         "content": [{"type": "text", "text": "service down"}]}]}]
    counted = claude.messages.count_tokens(model=MODEL, messages=error_result, tools=TOOLS)
    assert counted.input_tokens > claude.messages.count_tokens(model=MODEL, messages=ASK).input_tokens


def test_stop_sequence_is_reported(claude):
    free = claude.messages.create(model=MODEL, max_tokens=20, messages=ASK, extra_body=GREEDY).content[0].text
    stop = free.split()[1]
    cut = claude.messages.create(model=MODEL, max_tokens=20, messages=ASK, extra_body=GREEDY, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == free[:free.index(stop)]


def test_max_tokens_stop_reason(claude):
    message = claude.messages.create(model=MODEL, max_tokens=2, messages=ASK, extra_body=GREEDY)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


def test_prefix_cache_reads_are_reported(claude):
    system = "You answer questions about the weather. " * 20
    common = dict(model=MODEL, max_tokens=2, system=system, extra_body=GREEDY)
    claude.messages.create(messages=ASK, **common)
    again = claude.messages.create(messages=[{"role": "user", "content": "And in Rome?"}], **common)
    assert again.usage.cache_read_input_tokens > 100


@pytest.mark.parametrize("body, status, kind, words", [
    (dict(messages=ASK), 400, "invalid_request_error", "max_tokens"),
    (dict(max_tokens=10, messages=ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), 400,
     "invalid_request_error", "nope"),
    (dict(max_tokens=10, messages=ASK, tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400,
     "invalid_request_error", "web_search_20250305"),
    (dict(max_tokens=10, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]), 400,
     "invalid_request_error", "image"),
    (dict(max_tokens=10, messages=ASK, model="claude-opus-4"), 404, "not_found_error", "claude-opus-4"),
    (dict(max_tokens=10, messages=ASK, tools=[{"name": "x", "input_schema": {"type": "object", "not": {}}}],
          tool_choice={"type": "any"}), 400, "invalid_request_error", "not"),
])
def test_errors_have_anthropic_shape(server_url, body, status, kind, words):
    response = httpx.post(f"{server_url}/v1/messages", json={"model": MODEL, **body}, timeout=1800)
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert words in error["error"]["message"]


def test_output_config_format_gives_valid_json(claude):
    message = claude.messages.create(model=MODEL, max_tokens=60, messages=ASK, extra_body=GREEDY,
                                     output_config={"format": {"type": "json_schema", "schema": WEATHER}})
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), WEATHER)


def test_claude_style_agent_example_runs_its_tools(server_url, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / "claude_style_agent.py"
    spec = importlib.util.spec_from_file_location("claude_style_agent", path)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    assert agent.calculate("12 * (7 + 5)") == "144" and agent.calculate("__import__('os')").startswith("error")
    assert "examples/claude_style_agent.py" in agent.search_files("def search_files")
    answer = agent.run("What is 12 * (7 + 5)?", server_url, max_steps=2)
    assert "step 0: " in capsys.readouterr().out  # a real tool ran on a valid tool_use input
    assert isinstance(answer, str)
