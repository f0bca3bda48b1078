"""DRA driver benchmarks: start-up, Prepare/Unprepare latency, a kubelet batch, memory; JSON out.

``enflame-dra-plugin`` runs as its own process on a simulated 8-card node; the stub kubelet
talks to it over unix sockets and the claims come from the in-process fake API server of the
tests (over real HTTP), exactly as in tests/dra_plugin/test_process.py. A Prepare here does
all its real work: the claim read through the API client, two durable checkpoint writes
(fsync) and the per-claim CDI spec (fsync).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

# The fake API server is a test fixture: import it from the checkout's tests/ package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu import resourceslices
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command

DRIVER = resourceslices.DRIVER
CYCLES = 200
PAIRS = [(0, 1), (2, 3), (4, 5), (6, 7)]


def summary(samples_ms: list[float]) -> dict[str, float]:
    """p50/p99/max of latencies in milliseconds."""
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(ordered[-1], 3),
    }


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


def claim(index: int, cards: tuple[int, ...]) -> tuple[tuple[str, str, str], dict[str, Any]]:
    ref = ("bench", f"claim-{index}", f"00000000-0000-4000-8000-{index:012d}")
    document = harness.claim_document(*ref, [("gcus", f"gcu-{card}") for card in cards])
    return ref, document


async def main() -> dict[str, Any]:
    results: dict[str, Any] = {}
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(harness.NODE)
        kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
        refs = []
        for index in range(CYCLES):
            ref, document = claim(index, PAIRS[index % len(PAIRS)])
            fake.add_claim(document)
            refs.append(ref)
        batch = []
        for index, card in enumerate(range(8)):
            ref, document = claim(10_000 + index, (card,))
            fake.add_claim(document)
            batch.append(ref)
        stub = DraKubeletStub(where.registry)
        await stub.start()
        log = open(os.path.join(where.work, "driver.log"), "wb")  # noqa: SIM115 - closed below
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            *command(where, kubeconfig), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            await stub.wait_registered(DRIVER, timeout=30)
            results["start_to_registered_ms"] = round((time.perf_counter() - started) * 1000, 1)
            while not fake.node_slices(harness.NODE):
                await asyncio.sleep(0.005)
            results["start_to_slices_published_ms"] = round(
                (time.perf_counter() - started) * 1000, 1
            )
            prepare, again, unprepare = [], [], []
            for ref in refs:
                t0 = time.perf_counter()
                answer = await stub.prepare(DRIVER, [ref])
                t1 = time.perf_counter()
                await stub.prepare(DRIVER, [ref])  # the kubelet's retry: already prepared
                t2 = time.perf_counter()
                done = await stub.unprepare(DRIVER, [ref])
                t3 = time.perf_counter()
                assert answer.claims[ref[2]].error == "" and done.claims[ref[2]].error == ""
                prepare.append((t1 - t0) * 1000)
                again.append((t2 - t1) * 1000)
                unprepare.append((t3 - t2) * 1000)
            results["prepare_two_card_claim"] = summary(prepare)
            results["prepare_again_idempotent"] = summary(again)
            results["unprepare"] = summary(unprepare)
            t0 = time.perf_counter()
            answer = await stub.prepare(DRIVER, batch)
            results["prepare_8_claims_one_call_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            assert all(a.error == "" for a in answer.claims.values())
            assert process.pid is not None
            results["rss_after_cycles_mb"] = rss_mb(process.pid)
        finally:
            process.terminate()
            await process.wait()
            log.close()
            await stub.stop()
    return results


if __name__ == "__main__":
    measured = asyncio.run(main())
    print(
        json.dumps(
            {
                "benchmark": "dra",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "cycles": CYCLES,
                "results": measured,
            },
            indent=1,
        )
    )
