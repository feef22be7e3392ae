"""The schema shape check (server/schema_check.py) runs off the event loop, for structured outputs and tools.

It walks every subschema in Python: ~0.1 s for a 700 KB schema of 12 nested oneOf levels, seconds for
a body near the 32 MiB limit. On the event loop that stalled every other request and /health (a load
run with such a schema beside 16 clients saw a /health poll take 310 ms, py-spy showing the loop in
check_schema). Here the check is replaced by one that blocks its thread for 0.5 s, and a ticker on the
loop must keep ticking meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from server import structured_output, tool_calls
from server.errors import APIError
from server.generation import Fields
from server.structured_output import OutputFormat, build_format_constraint

BLOCK_S = 0.5
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def slow_check(schema, param) -> None:
    time.sleep(BLOCK_S)  # stands for a long walk over a huge schema


class StubCompiler:
    async def schema_regex_async(self, schema, ignore=()):
        return r'\{"q":"[a-z]*"\}'

    async def compile_regex_async(self, regex):
        return SimpleNamespace(matcher=lambda: "matcher")


async def longest_loop_gap(work):
    """Awaits `work` beside a 10 ms ticker on the event loop: (its result, the longest gap between ticks in s)."""
    ticks = [time.perf_counter()]

    async def ticker():
        while True:
            await asyncio.sleep(0.01)
            ticks.append(time.perf_counter())

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.03)  # ticking before the work starts
    try:
        result = await work
    finally:
        ticks.append(time.perf_counter())
        task.cancel()
    return result, max(b - a for a, b in zip(ticks, ticks[1:]))


def test_a_structured_outputs_schema_is_checked_off_the_event_loop(monkeypatch):
    monkeypatch.setattr(structured_output, "check_schema", slow_check)
    state = SimpleNamespace(compiler=StubCompiler())
    work = build_format_constraint(state, OutputFormat("json_schema", SCHEMA), Fields())
    matcher, gap = asyncio.run(longest_loop_gap(work))
    assert matcher == "matcher"
    assert gap < BLOCK_S / 2, f"the event loop stood still for {gap:.2f} s while the schema was checked"


def test_tool_schemas_are_checked_off_the_event_loop(monkeypatch):
    monkeypatch.setattr(tool_calls, "check_schema", slow_check)
    state = SimpleNamespace(compiler=StubCompiler())
    tools = [{"type": "function", "function": {"name": "ask", "parameters": SCHEMA}}]
    regexes, gap = asyncio.run(longest_loop_gap(tool_calls._args_regexes(state, tools, None, Fields())))
    assert list(regexes.values()) == [r'\{"q":"[a-z]*"\}']
    assert gap < BLOCK_S / 2, f"the event loop stood still for {gap:.2f} s while the tool schemas were checked"


def test_a_bad_shape_is_still_a_400_naming_where():
    state = SimpleNamespace(compiler=StubCompiler())
    bad = {"type": "object", "properties": {"q": {"type": []}}}
    with pytest.raises(APIError) as raised:
        asyncio.run(build_format_constraint(state, OutputFormat("json_schema", bad), Fields()))
    assert raised.value.code == "invalid_schema" and "properties.q.type" in raised.value.message
