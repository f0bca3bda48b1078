"""Prometheus metrics (``--metrics-port``; 0 = off): device health per resource, allocations.

Gauges are rebuilt from each resource's snapshot whenever it changes, so a device that
disappears (rediscovery) also disappears from the exposition. The registry is private to the
process's :class:`Metrics` object: no default collectors, nothing shared between tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

log = logging.getLogger(__name__)


class Metrics:
    """The plugin's metrics; feed it snapshots and Allocate outcomes, serve it on a port."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
            "Containers given devices by Allocate",
            ["resource"],
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
        self._known: dict[str, set[str]] = {}

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
        """Drop every device of resources no longer served (after a config reload)."""
        for resource in set(self._known) - set(resources):
            self.set_devices(resource, ())

    def allocated(self, resource: str, containers: list[list[str]]) -> None:
        """Count one successful Allocate (one entry per container)."""
        self.allocations.labels(resource).inc(len(containers))
        self.allocated_devices.labels(resource).inc(sum(len(ids) for ids in containers))

    def refused(self, resource: str, code: str) -> None:
        """Count one refused Allocate by its status code name."""
        self.refusals.labels(resource, code).inc()

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on every address at ``port`` (a daemon thread)."""
        start_http_server(port, registry=self.registry)
        log.info("serving Prometheus metrics on port %d", port)
