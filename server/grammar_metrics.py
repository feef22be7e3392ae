"""The grammar compiler's Prometheus metrics, read from its counters when /metrics is scraped.

maskd_grammar_compiles_total, maskd_grammar_compile_seconds_total, maskd_grammar_compile_timeouts_total,
maskd_grammar_cache_hits_total{tier="memory"|"disk"}, maskd_grammar_units (compiled units held in
memory), maskd_grammar_memory_bytes (what they hold: indexes, budget tables, memoised masks),
maskd_grammar_memory_budget_bytes, maskd_grammar_workers, maskd_json_automaton_load_seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class GrammarCollector:
    def __init__(self, compiler) -> None:
        self.compiler = compiler

    def collect(self):
        stats, memory = dict(self.compiler.stats), self.compiler.memory_report()
        yield CounterMetricFamily("maskd_grammar_compiles", "Grammar units compiled (cache misses)",
                                  value=stats["compiles"])
        yield CounterMetricFamily("maskd_grammar_compile_seconds", "Seconds spent compiling grammar units",
                                  value=stats["compile_seconds"])
        yield CounterMetricFamily("maskd_grammar_compile_timeouts", "Units that exceeded the compile limit",
                                  value=stats["timeouts"])
        hits = CounterMetricFamily("maskd_grammar_cache_hits", "Grammar units served from a cache", labels=["tier"])
        hits.add_metric(["memory"], stats["memory_hits"])
        hits.add_metric(["disk"], stats["disk_hits"])
        yield hits
        yield GaugeMetricFamily("maskd_grammar_units", "Compiled grammar units held in memory",
                                value=memory["grammars"])
        yield GaugeMetricFamily("maskd_grammar_memory_bytes", "Bytes the grammar units in memory hold",
                                value=memory["bytes"])
        yield GaugeMetricFamily("maskd_grammar_memory_budget_bytes", "--grammar-memory-mb in bytes",
                                value=memory["budget_bytes"])
        yield GaugeMetricFamily("maskd_grammar_workers", "Grammar compile processes", value=memory["workers"])
        yield GaugeMetricFamily("maskd_json_automaton_load_seconds",
                                "Seconds to build or load the JSON-value automaton (at startup)",
                                value=stats["json_automaton_seconds"])


def grammar_metrics_text(compiler) -> bytes:
    """The Prometheus text of ``compiler``'s metrics (empty without a compiler)."""
    if compiler is None:
        return b""
    registry = CollectorRegistry()
    registry.register(GrammarCollector(compiler))
    return generate_latest(registry)
