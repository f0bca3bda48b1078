"""API requests the DRA driver's topology order costs per claim change (issue 51); JSON out.

The real driver in process on a simulated vendor-8card node, served over gRPC to the stub
kubelet, publishing to the strict stand-in API server of the tests (real HTTP), which counts
every request. A seeded churn trace (``churn.make_trace``, about 80 % of the cards busy) is
replayed as NodePrepareResources / NodeUnprepareResources calls; each arriving pod's cards are
what the scheduler's allocator would take for the webhook's claim on the slice as published
at that moment (first fit, ``bench_dra_extended.switch_local``). Two pacings:

- ``spaced``: each change waits until the driver re-published (0.1 s delay): the most writes
  a change can cost;
- ``burst``: the calls back to back, the driver's default 1 s delay: how the delay coalesces.

And ``index`` order for reference (slices written only when devices change).
Environment: ``REORDER_EVENTS`` (default 120).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

# The fake API server is a test fixture: import it from the checkout's tests/ package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import churn
from bench_dra_extended import _values, calibrate, switch_local
from bench_plugin import machine

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import apiserver, publisher
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer

DRIVER = resourceslices.DRIVER
EVENTS = int(os.environ.get("REORDER_EVENTS", "120"))
MIX = {1: 0.6, 2: 0.3, 4: 0.1}  # bench_churn's "small" mix


def published(fake: FakeApiServer) -> list[dict[str, Any]]:
    slices = sorted(fake.node_slices(harness.NODE), key=lambda s: str(s["metadata"]["name"]))
    return [d for s in slices for d in s["spec"].get("devices") or []]


def counts(fake: FakeApiServer) -> dict[str, int]:
    """Requests on ResourceSlices so far: writes, and reads (lists and watches)."""
    result = {"writes": 0, "reads": 0}
    for method, path, _ in list(fake.requests):
        if "/resourceslices" in path:
            result["writes" if method in ("POST", "PUT", "DELETE") else "reads"] += 1
    return result


async def run(order: str, pacing: str, trace: list[churn.Event]) -> dict[str, Any]:
    delay = 0.1 if pacing == "spaced" else publisher.REORDER_DELAY
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(harness.NODE)
        client = apiserver.connect(fake.kubeconfig(f"{where.work}/kubeconfig"))
        api = apiserver.ApiServer(client, harness.NODE)
        async with harness.running(where, api) as env:
            pub = publisher.Publisher(
                api,
                env.devices,
                harness.NODE,
                resync_interval=3600,
                order=order,
                busy=env.driver.held_devices,
                reorder_delay=delay,
            )
            env.driver.on_change = pub.claims_changed
            stop = asyncio.Event()
            task = asyncio.ensure_future(pub.run(stop))
            await env.kubelet.wait_registered(DRIVER)
            while not fake.node_slices(harness.NODE):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            before = counts(fake)
            held: dict[int, tuple[str, str, str]] = {}
            cards: dict[int, list[str]] = {}
            changes = 0
            started = time.perf_counter()
            for event in trace:
                if event.size == 0:
                    ref = held.pop(event.pod, None)
                    if ref is None:
                        continue
                    cards.pop(event.pod)
                    await env.kubelet.unprepare(DRIVER, [ref])
                else:
                    busy = {c for taken in cards.values() for c in taken}
                    now = published(fake)
                    free = [resourceslices.node_device(d["name"]) for d in now]
                    free = [c for c in free if c not in busy]
                    if event.size > len(free):
                        continue
                    chooser = switch_local(
                        [(resourceslices.node_device(d["name"]), _values(d)) for d in now]
                    )
                    chosen = chooser(free, event.size)
                    ref = ("bench", f"pod-{event.pod}", f"uid-{event.pod}")
                    fake.add_claim(
                        harness.claim_document(
                            *ref, [("gcus", f"gcu-{c.removeprefix('gcu')}") for c in chosen]
                        )
                    )
                    answer = await env.kubelet.prepare(DRIVER, [ref])
                    assert answer.claims[ref[2]].error == "", answer
                    held[event.pod] = ref
                    cards[event.pod] = chosen
                changes += 1
                if pacing == "spaced":
                    await asyncio.sleep(delay + 0.25)
            await asyncio.sleep(publisher.REORDER_DELAY + 0.5)
            seconds = time.perf_counter() - started
            after = counts(fake)
            wanted = [d["name"] for d in pub.ordered(env.devices.published())]
            current = [d["name"] for d in published(fake)] == wanted
            stop.set()
            await task
        await client.close()
        assert fake.refusals == [], fake.refusals
    spent = {k: after[k] - before[k] for k in after}
    return {
        "order": order,
        "pacing": pacing,
        "claim_changes": changes,
        "requests": spent,
        "writes_per_change": round(spent["writes"] / changes, 3) if changes else None,
        "requests_per_change": (
            round((spent["writes"] + spent["reads"]) / changes, 3) if changes else None
        ),
        "published_order_current_at_end": current,
        "seconds": round(seconds, 1),
    }


def main() -> int:
    arrive, _ = calibrate(8, MIX, 51_500)
    trace = churn.make_trace(8, MIX, arrive, 51_500, EVENTS)
    runs = [
        asyncio.run(run(order, pacing, trace))
        for order, pacing in (("topology", "spaced"), ("topology", "burst"), ("index", "spaced"))
    ]
    for row in runs:
        print(f"# {row}", file=sys.stderr)
    print(
        json.dumps(
            {
                "benchmark": "dra_reorder_api_requests",
                "machine": machine(),
                "events": EVENTS,
                "runs": runs,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
