"""What operators see of the DRA driver: Prometheus metrics and the ``/healthz``, ``/readyz``
probes, served on ``--http-address`` from a daemon thread (a scrape never waits for the loop).

=========================================  =========  ========================================
metric                                     type       labels
=========================================  =========  ========================================
enflame_dra_claims_prepared                gauge      (claims on record as prepared)
enflame_dra_prepare_seconds                histogram  (one NodePrepareResources claim)
enflame_dra_unprepare_seconds              histogram  (one NodeUnprepareResources claim)
enflame_dra_errors_total                   counter    operation, reason
enflame_dra_devices_published              gauge      type (gcu, vgcu, drs), state
enflame_dra_drs_instances                  gauge      card (instances on record)
enflame_dra_slices_published_generation    gauge      (the pool generation last written)
enflame_dra_slices_converging              gauge      (0 while the publisher backs off)
enflame_dra_api_fields_dropped             gauge      field (taints, counters, ...)
=========================================  =========  ========================================

``/healthz`` is 200 while the event loop answers (a heartbeat younger than
:data:`STALL_SECONDS`); ``/readyz`` is 200 once the kubelet registered the driver and, when
publishing, the slices are published, and 503 again while the publisher backs off from a
server that does not store what it writes; its text names the fields the server drops.

Served by :mod:`enflame_gcu.bounded_http`, the device plugin's bounded server: one thread
whatever arrives, a per-peer connection rate and cap, a request head of at most 8 KiB within
5 s in total, GET and HEAD only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, exposition

from enflame_gcu import bounded_http, resourceslices
from enflame_gcu.errors import ClaimError, ConfigError, EfsmiError, InvalidRequestError

log = logging.getLogger(__name__)
STALL_SECONDS = 30.0
HEARTBEAT = 2.0
_DROPPED = {  # what the driver does instead, as /readyz says it
    "taints": "unhealthy GCUs are left out",
    "allowMultipleAllocations": "GCUs are published exclusive",
    "counters": "DRS cards are published whole only",
}
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def reason_of(exc: BaseException) -> str:
    """A short, bounded label for why a call failed."""
    if isinstance(exc, EfsmiError):
        return f"efsmi-{exc.reason}"
    if isinstance(exc, ClaimError):
        return "claim"
    if isinstance(exc, InvalidRequestError):
        return "device"
    if isinstance(exc, ConfigError):
        return "checkpoint"
    if isinstance(exc, OSError):
        return "io"
    return "other"


class DriverMetrics:
    """The driver's metrics in a registry of their own, and the state the probes read."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.claims = Gauge(
            "enflame_dra_claims_prepared", "Claims prepared on this node", registry=self.registry
        )
        self.prepare_seconds = Histogram(
            "enflame_dra_prepare_seconds",
            "Time to prepare one claim",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.unprepare_seconds = Histogram(
            "enflame_dra_unprepare_seconds",
            "Time to unprepare one claim",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "enflame_dra_errors",
            "Failed prepares and unprepares, by reason",
            ["operation", "reason"],
            registry=self.registry,
        )
        self.devices = Gauge(
            "enflame_dra_devices_published",
            "Devices in this node's ResourceSlices",
            ["type", "state"],
            registry=self.registry,
        )
        self.instances = Gauge(
            "enflame_dra_drs_instances",
            "DRS instances held by prepared claims",
            ["card"],
            registry=self.registry,
        )
        self.generation = Gauge(
            "enflame_dra_slices_published_generation",
            "Pool generation of the ResourceSlices last written or found current",
            registry=self.registry,
        )
        self.converging = Gauge(
            "enflame_dra_slices_converging",
            "1 while the API server stores the slices as written, 0 while publishing backs off",
            registry=self.registry,
        )
        self.converging.set(1)
        self.fields_dropped = Gauge(
            "enflame_dra_api_fields_dropped",
            "Fields the API server drops from this driver's slices (1 each)",
            ["field"],
            registry=self.registry,
        )
        self.registered: Callable[[], bool] = lambda: False
        self.stalled = ""
        self.dropped: tuple[str, ...] = ()
        self.published = False
        self.publishing = True
        self._beat = time.monotonic()

    def observe_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        """One claim prepared or unprepared (``error`` when it failed)."""
        histogram = self.prepare_seconds if operation == "prepare" else self.unprepare_seconds
        histogram.observe(seconds)
        if error is not None:
            self.errors.labels(operation, reason_of(error)).inc()

    def observe_failure(self, operation: str, reason: str) -> None:
        """A failure that has no exception object (an error text from the driver)."""
        self.errors.labels(operation, reason).inc()

    def observe_claims(self, held: Mapping[str, int], claims: int) -> None:
        """Claims on record and the DRS instances they hold, by card."""
        self.claims.set(claims)
        self.instances.clear()
        for card, count in held.items():
            self.instances.labels(card).set(count)

    def observe_devices(self, published: Iterable[Mapping[str, Any]]) -> None:
        """The devices of the slices, by type and state (tainted = unhealthy)."""
        counts: dict[tuple[str, str], int] = {}
        for device in published:
            kind = str(((device.get("attributes") or {}).get("type") or {}).get("string", ""))
            tainted = any(
                t.get("key") == resourceslices.UNHEALTHY_TAINT for t in device.get("taints") or []
            )
            key = (kind, "unhealthy" if tainted else "healthy")
            counts[key] = counts.get(key, 0) + 1
        self.devices.clear()
        for (kind, state), count in counts.items():
            self.devices.labels(kind, state).set(count)

    def observe_published(self, generation: int) -> None:
        """The slices are current at ``generation``."""
        self.published = True
        self.generation.set(generation)

    def observe_publishing(self, stalled: str, dropped: Iterable[str]) -> None:
        """Why publishing backs off ("" while converging) and the fields the server drops."""
        self.stalled = stalled
        self.converging.set(0 if stalled else 1)
        self.dropped = tuple(sorted(dropped))
        self.fields_dropped.clear()
        for field in self.dropped:
            self.fields_dropped.labels(field).set(1)

    def live(self) -> tuple[bool, str]:
        """The event loop beat recently."""
        age = time.monotonic() - self._beat
        if age > STALL_SECONDS:
            return False, f"the event loop has not answered for {age:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Registered with the kubelet and (when publishing) slices published."""
        if not self.registered():
            return False, "not registered with the kubelet yet"
        if self.publishing and not self.published:
            return False, "ResourceSlices not published yet"
        if self.publishing and self.stalled:
            return False, self.stalled
        if self.publishing and self.dropped:
            notes = "; ".join(
                f"the API server drops {field}: {_DROPPED.get(field, 'published without')}"
                for field in self.dropped
            )
            return True, f"ok; {notes}"
        return True, "ok"

    async def heartbeat(self) -> None:
        """Beat until cancelled (what ``/healthz`` checks)."""
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(HEARTBEAT)


def handler(exported: DriverMetrics) -> bounded_http.Handler:
    """The probes by path, ``/metrics`` the exposition, anything else 404."""
    probes = {"/healthz": exported.live, "/readyz": exported.ready}

    def answer(request: bounded_http.Request) -> bounded_http.Response:
        if request.path == "/metrics":
            encoder, content_type = exposition.choose_encoder(request.headers.get("accept", ""))
            return bounded_http.Response(200, encoder(exported.registry), content_type)
        probe = probes.get(request.path)
        if probe is None:
            return bounded_http.Response(404, "not found: /metrics, /healthz, /readyz\n")
        ok, reason = probe()
        return bounded_http.Response(200 if ok else 503, f"{reason}\n")

    return answer


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, ``:port`` = every address) as a pair; ValueError if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - ":port" means every address


def start(
    exported: DriverMetrics, address: str, limits: bounded_http.Limits | None = None
) -> bounded_http.BoundedServer:
    """Serve in a daemon thread; the server (``server.address`` has the real port).

    ConfigError when the port cannot be had; ValueError when ``address`` is not HOST:PORT."""
    host, port = parse_address(address)
    server = bounded_http.serve(
        handler(exported),
        "" if host == "0.0.0.0" else host,  # noqa: S104 (":port" asks for every address)
        port,
        limits,
        name="dra-http",
        what="--http-address",
    )
    log.info("serving /metrics, /healthz and /readyz on %s", address)
    return server
