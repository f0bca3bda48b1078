"""The API side against an in-process fake API server: publish, keep, re-publish, adapt, clean.

This machine has no API server; the fake serves the endpoints the driver uses over real HTTP,
through the real client (lightkube), with the behaviours that matter: resourceVersions and
409 conflicts, the kubelet's wipe, server-side defaulting, and fields dropped by clusters
that lack a feature.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from enflame_gcu import efsmi, resourceslices
from enflame_gcu.dra_plugin import apiserver, claims, node, observability, publisher
from enflame_gcu.errors import ClaimError
from enflame_gcu.simulation import efsmi_sim, simulate
from tests.dra_plugin import harness, slices_helpers
from tests.dra_plugin.fake_apiserver import FakeApiServer

NODE = harness.NODE


@dataclass
class Env:
    fake: FakeApiServer
    api: apiserver.ApiServer
    devices: node.NodeDevices
    publisher: publisher.Publisher
    where: harness.Node


@contextlib.asynccontextmanager
async def publishing(
    topology: str = "vendor-8card",
    *,
    drop_fields: tuple[str, ...] = (),
    options: resourceslices.PublishOptions = slices_helpers.DEFAULT_OPTIONS,
    run: bool = False,
    drs: bool = False,
    metrics: observability.DriverMetrics | None = None,
) -> AsyncIterator[Env]:
    with harness.simulated_node(topology) as where, FakeApiServer(drop_fields) as fake:
        fake.add_node(NODE)
        client = apiserver.connect(fake.kubeconfig(f"{where.work}/kubeconfig"))
        api = apiserver.ApiServer(client, NODE)
        tool = efsmi.Efsmi(efsmi_sim.install(where.root), timeout=30) if drs else None
        devices = node.NodeDevices(
            where.root,
            options,
            health_interval=0.1,
            drs_selected=(lambda card: True) if drs else None,
            tool=tool,
        )
        pub = publisher.Publisher(api, devices, NODE, resync_interval=30, metrics=metrics)
        stop = asyncio.Event()
        tasks = []
        if run:
            tasks = [asyncio.ensure_future(pub.run(stop)), asyncio.ensure_future(devices.run())]
        try:
            yield Env(fake, api, devices, pub, where)
        finally:
            stop.set()
            if tasks:
                tasks[1].cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def generations(slices: list[dict[str, Any]]) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices}


def test_publishes_schema_valid_slices_once_and_writes_nothing_when_unchanged() -> None:
    async def main() -> None:
        async with publishing() as env:
            assert await env.publisher.sync() is True
            stored = env.fake.node_slices(NODE)
            assert len(stored) == 1 and generations(stored) == {1}
            assert sorted(devices_of(stored)) == [f"gcu-{i}" for i in range(8)]
            owner = stored[0]["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["uid"]) == (
                "Node",
                env.fake.nodes[NODE]["metadata"]["uid"],
            )
            # The server rewrote 32768Mi as 32Gi: still the same slice.
            assert devices_of(stored)["gcu-0"]["capacity"]["memory"]["value"] == "32Gi"
            for version in slices_helpers.VERSIONS:
                for item in stored:
                    clean = {k: v for k, v in item.items()}
                    slices_helpers.validate(clean, version)
            assert await env.publisher.sync() is False
            # A restarted driver finds its own slices and leaves them (and the generation) alone.
            again = publisher.Publisher(env.api, env.devices, NODE)
            assert await again.sync() is False
            assert generations(env.fake.node_slices(NODE)) == {1}
            assert [r for r in env.fake.requests if r[0] in ("POST", "PUT")] == [
                ("POST", "/apis/resource.k8s.io/v1/resourceslices", 201)
            ]

    asyncio.run(main())


def test_slices_wiped_by_the_kubelet_are_published_again() -> None:
    async def main() -> None:
        async with publishing(run=True) as env:
            await eventually(lambda: len(env.fake.node_slices(NODE)) == 1, "first publish")
            assert env.fake.wipe(NODE, resourceslices.DRIVER) == 1
            await eventually(lambda: len(env.fake.node_slices(NODE)) == 1, "re-publish", 10)
            stored = env.fake.node_slices(NODE)
            assert generations(stored) == {2}  # the pool moved on
            assert len(devices_of(stored)) == 8

    asyncio.run(main())


def test_health_changes_taint_and_untaint_and_bump_the_generation_only_then() -> None:
    async def main() -> None:
        async with publishing(run=True) as env:
            await eventually(lambda: len(env.fake.node_slices(NODE)) == 1, "first publish")
            simulate.unplug(env.where.root, 3)
            await eventually(
                lambda: "taints" in devices_of(env.fake.node_slices(NODE))["gcu-3"], "taint"
            )
            stored = env.fake.node_slices(NODE)
            assert devices_of(stored)["gcu-3"]["taints"][0]["effect"] == "NoSchedule"
            assert generations(stored) == {2}
            simulate.replug(env.where.root, 3)
            await eventually(
                lambda: "taints" not in devices_of(env.fake.node_slices(NODE))["gcu-3"], "untaint"
            )
            await asyncio.sleep(0.2)
            writes = [r for r in env.fake.requests if r[0] in ("POST", "PUT")]
            await asyncio.sleep(0.6)  # health rescans keep running; nothing changes
            assert [r for r in env.fake.requests if r[0] in ("POST", "PUT")] == writes
            assert generations(env.fake.node_slices(NODE)) == {3}

    asyncio.run(main())


def test_a_conflicting_update_is_retried_from_a_fresh_list() -> None:
    async def main() -> None:
        async with publishing() as env:
            await env.publisher.sync()
            env.fake.conflict_next_update = 1
            simulate.unload_driver(env.where.root)
            env.devices.monitor.rescan()  # every card unhealthy: each device changes
            assert await env.publisher.sync() is True
            assert env.publisher.conflicts == 1
            assert (
                "PUT",
                "/apis/resource.k8s.io/v1/resourceslices/node-a-gcu.enflame.com-0",
                409,
            ) in env.fake.requests
            stored = env.fake.node_slices(NODE)
            assert all("taints" in d for d in devices_of(stored).values())
            assert generations(stored) == {2}

    asyncio.run(main())


def test_a_slice_name_taken_by_another_node_is_named_and_a_free_one_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 22 item 5: the create got 409 AlreadyExists for ever."""
    taken = resourceslices.slice_name(NODE, 0)

    async def main() -> None:
        async with publishing() as env:
            squatter = resourceslices.build_slices("other-node", None, [], 1)[0]
            squatter["metadata"]["name"] = taken
            with env.fake.lock:
                env.fake.slices[taken] = env.fake._store(squatter)
                env.fake.slices[taken]["metadata"]["resourceVersion"] = env.fake._bump()
            assert await asyncio.wait_for(env.publisher.sync(), 10) is True
            ours = env.fake.node_slices(NODE)
            assert len(ours) == 1 and ours[0]["metadata"]["name"].startswith(f"{taken}-")
            assert len(devices_of(ours)) == 8
            assert env.fake.slices[taken]["spec"]["nodeName"] == "other-node"  # left alone
            assert env.publisher.name_conflicts == 1
            # Later syncs find the slice under its generated name: nothing to write.
            assert await env.publisher.sync() is False
            simulate.unplug(env.where.root, 3)
            env.devices.monitor.rescan()
            assert await env.publisher.sync() is True
            again = env.fake.node_slices(NODE)
            assert [s["metadata"]["name"] for s in again] == [ours[0]["metadata"]["name"]]
            assert env.publisher.name_conflicts == 1

    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert f"a ResourceSlice named {taken} already exists" in caplog.text


