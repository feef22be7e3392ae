"""Two maskd replicas behind sglang-router's cache_aware policy, all on 127.0.0.1 (issue 16).

- each agent's session (its own long system prompt, a conversation that grows turn by turn) stays
  on one replica, and its later turns hit that replica's prefix cache;
- distinct sessions spread over both replicas;
- every field of a request body that maskd reads reaches the replica with the client's value (seen
  by a stub worker), and answers through the router equal a replica's own (greedy; tools,
  tool_choice, response_format, a field neither knows, a stream with its usage).

Needs the `sglang-router` package (a dev extra); skipped without it.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager, nullcontext
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

pytest.importorskip("sglang_router", reason="pip install sglang-router (in maskd's dev extra)")

from server.bench.replicas import replicas, sglang_router  # noqa: E402

MODEL = "smollm2-135m-instruct"
AGENTS = {
    "stock": "You are the stock clerk of a furniture warehouse. You answer questions about chairs, "
             "tables and shelves in stock, one short sentence each, and never invent a number. " * 3,
    "travel": "Du bist ein Reisebüro-Assistent für Bahnreisen in Europa. Antworte knapp, nenne "
              "Abfahrtszeiten nur, wenn der Kunde sie ausdrücklich verlangt, und sei freundlich. " * 3,
}
QUESTIONS = ["Hello!", "What can you do?", "Thanks, one more thing."]


@pytest.fixture(scope="module")
def cluster():
    # a generous compile limit: two replicas and the router share a small, busy CPU in CI
    with replicas(2, "--grammar-timeout", "120", "--grammar-workers", "1") as urls, \
            sglang_router(urls, policy="cache_aware") as router:
        yield router, urls


def metric(url: str, name: str) -> float:
    reply = httpx.get(f"{url}/metrics", timeout=1800)
    assert reply.status_code == 200, reply.text  # a scrape mid-growth of the KV tensors was a 500
    for line in reply.text.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    raise KeyError(f"{name} not in /metrics")


def looked_up(url: str) -> float:
    """Prompt tokens this replica has looked up in its prefix cache: grows by a request's prompt
    (all of it, or all but its last token) on the replica that serves it."""
    return metric(url, "vllm:prefix_cache_queries_total")


def chat(base: str, body: dict) -> dict:
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply.json()


@contextmanager
def held(router: str, urls: list[str], messages: list[dict]):
    """A request with the given messages kept in flight through the router until the block ends
    (it writes tokens past its end of text, and its client hangs up at the end).

    cache_aware counts a replica's requests in flight only once it has chosen it, so two new sessions
    that reach it at the same instant can both see two idle replicas and go to the first. A session
    whose first turn is held in flight when the next new session arrives is one the router has
    counted: the newcomer goes to the other replica."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    before = sum(looked_up(u) for u in urls)
    with httpx.stream("POST", f"{router}/v1/chat/completions", json=body, timeout=1800) as reply:
        assert reply.status_code == 200  # on a replica now, so counted by the router
        while sum(looked_up(u) for u in urls) == before:
            time.sleep(0.2)  # its prompt looked up, so it adds nothing to the turn's measures
        yield
    while sum(metric(u, "vllm:num_requests_running") + metric(u, "vllm:num_requests_waiting") for u in urls):
        time.sleep(0.2)  # the hang-up reaches the replica, which cancels it


def test_sessions_spread_over_both_replicas_then_stay_and_hit_its_cache(cluster):
    """The agents send their turns side by side, as concurrent agents do: cache_aware sends a
    session it has not seen to the least loaded replica, and its later turns, whose text starts
    with what it already sent there, to that same replica. The first turn is sent while a twin of
    the first agent's is held in flight (see `held`)."""
    router, urls = cluster
    history = {name: [{"role": "system", "content": system}] for name, system in AGENTS.items()}
    where: dict[str, list[int]] = {name: [] for name in AGENTS}
    cached: dict[str, list[int]] = {name: [] for name in AGENTS}
    for turn, question in enumerate(QUESTIONS):
        for name in AGENTS:
            history[name].append({"role": "user", "content": question})
        with held(router, urls, history[next(iter(AGENTS))]) if turn == 0 else nullcontext():
            before = [looked_up(u) for u in urls]
            with ThreadPoolExecutor(len(AGENTS)) as pool:
                answers = dict(zip(AGENTS, pool.map(lambda name: chat(router, {
                    "model": MODEL, "messages": history[name], "max_tokens": 6, "temperature": 0}), AGENTS)))
            grew = [looked_up(u) - b for u, b in zip(urls, before)]
        for name, answer in answers.items():
            prompt = answer["usage"]["prompt_tokens"]
            served = [i for i, g in enumerate(grew) if g in (prompt, prompt - 1)]
            assert len(served) == 1, f"{name} ({prompt} prompt tokens) not told apart by {grew}"
            where[name].append(served[0])
            cached[name].append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
            history[name].append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    assert {where[name][0] for name in AGENTS} == {0, 1}, f"both sessions went to one replica: {where}"
    for name in AGENTS:
        assert len(set(where[name])) == 1, f"session {name} moved between replicas: {where[name]}"
        assert all(c > 60 for c in cached[name][1:]), f"session {name}'s later turns missed the cache: {cached[name]}"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
