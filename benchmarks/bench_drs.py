"""DRS and hot-plug benchmarks of the DRA driver: Prepare/Unprepare of a DRS claim, publish time
after a card appears; JSON out.

DRS: the real ``enflame-dra-plugin --drs all`` process on the simulated 8-card node, with the
simulated efsmi (a Python program, like the real tool a separate process per call); the stub
kubelet calls it over unix sockets and the claims come from the tests' fake API server. A DRS
Prepare runs efsmi three times (list, create, list: the new instance is found by its UUID) and
writes the checkpoint four times (preparing, the card's instances before the create, instance
recorded, prepared). ``efsmi_call_ms`` is one ``efsmi -L`` alone, to tell the simulated
tool's cost from the driver's.

Edges (same process, before the cycles): "Prepare with a deadline shorter than create" makes
each simulated create take 8 s and calls Prepare with a 4 s deadline; the kubelet's call is
cut, the create finishes and is recorded anyway, and the retry (45 s) finds the claim prepared:
measured once (from the cut call's start to the retry's answer), with the instances left
(must be 1). A Prepare whose deadline (4 s) is shorter than the slowest create seen is then refused
before anything is created: measured until the refusal. "Unprepare of an unplugged card"
prepares a partition, unplugs its card and times the Unprepare (efsmi says "invalid device
index": the instance went with the card, the Unprepare finishes).

Hot-plug: the publisher and the health watch in-process (default 5 s health interval, inotify
on) against the fake API server on a 16-card node started with cards 8..15 absent; each round
plugs one in and measures until its device is in the stored ResourceSlices.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import grpc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_dra import rss_mb, summary

from enflame_gcu import efsmi, resourceslices
from enflame_gcu.dra_plugin import apiserver, node, publisher
from enflame_gcu.simulation import efsmi_sim, simulate
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command

DRIVER = resourceslices.DRIVER
CYCLES = 20
EDGE_ROUNDS = 3
LATE_CARDS = range(8, 16)


async def drs_cycles() -> dict[str, Any]:
    results: dict[str, Any] = {}
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(harness.NODE)
        kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
        tool = efsmi_sim.install(where.root)
        refs = []
        for index in range(CYCLES):
            ref = ("bench", f"part-{index}", f"00000000-0000-4000-9000-{index:012d}")
            device = f"gcu-{index % 8}-1g-8gb-0"
            fake.add_claim(harness.claim_document(*ref, [("part", device)]))
            refs.append(ref)
        started = time.perf_counter()
        efsmi.Efsmi(tool).instances()
        results["efsmi_call_ms"] = round((time.perf_counter() - started) * 1000, 1)
        stub = DraKubeletStub(where.registry)
        await stub.start()
        args = [*command(where, kubeconfig, "--no-publish"), "--drs", "all", "--efsmi", tool]
        with open(os.path.join(where.work, "driver.log"), "wb") as log:
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                *args, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                await stub.wait_registered(DRIVER, timeout=120)
                results["start_to_registered_ms"] = round((time.perf_counter() - started) * 1000, 1)
                # First, while the driver has seen no create yet (its budget is the 1 s floor).
                results.update(await edges(where, fake, stub))
                prepare, again, unprepare = [], [], []
                for ref in refs:
                    t0 = time.perf_counter()
                    answer = await stub.prepare(DRIVER, [ref], timeout=60)
                    t1 = time.perf_counter()
                    await stub.prepare(DRIVER, [ref], timeout=60)
                    t2 = time.perf_counter()
                    done = await stub.unprepare(DRIVER, [ref], timeout=60)
                    t3 = time.perf_counter()
                    assert answer.claims[ref[2]].error == "", answer.claims[ref[2]].error
                    assert done.claims[ref[2]].error == ""
                    prepare.append((t1 - t0) * 1000)
                    again.append((t2 - t1) * 1000)
                    unprepare.append((t3 - t2) * 1000)
                assert efsmi_sim.instances(where.root) == []
                results["prepare_drs_claim"] = summary(prepare)
                results["prepare_again_idempotent"] = summary(again)
                results["unprepare_drs_claim"] = summary(unprepare)
                assert process.pid is not None
                results["rss_mb"] = rss_mb(process.pid)
            finally:
                process.terminate()
                await process.wait()
                await stub.stop()
    return results


def on_card(where: harness.Node, card: int) -> list[dict[str, Any]]:
    return [i for i in efsmi_sim.instances(where.root) if i["index"] == card]


async def edges(where: harness.Node, fake: FakeApiServer, stub: DraKubeletStub) -> dict[str, Any]:
    """The deadline and unplugged-card edges (see the module's text). Only the first Prepare
    can be cut: after it the driver knows a create takes 8 s and refuses shorter deadlines."""
    cut, refused, left, unplugged = [], [], [], []
    for index in range(EDGE_ROUNDS):
        card = 4 + index
        ref = ("bench", f"edge-{index}", f"00000000-0000-4000-a000-{index:012d}")
        fake.add_claim(harness.claim_document(*ref, [("part", f"gcu-{card}-1g-8gb-0")]))
        efsmi_sim.set_fault(where.root, "create", "slow:8")
        if index == 0:
            t0 = time.perf_counter()
            try:
                answer = await stub.prepare(DRIVER, [ref], timeout=4)
                raise RuntimeError(f"a 4 s Prepare of an 8 s create was not cut: {answer}")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
            answer = await stub.prepare(DRIVER, [ref], timeout=45)
            cut.append((time.perf_counter() - t0) * 1000)
            assert answer.claims[ref[2]].error == "", answer.claims[ref[2]].error
            left.append(len(on_card(where, card)))
            assert (await stub.unprepare(DRIVER, [ref], timeout=60)).claims[ref[2]].error == ""
        t0 = time.perf_counter()
        answer = await stub.prepare(DRIVER, [ref], timeout=4)
        refused.append((time.perf_counter() - t0) * 1000)
        assert "deadline" in answer.claims[ref[2]].error, answer.claims[ref[2]].error
        assert on_card(where, card) == []
        efsmi_sim.set_fault(where.root, "create", None)
        answer = await stub.prepare(DRIVER, [ref], timeout=60)
        assert answer.claims[ref[2]].error == "", answer.claims[ref[2]].error
        simulate.unplug(where.root, card)
        t0 = time.perf_counter()
        done = await stub.unprepare(DRIVER, [ref], timeout=60)
        unplugged.append((time.perf_counter() - t0) * 1000)
        assert done.claims[ref[2]].error == "", done.claims[ref[2]].error
        simulate.replug(where.root, card)
        deadline = time.monotonic() + 60  # the driver sweeps what the card kept when it is back
        while on_card(where, card):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the instance left on gcu{card} was never destroyed")
            await asyncio.sleep(0.1)
    return {
        "prepare_cut_by_deadline_then_retry_ms": round(cut[0], 1),
        "instances_after_cut_and_retry": left[0],
        "prepare_refused_deadline_shorter_than_create": summary(refused),
        "unprepare_unplugged_card": summary(unplugged),
    }


async def hotplug_rounds() -> dict[str, Any]:
    with harness.simulated_node("2socket-16card") as where, FakeApiServer() as fake:
        for minor in LATE_CARDS:
            simulate.unplug(where.root, minor)
        fake.add_node(harness.NODE)
        client = apiserver.connect(fake.kubeconfig(os.path.join(where.work, "kubeconfig")))
        devices = node.NodeDevices(where.root, resourceslices.PublishOptions())
        pub = publisher.Publisher(apiserver.ApiServer(client, harness.NODE), devices, harness.NODE)
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(pub.run(stop)), asyncio.ensure_future(devices.run())]
        waits = []
        try:
            while not fake.node_slices(harness.NODE):
                await asyncio.sleep(0.005)
            for minor in LATE_CARDS:
                name = f"gcu-{minor}"
                started = time.perf_counter()
                simulate.replug(where.root, minor)
                while name not in {
                    d["name"] for s in fake.node_slices(harness.NODE) for d in s["spec"]["devices"]
                }:
                    await asyncio.sleep(0.002)
                    if time.perf_counter() - started > 30:
                        raise RuntimeError(f"{name} not published within 30 s")
                waits.append((time.perf_counter() - started) * 1000)
        finally:
            stop.set()
            tasks[1].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()
    return {"health_interval_s": devices.monitor.interval, "plug_to_published": summary(waits)}


async def main() -> dict[str, Any]:
    return {"drs": await drs_cycles(), "hotplug": await hotplug_rounds()}


if __name__ == "__main__":
    measured = asyncio.run(main())
    print(
        json.dumps(
            {
                "benchmark": "drs",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "cycles": CYCLES,
                "results": measured,
            },
            indent=1,
        )
    )
