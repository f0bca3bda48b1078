"""Prometheus metrics of the plugin (``--metrics-port``; 0 = off) and the state its probes read.

The registry is private to the process's :class:`Metrics` object (nothing shared between tests)
and carries no ``_created`` series. What each metric means is listed in docs/user-guide.md,
"Observe your GCUs"; the per-card families are computed at scrape time by
:class:`~.card_metrics.CardCollector` from one immutable view, so a scrape never sees half an
update. Every method here is called on the event loop; the HTTP thread only reads.

A scrape's bytes (:meth:`Metrics.exposition`) come in two parts: the families that change only
with a new view of the cards or a new telemetry pass (hundreds of series per card on a large
node) are encoded once per such change and kept; the plugin's own counters, histograms and
process figures (a few dozen series) are encoded on each scrape. Both on the HTTP server's worker
thread, never on the event loop the kubelet's calls run on.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    exposition,
)
from prometheus_client.registry import Collector

from enflame_gcu import __version__, devices, health, holders, topology, virtual
from enflame_gcu.device_plugin import card_metrics

log = logging.getLogger(__name__)
# Allocate and GetPreferredAllocation answer in well under a millisecond on a quiet node; the
# upper buckets catch a stalled event loop.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)
# A loop that has not ticked for this long is stuck: /healthz fails.
STALL_SECONDS = 30.0


class Metrics:
    """The plugin's metrics; fed by the runner, the servers and the PodResources reader."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        # Encoded on every scrape: the plugin's own counters and the process's figures.
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        # Encoded once per change of what they render (see :meth:`add_cached`).
        self.cached = CollectorRegistry(auto_describe=False)
        self._versions: list[Callable[[], object]] = []
        self._encoded: dict[bool, tuple[tuple[object, ...], bytes]] = {}
        self._encoding = threading.Lock()
        self.encodes = 0  # times the cached families were encoded (tests and benchmarks)
        self.cards = card_metrics.CardCollector()
        self.add_cached(self.cards, self.cards.version)
        labels = {"version": __version__, "python_version": platform.python_version()}
        Gauge(
            "enflame_gcu_build_info",
            "Always 1; the plugin's version and Python version as labels",
            list(labels),
            registry=self.registry,
        ).labels(**labels).set(1)
        self.device_healthy = Gauge(
            "enflame_gcu_device_healthy",
            "1 when the device is advertised Healthy, 0 when Unhealthy",
            ["resource", "device"],
            registry=self.registry,
        )
        self.devices = Gauge(
            "enflame_gcu_devices",
            "Devices advertised per resource and health",
            ["resource", "health"],
            registry=self.registry,
        )
        self.allocations = Counter(
            "enflame_gcu_allocations",
            "Containers given devices by Allocate, by the locality of their cards",
            ["resource", "locality"],
            registry=self.registry,
        )
        self.allocated_devices = Counter(
            "enflame_gcu_allocated_devices",
            "Device IDs handed out by Allocate",
            ["resource"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "enflame_gcu_allocation_errors",
            "Allocate calls refused, by gRPC status code",
            ["resource", "code"],
            registry=self.registry,
        )
        self.preferred = Counter(
            "enflame_gcu_preferred_allocations",
            "GetPreferredAllocation answers per container, by the locality of the chosen cards",
            ["resource", "locality"],
            registry=self.registry,
        )
        self.rpc_seconds = Histogram(
            "enflame_gcu_rpc_duration_seconds",
            "Time to answer a device plugin RPC from the kubelet",
            ["rpc", "resource", "code"],
            buckets=RPC_BUCKETS,
            registry=self.registry,
        )
        self.registrations = Counter(
            "enflame_gcu_registrations",
            "Successful Register calls to the kubelet, by cause (start, kubelet_restart, "
            "socket_lost, lock_lost, takeover)",
            ["resource", "cause"],
            registry=self.registry,
        )
        self.registered = Gauge(
            "enflame_gcu_registered",
            "1 while the resource is registered and the kubelet's ListAndWatch stream is open",
            ["resource"],
            registry=self.registry,
        )
        self.pod_resources_up = Gauge(
            "enflame_gcu_pod_resources_up",
            "1 when the last read of the kubelet's PodResources API succeeded",
            registry=self.registry,
        )
        self.feature_file_writes = Counter(
            "enflame_gcu_feature_file_writes",
            "Times the NFD feature file was rewritten because the labels changed",
            registry=self.registry,
        )
        self._known: dict[str, set[str]] = {}
        self._served: tuple[str, ...] = ()
        self._registered: dict[str, bool] = {}
        self._streams: dict[str, int] = {}
        self._inventory: devices.Inventory | None = None
        self._report: health.HealthReport | None = None
        self._holdings: tuple[holders.Holding, ...] | None = None
        self._topology = topology.Topology(())
        self._parents: dict[str, str | None] = {}
        self._beat = time.monotonic()
        # Set by the PodResources reader: an Allocate means a holder appears soon.
        self.after_allocate: Callable[[], None] | None = None

    # --- exposition ------------------------------------------------------------------------

    def add_cached(self, collector: Collector, version: Callable[[], object]) -> None:
        """Serve ``collector``'s families encoded once per value of ``version()`` (compared
        with ==; an object it returns is held, so identity cannot be reused)."""
        self.cached.register(collector)
        self._versions.append(version)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """One scrape's bytes for the client's Accept header, and their content type."""
        encoder, content_type = exposition.choose_encoder(accept)
        openmetrics = content_type.startswith("application/openmetrics-text")
        live = encoder(self.registry)
        cached = self._cached_bytes(encoder, openmetrics)
        if openmetrics:  # one "# EOF" at the very end
            return live.removesuffix(b"# EOF\n") + cached.removesuffix(b"# EOF\n") + (
                b"# EOF\n"
            ), content_type
        return live + cached, content_type

    def _cached_bytes(self, encoder: Callable[[CollectorRegistry], bytes], key: bool) -> bytes:
        with self._encoding:  # one encodes, a scrape beside it then takes the same bytes
            version = tuple(version() for version in self._versions)
            kept = self._encoded.get(key)
            if kept is not None and kept[0] == version:
                return kept[1]
            encoded = encoder(self.cached)
            self.encodes += 1
            self._encoded[key] = (version, encoded)
            return encoded

    # --- devices and cards ----------------------------------------------------------------

    def set_devices(self, resource: str, health: Iterable[tuple[str, bool]]) -> None:
        """Replace a resource's device health (``(device, healthy)`` pairs)."""
        current = dict(health)
        for gone in self._known.get(resource, set()) - set(current):
            self.device_healthy.remove(resource, gone)
        for device, healthy in current.items():
            self.device_healthy.labels(resource, device).set(1 if healthy else 0)
        self._known[resource] = set(current)
        healthy_count = sum(current.values())
        self.devices.labels(resource, "Healthy").set(healthy_count)
        self.devices.labels(resource, "Unhealthy").set(len(current) - healthy_count)

    def retain(self, resources: Iterable[str]) -> None:
        """Serve exactly ``resources`` from now on (after a config reload): drop the others."""
        self._served = tuple(resources)
        for resource in set(self._known) - set(self._served):
            self.set_devices(resource, ())
        for resource in set(self._registered) - set(self._served):
            self._registered.pop(resource, None)
            self._streams.pop(resource, None)
            self.registered.remove(resource)
        self._publish()

    def set_node(self, inventory: devices.Inventory, report: health.HealthReport) -> None:
        """The node's cards and their health (after discovery and every health change)."""
        self._inventory, self._report = inventory, report
        self._topology = topology.Topology.from_inventory(inventory)
        self._parents = virtual.parents(inventory)
        self._publish()

    def set_holdings(self, holdings: Sequence[holders.Holding] | None) -> None:
        """Who holds what per PodResources; None when it could not be read."""
        self._holdings = None if holdings is None else tuple(holdings)
        self.pod_resources_up.set(0 if holdings is None else 1)
        self._publish()

    def _publish(self) -> None:
        if self._inventory is None or self._report is None:
            return
        verdicts = {card.name: (card.healthy, card.reason) for card in self._report.cards}
        view = holders.build(
            self._inventory,
            self._holdings or (),
            resources=self._served or holders.DEFAULT_RESOURCES,
            health=verdicts,
        )
        self.cards.update(view, known=self._holdings is not None)

    # --- RPC outcomes ---------------------------------------------------------------------

    def _locality(self, ids: Sequence[str]) -> str:
        cards = [holders.parent_card(i, self._parents) or i for i in ids]
        return holders.locality(self._topology, cards)

    def allocated(self, resource: str, containers: list[list[str]]) -> None:
        """Count one successful Allocate (one entry per container)."""
        for ids in containers:
            self.allocations.labels(resource, self._locality(ids)).inc()
        self.allocated_devices.labels(resource).inc(sum(len(ids) for ids in containers))
        if self.after_allocate is not None:
            self.after_allocate()

    def refused(self, resource: str, code: str) -> None:
        """Count one refused Allocate by its status code name."""
        self.refusals.labels(resource, code).inc()

    def preferred_chosen(self, resource: str, ids: Sequence[str]) -> None:
        """Count one GetPreferredAllocation answer for a container."""
        self.preferred.labels(resource, self._locality(ids)).inc()

    def rpc_done(self, rpc: str, resource: str, code: str, seconds: float) -> None:
        """Observe one RPC's duration."""
        self.rpc_seconds.labels(rpc, resource, code).observe(seconds)

    # --- registration, streams and probes -------------------------------------------------

    def registered_with(self, resource: str, cause: str) -> None:
        """A Register call succeeded."""
        self.registrations.labels(resource, cause).inc()
        self._registered[resource] = True
        self._set_registered(resource)

    def unregistered(self, resource: str) -> None:
        """The registration is gone (socket lost, kubelet restarted, stopping)."""
        self._registered[resource] = False
        self._set_registered(resource)

    def stream(self, resource: str, delta: int) -> None:
        """A ListAndWatch stream opened (+1) or ended (-1)."""
        self._streams[resource] = max(0, self._streams.get(resource, 0) + delta)
        self._set_registered(resource)

    def _set_registered(self, resource: str) -> None:
        if resource in self._served or not self._served:
            self.registered.labels(resource).set(1 if self._connected(resource) else 0)

    def _connected(self, resource: str) -> bool:
        return self._registered.get(resource, False) and self._streams.get(resource, 0) > 0

    def beat(self) -> None:
        """The event loop is alive (called every second by the runner)."""
        self._beat = time.monotonic()

    def live(self) -> tuple[bool, str]:
        """``/healthz``: the event loop ticked recently."""
        age = time.monotonic() - self._beat
        if age > STALL_SECONDS:
            return False, f"event loop stalled for {age:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: every served resource is registered and the kubelet is listening."""
        if not self._served:
            return False, "not serving yet"
        missing = []
        for resource in self._served:
            if not self._registered.get(resource, False):
                missing.append(f"{resource}: not registered with the kubelet")
            elif self._streams.get(resource, 0) == 0:
                missing.append(f"{resource}: the kubelet is not connected")
        return (False, "; ".join(missing)) if missing else (True, "ok")

    def known(self) -> Mapping[str, bool]:
        """``{resource: connected}`` (for logs and tests)."""
        return {resource: self._connected(resource) for resource in self._served}
