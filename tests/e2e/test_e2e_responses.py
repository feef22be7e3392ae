"""End to end: the OpenAI Responses API on the live server, through the official openai SDK."""

import json

import jsonschema
import openai
import pytest

from test_e2e_tools import ADD, WEATHER

MODEL = "smollm2-135m-instruct"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER},
         {"type": "function", "name": "add", "description": "Add two integers", "parameters": ADD}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = "What is the weather in Paris?"


def function_calls(response):
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        assert call.call_id and call.id
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return calls


def test_required_gives_valid_function_calls(client):
    response = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required",
                                       max_output_tokens=100, temperature=0)
    assert function_calls(response) and response.status == "completed"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def test_named_tool_choice_is_exactly_one_call(client):
    response = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, max_output_tokens=100, temperature=0,
                                       tool_choice={"type": "function", "name": "add"})
    assert [call.name for call in function_calls(response)] == ["add"]


def test_stream_events_and_final_response_equal_the_non_streamed_one(client):
    common = dict(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=100,
                  temperature=0.8, extra_body={"seed": 5})
    plain = client.responses.create(**common)
    events = list(client.responses.create(stream=True, **common))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert [(c.name, c.arguments) for c in function_calls(final)] == \
        [(c.name, c.arguments) for c in function_calls(plain)]
    deltas: dict[str, str] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
        elif event.type == "response.function_call_arguments.done":
            assert deltas.get(event.item_id, "") == event.arguments
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.id for item in done] == [item.id for item in final.output]


def test_text_stream_joins_into_output_text(client):
    events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=12, temperature=0,
                                          stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and final.output_text == text
    assert events[-1].type == "response.incomplete" or final.status == "completed"


def test_max_output_tokens_makes_an_incomplete_response(client):
    response = client.responses.create(model=MODEL, input=ASK, max_output_tokens=2, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[-1].status == "incomplete"


def test_function_call_output_round_trip_and_previous_response_id(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, max_output_tokens=100, temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"})
    [call] = function_calls(first)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C and sunny"}
    stateless = client.responses.create(model=MODEL, input=[{"role": "user", "content": ASK}, call, result],
                                        instructions="Answer briefly.", tools=TOOLS, tool_choice="none",
                                        max_output_tokens=10, temperature=0)
    chained = client.responses.create(model=MODEL, previous_response_id=first.id, input=[result],
                                      tools=TOOLS, tool_choice="none", max_output_tokens=10, temperature=0,
                                      instructions="Answer briefly.")
    assert stateless.output_text and chained.output_text == stateless.output_text
    assert chained.usage.input_tokens_details.cached_tokens > 0
    assert client.responses.retrieve(chained.id).output_text == chained.output_text


def test_json_schema_text_format(client):
    response = client.responses.create(model=MODEL, input=ASK, max_output_tokens=60, temperature=0, text={
        "format": {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), WEATHER)


@pytest.mark.parametrize("kwargs, status, param", [
    (dict(previous_response_id="resp_unknown"), 400, "previous_response_id"),
    (dict(tools=[{"type": "web_search"}]), 400, "tools[0].type"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "name": "nope"}), 400, "tool_choice.name"),
    (dict(max_output_tokens=100000), 400, "max_output_tokens"),
    (dict(tools=[{"type": "function", "name": "x", "parameters": {"type": "object", "not": {}}}],
          tool_choice="required"), 400, "tools[0].parameters"),
])
def test_errors_name_the_field(client, kwargs, status, param):
    with pytest.raises(openai.APIStatusError) as err:
        client.responses.create(model=MODEL, input=ASK, **{"max_output_tokens": 20, **kwargs})
    assert err.value.status_code == status and err.value.body["param"] == param
