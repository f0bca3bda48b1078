"""A slow-request flood on the metrics/probe port (issue 22 item 2); JSON out.

The real plugin process on the simulated 8-card node behind the stub kubelet, with
``--metrics-port`` on loopback. A separate flood process opens 10,000 TCP connections to the
port, each sending half a request head and then a byte a second (slowloris), holds them for a
while and stops by itself. Measured: the plugin's RSS and thread count (peak while flooded),
Allocate p50/p99 before, during the flood and during the same flood aimed at another process (the
control: what the machine itself loses), and whether ``/healthz`` kept answering a probe from
another peer address (the kubelet's). Bounded: loopback only, 10,000 connections, a fixed
duration.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from bench_plugin import measure, rss_mb, summary  # benchmarks/ is the script's directory

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation.testing import plugin_process

RESOURCE = "enflame.com/gcu"
CALLS = 1000
CONNECTIONS = 10_000
HOLD_SECONDS = 20.0
PARTIAL_HEAD = b"GET /metrics HTTP/1.1\r\nHost: plugin\r\nX-Slow: "


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def threads(pid: int) -> int:
    """The process's thread count (/proc/PID/status)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Threads for pid {pid}")


def flood(port: int, count: int, hold: float) -> dict[str, int]:
    """Open ``count`` connections with half a request each, drip a byte a second for ``hold``
    seconds, close everything; how many the server had closed by then."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    opened: list[socket.socket] = []
    refused = 0
    for _ in range(count):
        client = socket.socket()
        client.setblocking(False)
        if client.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
            refused += 1
            client.close()
            continue
        opened.append(client)
    live = set(range(len(opened)))

    def drip(data: bytes) -> None:
        for index in list(live):
            try:
                opened[index].send(data)
            except BlockingIOError:
                pass
            except OSError:
                live.discard(index)  # reset: the server dropped it

    drip(PARTIAL_HEAD)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        time.sleep(1.0)
        drip(b"a")
    still_open = len(live)
    for client in opened:
        client.close()
    return {"opened": len(opened), "refused": refused, "open_at_end": still_open}


def healthz(port: int) -> bool:
    """One probe as the kubelet sends it, from another peer address than the flood's."""
    connection = http.client.HTTPConnection("127.0.0.1", port, 5, ("127.0.0.2", 0))
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def hold_everything(port: int) -> None:
    """The control: a listener of another process that takes and keeps every connection."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, CONNECTIONS + 1024), hard))

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            pass
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(keep, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


async def flooded_allocates(stub: Any, request: Any, port: int, pid: int) -> dict[str, Any]:
    """Allocate latency while a flood process works on ``port``; the plugin's peaks."""
    flooder = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--flood",
        str(port),
        str(CONNECTIONS),
        str(HOLD_SECONDS),
        stdout=subprocess.PIPE,
    )
    peak = {"rss_mb": 0.0, "threads": 0}
    probes = {"ok": 0, "failed": 0}

    async def sample() -> None:
        while flooder.returncode is None:
            peak["rss_mb"] = max(peak["rss_mb"], rss_mb(pid))
            peak["threads"] = max(peak["threads"], threads(pid))
            ok = await asyncio.to_thread(healthz, port)
            probes["ok" if ok else "failed"] += 1
            await asyncio.sleep(0.5)

    sampler = asyncio.ensure_future(sample())
    await asyncio.sleep(1.0)  # the flood is under way
    allocate = summary(await measure(CALLS, lambda _: stub.Allocate(request, timeout=5)))
    out, _ = await flooder.communicate()
    await sampler
    return {"flood": json.loads(out), "peak": peak, "healthz": probes, "allocate": allocate}


async def run() -> dict[str, Any]:
    port = free_port()
    args = ["--pass-device-specs", f"--metrics-port={port}", "--metrics-bind-address=127.0.0.1"]
    async with plugin_process.running_node(args=args) as node:
        pid = node.plugin.process.pid  # type: ignore[union-attr]
        stub = node.kubelet.plugins[RESOURCE].stub
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu2", "gcu3"])
        await asyncio.sleep(2.0)
        result: dict[str, Any] = {"before": {"rss_mb": rss_mb(pid), "threads": threads(pid)}}
        result["before"]["allocate"] = summary(
            await measure(CALLS, lambda _: stub.Allocate(request, timeout=5))
        )
        # The control: the same flood at another process's port costs the machine (kernel,
        # the flooding process) as much, and the plugin nothing: what it leaves is noise.
        other = free_port()
        holder = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--hold", str(other)
        )
        await asyncio.sleep(1.0)
        control = await flooded_allocates(stub, request, other, pid)
        holder.terminate()
        await holder.wait()
        result["control_flood_elsewhere"] = {
            "allocate": control["allocate"],
            "flood": control["flood"],
        }
        await asyncio.sleep(2.0)
        result["during"] = await flooded_allocates(stub, request, port, pid)
        await asyncio.sleep(2.0)
        result["after"] = {"rss_mb": rss_mb(pid), "threads": threads(pid)}
    return result


async def main() -> dict[str, Any]:
    measured = await run()
    return {
        "benchmark": "http_flood",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "connections": CONNECTIONS,
        "hold_seconds": HOLD_SECONDS,
        **measured,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hold"]:
        hold_everything(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--flood"]:
        port, count, hold = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(flood(port, count, hold)))
    else:
        print(json.dumps(asyncio.run(main()), indent=2))
