"""The simulated node: description format, round trip through discovery, and node actions."""

from __future__ import annotations

import os
import stat

import pytest

from enflame_gcu import devices
from enflame_gcu.errors import SimulationError
from enflame_gcu.simulation import simulate, topofile

from ..conftest import MakeNode


@pytest.mark.parametrize("name", topofile.builtin_names())
def test_round_trip_simulate_discover_matches_description(make_node: MakeNode, name: str) -> None:
    topo = topofile.load(name)
    inventory = devices.discover(make_node(name))
    found = [
        (c.minor, c.bdf, c.pci_chain, c.numa_node, c.device_id, c.driver_dir, c.root_complex)
        for c in inventory.cards
    ]
    described = [
        (c.minor, c.bdf, c.bridges, c.numa, c.device_id, c.driver_dir, c.root_complex)
        for c in topo.cards
    ]
    assert found == described


def test_tree_on_disk_is_shaped_like_sysfs(vendor_node: str) -> None:
    link = os.path.join(vendor_node, "sys/bus/pci/devices/0000:11:00.0")
    assert os.path.islink(link)
    assert not os.path.isabs(os.readlink(link))
    assert os.path.realpath(link) == os.path.join(
        vendor_node,
        "sys/devices/pci0000:0c/0000:0c:02.0/0000:0d:00.0/0000:0e:00.0/0000:0f:00.0/"
        "0000:10:00.0/0000:11:00.0",
    )
    with open(os.path.join(link, "class")) as handle:
        assert handle.read().strip() == "0x120000"
    with open(os.path.join(link, "enflame/gcu0/dev")) as handle:
        assert handle.read().strip() == "238:0"
    info = os.stat(os.path.join(vendor_node, "dev/gcu0"))
    assert stat.S_ISCHR(info.st_mode)
    assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (238, 0)


def test_without_mknod_nodes_are_regular_files_and_still_discovered(make_node: MakeNode) -> None:
    root = make_node("flat-4card", char_devices=False)
    assert stat.S_ISREG(os.stat(os.path.join(root, "dev/gcu0")).st_mode)
    inventory = devices.discover(root)
    assert [c.usable for c in inventory.cards] == [True] * 4
    assert (inventory.cards[0].node.major, inventory.cards[0].node.minor) == (238, 0)
    assert not inventory.cards[0].node.is_char


def test_unplug_and_replug_a_card(vendor_node: str) -> None:
    simulate.unplug(vendor_node, 3)
    assert not os.path.exists(os.path.join(vendor_node, "dev/gcu3"))
    assert not os.path.lexists(os.path.join(vendor_node, "sys/bus/pci/devices/0000:19:00.0"))
    assert [c.minor for c in devices.discover(vendor_node).cards] == [0, 1, 2, 4, 5, 6, 7]
    simulate.replug(vendor_node, 3)
    inventory = devices.discover(vendor_node)
    assert [c.minor for c in inventory.usable_cards()] == list(range(8))


def test_unload_and_reload_driver_keeps_unplugged_cards_out(vendor_node: str) -> None:
    simulate.unplug(vendor_node, 7)
    simulate.unload_driver(vendor_node)
    assert devices.read_driver_version(vendor_node) is None
    assert not os.path.exists(os.path.join(vendor_node, "dev/gcuctl"))
    simulate.load_driver(vendor_node)
    inventory = devices.discover(vendor_node)
    assert inventory.driver_version == "1.0.20230110"
    assert [c.minor for c in inventory.usable_cards()] == list(range(7))


def test_driver_version_change(vendor_node: str) -> None:
    simulate.set_driver_version(vendor_node, "1.1.20240501")
    assert devices.discover(vendor_node).driver_version == "1.1.20240501"
    simulate.unload_driver(vendor_node)
    with pytest.raises(SimulationError, match="not loaded"):
        simulate.set_driver_version(vendor_node, "2.0")
    simulate.load_driver(vendor_node, "2.0.1")
    assert devices.discover(vendor_node).driver_version == "2.0.1"


def test_creating_twice_is_refused(vendor_node: str) -> None:
    with pytest.raises(SimulationError, match="already holds a simulated node"):
        simulate.create(vendor_node, topofile.load("flat-4card"))


def test_unknown_card_action_names_the_cards(vendor_node: str) -> None:
    with pytest.raises(SimulationError, match=r"no card gcu9 on this node; cards: gcu0, gcu1"):
        simulate.unplug(vendor_node, 9)


def test_actions_on_a_plain_directory_are_refused(tmp_path: object) -> None:
    with pytest.raises(SimulationError, match="is not a simulated node"):
        simulate.unplug(str(tmp_path), 0)
