"""--metrics-port: the plugin process's Prometheus endpoint, scraped over HTTP."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import tempfile
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process

SHARED = "enflame.com/shared-gcu"
CONFIG = """\
version: v1
flags: {resources: [gcu, shared-gcu]}
sharing: {cards: [gcu4], slicesPerCard: 2, maxSlicesPerContainer: 1}
"""


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` as ``{(name, sorted labels): value}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def healthy(port: int, resource: str, device: str) -> float | None:
    """The device health gauge, None when absent."""
    key = ("enflame_gcu_device_healthy", (("device", device), ("resource", resource)))
    return scrape(port).get(key)


def test_metrics_show_health_per_resource_and_count_allocations() -> None:
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "config.yaml")
        pathlib.Path(path).write_text(CONFIG)

        async def main() -> None:
            args = ["--config-file", path, f"--metrics-port={port}"]
            async with plugin_process.running_node("vendor-8card", args) as node:
                kubelet = node.kubelet
                await kubelet.wait_for(lambda k: k.capacity(SHARED) == 2, 10, "slices")
                assert healthy(port, SHARED, "gcu4-slice1") == 1
                assert healthy(port, "enflame.com/gcu", "gcu0") == 1
                assert healthy(port, "enflame.com/gcu", "gcu4") is None  # shared, not whole
                samples = scrape(port)
                count = ("enflame_gcu_devices", (("health", "Healthy"), ("resource", SHARED)))
                assert samples[count] == 2

                await kubelet.allocate_pod("one", {"a": 1}, SHARED)
                over = api_pb2.AllocateRequest()
                over.container_requests.add(devices_ids=["gcu4-slice0", "gcu4-slice1"])
                with pytest.raises(grpc.aio.AioRpcError, match="at most 1 per container"):
                    await kubelet.plugins[SHARED].stub.Allocate(over, timeout=5)
                samples = scrape(port)
                one = (
                    "enflame_gcu_allocations_total",
                    (("locality", "single"), ("resource", SHARED)),
                )
                assert samples[one] == 1
                refused = (
                    "enflame_gcu_allocation_errors_total",
                    (("code", "INVALID_ARGUMENT"), ("resource", SHARED)),
                )
                assert samples[refused] == 1

                simulate.unplug(node.root, 4)
                await kubelet.wait_for(
                    lambda k: set(k.devices(SHARED).values()) == {"Unhealthy"}, 10, "unhealthy"
                )
                assert healthy(port, SHARED, "gcu4-slice0") == 0
                assert healthy(port, "enflame.com/gcu", "gcu5") == 1

        asyncio.run(main())
