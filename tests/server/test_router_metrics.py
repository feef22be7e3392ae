"""What a router in front of maskd replicas reads: the vLLM and SGLang metric names on /metrics,
/server_info, and request fields it adds (a session id, say) accepted by every route.

A tiny random-weight Llama behind the real app in this process (no model download, no subprocess).
"""

import re

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import LlamaConfig, LlamaForCausalLM

from engine.engine import Engine
from server.router_metrics import kv_cache_usage

EXTRA = {"router_session_id": "agent-7", "x_routing_hint": {"replica": 1}}


@pytest.fixture(scope="module")
def http(smollm_tokenizer):
    from server.app import create_app
    from server.state import ServerState
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(config).eval()
    engine = Engine(model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), context_length=1024,
                    prefix_cache_bytes=8 << 20)
    state = ServerState(model_name="tiny", tokenizer=smollm_tokenizer, context_length=1024,
                        tool_format="hermes", engine=engine)
    with TestClient(create_app(state)) as client:
        yield client


def sample(text: str, name: str) -> float:
    """The value of the one series named `name` (any labels) in Prometheus text."""
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, flags=re.M)
    assert len(found) == 1, f"{name}: {len(found)} series in /metrics"
    return float(found[0])


SYSTEM = "You are the stock clerk of a warehouse; answer in one short sentence. " * 6
ROUTES = [
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "temperature": 0,
                              "messages": [{"role": "system", "content": SYSTEM},
                                           {"role": "user", "content": "red chairs?"}]}),
    ("/v1/completions", {"model": "tiny", "max_tokens": 2, "temperature": 0, "prompt": "The quick brown fox"}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 2, "temperature": 0, "system": SYSTEM,
                      "messages": [{"role": "user", "content": "blue tables?"}]}),
    ("/v1/messages/count_tokens", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "tiny", "max_output_tokens": 2, "temperature": 0, "input": "hello"}),
    ("/tokenize", {"model": "tiny", "prompt": "hello there"}),
]


@pytest.mark.parametrize("route,body", ROUTES, ids=[r for r, _ in ROUTES])
def test_every_route_accepts_a_field_it_does_not_know(http, route, body):
    for stream in ((False, True) if route in ("/v1/chat/completions", "/v1/completions") else (False,)):
        reply = http.post(route, json={**body, **EXTRA, **({"stream": True} if stream else {})})
        assert reply.status_code == 200, reply.text


def test_responses_take_the_body_sglang_router_forwards(http):
    """sglang-router re-serializes a Responses body with its defaults, `stream` as null among them."""
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, "stream": None, "store": True, "top_k": -1,
            "min_p": 0.0, "repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "priority": 0}
    reply = http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["object"] == "response"


def test_metrics_carry_the_vllm_and_sglang_names_routers_scrape(http):
    chat = ROUTES[0][1]
    for question in ("red chairs?", "blue tables?"):  # the second one hits the system prompt's prefix
        body = {**chat, "messages": [chat["messages"][0], {"role": "user", "content": question}]}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    text = http.get("/metrics").text
    assert sample(text, "vllm:num_requests_running") == 0 == sample(text, "sglang:num_running_reqs")
    assert sample(text, "vllm:num_requests_waiting") == 0 == sample(text, "sglang:num_queue_reqs")
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"):
        assert sample(text, name) == 0  # nothing running: no slot reserved
    queries, hits = sample(text, "vllm:prefix_cache_queries_total"), sample(text, "vllm:prefix_cache_hits_total")
    assert queries > hits > 60  # the shared system prompt was matched
    assert sample(text, "sglang:cache_hit_rate") == pytest.approx(hits / queries)
    assert 'vllm:num_requests_running{model_name="tiny"}' in text
    assert "maskd_requests_running" in text  # maskd's own names stay


def test_server_info_names_the_served_model(http):
    info = http.get("/server_info").json()
    assert info["served_model_name"] == "tiny" and info["max_running_requests"] >= 1


def test_kv_cache_usage_is_reserved_tokens_over_the_budget():
    class Shape:
        bytes_per_token = 100

    class Slots:
        shape, budget_bytes, reserved = Shape(), 10_000, {0: 30, 3: 20}

    assert kv_cache_usage(Slots()) == pytest.approx(0.5)
    Slots.reserved = {}
    assert kv_cache_usage(Slots()) == 0.0
