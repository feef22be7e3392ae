"""The last gate before an output leaves: a call or structured output that fails its schema is withheld."""

import asyncio
from types import SimpleNamespace

from engine.sequence import Event, Request
from server.generation import Prepared
from server.output_check import FAILED, OutputCheck
from server.output_stream import Finish, collect, steps

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_calls_and_structured_outputs_are_checked():
    check = OutputCheck({"f": SCHEMA}, SCHEMA, "json_schema")
    before = FAILED.labels("tool_call")._value.get()
    assert check.call("f", '{"a": 1}') is None
    assert "do not match" in check.call("f", '{"a": "x"}')
    assert "not among the tools" in check.call("g", "{}")
    assert "not JSON" in check.call("f", '{"a": ')
    assert FAILED.labels("tool_call")._value.get() == before + 3
    assert check.text('{"a": 2}') is None and check.text('{"b": 2}') is not None
    assert OutputCheck({}, None, "json_object").text("[1]") is not None  # json_object: an object


def test_a_schema_the_check_cannot_finish_fails_closed():
    """Found by the API fuzz: a $ref cycle the grammar accepted made jsonschema recurse without end (a 500
    from an unhandled RecursionError, a stream cut off); now the output is withheld as unchecked."""
    cycle = {"$ref": "#/properties/a", "properties": {"a": {"$ref": "#/properties/a"}}}
    failure = OutputCheck({"f": cycle}, cycle, "json_schema")
    assert "could not be checked" in failure.text("{}")
    assert "could not be checked" in failure.call("f", "{}")


def run(texts: list[str], check: OutputCheck, reads_tools: bool, reason: str = "stop"):
    """The steps of a canned engine event stream (the engine's events, without a model)."""
    async def events():
        for i, text in enumerate(texts):
            yield Event(token_ids=[i], text=text, finish_reason=reason if i == len(texts) - 1 else None)
    prepared = Prepared([Request(prompt_ids=[1], constraint=object())], reads_tools=reads_tools,
                        thinking_open=False, check=check)
    state = SimpleNamespace(tool_format="hermes", engine=SimpleNamespace(cancel=lambda request_id: None))

    async def go():
        return [step async for step in steps(state, prepared, events())]
    return asyncio.run(go())


def test_an_invalid_call_is_withheld_as_an_error():
    texts = ['<tool_call>\n{"name": "f", ', '"arguments": {"a": "x"}}\n</tool_call>', ""]
    out = run(texts, OutputCheck({"f": SCHEMA}), reads_tools=True)
    assert out[-1].finish.reason == "error" and "failed validation" in out[-1].finish.error
    valid = run(['<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', ""], OutputCheck({"f": SCHEMA}),
                reads_tools=True)
    assert valid[-1].finish.reason == "tool_calls"


def test_a_structured_output_is_checked_at_its_end_unless_cut():
    bad = run(['{"b":', " 1}"], OutputCheck(None, SCHEMA, "json_schema"), reads_tools=False)
    assert isinstance(bad[-1].finish, Finish) and bad[-1].finish.reason == "error"
    cut = run(['{"a":'], OutputCheck(None, SCHEMA, "json_schema"), reads_tools=False, reason="length")
    assert cut[-1].finish.reason == "length"  # reported as cut, not as valid


def test_collect_turns_a_withheld_output_into_a_500():
    from server.errors import APIError
    prepared = Prepared([Request(prompt_ids=[1], constraint=object())], reads_tools=False, thinking_open=False,
                        check=OutputCheck(None, SCHEMA, "json_schema"))
    state = SimpleNamespace(tool_format="hermes", engine=SimpleNamespace(cancel=lambda request_id: None))

    async def events():
        yield Event(token_ids=[0], text='{"b": 1}', finish_reason="stop")

    async def go():
        await collect(steps(state, prepared, events()))
    try:
        asyncio.run(go())
    except APIError as exc:
        assert exc.status == 500 and "failed validation" in exc.message
    else:
        raise AssertionError("an invalid structured output was returned")
