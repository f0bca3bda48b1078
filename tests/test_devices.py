"""Discovery from a host root: every built-in topology and every way a card can be unusable."""

from __future__ import annotations

import os

import pytest

from enflame_gcu import devices, products, simulate, topofile

from .conftest import MakeNode


@pytest.mark.parametrize("name", topofile.builtin_names())
def test_every_builtin_topology_is_discovered_completely(make_node: MakeNode, name: str) -> None:
    topo = topofile.load(name)
    inventory = devices.discover(make_node(name))
    assert [card.minor for card in inventory.cards] == [card.minor for card in topo.cards]
    assert all(card.usable for card in inventory.cards), [c.problems for c in inventory.cards]
    assert inventory.driver_version == topo.driver_version
    assert inventory.control.usable
    assert (inventory.control.major, inventory.control.minor) == (topo.major, topo.control_minor)
    assert inventory.problems == ()
    assert inventory.simulated


def test_vendor_card_records_every_fact(vendor_node: str) -> None:
    card = devices.discover(vendor_node).card_by_name()["gcu3"]
    assert card.minor == 3
    assert card.dev_path == "/dev/gcu3"
    assert (card.node.major, card.node.minor, card.node.is_char) == (238, 3, True)
    assert card.bdf == "0000:19:00.0"
    assert card.model == "T20 32GB"
    assert card.numa_node == 0
    assert card.root_complex == "pci0000:0c"
    assert card.pci_chain == (
        "0000:0c:02.0",
        "0000:0d:00.0",
        "0000:0e:08.0",
        "0000:16:00.0",
        "0000:17:10.0",
    )
    assert card.root_port == "0000:0c:02.0"
    assert card.switch == "0000:16:00.0"
    assert card.driver_dir == "enflame"


def test_zixiao_driver_directory_is_found(make_node: MakeNode) -> None:
    inventory = devices.discover(make_node("zixiao-1card"))
    (card,) = inventory.cards
    assert card.driver_dir == "zixiao"
    assert card.usable
    assert card.model == "T10"
    assert card.switch is None  # straight on a root port


def test_unknown_device_id_gets_a_generic_name(make_node: MakeNode) -> None:
    root = make_node("gcu0 0000:01:00.0 <- 0000:00:01.0 <- cpu numa=0 device=0xbeef\n", text=True)
    (card,) = devices.discover(root).cards
    assert card.usable
    assert card.model == "Enflame GCU (device 0xbeef)"
    assert products.product_family(card.model) == "GCU"


def test_numa_minus_one_means_unknown(make_node: MakeNode) -> None:
    inventory = devices.discover(make_node("flat-4card"))
    assert {card.numa_node for card in inventory.cards} == {None}


def test_card_with_missing_dev_node_is_unusable_with_the_path_named(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, "dev/gcu5"))
    inventory = devices.discover(vendor_node)
    card = inventory.card_by_name()["gcu5"]
    assert not card.usable
    assert card.problems == ("/dev/gcu5 is missing",)
    assert [c.name for c in inventory.usable_cards()] == [f"gcu{i}" for i in (0, 1, 2, 3, 4, 6, 7)]


def test_dev_node_with_wrong_numbers_is_unusable(vendor_node: str) -> None:
    path = os.path.join(vendor_node, "dev/gcu2")
    os.unlink(path)
    os.mknod(path, 0o666 | 0o020000, os.makedev(238, 9))
    card = devices.discover(vendor_node).card_by_name()["gcu2"]
    assert card.problems == (
        "/dev/gcu2 is 238:9 but /sys/bus/pci/devices/0000:15:00.0/enflame/gcu2/dev says 238:2",
    )


