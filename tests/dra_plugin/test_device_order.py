"""Devices published in topology order (issue 51): the scheduler's first fit is the device
plugin's choice; the driver re-orders after Prepare/Unprepare over real gRPC, against the
strict stand-in API server, debounced, generation rules kept; ``index`` keeps minor order."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from enflame_gcu import allocation, devices, health, resourceslices, topology
from enflame_gcu.dra_plugin import apiserver, node, publisher
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.errors import ConfigError
from enflame_gcu.simulation import simulate, topofile
from tests.dra_plugin import allocator, harness
from tests.dra_plugin.fake_apiserver import FakeApiServer

DRIVER = resourceslices.DRIVER
NODE = harness.NODE
CLASSES = {
    DRIVER: {"spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
}
LEVELS = (
    ("switch", f"{DRIVER}/pcieSwitch"),
    ("port", f"{DRIVER}/pcieRootPort"),
    ("numa", "resource.kubernetes.io/numaNode"),
)


def webhook_claim(count: int) -> dict[str, Any]:
    """The claim the rewriting webhook makes for ``enflame.com/gcu: count`` (issue 51)."""
    alternatives = [
        {"name": name, "deviceClassName": DRIVER, "count": count}
        for name in ("switch", "port", "numa", "any")
    ]
    constraints = [{"requests": [f"gcus/{name}"], "matchAttribute": a} for name, a in LEVELS]
    return {
        "devices": {
            "requests": [{"name": "gcus", "firstAvailable": alternatives}],
            "constraints": constraints,
        }
    }


def scheduler_choice(order: Sequence[dict[str, Any]], held: set[str], count: int) -> list[str]:
    """The node cards the allocator model takes for the webhook's claim, first fit in order."""
    free = [d for d in order if d["name"] not in held]
    found = allocator.allocate(webhook_claim(count), CLASSES, free)
    assert found is not None, f"{count} of {[d['name'] for d in free]} found nothing"
    return sorted(resourceslices.node_device(name) for names in found.values() for name in names)


class Board:
    """A simulated board's published devices (minor order) and the device plugin's policy."""

    def __init__(self, name: str, directory: str) -> None:
        root = tempfile.mkdtemp(dir=directory)
        simulate.create(root, topofile.load(name))
        inventory = devices.discover(root)
        healthy = health.check(root, inventory.cards).healthy()
        self.devices = resourceslices.node_devices(inventory, healthy)
        self.names = [str(d["name"]) for d in self.devices]
        topo = topology.Topology.from_inventory(inventory)
        self.policy = allocation.TopologyPolicy(topo)
        self.switch = {
            resourceslices.node_device(str(d["name"])): d["attributes"]["pcieSwitch"]["string"]
            for d in self.devices
        }

    def plugin_choice(self, held: set[str], count: int) -> list[str]:
        free = [resourceslices.node_device(n) for n in self.names if n not in held]
        return sorted(self.policy.choose(free, [], count))


def test_first_fit_on_the_topology_order_is_the_device_plugins_choice_on_16_cards(
    tmp_path: Any,
) -> None:
    board = Board("2socket-16card", str(tmp_path))
    rng = random.Random(51)  # noqa: S311 - reproducible states, not a secret
    for _ in range(150):
        held = set(rng.sample(board.names, rng.randrange(len(board.names) - 1)))
        ordered = resourceslices.allocation_order(board.devices, held)
        for count in (1, 2):
            assert scheduler_choice(ordered, held, count) == board.plugin_choice(held, count), (
                sorted(held),
                count,
            )


def test_on_the_vendor_board_a_pair_is_switch_local_whenever_the_device_plugins_is(
    tmp_path: Any,
) -> None:
    board = Board("vendor-8card", str(tmp_path))
    for size in range(len(board.names) - 1):
        for held_cards in itertools.combinations(board.names, size):
            held = set(held_cards)
            ordered = resourceslices.allocation_order(board.devices, held)
            ours = {board.switch[c] for c in scheduler_choice(ordered, held, 2)}
            theirs = {board.switch[c] for c in board.plugin_choice(held, 2)}
            assert len(ours) == len(theirs), (sorted(held), ours, theirs)
            # A single card goes where the device plugin would put it: a lone card's switch
            # before a pair's, never splitting a whole pair while a lone card is free.
            one = scheduler_choice(ordered, held, 1)
            assert one == board.plugin_choice(held, 1) or (
                board.switch[one[0]] != board.switch[board.plugin_choice(held, 1)[0]]
                and not _splits_a_pair(board, held, one[0])
            ), (sorted(held), one)


