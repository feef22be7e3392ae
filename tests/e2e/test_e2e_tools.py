"""End to end: tool calling and structured output on the live server, through the openai SDK and LangChain."""

import asyncio
import json

import jsonschema
import openai
import pytest

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def valid_calls(message):
    assert message.tool_calls, f"expected tool calls, got content {message.content!r}"
    for call in message.tool_calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({call.id for call in message.tool_calls}) == len(message.tool_calls)
    return message.tool_calls


def streamed(client, **kwargs):
    """(content, {index: (id, name, arguments)}, finish_reason) accumulated from the stream, checking
    that the first delta of each call carries id/type/name/"" and later ones only arguments."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.index == len(calls), "call indices must be contiguous from 0"
                assert delta.id and delta.type == "function" and delta.function.name
                assert delta.function.arguments == ""
                calls[delta.index] = [delta.id, delta.function.name, ""]
            else:
                assert delta.id is None and delta.function.name is None, "name and id are sent once"
                calls[delta.index][2] += delta.function.arguments
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_required_gives_valid_calls(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=100, temperature=0)
    valid_calls(reply.choices[0].message)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.content is None


def test_n_rows_each_make_their_own_valid_calls(client):
    """n choices share the request's tool calls (built once) and each keeps its own state: three
    sampled rows, three sets of valid calls, each row's the ones it gives with its seed alone."""
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, temperature=1.0, seed=5, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    rows = [[(c.function.name, c.function.arguments) for c in valid_calls(choice.message)] for choice in reply.choices]
    alone = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, temperature=1.0, seed=6)  # row 1's seed (seed + row)
    assert rows[1] == [(c.function.name, c.function.arguments) for c in valid_calls(alone.choices[0].message)]


def test_named_tool_choice_calls_that_tool_once(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False, max_tokens=100, temperature=0)
    calls = valid_calls(reply.choices[0].message)
    assert [c.function.name for c in calls] == ["add"]


def test_streamed_calls_equal_non_streamed_for_same_seed(client):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=100,
                  temperature=0.8, seed=99, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs)
    content, calls, finish = streamed(client, **kwargs)
    expected = [(c.function.name, c.function.arguments) for c in valid_calls(whole.choices[0].message)]
    assert [(name, args) for _, name, args in calls.values()] == expected
    assert finish == whole.choices[0].finish_reason == "tool_calls"
    assert content == ""


def auto_reply(client, kwargs):
    """The message of an auto request, checked: any calls valid and ending it, no delimiter in the
    text, and the streamed answer the same."""
    reply = client.chat.completions.create(**kwargs)
    message = reply.choices[0].message
    if message.tool_calls:
        valid_calls(message)
        assert reply.choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in (message.content or "")
    content, calls, _ = streamed(client, **kwargs)
    assert content == (message.content or "")
    assert [(n, a) for _, n, a in calls.values()] == [(c.function.name, c.function.arguments)
                                                      for c in message.tool_calls or []]
    return message


@pytest.mark.parametrize("seed", [1, 2])
def test_auto_calls_are_valid_whenever_present(client, seed):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=60,
                  temperature=1.0, seed=seed, parallel_tool_calls=False)
    message = auto_reply(client, kwargs)


def test_auto_with_the_delimiter_favoured_makes_a_valid_call(client, smollm_tokenizer):
    """logit_bias on the tokens of `<tool_call>` makes this small model open a call in auto; from
    then on the lazy grammar holds it to a known tool and valid arguments."""
    bias = {str(t): 30 for t in smollm_tokenizer.encode("<tool_call>", add_special_tokens=False)}
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=80, temperature=0,
                  parallel_tool_calls=False, logit_bias=bias)
    assert auto_reply(client, kwargs).tool_calls


def test_tool_choice_none_answers_in_text(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none",
                                           max_tokens=10, temperature=0)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content