def test_a_cluster_without_device_taints_gets_unhealthy_devices_left_out() -> None:
    async def main() -> None:
        async with publishing(drop_fields=("taints",)) as env:
            simulate.unplug(env.where.root, 3)
            env.devices.monitor.rescan()
            await env.publisher.sync()
            assert env.publisher.dropped == {"taints"}
            assert "gcu-3" not in devices_of(env.fake.node_slices(NODE))
            assert len(devices_of(env.fake.node_slices(NODE))) == 7

    asyncio.run(main())


def test_a_cluster_without_consumable_capacity_gets_exclusive_cards() -> None:
    async def main() -> None:
        shared = resourceslices.PublishOptions(shared_slices=6)
        async with publishing(drop_fields=("allowMultipleAllocations",), options=shared) as env:
            await env.publisher.sync()
            assert env.publisher.dropped == {"allowMultipleAllocations"}
            gcu0 = devices_of(env.fake.node_slices(NODE))["gcu-0"]
            assert gcu0["attributes"]["shareable"] == {"bool": False}
            assert "slices" not in gcu0["capacity"]
        async with publishing(options=shared) as env:
            await env.publisher.sync()
            assert env.publisher.dropped == set()
            assert devices_of(env.fake.node_slices(NODE))["gcu-0"]["allowMultipleAllocations"]

    asyncio.run(main())


