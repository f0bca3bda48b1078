"""The metrics port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

Served from a daemon thread so a scrape never waits for the event loop (and a stuck loop still
answers ``/healthz`` with 503). An empty bind address means every address: IPv6 and IPv4 on a
dual-stack socket where the host has IPv6, else every IPv4 address.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref import simple_server

from prometheus_client import make_wsgi_app

from enflame_gcu.device_plugin import metrics

log = logging.getLogger(__name__)
Probe = Callable[[], tuple[bool, str]]


class _Server(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _DualStack(_Server6):
    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _Quiet(simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds would drown the plugin's own log."""


def app(exported: metrics.Metrics) -> Callable[..., Iterable[bytes]]:
    """The WSGI application: probes by path, everything else is the metrics exposition."""
    scrape = make_wsgi_app(exported.registry)
    probes: dict[str, Probe] = {"/healthz": exported.live, "/readyz": exported.ready}

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            result: Iterable[bytes] = scrape(environ, start_response)
            return result
        ok, reason = probe()
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{reason}\n".encode()]

    return serve


def _family(address: str) -> tuple[str, bool]:
    if address:
        return address, False
    if socket.has_ipv6 and socket.has_dualstack_ipv6():
        return "::", True
    return "0.0.0.0", False  # noqa: S104 (every address is the documented default)


def start(exported: metrics.Metrics, port: int, address: str = "") -> _Server:
    """Listen on ``address`` (empty = all) and ``port`` in a daemon thread; the server."""
    host, dual = _family(address)
    server_class = _DualStack if dual else _Server6 if ":" in host else _Server
    server: _Server = simple_server.make_server(host, port, app(exported), server_class, _Quiet)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "serving /metrics, /healthz and /readyz on %s:%d%s",
        shown,
        port,
        " (all addresses)" if not address else "",
    )
    return server