def test_conversation_round_trip_with_tool_results(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=100, temperature=0)
    call = valid_calls(first.choices[0].message)[0]
    messages = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=20, temperature=0)
    assert second.choices[0].message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize("kwargs, param", [
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
    (dict(tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "not": {"const": 3}}}}}}]),
     "tools[0].function.parameters"),
    (dict(tools=None, tool_choice="required"), "tool_choice"),
])
def test_bad_tool_requests_are_400_naming_the_field(client, kwargs, param):
    args = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 5, **kwargs}
    args = {k: v for k, v in args.items() if v is not None}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    assert err.value.body["param"] == param


def test_unsupported_keyword_error_names_it(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "not": {"const": 3}}}}}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required")
    assert "'not'" in err.value.body["message"]


def test_a_one_of_whose_branches_overlap_is_a_400_saying_so(client):
    """oneOf is compiled as anyOf: where 1 would match both branches, the schema is refused up front
    (never a call the output check has to withhold), with strict: false too."""
    overlapping = {"type": "object", "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}},
                   "required": ["n"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": overlapping}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required", max_tokens=5)
    assert err.value.body["param"] == "tools[0].function.parameters"
    assert "/properties/n/oneOf" in err.value.body["message"] and "use anyOf" in err.value.body["message"]
    json_schema = {"name": "n", "schema": overlapping}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                       response_format={"type": "json_schema", "json_schema": json_schema})
    assert err.value.body["param"] == "response_format.json_schema.schema" and "oneOf" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {**json_schema, "strict": False}})


def test_response_format_json_schema_validates(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 15},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON."}], max_tokens=150,
        temperature=0.7, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    assert reply.choices[0].finish_reason == "stop"


def test_response_format_json_object_parses(client):
    ask = [{"role": "user", "content": "Give me a JSON object describing a cat with keys name and age."}]
    reply = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=150, temperature=0,
                                           response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_async_stream_accumulation_helper(async_client):
    async def run():
        async with async_client.chat.completions.stream(
                model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                max_tokens=100, temperature=0) as stream:
            async for _ in stream:
                pass
            return await stream.get_final_completion()
    final = asyncio.run(run())
    valid_calls(final.choices[0].message)
    assert final.choices[0].finish_reason == "tool_calls"


def test_langchain_bind_tools(server_url):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(model=MODEL, base_url=f"{server_url}/v1", api_key="unused", temperature=0, max_tokens=100)
    message = llm.bind_tools([add], tool_choice="required", parallel_tool_calls=False).invoke("What is 2 + 3?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "add"
    assert set(message.tool_calls[0]["args"]) == {"a", "b"}
    assert all(isinstance(v, int) for v in message.tool_calls[0]["args"].values())


def test_react_agent_example_runs_to_an_answer(server_url, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / "react_agent.py"
    spec = importlib.util.spec_from_file_location("react_agent", path)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    answer = agent.run("What is the weather in Paris?", f"{server_url}/v1", MODEL, max_steps=2)
    assert "step 0:" in capsys.readouterr().out  # at least one real tool call ran
    assert isinstance(answer, str)


def test_a_stop_string_never_cuts_a_call_or_a_structured_output(client):
    """ReAct agents send stop=["Observation:"] on every request: inside a call or a JSON output the
    stop string is text like any other (stops apply to free text only)."""
    note = "Thought, then Observation: done"
    schema = {"type": "object", "properties": {"note": {"const": note}}, "required": ["note"],
              "additionalProperties": False}
    common = dict(model=MODEL, messages=ASK, stop=["Observation:"], max_tokens=60, temperature=0)
    tools = [{"type": "function", "function": {"name": "log", "parameters": schema}}]
    reply = client.chat.completions.create(tools=tools, tool_choice="required", **common)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == {"note": note}
    _, calls, finish = streamed(client, tools=tools, tool_choice="required", **common)
    assert finish == "tool_calls" and json.loads(calls[0][2]) == {"note": note}
    reply = client.chat.completions.create(response_format={"type": "json_schema", "json_schema": {
        "name": "note", "schema": schema}}, **common)
    assert reply.choices[0].finish_reason == "stop" and json.loads(reply.choices[0].message.content) == {"note": note}
