"""The metrics port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

Served by :mod:`enflame_gcu.bounded_http` (the same bounded server as the DRA driver's and the
scheduler extender's): an asyncio loop of its own in one daemon thread, never the loop Allocate
and registration run on (a stuck plugin loop still gets ``/healthz`` answered with 503). Per peer
address a connection rate and a cap, a cap in all (the oldest connection not being answered is
dropped for a newcomer), a request head of at most ``head_bytes`` that must arrive within
``head_timeout`` seconds *in total*, an answer that must be taken within ``write_timeout``, one
request per connection, GET and HEAD only. Memory and threads stay flat whatever arrives. The
exposition is built on the server's one worker thread (its card and telemetry families encoded
once per change, :meth:`metrics.Metrics.exposition`), so a scrape of a large node never holds up
a probe on the server's loop.

An empty bind address means every address: IPv6 and IPv4 on a dual-stack socket where the host
has IPv6, else every IPv4 address.
"""

from __future__ import annotations

import logging
import socket

from enflame_gcu import bounded_http
from enflame_gcu.device_plugin import metrics

log = logging.getLogger(__name__)
PROBES = ("/healthz", "/readyz")
METRICS_PATHS = ("/metrics", "/")
Limits = bounded_http.Limits
MetricsServer = bounded_http.BoundedServer


def handler(exported: metrics.Metrics) -> bounded_http.Handler:
    """The port's answers: the probes, the exposition, 404 for anything else."""

    def answer(request: bounded_http.Request) -> bounded_http.Response:
        if request.path in PROBES:
            probe = exported.live if request.path == "/healthz" else exported.ready
            ok, reason = probe()
            return bounded_http.Response(200 if ok else 503, f"{reason}\n")
        if request.path not in METRICS_PATHS:
            return bounded_http.Response(
                404, "not found: /metrics, /healthz and /readyz are served\n"
            )
        body, content_type = exported.exposition(request.headers.get("accept", ""))
        return bounded_http.Response(200, body, content_type)

    return answer


def off_the_loop(request: bounded_http.Request) -> bool:
    """The exposition is built on the server's worker thread; probes and 404s on its loop."""
    return request.path in METRICS_PATHS


def listen(address: str, port: int, backlog: int = 128) -> socket.socket:
    """The listening socket; ConfigError naming the address and the cause when it cannot be
    had (see :func:`bounded_http.listen`)."""
    return bounded_http.listen(address, port, backlog, "the metrics port")


def start(
    exported: metrics.Metrics, port: int, address: str = "", limits: Limits | None = None
) -> MetricsServer:
    """Listen on ``address`` (empty = all) and ``port`` in a daemon thread; the server.

    ConfigError when the port cannot be had (in use, no such address).
    """
    limits = limits or Limits()
    server = MetricsServer(
        handler(exported),
        listen(address, port, limits.backlog),
        limits,
        name="metrics",
        offload=off_the_loop,
    )
    server.start()
    host = server.address[0]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "serving /metrics, /healthz and /readyz on %s:%d%s (at most %d connections, %.0f s "
        "for a request)",
        shown,
        server.address[1],
        " (all addresses)" if not address else "",
        limits.connections,
        limits.head_timeout,
    )
    return server
