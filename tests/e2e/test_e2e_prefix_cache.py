"""End to end: agents resending a long system prompt hit the prefix cache; /metrics and the
integrity endpoint report it."""

import httpx

MODEL = "smollm2-135m-instruct"
SYSTEM = ("You are a careful assistant for a warehouse. Tools: lookup_stock(sku), reorder(sku, qty), "
          "list_orders(customer). Always answer in one short sentence. ") * 8


def test_second_request_with_the_same_system_prompt_reports_cached_tokens(client, server_url):
    def ask(question):
        return client.chat.completions.create(
            model=MODEL, max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    first = ask("How many red chairs are left?")
    second = ask("Reorder ten blue tables.")
    assert second.usage.prompt_tokens > 150
    assert second.usage.prompt_tokens_details.cached_tokens > 150
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens_details.cached_tokens
    metrics = httpx.get(f"{server_url}/metrics").text
    for name in ("maskd_requests_running", "maskd_requests_waiting", "maskd_prompt_tokens_total",
                 "maskd_cached_prompt_tokens_total", "maskd_generation_tokens_total", "maskd_forward_passes_total",
                 "maskd_prefix_cache_bytes", "maskd_prefix_cache_tokens", "maskd_prefix_cache_hit_ratio",
                 "maskd_time_to_first_token_seconds_bucket", "maskd_time_per_output_token_seconds_bucket"):
        assert name in metrics, f"{name} missing from /metrics"
    assert httpx.get(f"{server_url}/debug/integrity").json()["ok"] is True


TOOLS = [("get_weather", "Weather for a city", {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}),
         ("search_web", "Search the web", {"query": {"type": "string"},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 10}}),
         ("send_email", "Send an email", {"to": {"type": "string"}, "subject": {"type": "string"},
                                          "body": {"type": "string"}}),
         ("add", "Add numbers", {"a": {"type": "number"}, "b": {"type": "number"}}),
         ("read_file", "Read a file", {"path": {"type": "string"}}),
         ("list_dir", "List a folder", {"path": {"type": "string"}, "hidden": {"type": "boolean"}}),
         ("book_flight", "Book a flight", {"from": {"type": "string"}, "to": {"type": "string"},
                                           "date": {"type": "string"}}),
         ("translate", "Translate text", {"text": {"type": "string"}, "lang": {"type": "string"}}),
         ("set_timer", "Set a timer", {"minutes": {"type": "integer"}}),
         ("stock_price", "A stock's price", {"ticker": {"type": "string"}}),
         ("calendar_add", "Add an event", {"title": {"type": "string"}, "when": {"type": "string"}}),
         ("metadata", "Free-form metadata", {"data": {}})]


def test_a_greedy_tool_call_is_the_same_cold_and_warm(client):
    """A tool list the server has never seen: the first request prefills its prompt and compiles its
    units, the repeat reads all but the prompt's last token from the prefix cache. The calls are
    the same: the prompt's last token takes the same path either way (engine/scheduler.py)."""
    import json
    import random

    for trial in (5, 6, 13):  # lists whose cold and warm calls differed while the cold prompt's last
        # token was computed in its last prefill chunk
        rng = random.Random(trial)
        tag = "".join(rng.choice("klmnop") for _ in range(6))  # names no other test sends: a cold list
        tools = [{"type": "function", "function": {
            "name": f"{name}_{tag}", "description": about,
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}}
            for name, about, props in TOOLS]
        calls = []
        for _ in range(2):
            reply = client.chat.completions.create(
                model=MODEL, max_tokens=40, temperature=0, tools=tools, tool_choice="required",
                messages=[{"role": "user", "content": "What's the weather in Oslo in celsius?"}])
            calls.append(json.dumps([(c.function.name, c.function.arguments)
                                     for c in reply.choices[0].message.tool_calls]))
            cached = reply.usage.prompt_tokens_details.cached_tokens
        assert cached == reply.usage.prompt_tokens - 1  # the repeat hit the prefix cache
        assert calls[0] == calls[1], (trial, calls)
