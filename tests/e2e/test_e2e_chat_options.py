"""End to end: what clients send beyond the basics: n, logprobs, penalties, stop_token_ids, /tokenize."""

import json
import math
import socket
import time

import httpx

from test_e2e_tools import ASK, TOOLS, valid_calls

MODEL = "smollm2-135m-instruct"


def test_named_tool_choice_is_one_call_even_with_parallel_calls_allowed(client, smollm_tokenizer):
    """LangChain's bind_tools(tool_choice=name) leaves parallel calls on; a second call of a tool with
    side effects would run it twice. The separator token is favoured, so a second call is what the
    model wants next."""
    (newline,) = smollm_tokenizer.encode("\n", add_special_tokens=False)
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=100, temperature=0, logit_bias={str(newline): 30})
    assert [c.function.name for c in valid_calls(reply.choices[0].message)] == ["add"]


def test_n_choices_share_the_prompt_and_differ_by_seed(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=1.0, seed=3, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) > 1
    single = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert 3 <= reply.usage.completion_tokens <= 24
    again = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=1.0, seed=3, n=3)
    assert [c.message.content for c in again.choices] == texts
    streamed = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=1.0, seed=3,
                                                n=3, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts


def test_logprobs_are_of_the_masked_distribution(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, temperature=0, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) <= 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the chosen token is the best
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    forced = [e for e in content if e.logprob == 0.0]
    assert forced, "the call's forced text (delimiters, name) is certain under the mask"
    assert math.isclose(sum(math.exp(t.logprob) for t in forced[0].top_logprobs), 1.0, rel_tol=1e-6)


def test_penalties_change_repeats_both_ways(client):
    ask = [{"role": "user", "content": "Repeat the word dog ten times."}]
    common = dict(model=MODEL, messages=ask, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**common).choices[0].message.content
    penalised = client.chat.completions.create(frequency_penalty=1.0, presence_penalty=1.0, **common)
    assert penalised.choices[0].message.content.lower().count("dog") < plain.lower().count("dog")
    common["messages"] = ASK
    plain = client.chat.completions.create(**common).choices[0].message.content
    encouraged = client.chat.completions.create(frequency_penalty=-2.0, presence_penalty=-2.0, **common)
    assert encouraged.choices[0].message.content.count("City") > plain.count("City")


def test_stop_token_ids_end_free_text(client, smollm_tokenizer):
    free = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    ids = smollm_tokenizer.encode(free.choices[0].message.content, add_special_tokens=False)
    cut = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0,
                                         extra_body={"stop_token_ids": [ids[2]]})
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens == 3


def test_completions_n_and_logprobs(client):
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                                      n=2, logprobs=2)
    assert reply.choices[0].text == reply.choices[1].text  # greedy rows agree
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == 4 and "".join(logprobs.tokens) == reply.choices[0].text
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)


def test_tokenize_and_detokenize(server_url, client):
    chat = httpx.post(f"{server_url}/tokenize", json={"model": MODEL, "messages": ASK}, timeout=1800).json()
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert chat["count"] == len(chat["tokens"]) == reply.usage.prompt_tokens and chat["max_model_len"] > 0
    raw = httpx.post(f"{server_url}/tokenize", json={"prompt": "hello world", "add_special_tokens": False},
                     timeout=1800).json()
    back = httpx.post(f"{server_url}/detokenize", json={"tokens": raw["tokens"]}, timeout=1800).json()
    assert back["prompt"] == "hello world"
    bad = httpx.post(f"{server_url}/detokenize", json={"tokens": [10 ** 9]}, timeout=1800)
    assert bad.status_code == 400 and json.loads(bad.text)["error"]["param"] == "tokens"


def test_outputs_are_validated_and_counted(server_url, client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, temperature=0)
    valid_calls(reply.choices[0].message)
    metrics = httpx.get(f"{server_url}/metrics", timeout=1800).text
    lines = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#"))
    assert float(lines['maskd_outputs_validated_total{kind="tool_call"}']) >= 1
    assert float(lines.get('maskd_output_validation_failures_total{kind="tool_call"}', 0)) == 0


def _counter(server_url: str, name: str) -> float:
    for line in httpx.get(f"{server_url}/metrics", timeout=1800).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _engine_load(server_url: str) -> int:
    state = httpx.get(f"{server_url}/debug/integrity", timeout=1800).json()
    return state["running"] + state["waiting"]


def test_a_client_gone_cancels_a_non_streamed_request(server_url):
    while _engine_load(server_url) > 0:  # earlier tests' requests (a stream whose client left) end first
        time.sleep(0.2)
    cancelled = 'maskd_requests_total{finish_reason="cancelled"}'
    cut = 'maskd_requests_total{finish_reason="length"}'
    before = _counter(server_url, cancelled), _counter(server_url, cut)
    body = json.dumps({"model": MODEL, "messages": ASK, "max_tokens": 3000, "ignore_eos": True,
                       "temperature": 0}).encode()
    host, port = server_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:  # a client that hangs up mid-request
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
        while _engine_load(server_url) == 0:  # hang up only once the engine holds it, however slow the machine
            time.sleep(0.05)
    while _engine_load(server_url) > 0:  # it must end by cancellation, not by its 3000-token budget
        time.sleep(0.2)
    assert _counter(server_url, cancelled) == before[0] + 1 and _counter(server_url, cut) == before[1]
