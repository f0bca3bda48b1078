"""The extender's HTTP server: ``POST /filter``, ``POST /prioritize``, ``GET /healthz``,
``GET /readyz``, ``GET /stats`` (call counts and latency percentiles, JSON) and ``GET /metrics``
(Prometheus, :mod:`.metrics`).

Served by :mod:`enflame_gcu.bounded_http` (the device plugin's and the DRA driver's bounded
server): one asyncio thread, HTTP/1.1 keep-alive (the scheduler reuses its connections), a whole
request, head and body, within ``request_timeout`` (the scheduler's ``httpTimeout``), bodies
over ``max_body`` refused with 413 before they are read (names-only calls are small; raise it
only for a scheduler that sends whole Node objects), per-peer connection rate and cap, and a
newcomer taking the place of the oldest connection that never completed a request. A handler
that fails anyway answers the verb's neutral result with 200: a 500 would only make the
scheduler log an error per pod. With a TLS context the port is HTTPS (the scheduler's
``enableHTTPS`` and ``tlsConfig``), and with a client CA only callers holding a certificate it
signed are answered.
"""

from __future__ import annotations

import collections
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from enflame_gcu import bounded_http
from enflame_gcu.scheduler_extender import decisions, metrics

log = logging.getLogger(__name__)
Verb = Callable[[bytes], bytes]
NEUTRAL = {
    "/filter": b'{"Error":"enflame-scheduler-extender: internal error"}',
    "/prioritize": b"[]",
}
JSON = "application/json"
MAX_BODY = 1 << 20  # a names-only ExtenderArgs: the pod and up to 5000 node names


# Histogram buckets of /metrics: a names-only call at 5,000 nodes answers in milliseconds; the
# top buckets reach the scheduler's httpTimeout (2 s shipped).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class Stats:
    """Counts, the last ``keep`` durations (for /stats) and cumulative histogram buckets (for
    /metrics) of each verb (thread-safe)."""

    def __init__(self, keep: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._durations: dict[str, collections.deque[float]] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        self._totals: collections.Counter[str] = collections.Counter()
        self._keep = keep

    def observe(self, verb: str, seconds: float) -> None:
        """One call of ``verb`` took ``seconds``."""
        with self._lock:
            self._counts[verb] += 1
            self._totals[verb] += 1
            self._sums[verb] = self._sums.get(verb, 0.0) + seconds
            self._durations.setdefault(verb, collections.deque(maxlen=self._keep)).append(seconds)
            buckets = self._buckets.setdefault(verb, [0] * len(BUCKETS))
            for index, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    buckets[index] += 1

    def histograms(self) -> dict[str, tuple[list[tuple[float, int]], float, int]]:
        """``{verb: ([(upper bound, calls at most that long)], total seconds, calls)}``, since
        the start (never reset: Prometheus counters only grow)."""
        with self._lock:
            return {
                verb: (
                    list(zip(BUCKETS, buckets, strict=True)),
                    self._sums[verb],
                    self._totals[verb],
                )
                for verb, buckets in self._buckets.items()
            }

    def snapshot(self) -> dict[str, Any]:
        """``{verb: {calls, p50_ms, p99_ms, max_ms}}`` over the kept durations."""
        with self._lock:
            result = {}
            for verb, kept in self._durations.items():
                ordered = sorted(kept)
                result[verb] = {
                    "calls": self._counts[verb],
                    "p50_ms": round(_quantile(ordered, 0.50) * 1000, 3),
                    "p99_ms": round(_quantile(ordered, 0.99) * 1000, 3),
                    "max_ms": round(ordered[-1] * 1000, 3),
                }
            return result

    def reset(self) -> None:
        """Forget /stats' counts and durations (between benchmark runs); /metrics keeps its."""
        with self._lock:
            self._durations.clear()
            self._counts.clear()


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class ExtenderServer:
    """The extender's verbs and probes on one bounded server."""

    def __init__(
        self,
        address: tuple[str, int],
        decide: decisions.Decisions,
        *,
        ready: Callable[[], tuple[bool, str]] | None = None,
        request_timeout: float = 5.0,
        max_body: int = MAX_BODY,
        connections: int = 64,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.verbs: dict[str, Verb] = {"/filter": decide.filter, "/prioritize": decide.prioritize}
        self.decide = decide
        self.stats = Stats()
        self.metrics = metrics.registry(
            metrics.ExtenderCollector(
                self.stats.histograms, decide.refusal_counts, decide.cache.health
            )
        )
        self._ready = ready
        self.limits = bounded_http.Limits(
            connections=connections,
            per_client=connections,  # the scheduler and its host share one address
            rate_per_client=200.0,
            burst_per_client=200,
            head_bytes=16384,
            head_timeout=request_timeout,
            body_bytes=max_body,
            keep_alive=True,
            idle_timeout=90.0,  # Go's http.Transport keeps idle connections 90 s
            methods=("GET", "POST"),
        )
        sock = bounded_http.listen(address[0], address[1], self.limits.backlog, "the extender")
        self._server = bounded_http.BoundedServer(
            self.answer, sock, self.limits, name="extender-http", ssl_context=ssl_context
        )

    def ready(self) -> tuple[bool, str]:
        """Ready when the cache has been filled once (or no check was given)."""
        return (True, "ok") if self._ready is None else self._ready()

    def answer(self, request: bounded_http.Request) -> bounded_http.Response:
        """One request: a verb, a probe, the stats, or 404."""
        path = request.path.rstrip("/") or "/"
        if request.method == "POST":
            verb = self.verbs.get(path)
            if verb is None:
                return bounded_http.Response(404, "unknown verb; use /filter or /prioritize\n")
            started = time.perf_counter()
            try:
                answer = verb(request.body)
            except Exception:
                log.exception("%s failed; answering neutrally", path)
                answer = NEUTRAL[path]
            self.stats.observe(path.strip("/"), time.perf_counter() - started)
            return bounded_http.Response(200, answer, JSON)
        if path == "/healthz":
            return bounded_http.Response(200, "ok\n")
        if path == "/readyz":
            ok, reason = self.ready()
            return bounded_http.Response(200 if ok else 503, f"{reason}\n")
        if path == "/metrics":
            return bounded_http.Response(200, metrics.render(self.metrics), metrics.CONTENT_TYPE)
        if path == "/stats":
            document = {"verbs": self.stats.snapshot(), "cache": self.decide.cache.counts()}
            return bounded_http.Response(200, json.dumps(document), JSON)
        return bounded_http.Response(404, "not found\n")

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._server.start()

    def stop(self) -> None:
        """Stop listening and end every connection at once (a kept-alive one included)."""
        self._server.stop()

    @property
    def port(self) -> int:
        """The port bound (useful with port 0)."""
        return self._server.port

    @property
    def server(self) -> bounded_http.BoundedServer:
        """The bounded server underneath (tests read its counters)."""
        return self._server
