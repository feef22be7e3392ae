"""EngineMetrics: the engine's Prometheus counters, gauges and histograms, in a registry of its own.

The engine thread updates them; `GET /metrics` renders `registry` in the text format. Counters are
bumped once per step or per request, never per token of a row, to keep the decode loop cheap.
Gauges that mirror engine state (running, waiting, prefix cache size) are read at scrape time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from engine.scheduler import Scheduler
    from engine.sequence import Sequence

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge("maskd_requests_running", "Requests being prefilled or decoded", registry=r)
        self.waiting = Gauge("maskd_requests_waiting", "Requests queued for admission", registry=r)
        self.requests = Counter("maskd_requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self.rejected = Counter("maskd_requests_rejected", "Requests refused because the queue was full", registry=r)
        self.prompt_tokens = Counter("maskd_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.cached_tokens = Counter("maskd_cached_prompt_tokens", "Prompt tokens served from the prefix cache",
                                     registry=r)
        self.generated_tokens = Counter("maskd_generation_tokens", "Tokens appended to outputs (sampled and forced)",
                                        registry=r)
        self.forced_tokens = Counter("maskd_forced_tokens",
                                     "Output tokens the grammar forced (appended without sampling)", registry=r)
        self.forward_passes = Counter("maskd_forward_passes", "Model forward passes (prefill chunks + decode steps)",
                                      registry=r)
        self.batch_size = Histogram("maskd_decode_batch_size", "Rows per decode forward pass",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.cache_bytes = Gauge("maskd_prefix_cache_bytes", "KV bytes held by the prefix cache", registry=r)
        self.cache_budget = Gauge("maskd_prefix_cache_budget_bytes", "Prefix cache budget", registry=r)
        self.cache_tokens = Gauge("maskd_prefix_cache_tokens", "Tokens held by the prefix cache", registry=r)
        self.cache_hit_ratio = Gauge("maskd_prefix_cache_hit_ratio",
                                     "Matched / looked-up prompt tokens since start", registry=r)
        self.batch_bytes = Gauge("maskd_batch_cache_bytes", "KV bytes allocated for the rows (SlotCache tensors, kept while idle)", registry=r)
        self.ttft = Histogram("maskd_time_to_first_token_seconds", "Submit to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("maskd_time_per_output_token_seconds",
                              "Mean time between output tokens, per request", buckets=_TPOT_BUCKETS, registry=r)

    def watch(self, scheduler: Scheduler) -> None:
        """Gauges that read the scheduler's state when scraped (plain int reads, safe off-thread)."""
        self.running.set_function(lambda: scheduler.num_running)
        self.waiting.set_function(lambda: len(scheduler.waiting))
        self.batch_bytes.set_function(scheduler.slots.nbytes)
        cache = scheduler.prefix_cache
        if cache is not None:
            self.cache_bytes.set_function(lambda: cache.size_bytes)
            self.cache_budget.set(cache.budget_bytes)
            self.cache_tokens.set_function(lambda: cache.num_tokens)
            self.cache_hit_ratio.set_function(lambda: cache.hit_ratio)

    # ---- engine-thread hooks ----------------------------------------------------------------

    def admitted(self, seq: Sequence) -> None:
        self.prompt_tokens.inc(len(seq.request.prompt_ids))
        self.cached_tokens.inc(seq.cached_tokens)

    def stepped(self, seqs: list[Sequence], now: float, appended: int, forced: int) -> None:
        """After a step appended `appended` tokens to seqs, `forced` of them forced text."""
        self.generated_tokens.inc(appended)
        self.forced_tokens.inc(forced)
        for seq in seqs:
            if seq.first_token_at is None:
                seq.first_token_at = now
                self.ttft.observe(now - seq.request.submitted_at)

    def finished(self, seq: Sequence, reason: str) -> None:
        self.requests.labels(finish_reason=reason).inc()
        n = len(seq.output_ids)
        if seq.first_token_at is not None and n > 1:
            self.tpot.observe((time.perf_counter() - seq.first_token_at) / (n - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
