"""What observing costs the plugin: RSS, Allocate latency and idle CPU with metrics, PodResources
reads and the feature file on versus off, plus the scrape latency and size; JSON out.

Both runs use the real plugin process on the simulated 8-card node behind the stub kubelet
(which also serves PodResources with four held cards), as the integration tests do.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import socket
import tempfile
import time
import urllib.request
from typing import Any

from bench_plugin import measure, rss_mb, summary  # benchmarks/ is the script's directory

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation.testing import plugin_process

RESOURCE = "enflame.com/gcu"
CALLS = 1000
SCRAPES = 200
IDLE_SECONDS = 20.0


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return len(answer.read())


async def run(observe: bool) -> dict[str, Any]:
    """One configuration: settle, pods, 1,000 Allocates, idle CPU, scrapes when observing."""
    port = free_port()
    directory = tempfile.mkdtemp(prefix="bench-observe-")
    args = ["--pass-device-specs"]
    if observe:
        args += [f"--metrics-port={port}", "--feature-file", os.path.join(directory, "f")]
    async with plugin_process.running_node(args=args, pod_resources=observe) as node:
        pid = node.plugin.process.pid  # type: ignore[union-attr]
        kubelet = node.kubelet
        await kubelet.allocate_pod("pod1", {"main": 2})
        await kubelet.allocate_pod("pod2", {"main": 2})
        await asyncio.sleep(2.0)
        result: dict[str, Any] = {"rss_mb_settled": rss_mb(pid)}
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu2", "gcu3"])
        stub = kubelet.plugins[RESOURCE].stub
        samples = await measure(CALLS, lambda _: stub.Allocate(request, timeout=5))
        result["allocate"] = summary(samples)
        result["rss_mb_after_allocates"] = rss_mb(pid)
        before = cpu_seconds(pid)
        await asyncio.sleep(IDLE_SECONDS)
        result["idle_cpu_ms_per_s"] = round((cpu_seconds(pid) - before) / IDLE_SECONDS * 1000, 2)
        if observe:
            sizes = []

            async def one(_: int) -> None:
                sizes.append(await asyncio.to_thread(scrape, port))

            result["scrape"] = summary(await measure(SCRAPES, one))
            result["scrape_bytes"] = sizes[-1]
            result["rss_mb_after_scrapes"] = rss_mb(pid)
    return result


async def main() -> dict[str, Any]:
    off = await run(False)
    on = await run(True)
    return {
        "benchmark": "observe",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "plain": off,
        "observing": on,
        "added": {
            "rss_mb": round(on["rss_mb_after_allocates"] - off["rss_mb_after_allocates"], 1),
            "allocate_p50_ms": round(on["allocate"]["p50_ms"] - off["allocate"]["p50_ms"], 3),
            "idle_cpu_ms_per_s": round(on["idle_cpu_ms_per_s"] - off["idle_cpu_ms_per_s"], 2),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
