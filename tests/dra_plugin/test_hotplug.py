"""Cards that appear after the driver started are published, in every mode (issue 26).

Each test starts the publisher and the health watch on a simulated node where one card is
missing (unplugged before start), plugs it in, and waits for its devices in the fake API
server's slices. A card present at start and then removed stays published, tainted, and
comes back untainted: an arrival never drops a card the driver already knew.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from enflame_gcu import efsmi, resourceslices
from enflame_gcu.dra_plugin import apiserver, node, publisher
from enflame_gcu.simulation import efsmi_sim, simulate
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer

NODE = harness.NODE
INTERVAL = 0.1
# Published "within the health interval": a rescan runs every INTERVAL; the margin is for a
# machine shared with other builds, not for the driver.
DEADLINE = 20 * INTERVAL + 3


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


async def eventually_published(fake: FakeApiServer, names: set[str]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        found = devices_of(fake.node_slices(NODE))
        if names <= set(found):
            return found
        if loop.time() > deadline:
            missing = sorted(names - set(found))
            raise AssertionError(f"{missing} not published; have {sorted(found)}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_with_card_missing(
    topology: str, minor: int, options: resourceslices.PublishOptions
) -> AsyncIterator[tuple[harness.Node, FakeApiServer, node.NodeDevices]]:
    with harness.simulated_node(topology) as where, FakeApiServer() as fake:
        simulate.unplug(where.root, minor)
        fake.add_node(NODE)
        client = apiserver.connect(fake.kubeconfig(f"{where.work}/kubeconfig"))
        devices = node.NodeDevices(where.root, options, health_interval=INTERVAL)
        pub = publisher.Publisher(apiserver.ApiServer(client, NODE), devices, NODE)
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(pub.run(stop)), asyncio.ensure_future(devices.run())]
        try:
            yield where, fake, devices
        finally:
            stop.set()
            tasks[1].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()


def test_a_whole_card_plugged_in_after_start_is_published() -> None:
    async def main() -> None:
        options = resourceslices.PublishOptions()
        async with running_with_card_missing("vendor-8card", 3, options) as (where, fake, _):
            first = await eventually_published(fake, {"gcu-0"})
            assert "gcu-3" not in first and len(first) == 7
            simulate.replug(where.root, 3)
            found = await eventually_published(fake, {"gcu-3"})
            assert "taints" not in found["gcu-3"]
            assert found["gcu-3"]["attributes"]["index"] == {"int": 3}
            assert len(found) == 8

    asyncio.run(main())


def test_a_shareable_card_plugged_in_after_start_is_published_shareable() -> None:
    async def main() -> None:
        options = resourceslices.PublishOptions(shared_slices=4)
        async with running_with_card_missing("vendor-8card", 5, options) as (where, fake, devs):
            await eventually_published(fake, {"gcu-0"})
            simulate.replug(where.root, 5)
            found = await eventually_published(fake, {"gcu-5"})
            assert found["gcu-5"]["allowMultipleAllocations"] is True
            assert found["gcu-5"]["capacity"]["slices"]["value"] == "4"
            assert devs.slices_of()["gcu5"] == 4

    asyncio.run(main())


def test_a_card_in_vgcu_mode_plugged_in_after_start_publishes_its_vgcus() -> None:
    async def main() -> None:
        options = resourceslices.PublishOptions()
        async with running_with_card_missing("vgcu-2card", 1, options) as (where, fake, devs):
            first = await eventually_published(fake, {"vgcu-0"})
            assert sorted(first) == [f"vgcu-{i}" for i in range(4)]
            simulate.replug(where.root, 1)
            found = await eventually_published(fake, {f"vgcu-{i}" for i in range(4, 8)})
            assert "gcu-1" not in found  # a card in vGCU mode is never published whole
            assert found["vgcu-5"]["attributes"]["parentIndex"] == {"int": 1}
            assert devs.parent_of("vgcu5") == "gcu1"

    asyncio.run(main())


def test_a_new_card_does_not_drop_a_known_card_that_is_gone() -> None:
    async def main() -> None:
        options = resourceslices.PublishOptions()
        async with running_with_card_missing("vendor-8card", 3, options) as (where, fake, _):
            await eventually_published(fake, {"gcu-0"})
            simulate.unplug(where.root, 6)
            simulate.replug(where.root, 3)
            found = await eventually_published(fake, {"gcu-3"})
            # gcu-6 was known: it stays, tainted, until it comes back.
            assert found["gcu-6"]["taints"][0]["key"] == resourceslices.UNHEALTHY_TAINT
            simulate.replug(where.root, 6)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE
            while "taints" in devices_of(fake.node_slices(NODE))["gcu-6"]:
                assert loop.time() < deadline, "gcu-6 never untainted"
                await asyncio.sleep(0.02)

    asyncio.run(main())


def test_a_drs_card_arriving_does_not_stall_the_loop_while_efsmi_runs() -> None:
    """An arriving DRS card costs up to three efsmi calls; with efsmi hanging until its time
    limit they run in a thread: the loop keeps serving (Prepare, the health stream, the
    probes) instead of stopping for the whole call."""

    async def main() -> None:
        with harness.simulated_node() as where:
            simulate.unplug(where.root, 7)
            tool = efsmi.Efsmi(efsmi_sim.install(where.root), timeout=6)
            devices = node.NodeDevices(
                where.root,
                resourceslices.PublishOptions(),
                health_interval=INTERVAL,
                drs_selected=lambda card: True,
                tool=tool,
            )
            assert "gcu6" in devices.layouts
            efsmi_sim.set_fault(where.root, "cards", "hang")
            gaps: list[float] = []

            async def tick() -> None:
                loop = asyncio.get_running_loop()
                last = loop.time()
                while True:
                    await asyncio.sleep(0.05)
                    gaps.append(loop.time() - last)
                    last = loop.time()

            tasks = [asyncio.ensure_future(devices.run()), asyncio.ensure_future(tick())]
            try:
                simulate.replug(where.root, 7)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while "gcu7" not in devices.drs_problems:
                    assert loop.time() < deadline, "the arrival was never looked at"
                    await asyncio.sleep(0.05)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            assert "did not finish within 6s" in devices.drs_problems["gcu7"]
            assert "gcu7" in {card.name for card in devices.inventory.cards}
            # The call took 6 s; the loop went on meanwhile (a blocked loop shows one gap >= 6 s).
            longest = max(gaps, default=float("inf"))  # none: it never ran at all
            assert longest < 3, f"the loop stalled for {longest:.1f}s"

    asyncio.run(main())
