"""DRA driver takeover without a pod UID: how soon the standby instance serves; JSON out.

Two ``enflame-dra-plugin`` processes on one simulated node, no pod UID, so they share the
socket names: one holds ``dra.sock.lock`` and serves, the other stands by. Each round stops the
holder (SIGKILL and SIGTERM alternately) and measures, from the signal, when the stub kubelet
has registered the standby and when a NodePrepareResources through it has answered; a fresh
process then starts as the next standby. Claims come from the tests' fake API server over real
HTTP, as in benchmarks/bench_dra.py; slices are not published (--no-publish).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Any

# The fake API server is a test fixture: import it from the checkout's tests/ package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_dra import rss_mb, summary

from enflame_gcu import resourceslices
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command

DRIVER = resourceslices.DRIVER
ROUNDS = 10  # per signal
STANDBY = "this instance stands by and takes over when that one stops"


async def start(where: harness.Node, kubeconfig: str, index: int) -> tuple[Any, str]:
    log_path = os.path.join(where.work, f"driver-{index}.log")
    with open(log_path, "wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command(where, kubeconfig, "--no-publish"), stdout=log, stderr=subprocess.STDOUT
        )
    return process, log_path


async def standing_by(log_path: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            if STANDBY in handle.read():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log_path}: no standby line")
        await asyncio.sleep(0.02)


async def main() -> dict[str, Any]:
    results: dict[str, Any] = {}
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(harness.NODE)
        kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
        refs = []
        for index in range(2 * ROUNDS):
            ref = ("bench", f"claim-{index}", f"00000000-0000-4000-8000-{index:012d}")
            fake.add_claim(harness.claim_document(*ref, [("gcus", f"gcu-{index % 8}")]))
            refs.append(ref)
        stub = DraKubeletStub(where.registry)
        await stub.start()
        processes = []
        try:
            holder, _ = await start(where, kubeconfig, 0)
            processes.append(holder)
            await stub.wait_registered(DRIVER, timeout=60)
            standby, log_path = await start(where, kubeconfig, 1)
            processes.append(standby)
            await standing_by(log_path)
            results["standby_rss_mb"] = rss_mb(standby.pid)
            registered: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
            answered: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
            for index, ref in enumerate(refs):
                signum = signal.SIGKILL if index % 2 == 0 else signal.SIGTERM
                count = stub.registrations + 1
                t0 = time.perf_counter()
                holder.send_signal(signum)
                await stub.wait_registered(DRIVER, count=count, timeout=30)
                t1 = time.perf_counter()
                answer = await stub.prepare(DRIVER, [ref])
                t2 = time.perf_counter()
                assert answer.claims[ref[2]].error == "", answer
                await stub.unprepare(DRIVER, [ref])
                registered[signum.name].append((t1 - t0) * 1000)
                answered[signum.name].append((t2 - t0) * 1000)
                await holder.wait()
                holder = standby
                standby, log_path = await start(where, kubeconfig, index + 2)
                processes.append(standby)
                await standing_by(log_path)
            for name, samples in registered.items():
                results[f"{name}_to_registered"] = summary(samples)
                results[f"{name}_to_first_prepare_answered"] = summary(answered[name])
        finally:
            for process in processes:
                if process.returncode is None:
                    process.terminate()
                    await process.wait()
            await stub.stop()
    return results


if __name__ == "__main__":
    measured = asyncio.run(main())
    print(
        json.dumps(
            {
                "benchmark": "dra_takeover",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "rounds_per_signal": ROUNDS,
                "results": measured,
            },
            indent=1,
        )
    )
