"""The engine's load and cache state under the metric names routers already scrape.

maskd's own names (maskd_requests_running, ...) mean nothing to a router; these aliases are read
from the same engine state when /metrics is scraped, so a router built for vLLM or SGLang workers
can balance maskd replicas unchanged:

- vLLM names, read by llm-d's inference scheduler (the Gateway API Inference Extension's endpoint
  picker, whose model-server protocol asks for the waiting queue and the KV-cache utilisation)
  and by other vLLM-aware routers: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (and its older name ``vllm:gpu_cache_usage_perc``; both a fraction,
  1 = full), ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (tokens
  looked up in / matched by the prefix cache);
- SGLang names: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``
  (the same fraction), ``sglang:cache_hit_rate`` (hits / queries since start).

KV-cache usage is the tokens the running rows have reserved over the tokens the KV budget
(--kv-cache-mb) holds: admission waits when a row's reservation would not fit, so 1 means full.
Each series carries a ``model_name`` label, as vLLM's do.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def kv_cache_usage(slots) -> float:
    """Reserved tokens of the open slots over the tokens the KV budget holds (0..1)."""
    budget = slots.budget_bytes
    if budget <= 0:
        return 0.0
    for _ in range(3):  # the engine thread may open or close a slot while this reads
        try:
            reserved = sum(list(slots.reserved.values()))
            break
        except RuntimeError:
            continue
    else:
        return 0.0
    return min(1.0, reserved * slots.shape.bytes_per_token / budget)


class RouterMetricsCollector:
    def __init__(self, engine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def _family(self, kind, name: str, doc: str, value: float):
        family = kind(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def collect(self):
        scheduler = self.engine.scheduler
        running, waiting = scheduler.num_running, len(scheduler.waiting)
        usage = kv_cache_usage(scheduler.slots)
        cache = scheduler.prefix_cache
        queries = cache.lookup_tokens if cache is not None else 0
        hits = cache.hit_tokens if cache is not None else 0
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        yield self._family(gauge, "vllm:num_requests_running", "Requests being prefilled or decoded", running)
        yield self._family(gauge, "vllm:num_requests_waiting", "Requests queued for admission", waiting)
        yield self._family(gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        yield self._family(gauge, "vllm:gpu_cache_usage_perc", "KV-cache usage (older name of kv_cache_usage_perc)",
                           usage)
        yield self._family(counter, "vllm:prefix_cache_queries", "Prefix cache queries, in tokens looked up", queries)
        yield self._family(counter, "vllm:prefix_cache_hits", "Prefix cache hits, in tokens matched", hits)
        yield self._family(gauge, "sglang:num_running_reqs", "Requests being prefilled or decoded", running)
        yield self._family(gauge, "sglang:num_queue_reqs", "Requests queued for admission", waiting)
        yield self._family(gauge, "sglang:token_usage", "KV-cache usage (fraction of the KV budget reserved)", usage)
        yield self._family(gauge, "sglang:cache_hit_rate", "Prefix cache hit rate (matched / looked-up tokens)",
                           hits / queries if queries else 0.0)


def router_metrics_text(engine, model_name: str) -> bytes:
    """The Prometheus text of the router-facing aliases of ``engine``'s state."""
    registry = CollectorRegistry()
    registry.register(RouterMetricsCollector(engine, model_name))
    return generate_latest(registry)
