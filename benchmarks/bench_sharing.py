"""Sharing benchmarks: shared-gcu GetPreferredAllocation over 128 slices, Allocate, health; JSON.

The plugin runs as its own process on the simulated vendor 8-card node with every card shared
as 16 slices (128 device IDs), configured through a real config file; the stub kubelet calls it
over unix sockets, as in the integration tests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import sys
import tempfile
from typing import Any

from bench_plugin import measure, preferred_requests, summary

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process

SHARED = "enflame.com/shared-gcu"
TARGET_P99_MS = 10.0
CONFIG = """\
version: v1
flags: {{resources: [shared-gcu]}}
sharing: {{slicesPerCard: 16, policy: {policy}}}
"""


async def bench_policy(policy: str, count: int, results: dict[str, Any]) -> None:
    """GetPreferredAllocation with all 128 slices available (sizes 1..16), then Allocate."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "config.yaml")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(CONFIG.format(policy=policy))
        async with plugin_process.running_node("vendor-8card", ["--config-file", path]) as node:
            await node.kubelet.wait_for(lambda k: k.capacity(SHARED) == 128, 10, "128 slices")
            stub = node.kubelet.plugins[SHARED].stub
            slices = list(node.kubelet.devices(SHARED))
            sizes = [1, 2, 4, 8, 16]
            requests = preferred_requests(slices, sizes)

            async def prefer(i: int) -> None:
                await stub.GetPreferredAllocation(requests[i % len(requests)], timeout=5)

            await measure(50, prefer)  # warm-up
            gc.freeze()
            preferred = summary(await measure(count, prefer))
            results[f"get_preferred_allocation_128_slices_{policy}"] = {
                **preferred,
                "sizes": sizes,
                "target_p99_ms": TARGET_P99_MS,
                "met": preferred["p99_ms"] <= TARGET_P99_MS,
            }
            allocate = api_pb2.AllocateRequest()
            allocate.container_requests.add(devices_ids=["gcu0-slice0", "gcu0-slice1"])
            await measure(50, lambda _i: stub.Allocate(allocate, timeout=5))
            results[f"allocate_2_slices_{policy}"] = summary(
                await measure(count, lambda _i: stub.Allocate(allocate, timeout=5))
            )
            if policy == "packed":
                await bench_unplug(node, results)


async def bench_unplug(node: plugin_process.RunningNode, results: dict[str, Any]) -> None:
    """Unplug a shared card -> all 16 of its slices Unhealthy on the shared ListAndWatch."""

    def card_health(card: str) -> set[str]:
        devices = node.kubelet.devices(SHARED)
        return {h for d, h in devices.items() if d.startswith(f"{card}-")}

    samples = []
    for i in range(30):
        card = f"gcu{i % 8}"

        async def unplug(_j: int, minor: int = i % 8, name: str = card) -> None:
            simulate.unplug(node.root, minor)
            await node.kubelet.wait_for(
                lambda _k: card_health(name) == {"Unhealthy"}, 10, f"{name} slices unhealthy"
            )

        samples += await measure(1, unplug)
        simulate.replug(node.root, i % 8)
        await node.kubelet.wait_for(
            lambda k: len(k.allocatable(SHARED)) == 128, 10, "every slice healthy again"
        )
    results["unplug_to_16_slices_unhealthy_on_list_and_watch"] = summary(samples)


async def main() -> dict[str, Any]:
    """Every sharing benchmark; the JSON document to print."""
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    for policy in ("packed", "distributed"):
        await bench_policy(policy, 1000, results)
    return results


if __name__ == "__main__":
    document = asyncio.run(main())
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    ok = all(v.get("met", True) for v in document.values() if isinstance(v, dict))
    sys.exit(0 if ok else 1)