def _splits_a_pair(board: Board, held: set[str], card: str) -> bool:
    """Taking ``card`` breaks a switch of several cards that are all free."""
    busy = {resourceslices.node_device(name) for name in held}
    mates = [c for c, switch in board.switch.items() if switch == board.switch[card]]
    return len(mates) > 1 and not busy.intersection(mates)


def test_the_order_keeps_every_device_and_refuses_nothing_it_does_not_know() -> None:
    plain: list[dict[str, Any]] = [
        {"name": "gcu-1"},
        {"name": "gcu-0"},
        {"name": "vgcu-3", "attributes": {}},
    ]
    ordered = resourceslices.allocation_order(plain, {"gcu-0", "not-a-device"})
    # Without topology attributes each device is its own group: the held one goes first
    # (no free card in its group), the others keep their order.
    assert [d["name"] for d in ordered] == ["gcu-0", "gcu-1", "vgcu-3"]
    assert all(a is b for a, b in zip(sorted(ordered, key=id), sorted(plain, key=id), strict=True))
    with pytest.raises(ValueError, match="device order 'busiest' is not one of topology, index"):
        publisher.Publisher(None, None, NODE, order="busiest")  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def publishing_driver(
    order: str = "topology", delay: float = 0.05
) -> AsyncIterator[tuple[FakeApiServer, harness.Running, publisher.Publisher]]:
    """The driver served over gRPC to the stub kubelet, publishing to the strict stand-in."""
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(NODE)
        client = apiserver.connect(fake.kubeconfig(f"{where.work}/kubeconfig"))
        api = apiserver.ApiServer(client, NODE)
        async with harness.running(where, api) as env:
            pub = publisher.Publisher(
                api,
                env.devices,
                NODE,
                resync_interval=30,
                order=order,
                busy=env.driver.held_devices,
                reorder_delay=delay,
            )
            env.driver.on_change = pub.claims_changed
            stop = asyncio.Event()
            task = asyncio.ensure_future(pub.run(stop))
            try:
                await env.kubelet.wait_registered(DRIVER)
                await eventually(lambda: bool(fake.node_slices(NODE)), "the first publish")
                yield fake, env, pub
            finally:
                stop.set()
                await task
                await client.close()
        assert fake.refusals == []


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


def published(fake: FakeApiServer) -> list[dict[str, Any]]:
    slices = sorted(fake.node_slices(NODE), key=lambda s: str(s["metadata"]["name"]))
    return [d for s in slices for d in s["spec"].get("devices") or []]


def slice_writes(fake: FakeApiServer) -> int:
    return sum(
        1
        for method, path, code in list(fake.requests)
        if method in ("POST", "PUT", "DELETE") and "/resourceslices" in path and code < 300
    )


def claim(fake: FakeApiServer, name: str, *cards: str) -> tuple[str, str, str]:
    fake.add_claim(harness.claim_document("ns", name, f"uid-{name}", [("gcus", c) for c in cards]))
    return ("ns", name, f"uid-{name}")


def test_the_driver_reorders_its_slice_after_prepares_and_unprepares_over_grpc(
    tmp_path: Any,
) -> None:
    board = Board("vendor-8card", str(tmp_path))

    async def main() -> None:
        async with publishing_driver() as (fake, env, _):
            first = {d["name"]: d for d in published(fake)}
            (generation,) = {s["spec"]["pool"]["generation"] for s in fake.node_slices(NODE)}
            held: set[str] = set()
            steps: list[tuple[str, tuple[str, str, str], set[str]]] = [
                ("prepare", claim(fake, "a", "gcu-6"), {"gcu-6"}),
                ("prepare", claim(fake, "b", "gcu-7", "gcu-3"), {"gcu-7", "gcu-3"}),
                ("prepare", claim(fake, "c", "gcu-0"), {"gcu-0"}),
                ("unprepare", ("ns", "b", "uid-b"), {"gcu-7", "gcu-3"}),
                ("unprepare", ("ns", "a", "uid-a"), {"gcu-6"}),
            ]
            for action, ref, cards in steps:
                writes = slice_writes(fake)
                if action == "prepare":
                    answer = await env.kubelet.prepare(DRIVER, [ref])
                    assert answer.claims[ref[2]].error == ""
                    held |= cards
                else:
                    answer = await env.kubelet.unprepare(DRIVER, [ref])
                    assert answer.claims[ref[2]].error == ""
                    held -= cards

                def agrees(held: set[str] = held) -> bool:
                    order = published(fake)
                    return all(
                        scheduler_choice(order, held, n) == board.plugin_choice(held, n)
                        for n in (1, 2)
                    )

                await eventually(agrees, f"the slice after {action} {ref[1]} ({sorted(held)})")
                await asyncio.sleep(0.3)  # nothing more is written for this change
                now = published(fake)
                # Same devices, same fields: only the order changed.
                assert {d["name"]: d for d in now} == first
                generations = {s["spec"]["pool"]["generation"] for s in fake.node_slices(NODE)}
                changed = slice_writes(fake) - writes
                assert changed <= 1, f"{changed} slice writes for one claim change"
                generation += changed
                assert generations == {generation}, "every write is the next pool generation"

    asyncio.run(main())


