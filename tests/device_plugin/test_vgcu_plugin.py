"""enflame.com/vgcu: discovery on a simulated vGCU node, the vGCU policy, Allocate via the stub."""

from __future__ import annotations

import asyncio
import pathlib
import signal
from typing import Any

import pytest

from enflame_gcu import devices, edits, health, naming, topology, virtual
from enflame_gcu._proto import api_pb2
from enflame_gcu.device_plugin import config, resources
from enflame_gcu.errors import InvalidRequestError
from enflame_gcu.simulation import simulate, topofile
from enflame_gcu.simulation.testing import plugin_process

VGCU = "enflame.com/vgcu"
# Four cards laid out like gcu0..gcu3 of the vendor machine plus gcu4 on socket 1; two vGCUs
# each: gcu0 has vgcu0,1; gcu1 vgcu2,3; gcu2 vgcu4,5; gcu3 vgcu6,7; gcu4 vgcu8,9.
FOUR_PLUS_ONE = """\
name: vgcu-5card
device: 0xc035
gcu0 0000:11:00.0 <- 0000:10:00.0 <- 0000:0f:00.0 <- 0000:0e:00.0 <- 0000:0d:00.0 <- 0000:0c:02.0 <- cpu  numa=0  vgcus=0,1
gcu1 0000:12:00.0 <- 0000:10:10.0 <- 0000:0f:00.0 <- 0000:0e:00.0 <- 0000:0d:00.0 <- 0000:0c:02.0 <- cpu  numa=0  vgcus=2,3
gcu2 0000:15:00.0 <- 0000:14:00.0 <- 0000:13:00.0 <- 0000:0e:04.0 <- 0000:0d:00.0 <- 0000:0c:02.0 <- cpu  numa=0  vgcus=4,5
gcu3 0000:19:00.0 <- 0000:17:10.0 <- 0000:16:00.0 <- 0000:0e:08.0 <- 0000:0d:00.0 <- 0000:0c:02.0 <- cpu  numa=0  vgcus=6,7
gcu4 0000:9c:00.0 <- 0000:9b:00.0 <- 0000:9a:00.0 <- 0000:99:00.0 <- 0000:98:00.0 <- 0000:97:02.0 <- cpu  numa=1  vgcus=8,9
"""  # noqa: E501 - one card per line, as the topology format wants


def discover(tmp_path: pathlib.Path, text: str | None = None) -> devices.Inventory:
    """Discovery of a fresh simulated node (the built-in vgcu-2card unless ``text``)."""
    root = str(tmp_path / "node")
    topo = topofile.load("vgcu-2card") if text is None else topofile.parse(text)
    simulate.create(root, topo)
    return devices.discover(root)


def test_vgcus_are_discovered_with_their_card_and_its_numa_node(tmp_path: pathlib.Path) -> None:
    inventory = discover(tmp_path)
    kind = resources.vgcus(inventory)
    assert [(d.id, d.card, d.numa_node) for d in kind.catalog] == [
        (f"vgcu{i}", "gcu0" if i < 4 else "gcu1", 0 if i < 4 else 1) for i in range(8)
    ]
    # Both cards are partitioned: neither is whole nor shared, even when sharing is on.
    placed = resources.assign(inventory, config.PluginConfig(resources=("gcu", "shared-gcu")))
    assert (placed.whole, placed.shared) == ((), ())
    assert [c.name for c in placed.vgcu_mode] == ["gcu0", "gcu1"]


def policy_for(inventory: devices.Inventory) -> virtual.VgcuPolicy:
    """The vGCU policy of a discovery."""
    return virtual.VgcuPolicy(
        virtual.parents(inventory), topology.Topology.from_inventory(inventory)
    )


ALL_TWO_CARD = [f"vgcu{i}" for i in range(8)]
TWO_CARD_TABLE = [
    # (available, required, size, expected, why)
    (ALL_TWO_CARD, [], 2, ["vgcu0", "vgcu1"], "one card, lowest"),
    (ALL_TWO_CARD, [], 5, ["vgcu0", "vgcu1", "vgcu2", "vgcu3", "vgcu4"], "fill a card first"),
    (["vgcu0", "vgcu4", "vgcu5", "vgcu6"], [], 2, ["vgcu4", "vgcu5"], "the card that holds both"),
    (["vgcu0", "vgcu1", "vgcu2", "vgcu4", "vgcu5"], [], 2, ["vgcu4", "vgcu5"], "tightest fit"),
    (ALL_TWO_CARD, ["vgcu5"], 3, ["vgcu4", "vgcu5", "vgcu6"], "stay on the required card"),
    (["vgcu3", "vgcu4", "vgcu5"], ["vgcu3"], 3, ["vgcu3", "vgcu4", "vgcu5"], "must span"),
]
FIVE_CARD_TABLE = [
    # gcu1 shares gcu0's switch, gcu2/gcu3 its root port only, gcu4 is on the other socket.
    ([f"vgcu{i}" for i in (0, 2, 3, 4, 5, 8, 9)], ["vgcu0"], 3, ["vgcu0", "vgcu2", "vgcu3"]),
    ([f"vgcu{i}" for i in (0, 4, 5, 8, 9)], ["vgcu0"], 3, ["vgcu0", "vgcu4", "vgcu5"]),
    ([f"vgcu{i}" for i in (1, 8, 9)], ["vgcu1"], 2, ["vgcu1", "vgcu8"]),
]


