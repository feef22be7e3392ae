"""call_block_regex: what each format's call block admits and rejects, in Python's re and in outlines-core."""

from __future__ import annotations

import re

import pytest
from outlines_core import Index, Vocabulary
from test_tool_formats_fixtures import TOOLS, args_regex

from grammars.tools.formats import ToolFormatError, get_tool_format

WEATHER_PARIS = ("get_weather", '{"city":"Paris"}')
TIME = ("get_time", "{}")


def output(name: str, calls: list[tuple[str, str]]) -> str:
    """The assistant output a model following the format writes for these calls."""
    if name == "hermes":
        return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in calls)
    if name == "llama3_json":
        return "; ".join(f'{{"name": "{n}", "parameters": {a}}}' for n, a in calls)
    return "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in calls) + "]"


def matches(name: str, text: str, parallel: bool = False, forced_name: str | None = None) -> bool:
    fmt = get_tool_format(name)
    regex = re.escape(fmt.open_text()) + fmt.call_block_regex(TOOLS, args_regex, parallel, forced_name)
    return re.fullmatch(regex, text) is not None


FORMATS = ["hermes", "llama3_json", "mistral"]


@pytest.mark.parametrize("name", FORMATS)
def test_single_call_and_parallel(name):
    one, two = output(name, [WEATHER_PARIS]), output(name, [WEATHER_PARIS, TIME])
    assert matches(name, one) and matches(name, output(name, [TIME]))
    assert not matches(name, two), "a second call must be rejected when parallel is off"
    assert matches(name, one, parallel=True) and matches(name, two, parallel=True)
    assert matches(name, output(name, [TIME, WEATHER_PARIS, TIME]), parallel=True)


@pytest.mark.parametrize("name", FORMATS)
def test_forced_name_rejects_other_tools(name):
    assert matches(name, output(name, [WEATHER_PARIS]), forced_name="get_weather")
    assert not matches(name, output(name, [TIME]), forced_name="get_weather")
    assert not matches(name, output(name, [WEATHER_PARIS, TIME]), parallel=True, forced_name="get_weather")
    with pytest.raises(ToolFormatError, match="'get_weather', 'get_time'"):
        get_tool_format(name).call_block_regex(TOOLS, args_regex, forced_name="get_news")


@pytest.mark.parametrize("name", FORMATS)
def test_unknown_names_and_bad_arguments_rejected(name):
    assert not matches(name, output(name, [("get_news", "{}")]))
    assert not matches(name, output(name, [("get_weather", "{}")])), "city is required"
    assert not matches(name, output(name, [("get_weather", '{"city":3}')]))
    assert not matches(name, output(name, [("get_weather", '{"city":"Paris","unit":"k"}')]))
    assert matches(name, output(name, [("get_weather", '{"city":"Paris","unit":"c"}')]))
    assert not matches(name, output(name, [("get_time", '{"x":1}')])), "no parameters means {}"


def test_exact_block_shapes():
    weather_only = [TOOLS[1]]
    hermes = get_tool_format("hermes").call_block_regex(weather_only, args_regex, parallel=True)
    assert hermes == (r'\n(\{"name": "get_time", "arguments": \{()?\}\})\n</tool_call>'
                      r'(\n<tool_call>\n(\{"name": "get_time", "arguments": \{()?\}\})\n</tool_call>)*')
    llama = get_tool_format("llama3_json").call_block_regex(weather_only, args_regex)
    assert llama == r'(\{"name": "get_time", "parameters": \{()?\}\})'
    mistral = get_tool_format("mistral").call_block_regex(weather_only, args_regex, parallel=True)
    assert mistral == (r' ?\[(\{"name": "get_time", "arguments": \{()?\}\})'
                       r'(, (\{"name": "get_time", "arguments": \{()?\}\}))*\]')


def test_bad_tools_are_explained():
    fmt = get_tool_format("hermes")
    with pytest.raises(ToolFormatError, match="no tools"):
        fmt.call_block_regex([], args_regex)
    with pytest.raises(ToolFormatError, match="used twice"):
        fmt.call_block_regex(TOOLS + TOOLS[:1], args_regex)
    with pytest.raises(ToolFormatError, match="only .*function"):
        fmt.call_block_regex([{"type": "custom", "custom": {"name": "x"}}], args_regex)
    with pytest.raises(ToolFormatError, match=r"tools\[0\].function.name is missing"):
        fmt.call_block_regex([{"type": "function", "function": {}}], args_regex)


def test_names_are_escaped():
    tools = [{"type": "function", "function": {"name": "a.b+c"}}]
    regex = get_tool_format("hermes").call_block_regex(tools, args_regex)
    assert re.fullmatch(regex, '\n{"name": "a.b+c", "arguments": {}}\n</tool_call>')
    assert not re.fullmatch(regex, '\n{"name": "aXbbc", "arguments": {}}\n</tool_call>')


CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
VOCABULARY = Vocabulary(len(CHARS), {c: [i] for i, c in enumerate(CHARS)})


def outlines_accepts(regex: str, text: str) -> bool:
    index = Index(regex, VOCABULARY)
    state = index.get_initial_state()
    for char in text:
        state = index.get_next_state(state, CHARS.index(char))
        if state is None:
            return False
    return index.is_final_state(state)


@pytest.mark.parametrize("name", FORMATS)
def test_outlines_core_compiles_and_agrees(name):
    fmt = get_tool_format(name)
    single = fmt.call_block_regex(TOOLS, args_regex)
    for calls in ([WEATHER_PARIS], [TIME]):
        assert outlines_accepts(single, output(name, calls)[len(fmt.open_text()):])
    assert not outlines_accepts(single, output(name, [("get_news", "{}")])[len(fmt.open_text()):])
    assert not outlines_accepts(single, output(name, [("get_weather", "{}")])[len(fmt.open_text()):])


# outlines-core 0.2.14 drops a token's transition when the token's last character leaves a state
# where the regex could already end for a state where it cannot (observed, not traced to its source;
# regex-automata's one-byte match delay is the likely cause). `a(;b)*` then rejects "a;b" with
# one-character tokens, and a block that may end after one call but also continue (hermes'
# `</tool_call>` then `\n<tool_call>`, llama3_json's `}` then `; `) loses its single-character
# continuations. Mistral's list ends with `]`, so it is not affected. These xfails are strict: when
# outlines-core fixes this they fail, and they can become plain tests.
UPSTREAM = "outlines-core 0.2.14 drops transitions out of a final state into a non-final one"


def test_outlines_core_drops_transitions_out_of_final_states():
    assert outlines_accepts("a(;b)*", "a") and not outlines_accepts("a(;b)*", "a;b"), UPSTREAM


@pytest.mark.parametrize("name", [
    pytest.param("hermes", marks=pytest.mark.xfail(strict=True, reason=UPSTREAM)),
    pytest.param("llama3_json", marks=pytest.mark.xfail(strict=True, reason=UPSTREAM)),
    "mistral"])
def test_outlines_core_parallel_blocks(name):
    fmt = get_tool_format(name)
    regex = fmt.call_block_regex(TOOLS, args_regex, parallel=True)
    assert outlines_accepts(regex, output(name, [WEATHER_PARIS, TIME])[len(fmt.open_text()):])
