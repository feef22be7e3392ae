"""Rendering tools and past calls: through the family's own template, and built in."""

from __future__ import annotations

import copy
import json
import re

import pytest
from test_tool_formats_fixtures import CONVERSATION, TOOLS, WEATHER, args_regex, render

from grammars.tools.formats import ToolFormatError, get_tool_format

FAMILY = {  # format -> (template, a sample model output for "And in Lyon?")
    "hermes": ("qwen2_5.jinja", '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Lyon"}}\n</tool_call>'),
    "llama3_json": ("llama3_1.jinja", '{"name": "get_weather", "parameters": {"city":"Lyon"}}'),
    "mistral": ("mistral_v0_3.jinja", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city":"Lyon"}}]'),
}


def test_registry_lists_known_formats_on_unknown_name():
    with pytest.raises(ToolFormatError, match="hermes, llama3_json, mistral"):
        get_tool_format("chatml")


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_round_trip_through_family_template(name):
    fmt = get_tool_format(name)
    template, output = FAMILY[name]
    before = copy.deepcopy(CONVERSATION)
    messages, tools = fmt.prepare_messages(CONVERSATION, TOOLS, template_supports_tools=True)
    assert CONVERSATION == before, "prepare_messages must not change the caller's messages"
    assert tools == TOOLS
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    text = render(template, messages, tools)

    assert "Current weather in a city" in text and '"get_weather"' in text and '"get_time"' in text
    if name == "hermes":
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
        assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in text
    elif name == "llama3_json":
        assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in text
        assert "<|start_header_id|>ipython<|end_header_id|>" in text
    else:
        call_id = fmt.map_call_id("call_abc123")
        assert re.fullmatch(r"[A-Za-z0-9]{9}", call_id)
        assert messages[2]["tool_calls"][0]["id"] == messages[3]["tool_call_id"] == call_id
        assert f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{call_id}"}}]' in text
        assert f'"call_id": "{call_id}"}}[/TOOL_RESULTS]' in text
        assert "[AVAILABLE_TOOLS] [" in text

    regex = re.escape(fmt.open_text()) + fmt.call_block_regex(TOOLS, args_regex)
    assert re.fullmatch(regex, output)
    assert fmt.parse(output) == (None, [("get_weather", '{"city":"Lyon"}')])


@pytest.mark.parametrize("name", ["hermes", "mistral"])
def test_past_call_as_template_renders_it_parses_back(name):
    fmt = get_tool_format(name)
    template, _ = FAMILY[name]
    messages, tools = fmt.prepare_messages(CONVERSATION[:3], TOOLS, template_supports_tools=True)
    text = render(template, messages, tools, generation_prompt=False)
    start = text.index(fmt.open, text.index("Weather in Paris?"))
    assistant = text[start:].split("<|im_end|>")[0].split("</s>")[0]
    content, calls = fmt.parse(assistant)
    assert content is None
    assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_builtin_rendering_is_byte_stable_and_holds_the_tools(name):
    fmt = get_tool_format(name)
    first = fmt.prepare_messages(CONVERSATION, TOOLS, template_supports_tools=False)
    second = fmt.prepare_messages(copy.deepcopy(CONVERSATION), copy.deepcopy(TOOLS), template_supports_tools=False)
    assert json.dumps(first) == json.dumps(second)
    messages, tools = first
    assert tools is None
    assert messages[0]["role"] == "system" and "You are a weather bot." in messages[0]["content"]
    assert sum(m["role"] == "system" for m in messages) == 1
    indent = 4 if name == "llama3_json" else None
    for tool in TOOLS:
        dumped = json.dumps(tool if name != "mistral" else {"type": "function", "function": tool["function"]},
                            ensure_ascii=False, indent=indent, separators=None if indent else (", ", ": "))
        assert dumped in messages[0]["content"]
    assert all(isinstance(m["content"], str) and "tool_calls" not in m for m in messages)

    text = render("chatml_no_tools.jinja", messages, None)
    turn_one = render("chatml_no_tools.jinja", fmt.prepare_messages(CONVERSATION[:2], TOOLS, False)[0], None,
                      generation_prompt=False)
    assert text.startswith(turn_one), "the prompt prefix must stay the same across turns"

    assistant = messages[2]["content"]
    assert fmt.parse(assistant) == (None, [("get_weather", '{"city": "Paris"}')])


def test_builtin_system_message_created_when_absent():
    fmt = get_tool_format("hermes")
    messages, _ = fmt.prepare_messages(CONVERSATION[1:2], [WEATHER], False)
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("# Tools\n\n")
    assert messages[1] == CONVERSATION[1]


def test_builtin_tool_results_per_family():
    hermes, _ = get_tool_format("hermes").prepare_messages(CONVERSATION, TOOLS, False)
    assert hermes[3] == {"role": "user", "content": '<tool_response>\n{"temp": 21}\n</tool_response>'}
    two_results = CONVERSATION[:4] + [dict(CONVERSATION[3], content="second")]
    merged, _ = get_tool_format("hermes").prepare_messages(two_results, TOOLS, False)
    assert merged[3]["content"].endswith("</tool_response>\n<tool_response>\nsecond\n</tool_response>")
    assert len(merged) == 4

    llama = get_tool_format("llama3_json")
    as_user, _ = llama.prepare_messages(CONVERSATION, TOOLS, False)
    assert as_user[3] == {"role": "user", "content": 'Tool result:\n{"temp": 21}'}
    as_ipython, _ = llama.prepare_messages(CONVERSATION, TOOLS, False, chat_template="... ipython ...")
    assert as_ipython[3] == {"role": "ipython", "content": '{"temp": 21}'}

    mistral = get_tool_format("mistral")
    messages, _ = mistral.prepare_messages(CONVERSATION, TOOLS, False)
    call_id = mistral.map_call_id("call_abc123")
    assert messages[3]["content"] == f'[TOOL_RESULTS] {{"content": {{"temp": 21}}, "call_id": "{call_id}"}}[/TOOL_RESULTS]'
    assert messages[2]["content"].endswith(f'"id": "{call_id}"}}]')


def test_delimiters():
    shapes = {name: (get_tool_format(name).open, get_tool_format(name).close, get_tool_format(name).open_text(),
                     get_tool_format(name).call_may_open_reply) for name in FAMILY}
    assert shapes == {"hermes": ("<tool_call>", "</tool_call>", "<tool_call>", False),
                      "llama3_json": ("<|python_tag|>", None, "", True),
                      "mistral": ("[TOOL_CALLS]", None, "[TOOL_CALLS]", False)}


def test_mistral_call_ids():
    fmt = get_tool_format("mistral")
    assert fmt.map_call_id("abcDEF123") == "abcDEF123"
    assert fmt.map_call_id("call_x") == fmt.map_call_id("call_x") != fmt.map_call_id("call_y")
    assert re.fullmatch(r"[A-Za-z0-9]{9}", fmt.new_call_id())
    for name in ("hermes", "llama3_json"):
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", get_tool_format(name).new_call_id())


def test_template_path_handles_missing_and_bad_arguments():
    fmt = get_tool_format("hermes")
    calls = [{"id": "a", "type": "function", "function": {"name": "get_time", "arguments": ""}},
             {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}}]
    messages, _ = fmt.prepare_messages([{"role": "assistant", "content": "", "tool_calls": calls}], TOOLS, True)
    assert [c["function"]["arguments"] for c in messages[0]["tool_calls"]] == [{}, '{"city": "Par']
    no_id = [{"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
    messages, _ = get_tool_format("mistral").prepare_messages([{"role": "assistant", "tool_calls": no_id}], None, True)
    assert "id" not in messages[0]["tool_calls"][0]
    plain, _ = fmt.prepare_messages([{"role": "assistant", "content": "hi", "tool_calls": []}], None, True)
    assert plain == [{"role": "assistant", "content": "hi"}]