@pytest.mark.parametrize(
    ("available", "required", "size", "expected"),
    [row[:4] for row in TWO_CARD_TABLE],
    ids=[row[-1] for row in TWO_CARD_TABLE],
)
def test_vgcu_policy_on_two_cards(
    tmp_path: pathlib.Path, available: list[str], required: list[str], size: int, expected: Any
) -> None:
    policy = policy_for(discover(tmp_path))
    assert policy.choose(available, required, size) == expected
    assert policy.choose(list(reversed(available)), required, size) == expected  # order-free


@pytest.mark.parametrize(("available", "required", "size", "expected"), FIVE_CARD_TABLE)
def test_vgcu_policy_prefers_topology_close_cards(
    tmp_path: pathlib.Path, available: list[str], required: list[str], size: int, expected: Any
) -> None:
    assert policy_for(discover(tmp_path, FOUR_PLUS_ONE)).choose(available, required, size) == (
        expected
    )


def test_vgcu_without_a_card_in_sysfs_is_its_own_group(tmp_path: pathlib.Path) -> None:
    policy = virtual.VgcuPolicy({"vgcu0": "gcu0", "vgcu1": "gcu0", "vgcu9": None})
    assert policy.choose(["vgcu9", "vgcu0", "vgcu1"], [], 2) == ["vgcu0", "vgcu1"]
    assert policy.choose(["vgcu9", "vgcu0"], [], 1) == ["vgcu0"]


def run(args: list[str], scenario: Any) -> None:
    """A vgcu-2card node served by a plugin process with ``args``."""

    async def main() -> None:
        async with plugin_process.running_node("vgcu-2card", args) as node:
            served = [VGCU] + (["enflame.com/gcu"] if "--resources=gcu,vgcu" in args else [])
            await node.kubelet.wait_for(
                lambda k: all(r in k.plugins and k.plugins[r].lists_received for r in served),
                10,
                f"{', '.join(served)} to list their devices",
            )
            await scenario(node)

    asyncio.run(main())


def test_vgcus_are_served_on_their_own_socket_with_numa_and_allocated_as_nodes() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet
        assert sorted((r.resource_name, r.endpoint) for r in kubelet.registrations) == [
            ("enflame.com/gcu", "enflame.sock"),
            (VGCU, "enflame-vgcu.sock"),
        ]
        assert kubelet.devices(VGCU) == {f"vgcu{i}": "Healthy" for i in range(8)}
        assert kubelet.plugins[VGCU].numa == {f"vgcu{i}": (i // 4,) for i in range(8)}
        assert kubelet.devices() == {}  # both cards are in vGCU mode: never handed out whole
        pod = await kubelet.allocate_pod("a", {"main": 2}, VGCU)
        got = pod["main"]
        assert got.asked_preference and got.device_ids == ("vgcu0", "vgcu1")
        assert dict(got.response.envs) == {naming.VISIBLE_DEVICES_ENV: "vgcu0,vgcu1"}
        assert [d.container_path for d in got.response.devices] == [
            "/dev/vgcu0",
            "/dev/vgcu1",
            "/dev/gcuctl",
        ]
        assert [d.name for d in got.response.cdi_devices] == [
            "enflame.com/vgcu=0",
            "enflame.com/vgcu=1",
        ]
        second = await kubelet.allocate_pod("b", {"main": 3}, VGCU)
        assert second["main"].device_ids == ("vgcu4", "vgcu5", "vgcu6")  # the card with room

    run(
        [
            "--resources=gcu,vgcu",
            "--pass-device-specs",
            "--device-list-strategy=envvar,cdi-cri",
        ],
        scenario,
    )


def test_vgcus_follow_their_card_health_and_allocate_refuses_unknown_ids() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet
        simulate.unplug(node.root, 1)
        await kubelet.wait_for(
            lambda k: (
                [h for _, h in sorted(k.devices(VGCU).items())]
                == ["Healthy"] * 4 + ["Unhealthy"] * 4
            ),
            10,
            "gcu1's vGCUs unhealthy",
        )
        simulate.replug(node.root, 1)
        await kubelet.wait_for(
            lambda k: set(k.devices(VGCU).values()) == {"Healthy"}, 10, "all vGCUs healthy"
        )
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["vgcu9"])
        with pytest.raises(Exception, match=r"unknown device.*vgcu9.*healthy devices: vgcu0"):
            await kubelet.plugins[VGCU].stub.Allocate(request, timeout=5)
        node.plugin.send(signal.SIGTERM)
        assert await node.plugin.wait(5) == 0

    run(["--resources=vgcu"], scenario)


def test_vgcu_the_runtime_would_refuse_is_unhealthy_though_its_card_is_fine(
    tmp_path: pathlib.Path,
) -> None:
    root = str(tmp_path / "node")
    simulate.create(root, topofile.load("vgcu-2card"))
    (tmp_path / "node" / "dev" / "vgcu2").unlink()
    inventory = devices.discover(root)
    kind = resources.vgcus(inventory)
    report = health.check(root, inventory.cards)
    assert report.healthy() == {"gcu0": True, "gcu1": True}
    verdict = resources.health_of(kind, report)
    assert verdict["vgcu2"] is False
    with pytest.raises(InvalidRequestError, match="unusable device"):
        edits.for_devices(inventory, ["vgcu2"])  # what the runtime does at create
    assert all(verdict[f"vgcu{i}"] for i in (0, 1, 3, 4, 5, 6, 7))