def test_a_burst_of_claims_is_one_write_and_index_order_writes_none(tmp_path: Any) -> None:
    board = Board("vendor-8card", str(tmp_path))
    held = {"gcu-0", "gcu-2", "gcu-4", "gcu-6"}

    async def main(order: str) -> tuple[int, list[dict[str, Any]]]:
        async with publishing_driver(order, delay=1.5) as (fake, env, _):
            writes = slice_writes(fake)
            for name, card in (("a", "gcu-0"), ("b", "gcu-2"), ("c", "gcu-4"), ("d", "gcu-6")):
                answer = await env.kubelet.prepare(DRIVER, [claim(fake, name, card)])
                assert answer.claims[f"uid-{name}"].error == ""
            await asyncio.sleep(2.5)
            return slice_writes(fake) - writes, published(fake)

    minor = [f"gcu-{i}" for i in range(8)]
    writes, order = asyncio.run(main("topology"))
    assert writes == 1  # four Prepare calls within the delay: one re-ordering
    assert [d["name"] for d in order] != minor
    for count in (1, 2, 4):
        assert scheduler_choice(order, held, count) == board.plugin_choice(held, count)
    writes, order = asyncio.run(main("index"))
    assert (writes, [d["name"] for d in order]) == (0, minor)


def test_held_devices_follow_the_record(tmp_path: Any) -> None:
    changes: list[frozenset[str]] = []

    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            ref = source.add(harness.claim_document("ns", "a", "uid-a", [("gcus", "gcu-4")]))
            prepare, _ = harness.make_driver(where, source)
            prepare.on_change = lambda: changes.append(prepare.held_devices())
            await prepare.prepare([ref])
            await prepare.prepare([ref])  # idempotent: nothing changed, no call
            await prepare.unprepare([ref])
            missing = source.add(harness.claim_document("ns", "b", "uid-b", [("g", "gcu-99")]))
            outcome = await prepare.prepare([missing])
            assert isinstance(outcome["uid-b"], str)  # refused: nothing held, no call

    asyncio.run(main())
    assert changes == [frozenset({"gcu-4"}), frozenset()]


def test_the_device_order_flag_and_its_environment_variable() -> None:
    assert dra_config.parse(["--node-name", "n"], {}).device_order == "topology"
    assert dra_config.parse(["--node-name", "n", "--device-order", "index"], {}).device_order == (
        "index"
    )
    assert dra_config.parse(
        ["--node-name", "n"], {"ENFLAME_DEVICE_ORDER": "index"}
    ).device_order == ("index")
    with pytest.raises(ConfigError, match="invalid command line"):
        dra_config.parse(["--node-name", "n", "--device-order", "busiest"], {})
    with pytest.raises(ConfigError, match="--device-order must be one of topology, index"):
        dra_config.DraConfig(node_name="n", device_order="busiest")


def test_a_device_never_moves_to_another_slice_of_a_split_pool() -> None:
    with harness.simulated_node() as where:
        options = resourceslices.PublishOptions(devices_per_slice=4)
        devices_now = node.NodeDevices(where.root, options, health_interval=0.1)
        held = {"gcu-0", "gcu-5"}
        pub = publisher.Publisher(None, devices_now, NODE, busy=lambda: held)  # type: ignore[arg-type]
        minor = devices_now.published()
        ordered = pub.ordered(minor)
        names = [str(d["name"]) for d in ordered]
        # Slices of 4: gcu-0..3 stay in the first, gcu-4..7 in the second; each is ordered.
        assert sorted(names[:4]) == [f"gcu-{i}" for i in range(4)]
        assert sorted(names[4:]) == [f"gcu-{i}" for i in range(4, 8)]
        assert names != [str(d["name"]) for d in minor]
        assert names[:4] == [d["name"] for d in resourceslices.allocation_order(minor[:4], held)]
        slices = resourceslices.build_slices(NODE, None, ordered, 3, options)
        assert [[d["name"] for d in s["spec"]["devices"]] for s in slices] == [names[:4], names[4:]]
        assert {s["spec"]["pool"]["generation"] for s in slices} == {3}
