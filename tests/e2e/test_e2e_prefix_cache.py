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
