"""What card telemetry costs: one collection pass per card and per node (8 and 64 cards), one
scrape with telemetry on versus off, the plugin's RSS and idle CPU with telemetry on; JSON out.

Collection runs in-process against the simulated libefml (its calls read a small values file,
so a real libefml's ioctls cost differently; the binding's and the worker threads' share is the
same). Scrapes and RSS use the real plugin process on the simulated 8-card node behind the stub
kubelet with four held cards, as the integration tests do.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import urllib.request
from typing import Any

from bench_observe import cpu_seconds, free_port
from bench_plugin import measure, rss_mb, summary  # benchmarks/ is the script's directory
from prometheus_client import CollectorRegistry, generate_latest

from enflame_gcu import devices, holders
from enflame_gcu.device_plugin import card_metrics, telemetry, telemetry_metrics
from enflame_gcu.simulation import efmlsim, simulate, topofile
from enflame_gcu.simulation.testing import plugin_process

PASSES = 50
SCRAPES = 200
IDLE_SECONDS = 20.0


def collection(topology: str) -> dict[str, Any]:
    """Milliseconds per pass and per card over ``PASSES`` passes on a simulated node."""
    root = tempfile.mkdtemp(prefix="bench-telemetry-")
    topo = topofile.load(topology)
    simulate.create(root, topo)
    efmlsim.install(root)
    collector = telemetry.TelemetryCollector(root, interval=1, timeout=5)
    first = collector.collect_once()
    assert first.up and len(first.cards) == len(topo.cards), first
    samples = []
    for _ in range(PASSES):
        started = time.perf_counter()
        snap = collector.collect_once()
        samples.append((time.perf_counter() - started) * 1000)
    assert len(snap.cards) == len(topo.cards)
    collector.stop()
    cards = len(topo.cards)
    return {
        "cards": cards,
        "pass": summary(samples),
        "per_card_ms_p50": round(statistics.median(samples) / cards, 3),
        "worker_threads": collector.calls.threads(),
    }


def render_cost(topology: str = "vendor-8card", rounds: int = 200) -> dict[str, Any]:
    """Milliseconds to build the telemetry families (collect) and to render them as text, when
    each scrape follows a new pass and a new holders view with the same content (the cache
    hits) and when the cache is dropped before each scrape (every family rebuilt)."""
    root = tempfile.mkdtemp(prefix="bench-telemetry-")
    simulate.create(root, topofile.load(topology))
    efmlsim.install(root)
    collector = telemetry.TelemetryCollector(root, interval=1, timeout=5)
    collector.snapshot = collector.collect_once()
    inventory = devices.discover(root)
    held = [holders.Holding("default", "pod1", "main", "enflame.com/gcu", ("gcu0", "gcu1"))]
    cards = card_metrics.CardCollector(host="bench")
    families = telemetry_metrics.TelemetryMetrics(collector, cards.current, host="bench")
    registry = CollectorRegistry()
    registry.register(families)
    result: dict[str, Any] = {"cards": len(inventory.cards)}
    for name, work in (("collect", lambda: list(families.collect())),
                       ("text", lambda: generate_latest(registry))):  # fmt: skip
        for case in ("cache_hit", "rebuild"):
            samples = []
            for _ in range(rounds):
                collector.snapshot = collector.collect_once()  # a new pass, same readings
                cards.update(holders.build(inventory, held), known=True)  # a new, equal view
                if case == "rebuild":
                    families._cached = None  # what every scrape did before
                started = time.perf_counter()
                work()
                samples.append((time.perf_counter() - started) * 1000)
            result[f"{name}_{case}_ms_p50"] = round(statistics.median(samples), 3)
    collector.stop()
    return result


def scrape(port: int) -> tuple[int, int]:
    """Bytes and series (sample lines) of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        body = answer.read()
    series = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
    return len(body), series


def telemetry_series(text: str) -> int:
    """Sample lines of the telemetry families (enflame_gcu_*/enflame_vgcu_* but the plugin's
    own allocation families) in one scrape."""
    own = (b"enflame_gcu_card", b"enflame_gcu_cards", b"enflame_gcu_allocation_info")
    return sum(
        1
        for line in text.encode().split(b"\n")
        if line.startswith((b"enflame_gcu_", b"enflame_vgcu_")) and not line.startswith(own)
    )


async def plugin(telemetry_on: bool) -> dict[str, Any]:
    """Scrape latency and size, RSS, idle CPU of the plugin with telemetry on or off."""
    port = free_port()
    interval = "10" if telemetry_on else "0"
    args = [f"--metrics-port={port}", f"--telemetry-interval={interval}"]
    async with plugin_process.running_node(
        args=args, pod_resources=True, efml=telemetry_on
    ) as node:
        pid = node.plugin.process.pid  # type: ignore[union-attr]
        await node.kubelet.allocate_pod("pod1", {"main": 2})
        await node.kubelet.allocate_pod("pod2", {"main": 2})
        await asyncio.sleep(3.0)
        result: dict[str, Any] = {"rss_mb_settled": rss_mb(pid)}
        before = cpu_seconds(pid)
        await asyncio.sleep(IDLE_SECONDS)
        result["idle_cpu_ms_per_s"] = round((cpu_seconds(pid) - before) / IDLE_SECONDS * 1000, 2)
        sizes = []

        async def one(_: int) -> None:
            sizes.append(await asyncio.to_thread(scrape, port))

        result["scrape"] = summary(await measure(SCRAPES, one))
        result["scrape_bytes"], result["series"] = sizes[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            result["telemetry_series"] = telemetry_series(answer.read().decode())
        result["rss_mb_after_scrapes"] = rss_mb(pid)
    return result


async def main() -> dict[str, Any]:
    per_node = {name: collection(name) for name in ("vendor-8card", "2socket-64card")}
    render = render_cost()
    off = await plugin(False)
    on = await plugin(True)
    return {
        "benchmark": "telemetry",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "collection": per_node,
        "render": render,
        "plugin_telemetry_off": off,
        "plugin_telemetry_on": on,
        "added": {
            "rss_mb": round(on["rss_mb_after_scrapes"] - off["rss_mb_after_scrapes"], 1),
            "scrape_p50_ms": round(on["scrape"]["p50_ms"] - off["scrape"]["p50_ms"], 3),
            "scrape_bytes": on["scrape_bytes"] - off["scrape_bytes"],
            "series": on["series"] - off["series"],
            "idle_cpu_ms_per_s": round(on["idle_cpu_ms_per_s"] - off["idle_cpu_ms_per_s"], 2),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