def test_regular_file_is_not_a_device_outside_a_simulated_node(vendor_node: str) -> None:
    path = os.path.join(vendor_node, "dev/gcu1")
    os.unlink(path)
    with open(path, "w") as handle:
        handle.write("not a device\n")
    os.rename(os.path.join(vendor_node, devices.SIMULATION_MARKER), os.path.join(vendor_node, "x"))
    card = devices.discover(vendor_node).card_by_name()["gcu1"]
    assert card.problems == ("/dev/gcu1 is not a character device",)


def test_unreadable_sysfs_file_is_named_and_card_unusable(vendor_node: str) -> None:
    dev_file = os.path.join(vendor_node, "sys/bus/pci/devices/0000:11:00.0/enflame/gcu0/dev")
    os.unlink(dev_file)
    os.mkdir(dev_file)  # reading a directory fails even as root
    card = devices.discover(vendor_node).card_by_name()["gcu0"]
    assert not card.usable
    assert card.problems[0].startswith(
        "cannot read /sys/bus/pci/devices/0000:11:00.0/enflame/gcu0/dev:"
    )


def test_garbage_in_sysfs_dev_file_is_reported(vendor_node: str) -> None:
    dev_file = os.path.join(vendor_node, "sys/bus/pci/devices/0000:12:00.0/enflame/gcu1/dev")
    with open(dev_file, "w") as handle:
        handle.write("garbage\n")
    card = devices.discover(vendor_node).card_by_name()["gcu1"]
    assert "has unexpected content 'garbage' (want major:minor)" in card.problems[0]


def test_no_driver_reports_every_card_unusable(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, "sys/module/enflame/version"))
    inventory = devices.discover(vendor_node)
    assert inventory.driver_version is None
    assert not inventory.driver_loaded
    assert inventory.problems[0] == ("driver not loaded: /sys/module/enflame/version is missing")
    assert len(inventory.cards) == 8
    assert all("driver not loaded" in card.problems[-1] for card in inventory.cards)


def test_unloaded_driver_leaves_unbound_pci_devices_named(vendor_node: str) -> None:
    simulate.unload_driver(vendor_node)
    inventory = devices.discover(vendor_node)
    assert inventory.cards == ()
    assert len(inventory.unbound) == 8
    assert "0000:11:00.0" in inventory.problems[-1]


def test_no_cards_at_all(tmp_path: object) -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "sys/bus/pci/devices"))
    inventory = devices.discover(root)
    assert inventory.cards == ()
    assert inventory.usable_cards() == ()
    assert not inventory.simulated


def test_missing_pci_bus_is_a_problem_not_a_crash(tmp_path: object) -> None:
    inventory = devices.discover(str(tmp_path))
    assert inventory.cards == ()
    assert any(p.startswith("cannot list /sys/bus/pci/devices") for p in inventory.problems)


def test_other_vendors_are_ignored(vendor_node: str) -> None:
    bridge = os.path.join(vendor_node, "sys/bus/pci/devices/0000:0c:02.0/vendor")
    with open(bridge) as handle:
        assert handle.read().strip() == "0x10b5"
    assert {c.bdf for c in devices.discover(vendor_node).cards}.isdisjoint({"0000:0c:02.0"})


def test_missing_control_node_is_a_node_problem(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, "dev/gcuctl"))
    inventory = devices.discover(vendor_node)
    assert not inventory.control.present
    assert "/dev/gcuctl is missing" in inventory.problems


def test_vgcu_nodes_are_found_with_their_parent(make_node: MakeNode) -> None:
    root = make_node(
        "gcu0 0000:01:00.0 <- 0000:00:01.0 <- cpu numa=0 vgcus=16,17\n"
        "gcu1 0000:02:00.0 <- 0000:00:02.0 <- cpu numa=0\n",
        text=True,
    )
    inventory = devices.discover(root)
    assert [(v.name, v.parent_minor, v.usable) for v in inventory.vgcus] == [
        ("vgcu16", 0, True),
        ("vgcu17", 0, True),
    ]
    assert (inventory.vgcus[0].node.major, inventory.vgcus[0].node.minor) == (239, 16)
