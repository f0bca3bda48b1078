"""Device plugin benchmarks: RPC latency, self-healing latency, start-up time and memory; JSON out.

Everything runs for real: the plugin is its own process on a simulated node and the stub
kubelet talks to it over unix sockets, exactly as in the integration tests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process

RESOURCE = "enflame.com/gcu"


def summary(samples_ms: list[float]) -> dict[str, float]:
    """p50/p99/max of latencies in milliseconds, rounded for reading."""
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(ordered[-1], 3),
    }


async def measure(count: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    """Milliseconds per awaited call, ``count`` times."""
    samples = []
    for i in range(count):
        started = time.perf_counter()
        await call(i)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def bench_vendor_node(results: dict[str, Any]) -> None:
    """Allocate latency and memory, re-registration, unplug -> Unhealthy, on the 8-card node."""
    async with plugin_process.running_node("vendor-8card", ["--pass-device-specs"]) as node:
        stub = node.kubelet.plugins[RESOURCE].stub
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu0", "gcu1"])
        await measure(50, lambda _i: stub.Allocate(request, timeout=5))  # warm-up
        gc.freeze()  # the client's own collector pauses are not the plugin's latency
        samples = await measure(1000, lambda _i: stub.Allocate(request, timeout=5))
        results["allocate"] = summary(samples)
        # The floor: an RPC that does no work, through the same Python client and server.
        empty = api_pb2.Empty()
        samples = await measure(1000, lambda _i: stub.GetDevicePluginOptions(empty, timeout=5))
        results["round_trip_floor_get_options"] = summary(samples)
        assert node.plugin.process is not None
        results["rss_after_1000_allocations_mb"] = rss_mb(node.plugin.process.pid)

        async def restart(_i: int) -> None:
            before = len(node.kubelet.registrations)
            await node.kubelet.restart()
            await node.kubelet.wait_for(
                lambda k: len(k.registrations) > before and len(k.allocatable()) == 8,
                10,
                "re-registration",
            )

        results["reregistration_after_kubelet_restart"] = summary(await measure(50, restart))

        async def unplug(i: int) -> None:
            card = f"gcu{i % 8}"
            simulate.unplug(node.root, i % 8)
            await node.kubelet.wait_for(
                lambda k: k.devices().get(card) == "Unhealthy", 10, f"{card} unhealthy"
            )

        samples = []
        for i in range(50):

            def unplug_card(_j: int, i: int = i) -> Awaitable[None]:
                return unplug(i)

            samples += await measure(1, unplug_card)
            simulate.replug(node.root, i % 8)
            await node.kubelet.wait_for(lambda k: len(k.allocatable()) == 8, 10, "replugged")
        results["unplug_to_unhealthy_on_list_and_watch"] = summary(samples)


def preferred_requests(ids: list[str], sizes: list[int]) -> list[Any]:
    """One GetPreferredAllocation request per size, each offering every ID."""
    requests = []
    for size in sizes:
        request = api_pb2.PreferredAllocationRequest()
        request.container_requests.add(available_deviceIDs=ids, allocation_size=size)
        requests.append(request)
    return requests


async def bench_preferred(results: dict[str, Any], board: str, count: int) -> None:
    """GetPreferredAllocation latency with every card available, sizes 1..half the board."""
    async with plugin_process.running_node(board) as node:
        stub = node.kubelet.plugins[RESOURCE].stub
        cards = list(node.kubelet.devices())
        sizes = [s for s in (1, 2, 4, 8, 16, 32) if s <= len(cards) // 2]
        requests = preferred_requests(cards, sizes)

        async def call(i: int) -> None:
            await stub.GetPreferredAllocation(requests[i % len(requests)], timeout=5)

        await measure(20, call)
        results[f"get_preferred_allocation_{len(cards)}_cards"] = {
            **summary(await measure(count, call)),
            "sizes": sizes,
        }


async def bench_startup(results: dict[str, Any], runs: int = 5) -> None:
    """Process start (exec) until the stub kubelet has the device list."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        async with plugin_process.running_node("vendor-8card") as _node:
            samples.append((time.perf_counter() - started) * 1000)
    results["process_start_to_registered"] = summary(samples)


def machine() -> dict[str, Any]:
    """Where the figures were taken."""
    model = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


async def main() -> dict[str, Any]:
    """Run every measurement."""
    results: dict[str, Any] = {"benchmark": "device_plugin", "machine": machine()}
    await bench_startup(results)
    await bench_vendor_node(results)
    await bench_preferred(results, "2socket-16card", 1000)
    await bench_preferred(results, "2socket-64card", 300)
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
    sys.exit(0)