def test_a_cluster_without_partitionable_devices_gets_whole_drs_cards_once() -> None:
    """The server drops sharedCounters and consumesCounters without an error (Kubernetes'
    strategy with DRAPartitionableDevices off): partitions stored without counters would be
    independent devices beside their card, so DRS cards are published whole only, said once,
    and the slices converge (no write loop)."""

    async def main() -> None:
        exported = observability.DriverMetrics()
        exported.registered = lambda: True
        async with publishing(
            drop_fields=("sharedCounters",), drs=True, run=True, metrics=exported
        ) as env:
            await eventually(lambda: env.publisher.dropped == {"counters"}, "counters dropped")
            await asyncio.sleep(2)  # watch events of our own writes: nothing more to write
            writes = env.publisher.writes
            stored = devices_of(env.fake.node_slices(NODE))
            assert sorted(stored) == [f"gcu-{n}" for n in range(8)]
            assert not any(s["spec"].get("sharedCounters") for s in env.fake.node_slices(NODE))
            assert writes <= 2, writes
            await env.publisher.sync()
            assert env.publisher.writes == writes
            ok, detail = exported.ready()
            assert ok and "drops counters: DRS cards are published whole only" in detail
            assert env.devices.published_names().keys() == stored.keys()
        async with publishing(drs=True) as env:
            await env.publisher.sync()
            assert env.publisher.dropped == set()
            assert "gcu-0-1g-8gb-0" in devices_of(env.fake.node_slices(NODE))

    asyncio.run(main())


def test_a_server_that_never_stores_what_is_written_stops_the_writes_and_readyz() -> None:
    """A field dropped that the driver cannot adapt to: after a few writes in a row stored
    otherwise, the publisher backs off and /readyz says why, instead of rewriting for ever."""

    async def main() -> None:
        exported = observability.DriverMetrics()
        exported.registered = lambda: True
        async with publishing(drop_fields=("attributes",), run=True, metrics=exported) as env:
            await eventually(lambda: bool(env.publisher.stalled), "publishing backs off")
            writes = env.publisher.writes
            await asyncio.sleep(3)
            assert env.publisher.writes == writes == publisher.MAX_UNCONVERGED
            ok, detail = exported.ready()
            assert not ok and "other than written" in detail and "not writing again" in detail

    asyncio.run(main())


def test_large_nodes_split_and_shrink_their_pool() -> None:
    async def main() -> None:
        async with publishing("2socket-64card") as env:
            await env.publisher.sync()
            stored = env.fake.node_slices(NODE)
            assert [len(s["spec"]["devices"]) for s in stored] == [64]
            env.devices.options = resourceslices.PublishOptions(devices_per_slice=20)
            await env.publisher.sync()
            stored = env.fake.node_slices(NODE)
            assert [len(s["spec"]["devices"]) for s in stored] == [20, 20, 20, 4]
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {4}
            env.devices.options = resourceslices.PublishOptions()
            await env.publisher.sync()
            assert len(env.fake.node_slices(NODE)) == 1  # the extra slices are deleted
            assert resourceslices.check_pool(env.fake.node_slices(NODE)) == []

    asyncio.run(main())


def test_claims_are_read_through_the_api() -> None:
    async def main() -> None:
        async with publishing() as env:
            env.fake.add_claim(harness.claim_document("ns", "c", "uid-c", [("gcus", "gcu-2")]))
            found = await env.api.allocated_devices(claims.ClaimRef("ns", "c", "uid-c"))
            assert found == [claims.AllocatedDevice("gcus", NODE, "gcu-2")]
            with pytest.raises(ClaimError, match="not found on the API server"):
                await env.api.allocated_devices(claims.ClaimRef("ns", "missing", "u"))
            with pytest.raises(ClaimError, match="has uid uid-c, not other"):
                await env.api.allocated_devices(claims.ClaimRef("ns", "c", "other"))

    asyncio.run(main())


def test_uninstall_deletes_the_slices() -> None:
    async def main() -> None:
        async with publishing() as env:
            await env.publisher.sync()
            other = resourceslices.build_slices("node-b", None, [], 1)[0]
            await env.api.create_slice(other)
            assert await env.api.delete_driver_slices() == 1
            assert env.fake.node_slices(NODE) == []
            assert len(env.fake.node_slices("node-b")) == 1
            assert await env.api.delete_driver_slices(every_node=True) == 1
            assert env.fake.slices == {}

    asyncio.run(main())
