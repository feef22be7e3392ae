"""The API key, the body limit and opaque 500s, on the real app (no model needed for these routes)."""

import httpx
import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.state import ServerState


@pytest.fixture
def http():
    state = ServerState(model_name="m", tokenizer=None, context_length=8, tool_format="hermes", engine=None)
    app = create_app(state, api_key="sekret", max_body_bytes=1000, cors_origins=("http://localhost:3000",))

    @app.get("/v1/boom")
    async def boom():
        raise RuntimeError("secret internals /home/x/.ssh")
    return TestClient(app, raise_server_exceptions=False)  # no `with`: the engine is never started


def test_the_key_is_required_except_on_health(http):
    assert http.get("/health").status_code == 200
    missing = http.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert http.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert http.get("/v1/models", headers={"Authorization": "Bearer sekret"}).json()["data"][0]["id"] == "m"
    assert http.get("/v1/models", headers={"x-api-key": "sekret"}).status_code == 200
    anthropic_shape = http.post("/v1/messages", json={})
    assert anthropic_shape.status_code == 401 and anthropic_shape.json()["type"] == "error"
    assert http.get("/debug/integrity").status_code == 401


def test_cors_preflight_is_answered_before_the_key(http):
    preflight = http.options("/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_a_body_over_the_limit_is_413_before_parsing(http):
    key = {"Authorization": "Bearer sekret"}
    big = http.post("/tokenize", content=b'{"prompt": "' + b"a" * 2000 + b'"}', headers=key)
    assert big.status_code == 413 and "exceeds 1000 bytes" in big.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(30):
            yield b"a" * 100
        yield b'"}'
    chunked = http.post("/tokenize", content=chunks(), headers=key)
    assert chunked.status_code == 413


def test_a_500_shows_no_internals(http):
    reply = http.get("/v1/boom", headers={"Authorization": "Bearer sekret"})
    assert reply.status_code == 500
    message = reply.json()["error"]["message"]
    assert "incident" in message and "secret" not in message and "RuntimeError" not in message
