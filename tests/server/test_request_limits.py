"""--request-timeout and --max-tokens-cap on the real app and a real engine (a tiny random Llama with
the embedded model's tokenizer), through every generation route, plain and streamed.

The deadline tests use an engine that is never started: a request then waits forever, so only its
deadline can end it, whatever the speed of the machine."""

import json

import pytest
import torch
from fastapi.testclient import TestClient

from engine.engine import Engine
from engine_fixtures import tiny_model  # noqa: F401 (fixture)
from server.app import create_app
from server.state import ServerState

EOS = frozenset({2})
USER = [{"role": "user", "content": "hi"}]
ROUTES = {  # route -> a body asking for at most `n` tokens
    "/v1/chat/completions": lambda n: {"model": "tiny", "messages": USER, "max_tokens": n},
    "/v1/completions": lambda n: {"model": "tiny", "prompt": "hi", "max_tokens": n},
    "/v1/messages": lambda n: {"model": "tiny", "messages": USER, "max_tokens": n},
    "/v1/responses": lambda n: {"model": "tiny", "input": "hi", "max_output_tokens": n},
}


def serve(model, tokenizer, **limits) -> tuple[ServerState, Engine]:
    engine = Engine(model, tokenizer, torch.device("cpu"), EOS, context_length=512)
    return ServerState(model_name="tiny", tokenizer=tokenizer, context_length=512, tool_format="hermes",
                       engine=engine, **limits), engine


@pytest.fixture
def stalled(tiny_model, smollm_tokenizer):  # noqa: F811
    state, engine = serve(tiny_model, smollm_tokenizer, request_timeout=0.2)
    return TestClient(create_app(state)), engine  # no `with`: the engine thread never starts


def cancelled_in_engine(engine: Engine) -> bool:
    """Whether every request the engine was given has also been cancelled (its inbox, read by hand)."""
    engine._drain_inbox()
    waiting = list(engine.scheduler.waiting)
    return bool(waiting) and all(seq.cancelled for seq in waiting)


@pytest.mark.parametrize("route", ROUTES)
def test_a_plain_request_past_its_deadline_is_a_504_and_is_cancelled(stalled, route):
    http, engine = stalled
    reply = http.post(route, json=ROUTES[route](50))
    assert reply.status_code == 504
    if route == "/v1/messages":
        error = reply.json()["error"]
        assert reply.json()["type"] == "error" and error["type"] == "timeout_error"
    else:
        error = reply.json()["error"]
        assert error["type"] == "timeout_error" and error["code"] == "request_timeout"
    assert "--request-timeout" in error["message"] and "0.2 s" in error["message"]
    assert cancelled_in_engine(engine)


@pytest.mark.parametrize("route", ROUTES)
def test_a_stream_past_its_deadline_ends_with_the_apis_error_event(stalled, route):
    http, engine = stalled
    reply = http.post(route, json={**ROUTES[route](50), "stream": True})
    assert reply.status_code == 200
    events = [line.removeprefix("event:").strip() for line in reply.text.splitlines() if line.startswith("event:")]
    data = [line.removeprefix("data:").strip() for line in reply.text.splitlines() if line.startswith("data:")]
    if route in ("/v1/chat/completions", "/v1/completions"):  # the openai SDK raises on an `error` payload
        assert data[-1] == "[DONE]"
        error = json.loads(data[-2])["error"]
        assert error["type"] == "timeout_error" and error["code"] == "request_timeout"
    elif route == "/v1/messages":  # the anthropic SDK raises on an `error` event
        assert events[-1] == "error"
        error = json.loads(data[-1])["error"]
        assert error["type"] == "timeout_error"
    else:  # Responses: an `error` event, then `response.failed` carrying it
        assert events[-2:] == ["error", "response.failed"]
        assert json.loads(data[-2])["code"] == "request_timeout"
        error = json.loads(data[-1])["response"]["error"]
        assert json.loads(data[-1])["response"]["status"] == "failed" and error["code"] == "request_timeout"
    assert "--request-timeout" in error["message"]
    assert cancelled_in_engine(engine)


@pytest.mark.parametrize("route", ROUTES)
def test_max_tokens_above_the_cap_is_a_400_naming_the_field_and_the_cap(tiny_model, smollm_tokenizer, route):  # noqa: F811
    state, _ = serve(tiny_model, smollm_tokenizer, max_tokens_cap=6)
    http = TestClient(create_app(state))  # refused before the engine is asked
    reply = http.post(route, json=ROUTES[route](7))
    assert reply.status_code == 400
    field = "max_output_tokens" if route == "/v1/responses" else "max_tokens"
    error = reply.json()["error"]
    assert f"{field} is 7" in error["message"] and "cap of 6" in error["message"]
    assert "--max-tokens-cap" in error["message"]
    if route != "/v1/messages":
        assert error["param"] == field and error["code"] == "max_tokens_exceeded"
    if route == "/v1/chat/completions":  # the newer field name is capped alike
        reply = http.post(route, json={"model": "tiny", "messages": USER, "max_completion_tokens": 7})
        assert reply.status_code == 400 and "cap of 6" in reply.json()["error"]["message"]


def test_the_cap_bounds_the_default_and_allows_up_to_itself(tiny_model, smollm_tokenizer):  # noqa: F811
    state, _ = serve(tiny_model, smollm_tokenizer, max_tokens_cap=6, default_max_tokens=4096)
    with TestClient(create_app(state)) as http:
        unasked = http.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "ignore_eos": True})
        assert unasked.json()["usage"]["completion_tokens"] == 6
        assert unasked.json()["choices"][0]["finish_reason"] == "length"
        at_cap = http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": USER, "ignore_eos": True, "max_tokens": 6})
        assert at_cap.status_code == 200 and at_cap.json()["usage"]["completion_tokens"] == 6


def test_the_sdks_raise_the_timeout_plain_and_streamed(stalled):
    import anthropic
    import openai
    http, _ = stalled
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http, max_retries=0)
    with pytest.raises(openai.APIStatusError, match="--request-timeout") as plain:
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=50)
    assert plain.value.status_code == 504
    with pytest.raises(openai.APIError, match="--request-timeout"):
        for _ in client.chat.completions.create(model="tiny", messages=USER, max_tokens=50, stream=True):
            pass
    claude = anthropic.Anthropic(base_url="http://testserver", api_key="-", http_client=http, max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="--request-timeout") as plain:
        claude.messages.create(model="tiny", messages=USER, max_tokens=50)
    assert plain.value.status_code == 504
    with pytest.raises(anthropic.APIError, match="--request-timeout"):
        with claude.messages.stream(model="tiny", messages=USER, max_tokens=50) as stream:
            for _ in stream:
                pass
