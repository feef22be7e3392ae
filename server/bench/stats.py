"""Percentiles and medians the suites report (None for no values)."""

from __future__ import annotations

import statistics


def pct(values, q: float):
    """The ``q`` quantile (0..1) of ``values`` by rank, or None for none."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def median(values):
    return statistics.median(values) if values else None


def fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)
