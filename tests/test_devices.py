"""Discovery from a host root: every built-in topology and every way a card can be unusable."""

from __future__ import annotations

import os

import pytest

from enflame_gcu import devices, products
from enflame_gcu.simulation import simulate, topofile

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
    assert card.model == "T20-32GB"
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
    assert card.model == "Enflame-GCU-device-0xbeef"
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


# --- malformed sysfs: the card is skipped or unusable with the path named; discovery goes on --

PCI0 = "sys/bus/pci/devices/0000:11:00.0"  # gcu0 on the vendor machine


def _write_bytes(root: str, relative: str, data: bytes) -> None:
    with open(os.path.join(root, relative), "wb") as handle:
        handle.write(data)


@pytest.mark.parametrize(
    ("attribute", "data"),
    [
        ("numa_node", b"\xff\xfe0\n"),
        ("device", b"0x00\x80\x81\n"),
        ("enflame/gcu0/dev", b"238:\xe9\n"),
    ],
)
def test_non_utf8_attribute_makes_only_that_card_unusable(
    vendor_node: str, attribute: str, data: bytes
) -> None:
    _write_bytes(vendor_node, f"{PCI0}/{attribute}", data)
    inventory = devices.discover(vendor_node)
    by_name = inventory.card_by_name()
    assert not by_name["gcu0"].usable
    assert f"/sys/bus/pci/devices/0000:11:00.0/{attribute} is not UTF-8 text" in (
        by_name["gcu0"].problems
    )
    assert [c.name for c in inventory.usable_cards()] == [f"gcu{i}" for i in range(1, 8)]


@pytest.mark.parametrize(
    ("attribute", "text", "problem"),
    [
        ("numa_node", "99999999999999999999999", "numa_node is out of range"),
        ("numa_node", "4096", "numa_node is out of range"),
        ("numa_node", "\u0661", "numa_node has unexpected content"),  # Arabic-Indic one
        ("numa_node", "1_0", "numa_node has unexpected content"),
        ("numa_node", "garbage", "numa_node has unexpected content"),
        ("device", "0x1ffffffff", "device is out of range"),
        ("device", "0x00\x01", "device has unexpected content"),
        ("enflame/gcu0/dev", "238:\u00b2", "want major:minor"),  # superscript two
        ("enflame/gcu0/dev", "99999:0", "out of range"),
        ("enflame/gcu0/dev", "238:" + "9" * 100, "want major:minor"),
    ],
)
def test_absurd_attribute_values_make_only_that_card_unusable(
    vendor_node: str, attribute: str, text: str, problem: str
) -> None:
    _write_bytes(vendor_node, f"{PCI0}/{attribute}", text.encode() + b"\n")
    inventory = devices.discover(vendor_node)
    gcu0 = inventory.card_by_name()["gcu0"]
    assert not gcu0.usable
    assert any(problem in p and "0000:11:00.0" in p for p in gcu0.problems), gcu0.problems
    assert all("\n" not in p and "\x01" not in p for p in gcu0.problems)
    assert len(inventory.usable_cards()) == 7


def test_unreadable_numa_node_makes_the_card_unusable(vendor_node: str) -> None:
    path = os.path.join(vendor_node, PCI0, "numa_node")
    os.unlink(path)
    os.mkdir(path)  # reading fails even as root
    gcu0 = devices.discover(vendor_node).card_by_name()["gcu0"]
    assert gcu0.problems[0].startswith(f"cannot read /{PCI0}/numa_node:")


def test_missing_numa_node_file_means_unknown_not_broken(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, PCI0, "numa_node"))
    gcu0 = devices.discover(vendor_node).card_by_name()["gcu0"]
    assert gcu0.usable and gcu0.numa_node is None


def test_huge_attribute_file_is_not_read_whole(vendor_node: str) -> None:
    _write_bytes(vendor_node, f"{PCI0}/numa_node", b"0" * 10_000_000)
    gcu0 = devices.discover(vendor_node).card_by_name()["gcu0"]
    assert gcu0.problems == (f"/{PCI0}/numa_node is longer than 4096 bytes",)


def test_fifo_or_symlink_in_place_of_an_attribute_is_not_read(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, PCI0, "numa_node"))
    os.mkfifo(os.path.join(vendor_node, PCI0, "numa_node"))  # a read would block forever
    gcu1 = os.path.join(vendor_node, "sys/bus/pci/devices/0000:12:00.0/device")
    os.unlink(gcu1)
    os.symlink("/etc/hostname", gcu1)
    by_name = devices.discover(vendor_node).card_by_name()
    assert by_name["gcu0"].problems == (f"cannot read /{PCI0}/numa_node: not a regular file",)
    assert (
        by_name["gcu1"]
        .problems[0]
        .startswith("cannot read /sys/bus/pci/devices/0000:12:00.0/device:")
    )


@pytest.mark.parametrize(
    "entry",
    ["gcu2\n", "gcu\u0661\u0662", "gcu02", "gcu 2", "gcu2x", "gcu", "gcu99999999", "gcu\udcff"],
)
def test_driver_entries_not_named_gcu_and_ascii_digits_are_skipped_with_a_warning(
    vendor_node: str, entry: str
) -> None:
    driver = os.path.join(vendor_node, PCI0, "enflame")
    os.rename(os.path.join(driver, "gcu0"), os.path.join(driver, entry))
    inventory = devices.discover(vendor_node)
    assert "gcu0" not in inventory.card_by_name()
    assert [c.name for c in inventory.usable_cards()] == [f"gcu{i}" for i in range(1, 8)]
    [warning] = [p for p in inventory.problems if "0000:11:00.0/enflame/" in p]
    assert warning.startswith("ignoring /sys/bus/pci/devices/0000:11:00.0/enflame/")
    assert "not gcu or vgcu followed by a card number" in warning
    assert warning.isprintable() and "\udcff" not in warning


def test_two_functions_claiming_one_minor_are_both_unusable(vendor_node: str) -> None:
    driver = os.path.join(vendor_node, "sys/bus/pci/devices/0000:12:00.0/enflame")
    os.rename(os.path.join(driver, "gcu1"), os.path.join(driver, "gcu0"))
    with open(os.path.join(driver, "gcu0/dev"), "w") as handle:
        handle.write("238:0\n")
    inventory = devices.discover(vendor_node)
    claimed = [c for c in inventory.cards if c.minor == 0]
    assert len(claimed) == 2
    assert all(not c.usable for c in claimed)
    assert all("gcu0 is claimed by 0000:11:00.0 and 0000:12:00.0" in c.problems for c in claimed)


def test_pci_entry_that_is_not_an_address_is_skipped_with_a_warning(vendor_node: str) -> None:
    pci = os.path.join(vendor_node, "sys/bus/pci/devices")
    os.rename(os.path.join(pci, "0000:11:00.0"), os.path.join(pci, "0000:11:00.0\n"))
    inventory = devices.discover(vendor_node)
    assert "gcu0" not in inventory.card_by_name()
    assert len(inventory.usable_cards()) == 7
    assert any(
        p.startswith("ignoring /sys/bus/pci/devices/0000:11:00.0\\n:") for p in inventory.problems
    ), inventory.problems


def test_non_ascii_vgcu_nodes_in_dev_are_not_taken_for_vgcus(vendor_node: str) -> None:
    os.mknod(os.path.join(vendor_node, "dev", "vgcu\u0663"), 0o666 | 0o020000, os.makedev(239, 3))
    os.mknod(os.path.join(vendor_node, "dev", "vgcu4\n"), 0o666 | 0o020000, os.makedev(239, 4))
    assert devices.discover(vendor_node).vgcus == ()
