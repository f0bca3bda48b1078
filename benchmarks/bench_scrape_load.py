"""Allocate and ``/healthz`` under 10 scrapes a second on a 64-card node with telemetry; JSON out.

The real plugin process on the simulated 64-card node (``2socket-64card``) with the simulated
libefml, behind the stub kubelet serving PodResources with pods holding cards, telemetry every
2 s, once per isolation mode (``thread`` and ``process``). For each: Allocate p50/p99 (50 calls
a second for 20 s) and ``/healthz`` latency (4 probes a second) first with nobody scraping, then
while a separate process scrapes ``/metrics`` 10 times a second (one connection per scrape, as
Prometheus does per target). The probe is sent from 127.0.0.2, as the kubelet is another peer
than the scraper. The scraper runs in its own process so its work is not the measuring side's.
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import os
import platform
import subprocess
import sys
import threading
import time
from typing import Any

from bench_http_flood import free_port
from bench_plugin import measure, summary  # benchmarks/ is the script's directory

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation.testing import plugin_process

RESOURCE = "enflame.com/gcu"
TOPOLOGY = "2socket-64card"
PHASE_SECONDS = 20.0
ALLOCATE_EVERY = 0.02  # 50 Allocates a second
SCRAPES_PER_SECOND = 10.0
PROBE_EVERY = 0.25


def scraper(port: int, rate: float) -> dict[str, Any]:
    """Scrape ``/metrics`` ``rate`` times a second (one connection each) until stdin closes."""
    samples: list[float] = []
    failed = 0
    size = 0
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    tick = time.monotonic()
    while not stop.is_set():
        begun = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            answer = connection.getresponse()
            size = len(answer.read())
            if answer.status != 200:
                failed += 1
        except OSError:
            failed += 1
        finally:
            connection.close()
        samples.append((time.perf_counter() - begun) * 1000)
        tick += 1.0 / rate
        stop.wait(max(0.0, tick - time.monotonic()))
    return {"scrapes": summary(samples), "failed": failed, "bytes": size}


def probe(port: int) -> float | None:
    """One ``/healthz`` as the kubelet sends it (another peer address); ms, None on failure."""
    begun = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, 5, ("127.0.0.2", 0))
    try:
        connection.request("GET", "/healthz")
        ok = connection.getresponse().status == 200
    except OSError:
        ok = False
    finally:
        connection.close()
    return (time.perf_counter() - begun) * 1000 if ok else None


async def phase(stub: Any, request: Any, port: int, scraping: bool) -> dict[str, Any]:
    """Allocate latency and probes, with or without the scraping process."""
    scraper_process = None
    if scraping:
        scraper_process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--scrape", str(port), str(SCRAPES_PER_SECOND),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(2.0)  # the scrapes are under way
    probes: list[float] = []
    failed = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal failed
        while not done.is_set():
            took = await asyncio.to_thread(probe, port)
            if took is None:
                failed += 1
            else:
                probes.append(took)
            await asyncio.sleep(PROBE_EVERY)

    sampler = asyncio.ensure_future(sample())
    samples: list[float] = []
    ends = time.monotonic() + PHASE_SECONDS
    while time.monotonic() < ends:
        begun = time.perf_counter()
        await stub.Allocate(request, timeout=10)
        samples.append((time.perf_counter() - begun) * 1000)
        await asyncio.sleep(max(0.0, ALLOCATE_EVERY - (time.perf_counter() - begun)))
    allocate = summary(samples)
    done.set()
    await sampler
    result: dict[str, Any] = {
        "allocate": allocate,
        "healthz": summary(probes) if probes else {},
        "healthz_failed": failed,
    }
    if scraper_process is not None:
        out, _ = await scraper_process.communicate(b"")
        result["scraper"] = json.loads(out)
    return result


async def one_mode(isolation: str) -> dict[str, Any]:
    port = free_port()
    args = [
        "--pass-device-specs",
        f"--metrics-port={port}",
        "--metrics-bind-address=127.0.0.1",
        "--telemetry-interval=2",
        f"--telemetry-isolation={isolation}",
    ]
    async with plugin_process.running_node(
        TOPOLOGY, args=args, pod_resources=True, efml=True, timeout=60
    ) as node:
        for n in range(4):
            await node.kubelet.allocate_pod(f"pod{n}", {"main": 4})
        await asyncio.sleep(5.0)  # two telemetry passes, the holders read
        stub = node.kubelet.plugins[RESOURCE].stub
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu40", "gcu41"])
        await measure(50, lambda _: stub.Allocate(request, timeout=10))  # warm-up
        gc.freeze()
        quiet = await phase(stub, request, port, scraping=False)
        loaded = await phase(stub, request, port, scraping=True)
    return {"quiet": quiet, "scraped_10_per_s": loaded}


async def main() -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    modes = {mode: await one_mode(mode) for mode in ("thread", "process")}
    return {
        "benchmark": "scrape_load",
        "topology": TOPOLOGY,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "uptime": subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "modes": modes,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--scrape"]:
        print(json.dumps(scraper(int(sys.argv[2]), float(sys.argv[3]))))
    else:
        print(json.dumps(asyncio.run(main()), indent=2))
