"""The extender's own Prometheus metrics, on its bounded server's ``GET /metrics``.

Computed at scrape time from what the extender already keeps (one private registry, no
``_created`` series): calls and their latency per verb (from :class:`.server.Stats`), refusals
by reason (from :class:`.decisions.Decisions`), and the cache: how many node states it holds
by status, how old the oldest fresh one is, and how long since the watches last delivered
anything (a stuck watch shows as a growing age while the extender keeps answering).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

PREFIX = "enflame_scheduler_extender"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ExtenderCollector(Collector):
    """Every family, read from the sources at each scrape."""

    def __init__(
        self,
        histograms: Callable[[], Mapping[str, tuple[list[tuple[float, int]], float, int]]],
        refusals: Callable[[], Mapping[str, int]],
        cache: Callable[[], Mapping[str, Any]],
    ) -> None:
        self._histograms, self._refusals, self._cache = histograms, refusals, cache

    def collect(self) -> Iterator[Metric]:
        """The families of one scrape."""
        calls = CounterMetricFamily(
            f"{PREFIX}_calls", "Filter and prioritize calls answered.", labels=["verb"]
        )
        latency = HistogramMetricFamily(
            f"{PREFIX}_call_duration_seconds",
            "Time from a call's body read to its answer, per verb.",
            labels=["verb"],
        )
        for verb, (buckets, total, count) in sorted(self._histograms().items()):
            calls.add_metric([verb], count)
            shown = [(_le(bound), n) for bound, n in buckets] + [("+Inf", count)]
            latency.add_metric([verb], shown, total)
        yield calls
        yield latency
        refused = CounterMetricFamily(
            f"{PREFIX}_refusals",
            "Nodes a filter call refused, by reason (slices: not enough free slices after the "
            "pods bound there; per_container_cap: a container over the node's cap).",
            labels=["reason"],
        )
        for reason, count in sorted(self._refusals().items()):
            refused.add_metric([reason], count)
        yield refused
        cache = self._cache()
        states = GaugeMetricFamily(
            f"{PREFIX}_node_states",
            "Node-state Leases in the cache by status (fresh: scored; stale, future, "
            "unreadable: neutral).",
            labels=["status"],
        )
        for status, count in sorted(cache["states"].items()):
            states.add_metric([status], count)
        yield states
        yield GaugeMetricFamily(
            f"{PREFIX}_node_state_oldest_age_seconds",
            "Age of the oldest fresh node state (its Lease's renewTime against this clock).",
            value=cache["oldest_age"],
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_cache_update_age_seconds",
            "Seconds since the API watches last changed the cache (-1: never).",
            value=cache["update_age"],
        )
        pods = GaugeMetricFamily(
            f"{PREFIX}_cached_pods", "GCU pods in the cache, by kind.", labels=["kind"]
        )
        for kind in ("bound", "waiting", "guessed", "released"):
            pods.add_metric([kind], cache["pods"][kind])
        yield pods


def _le(bound: float) -> str:
    return repr(float(bound))


def registry(collector: ExtenderCollector) -> CollectorRegistry:
    """A private registry holding only ``collector``."""
    found = CollectorRegistry(auto_describe=False)
    found.register(collector)
    return found


def render(found: CollectorRegistry) -> bytes:
    """The text exposition of one scrape."""
    return generate_latest(found)
