"""Scheduler extender at 200, 1,000 and 5,000 nodes of 8 cards: filter and prioritize; JSON.

The extender's own HTTP server (``scheduler_extender.server``) in a child process, its cache
holding N vendor 8-card nodes whose ``enflame.com/gcu-node-state`` annotations are in mixed,
seeded states (bench_cluster.py's ``serve_states``), called as kube-scheduler calls it in the
shipped names-only mode (``nodeCacheCapable: true``: ``NodeNames`` only) over one kept-alive
connection, for pods of 1/2/4/8 cards. Reported per N: client-side and server-side p50/p99
of filter and prioritize, and the extender process's resident memory with the cache filled
and after the calls. No control plane: the scheduler's own pods/s with and without the
extender at these sizes needs bench_cluster.py with a built cluster.

    .venv/bin/python benchmarks/bench_extender_scale.py [--nodes 200,1000,5000] [--calls 1000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import bench_cluster  # benchmarks/ is the script's directory, so it is on sys.path

TARGET_P99_MS = 20.0


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _quantiles(durations: list[float]) -> dict[str, float]:
    ordered = sorted(durations)
    return {
        "p50_ms": round(bench_cluster._quantile(ordered, 0.5) * 1000, 3),
        "p99_ms": round(bench_cluster._quantile(ordered, 0.99) * 1000, 3),
    }


def measure(nodes: int, calls: int, directory: str) -> dict[str, Any]:
    """Filter and prioritize ``calls`` times each for ``nodes`` nodes; latencies and memory."""
    port = bench_cluster.free_port()
    child = multiprocessing.get_context("fork").Process(
        target=bench_cluster.serve_states, args=(nodes, directory, port), daemon=True
    )
    child.start()
    try:
        bench_cluster.wait_ready(port)
        assert child.pid is not None
        rss_filled = _rss_mb(child.pid)
        names = [f"n{i}" for i in range(nodes)]
        bodies = []
        for i in range(64):
            limits = {bench_cluster.GCU: str(bench_cluster.SIZES[i % 4])}
            pod = {
                "metadata": {"name": f"p{i}", "namespace": "b", "uid": f"u{i}"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
            }
            bodies.append(json.dumps({"Pod": pod, "NodeNames": names}).encode())
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client: dict[str, list[float]] = {"filter": [], "prioritize": []}
        for i in range(calls + 100):
            for verb in ("filter", "prioritize"):
                started = time.perf_counter()
                connection.request("POST", f"/{verb}", bodies[i % len(bodies)])
                answer = connection.getresponse()
                answer.read()
                if answer.status != 200:
                    raise SystemExit(f"{verb} answered {answer.status}")
                if i >= 100:  # the first calls fill the score cache
                    client[verb].append(time.perf_counter() - started)
        connection.close()
        server_side = bench_cluster.stats(port)["verbs"]
        rss_after = _rss_mb(child.pid)
    finally:
        child.terminate()
        child.join(10)
    result: dict[str, Any] = {"nodes": nodes, "calls_per_verb": calls}
    for verb, durations in client.items():
        result[verb] = {
            "client": _quantiles(durations),
            "server": {k: server_side[verb][k] for k in ("p50_ms", "p99_ms")},
        }
        result[verb]["met_p99"] = result[verb]["client"]["p99_ms"] <= TARGET_P99_MS
    result["request_body_kb"] = round(len(bodies[0]) / 1024, 1)
    result["rss_mb"] = {"cache_filled": rss_filled, "after_calls": rss_after}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every size; print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="200,1000,5000")
    parser.add_argument("--calls", type=int, default=1000)
    options = parser.parse_args(argv)
    results: dict[str, Any] = {
        "benchmark": "scheduler extender at scale (names-only, no control plane)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "target_p99_ms": TARGET_P99_MS,
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-extender-") as directory:
        for nodes in (int(n) for n in options.nodes.split(",")):
            work = os.path.join(directory, str(nodes))
            os.makedirs(work)
            results["sizes"].append(measure(nodes, options.calls, work))
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
