"""The simulated node: description format, round trip through discovery, and node actions."""

from __future__ import annotations

import os
import stat

import pytest

from enflame_gcu import devices, simulate
from enflame_gcu.errors import SimulationError, TopologyError

from .conftest import MakeNode


@pytest.mark.parametrize("name", simulate.builtin_names())
def test_round_trip_simulate_discover_matches_description(make_node: MakeNode, name: str) -> None:
    topo = simulate.load(name)
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


@pytest.mark.parametrize("name", simulate.builtin_names())
def test_render_parses_back_to_the_same_topology(name: str) -> None:
    topo = simulate.load(name)
    assert simulate.parse(simulate.render(topo), topo.name) == topo


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
        simulate.create(vendor_node, simulate.load("flat-4card"))


def test_unknown_card_action_names_the_cards(vendor_node: str) -> None:
    with pytest.raises(SimulationError, match=r"no card gcu9 on this node; cards: gcu0, gcu1"):
        simulate.unplug(vendor_node, 9)


def test_actions_on_a_plain_directory_are_refused(tmp_path: object) -> None:
    with pytest.raises(SimulationError, match="is not a simulated node"):
        simulate.unplug(str(tmp_path), 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu0 0000:01:00.0 <- cpu", "starts with gcuN"),
        ("gcu0 0000:01:00.0 <- 0000:00:01.0", "want 'gcuN <BDF>"),
        ("gcu0 0000:1:00.0 <- cpu", "is not a PCI address"),
        ("gcu0 0000:01:00.0 <- cpu colour=red", "unknown option(s) colour"),
        ("gcu0 0000:01:00.0 <- cpu numa=x", "numa must be a number"),
        ("gcu0 0000:01:00.0 <- cpu dir=other", "dir must be enflame or zixiao"),
        ("flavour: x\ngcu0 0000:01:00.0 <- cpu", "unknown header(s) flavour"),
        ("gcu0 0000:01:00.0 <- cpu\ngcu0 0000:02:00.0 <- cpu", "card minors repeat"),
        (
            "gcu0 0000:02:00.0 <- 0000:01:00.0 <- 0000:00:01.0 <- cpu\n"
            "gcu1 0000:03:00.0 <- 0000:01:00.0 <- 0000:00:02.0 <- cpu",
            "has two parents",
        ),
    ],
)
def test_bad_descriptions_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=None) as caught:
        simulate.parse(text)
    assert message in str(caught.value)


def test_unknown_builtin_lists_the_builtins() -> None:
    with pytest.raises(TopologyError, match="built-in: 2socket-16card"):
        simulate.load("nope")


def test_description_file_by_path(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "mine.topo")
    with open(path, "w") as handle:
        handle.write("# a comment\ndriver-version: 9.9\ngcu4 0000:01:00.0 <- cpu numa=1\n")
    topo = simulate.load(path)
    assert topo.name == "mine"
    assert topo.driver_version == "9.9"
    assert topo.cards == (simulate.SimCard(4, "0000:01:00.0", (), 1),)