BODIES = {
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris, in celsius?"}], "tools": [WEATHER],
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 40},
    "response_format": {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 16,
                        "response_format": {"type": "json_schema", "json_schema": {"name": "colour", "schema": {
                            "type": "object", "properties": {"colour": {"type": "string", "maxLength": 8}},
                            "required": ["colour"]}}}},
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_answers_through_the_router_equal_a_replicas_own(cluster, kind):
    router, urls = cluster
    body = {"model": MODEL, "temperature": 0, "router_session_id": "agent-42", **BODIES[kind]}
    via_router, direct = chat(router, body), chat(urls[0], body)
    for answer in (via_router, direct):
        for call in answer["choices"][0]["message"].get("tool_calls") or []:
            call.pop("id")  # fresh per answer
    assert via_router["choices"][0]["message"] == direct["choices"][0]["message"]
    assert via_router["choices"][0]["finish_reason"] == direct["choices"][0]["finish_reason"]
    message = via_router["choices"][0]["message"]
    if kind == "tools":
        assert message["tool_calls"][0]["function"]["name"] == "get_weather"
        assert set(json.loads(message["tool_calls"][0]["function"]["arguments"])) == {"city", "unit"}
    else:
        assert set(json.loads(message["content"])) == {"colour"}


def test_a_stream_passes_through_with_its_usage(cluster):
    router, urls = cluster
    body = {"model": MODEL, "temperature": 0, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": "Say hi."}]}
    chunks = []
    with httpx.stream("POST", f"{router}/v1/chat/completions", json=body, timeout=600) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert text == chat(urls[1], {**body, "stream": False})["choices"][0]["message"]["content"]


class _Echo(BaseHTTPRequestHandler):
    """A stub worker: answers /health, and every POST with the JSON body it received."""
    received: list[tuple[str, object]] = []

    def _send(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send({"status": "ok"})
        self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.received.append((self.path, body))
        self._send({"id": "echo", "object": "chat.completion", "model": MODEL, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})

    def log_message(self, *args):
        pass


# maskd's own request extensions; sglang-router 0.3 drops fields its schema lacks from chat and
# Responses bodies (not from completions), so these reach maskd only on /v1/completions
MASKD_ONLY = {"forced_extend", "router_session_id"}


def test_the_router_forwards_every_field_maskd_reads():
    """A stub worker sees what the router forwards: every field of the body maskd reads, with the
    client's values. The router re-serializes chat bodies (max_tokens arrives as
    max_completion_tokens, which maskd reads alike, and SGLang's defaults are added, which maskd
    ignores) and drops fields it does not know, maskd's own extensions among them."""
    _Echo.received.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = {"model": MODEL, "temperature": 0, "top_k": 1, "seed": 3, "max_tokens": 9, "ignore_eos": True,
            "stop_token_ids": [5], "logit_bias": {"5": 1.0}, "chat_template_kwargs": {"enable_thinking": False},
            "parallel_tool_calls": False, **BODIES["tools"], "stream": True, "stream_options": {"include_usage": True},
            "response_format": BODIES["response_format"]["response_format"], "forced_extend": False,
            "router_session_id": "agent-42"}
    completion = {"model": MODEL, "prompt": "Once", "max_tokens": 3, "top_k": 2, "forced_extend": False,
                  "router_session_id": "agent-42"}
    try:
        with sglang_router([f"http://127.0.0.1:{server.server_port}"], policy="cache_aware") as router:
            httpx.post(f"{router}/v1/chat/completions", json=body, timeout=1800)  # the stub's answer is no stream
            assert httpx.post(f"{router}/v1/completions", json=completion, timeout=1800).status_code == 200
    finally:
        server.shutdown()
    (chat_path, chat_got), (completion_path, completion_got) = _Echo.received
    assert (chat_path, completion_path) == ("/v1/chat/completions", "/v1/completions")
    chat_got["max_tokens"] = chat_got.pop("max_completion_tokens")
    assert {k: chat_got.get(k) for k in body if k not in MASKD_ONLY} == {k: v for k, v in body.items()
                                                                        if k not in MASKD_ONLY}
    assert {k: completion_got.get(k) for k in completion} == completion
