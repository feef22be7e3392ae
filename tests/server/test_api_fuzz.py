"""The HTTP API fuzzed in process (tests/api_fuzz.py): hypothesis-built requests (bad JSON, wrong types, unknown
roles and models, empty messages, pathological schemas, absent and duplicate tools) and schemathesis cases
from the app's own OpenAPI document. Never a 5xx, every 4xx in the API's error shape, every constrained
200 valid against its schema, and /health and a one-token chat answer after each request.
benchmarks/fuzz.py runs the same at >= 10,000 requests; MASKD_API_FUZZ_EXAMPLES sets the count here."""

import os

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st

import api_fuzz
from engine_fixtures import tiny_model  # noqa: F401 (fixture)
from server.app import create_app

EXAMPLES = int(os.environ.get("MASKD_API_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
CANARY = {"model": api_fuzz.MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def served(tiny_model, smollm_tokenizer):  # noqa: F811
    state = api_fuzz.build_state(tiny_model, smollm_tokenizer)
    app = create_app(state)
    try:
        with TestClient(app, raise_server_exceptions=False) as http:
            yield api_fuzz.schemathesis_cases(app), http
    finally:
        state.compiler.close()


def still_serving(http) -> None:
    assert http.get("/health").status_code == 200
    assert http.post("/v1/chat/completions", json=CANARY).status_code == 200


@FUZZ
@given(case=api_fuzz.CASES)
def test_hypothesis_requests_get_no_5xx_and_valid_outputs(served, case):
    _, http = served
    reply = case.send(http)
    assert api_fuzz.problems(case, reply) == []
    still_serving(http)


@FUZZ
@given(data=st.data())
def test_schemathesis_cases_from_the_openapi_document_get_no_5xx(served, data):
    cases, http = served
    case = api_fuzz.as_case(data.draw(cases))
    reply = case.send(http)
    assert api_fuzz.problems(case, reply) == []
    still_serving(http)


@pytest.mark.parametrize("prompt", ["", [""]])
def test_an_empty_prompt_is_a_400_not_an_engine_failure(served, prompt):
    """Found by the fuzzer: an empty completions prompt (0 tokens) reached the engine and failed there (500)."""
    _, http = served
    for stream in (False, True):
        reply = http.post("/v1/completions", json={"model": api_fuzz.MODEL, "prompt": prompt, "max_tokens": 1,
                                                  "stream": stream})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "empty_prompt" and error["param"] == "prompt" and "empty" in error["message"]
    still_serving(http)


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": "a\\udfff", "max_tokens": 1}'),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/tokenize", b'{"prompt": "\\ud800"}'),
])
def test_a_lone_surrogate_is_a_400_not_a_tokenizer_failure(served, route, body):
    """Found by the fuzzer: the JSON escape of a lone UTF-16 surrogate parses, then the tokenizer raised (500)."""
    _, http = served
    reply = http.post(route, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "invalid_unicode" and "surrogate" in error["message"]
    still_serving(http)


BAD_SHAPES = [{"type": []}, {"type": "string", "pattern": 5}, {"type": "object", "properties": {"a": {"type": "strnig"}}},
              # compiled, then the output check recursed without end (500; a stream cut off)
              {"$ref": "#/properties/a", "properties": {"a": {"$ref": "#/properties/a"}}}]


@pytest.mark.parametrize("schema", BAD_SHAPES)
def test_a_schema_of_the_wrong_shape_is_a_400(served, schema):
    """Found by the fuzzer: `"type": []` compiled into a grammar no output fits (the output check withheld
    it: 500) and `"pattern": 5` failed in the compiler (500); now each is a 400 naming the keyword."""
    _, http = served
    user = [{"role": "user", "content": "hi"}]
    cases = [("/v1/chat/completions", {"model": "tiny", "messages": user, "max_tokens": 4, "response_format": {
                 "type": "json_schema", "json_schema": {"name": "o", "schema": schema}}}, "response_format.json_schema.schema"),
             ("/v1/chat/completions", {"model": "tiny", "messages": user, "max_tokens": 4, "tool_choice": "required",
                                       "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]},
              "tools[0].function.parameters"),
             ("/v1/messages", {"model": "tiny", "messages": user, "max_tokens": 4, "stream": True,
                               "output_config": {"format": {"type": "json_schema", "schema": schema}}}, None)]
    for route, body, param in cases:
        reply = http.post(route, json=body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert "not a valid JSON Schema" in error["message"]
        if param:
            assert error["param"] == param and error["code"] == "invalid_schema"
    still_serving(http)
