"""End to end: the real `maskd serve` on the embedded SmolLM2, called through the official openai SDK."""

import asyncio

import httpx
import openai
import pytest

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Name three colours."}]


def test_health_and_models(client, server_url):
    assert httpx.get(f"{server_url}/health").json()["status"] == "ok"
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["tool_format"] == "hermes"


def test_plain_completion(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5 and 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens >= 0
    assert reply.id.startswith("chatcmpl-") and reply.model == MODEL


def test_streamed_text_equals_non_streamed_for_same_seed(client):
    kwargs = dict(model=MODEL, messages=ASK, max_tokens=16, temperature=0.9, seed=1234)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stream_helper_accumulates(client):
    hi = [{"role": "user", "content": "Say hi."}]  # answered well inside the budget: the helper refuses "length"
    with client.chat.completions.stream(model=MODEL, messages=hi, max_tokens=60, temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    plain = client.chat.completions.create(model=MODEL, messages=hi, max_tokens=60, temperature=0)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == plain.choices[0].message.content


def test_async_client_concurrent_requests(async_client):
    async def both():
        calls = [async_client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6, temperature=0)
                 for _ in range(2)]
        return await asyncio.gather(*calls)
    first, second = asyncio.run(both())
    assert first.choices[0].message.content == second.choices[0].message.content


def test_stop_sequence(client):
    free = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20, temperature=0).choices[0].message.content
    stop = free.split()[1]
    cut = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == free[:free.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kwargs, status, param", [
    (dict(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    (dict(messages=ASK, temperature=3), 400, "temperature"),
    (dict(messages=ASK, n=17), 400, "n"),
    (dict(messages=[]), 400, "messages"),
    (dict(messages=ASK, max_tokens=100000), 400, "max_tokens"),
    (dict(messages=ASK, presence_penalty=2.5), 400, "presence_penalty"),
    (dict(messages=ASK, top_logprobs=21, logprobs=True), 400, "top_logprobs"),
    (dict(messages=ASK, top_logprobs=2), 400, "top_logprobs"),
    (dict(messages=ASK, extra_body={"chat_template_kwargs": {"messages": []}}), 400, "chat_template_kwargs"),
    (dict(messages=ASK, model="gpt-4o"), 404, "model"),
    (dict(messages=ASK, logit_bias={"banana": 5}), 400, "logit_bias"),
    (dict(messages=ASK, logit_bias={"²": 5}), 400, "logit_bias"),  # a digit, but not an ASCII one
    (dict(messages=ASK, logit_bias={"42": 101}), 400, "logit_bias"),
    (dict(messages=ASK, logit_bias={"9999999": 5}), 400, "logit_bias"),
])
def test_bad_requests_get_openai_errors_naming_the_field(client, kwargs, status, param):
    kwargs = {"model": MODEL, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**kwargs)
    assert err.value.status_code == status
    body = err.value.body
    assert body["param"] == param and body["message"] and body["type"]


def test_logit_bias_steers_the_tokens(client, smollm_tokenizer):
    (token,) = smollm_tokenizer.encode(" banana", add_special_tokens=False)
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, temperature=0,
                                           logit_bias={str(token): 100})
    assert reply.choices[0].message.content == " banana" * 3
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, temperature=0)
    assert "banana" not in plain.choices[0].message.content


def test_malformed_json_is_a_400_and_server_keeps_serving(server_url, client):
    reply = httpx.post(f"{server_url}/v1/chat/completions", content=b"{not json",
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "error" in reply.json()
    ok = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3)
    assert ok.choices[0].message.content is not None


def test_client_disconnect_mid_stream_leaves_server_serving(server_url, client):
    with httpx.stream("POST", f"{server_url}/v1/chat/completions", timeout=1800, json={
            "model": MODEL, "messages": ASK, "max_tokens": 300, "stream": True, "ignore_eos": True}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                break  # leave after the first chunk
    ok = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_text_completions_plain_streamed_and_token_ids(client, smollm_tokenizer):
    prompt = "The capital of France is"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert whole.choices[0].text and whole.usage.completion_tokens <= 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text
    ids = smollm_tokenizer.encode(prompt)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == whole.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[10 ** 9], max_tokens=2)
    assert err.value.body["param"] == "prompt"
