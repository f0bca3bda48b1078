"""Health verdicts and the monitor: flips both ways, events first, rescan for what events miss."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from enflame_gcu import devices, edits, health
from enflame_gcu.errors import InvalidRequestError
from enflame_gcu.simulation import simulate, topofile


@pytest.fixture
def node() -> Iterator[str]:
    """A simulated vendor 8-card node."""
    work = tempfile.mkdtemp(prefix="gcuh-", dir="/tmp")
    root = os.path.join(work, "n")
    simulate.create(root, topofile.load("vendor-8card"))
    yield root
    shutil.rmtree(work)


def cards(root: str) -> tuple[devices.Card, ...]:
    """The node's cards as discovered now."""
    return devices.discover(root).cards


def test_every_card_is_healthy_on_a_fresh_node(node: str) -> None:
    report = health.check(node, cards(node))
    assert report.healthy() == {f"gcu{i}": True for i in range(8)}
    assert report.driver_version == "1.0.20230110"
    assert report.reasons() == {}


def test_unplug_names_the_missing_pci_device_and_replug_heals(node: str) -> None:
    known = cards(node)
    simulate.unplug(node, 5)
    report = health.check(node, known)
    assert report.healthy()["gcu5"] is False
    assert report.reasons() == {
        "gcu5": "PCI device 0000:9d:00.0 is gone (/sys/bus/pci/devices/0000:9d:00.0 missing)"
    }
    simulate.replug(node, 5)
    assert all(health.check(node, known).healthy().values())


def test_missing_device_node_alone_makes_a_card_unhealthy(node: str) -> None:
    known = cards(node)
    os.unlink(os.path.join(node, "dev/gcu1"))
    assert health.check(node, known).reasons() == {"gcu1": "/dev/gcu1 is missing"}


def test_device_node_with_other_numbers_is_unhealthy(node: str) -> None:
    known = cards(node)
    path = os.path.join(node, "dev/gcu2")
    os.unlink(path)
    os.mknod(path, 0o666 | 0o020000, os.makedev(238, 9))
    assert health.check(node, known).reasons() == {"gcu2": "/dev/gcu2 is now 238:9"}


def test_unloaded_driver_makes_every_card_unhealthy(node: str) -> None:
    known = cards(node)
    simulate.unload_driver(node)
    report = health.check(node, known)
    assert report.driver_version is None
    assert set(report.reasons().values()) == {"driver not loaded"}
    assert len(report.reasons()) == 8


def test_disabled_checks_keep_the_discovery_verdict(node: str) -> None:
    known = cards(node)
    simulate.unplug(node, 0)
    assert all(health.check(node, known, disabled=True).healthy().values())


def test_derived_devices_follow_their_parent_and_unknown_parents_are_unhealthy(node: str) -> None:
    known = cards(node)
    simulate.unplug(node, 1)
    report = health.check(node, known)
    derived = report.for_derived({"gcu0-s0": "gcu0", "gcu1-s0": "gcu1", "x": "gcu99"})
    assert derived == {"gcu0-s0": True, "gcu1-s0": False, "x": False}


def test_rescan_reports_changes_once_and_a_driver_change_once(node: str) -> None:
    inventory = devices.discover(node)
    monitor = health.HealthMonitor(node, inventory.cards, driver_version=inventory.driver_version)
    assert monitor.rescan() is None
    simulate.unplug(node, 4)
    update = monitor.rescan()
    assert update is not None and not update.rediscover
    assert update.report.healthy()["gcu4"] is False
    assert monitor.rescan() is None
    simulate.set_driver_version(node, "2.0.1")
    update = monitor.rescan()
    assert update is not None and update.rediscover
    assert update.report.driver_version == "2.0.1"
    assert monitor.rescan() is None  # reported once; reset() is the consumer's move
    fresh = devices.discover(node)
    monitor.reset(fresh.cards, fresh.driver_version)
    assert len(monitor.report.cards) == 7


async def _updates_until(
    monitor: health.HealthMonitor, want: dict[str, bool], timeout: float
) -> list[health.HealthUpdate]:
    seen: list[health.HealthUpdate] = []
    done = asyncio.Event()

    def notify(update: health.HealthUpdate) -> None:
        seen.append(update)
        if all(update.report.healthy()[k] == v for k, v in want.items()):
            done.set()

    task = asyncio.ensure_future(monitor.run(notify))
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return seen


def test_monitor_sees_unplug_and_replug_through_inotify(node: str) -> None:
    async def main() -> None:
        inventory = devices.discover(node)
        # One-hour rescans: only inotify can deliver these updates within the timeout.
        monitor = health.HealthMonitor(
            node, inventory.cards, driver_version=inventory.driver_version, interval=3600
        )
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, simulate.unplug, node, 6)
        await _updates_until(monitor, {"gcu6": False}, 3)
        loop.call_later(0.1, simulate.replug, node, 6)
        await _updates_until(monitor, {"gcu6": True}, 3)

    asyncio.run(main())


def test_monitor_rewatches_the_driver_directory_after_unload_and_reload(node: str) -> None:
    async def main() -> None:
        inventory = devices.discover(node)
        monitor = health.HealthMonitor(
            node, inventory.cards, driver_version=inventory.driver_version, interval=3600
        )
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, simulate.unload_driver, node)
        await _updates_until(monitor, dict.fromkeys(monitor.report.healthy(), False), 3)
        loop.call_later(0.1, simulate.load_driver, node, "1.0.20230110")
        await _updates_until(monitor, dict.fromkeys(monitor.report.healthy(), True), 3)
        # /sys/module/enflame came back: a version change inside it is an event again.
        loop.call_later(0.1, simulate.set_driver_version, node, "1.2.0")
        seen = await _updates_until(monitor, {}, 3)
        assert seen[-1].rediscover

    asyncio.run(main())


def test_periodic_rescan_catches_what_no_watch_sees(node: str) -> None:
    async def main() -> None:
        inventory = devices.discover(node)
        monitor = health.HealthMonitor(
            node, inventory.cards, driver_version=inventory.driver_version, interval=0.1
        )
        card = inventory.cards[3]
        # The card's driver entry lives below the watched directories: no event reaches us.
        entry = os.path.join(node, f"sys/bus/pci/devices/{card.bdf}/{card.driver_dir}/{card.name}")
        asyncio.get_running_loop().call_later(0.1, shutil.rmtree, entry)
        seen = await _updates_until(monitor, {"gcu3": False}, 3)
        assert "driver entry enflame/gcu3" in seen[-1].report.reasons()["gcu3"]

    asyncio.run(main())


def test_missing_control_node_makes_every_card_unhealthy(node: str) -> None:
    known = cards(node)
    os.unlink(os.path.join(node, "dev/gcuctl"))
    assert set(health.check(node, known).reasons().values()) == {"/dev/gcuctl is missing"}


def test_a_failing_consumer_does_not_stop_the_monitor(node: str) -> None:
    async def main() -> None:
        inventory = devices.discover(node)
        monitor = health.HealthMonitor(
            node, inventory.cards, driver_version=inventory.driver_version, interval=3600
        )
        seen: list[dict[str, bool]] = []
        healed = asyncio.Event()

        def notify(update: health.HealthUpdate) -> None:
            seen.append(update.report.healthy())
            if len(seen) == 1:
                raise RuntimeError("consumer bug")
            if update.report.healthy()["gcu0"]:
                healed.set()

        task = asyncio.ensure_future(monitor.run(notify))
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, simulate.unplug, node, 0)
        loop.call_later(0.4, simulate.replug, node, 0)
        try:
            await asyncio.wait_for(healed.wait(), 3)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert seen[0]["gcu0"] is False and seen[-1]["gcu0"] is True

    asyncio.run(main())


# --- one definition of a usable card: health agrees with what the runtime accepts -----------

GCU0 = "sys/bus/pci/devices/0000:11:00.0"


def _runtime_accepts(root: str, name: str) -> bool:
    """Would the runtime (which rediscovers at create) give a container this card?"""
    try:
        edits.for_devices(devices.discover(root), [name])
    except InvalidRequestError:
        return False
    return True


def _damage_numa(root: str) -> None:
    with open(os.path.join(root, GCU0, "numa_node"), "w") as handle:
        handle.write("garbage\n")


def _damage_device_id(root: str) -> None:
    with open(os.path.join(root, GCU0, "device"), "wb") as handle:
        handle.write(b"\xff\xfe")


def _damage_dev_file(root: str) -> None:
    with open(os.path.join(root, GCU0, "enflame/gcu0/dev"), "w") as handle:
        handle.write("238:7\n")


def _damage_pci_link(root: str) -> None:
    link = os.path.join(root, "sys/bus/pci/devices/0000:11:00.0")
    os.unlink(link)
    os.symlink("/nonexistent", link)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_damage_numa, "numa_node has unexpected content 'garbage'"),
        (_damage_device_id, "device is not UTF-8 text"),
        (_damage_dev_file, "says minor 7 but the entry is gcu0"),
        (_damage_pci_link, "PCI device 0000:11:00.0 is gone"),
    ],
)
def test_health_reports_unhealthy_whatever_the_runtime_would_refuse(
    node: str, damage: Callable[[str], None], reason: str
) -> None:
    known = cards(node)
    damage(node)
    report = health.check(node, known)
    assert not _runtime_accepts(node, "gcu0")
    assert report.healthy()["gcu0"] is False
    assert reason in report.reasons()["gcu0"]
    for card in known[1:]:  # the other cards: both say usable
        assert report.healthy()[card.name] is _runtime_accepts(node, card.name) is True


def test_card_broken_at_discovery_is_unhealthy_and_recovers_when_sysfs_does(node: str) -> None:
    _damage_numa(node)
    inventory = devices.discover(node)
    monitor = health.HealthMonitor(node, inventory.cards, driver_version=inventory.driver_version)
    assert monitor.report.healthy()["gcu0"] is False
    with open(os.path.join(node, GCU0, "numa_node"), "w") as handle:
        handle.write("0\n")
    update = monitor.rescan()
    assert update is not None and update.report.healthy()["gcu0"] is True
    assert _runtime_accepts(node, "gcu0")


def test_health_check_survives_a_damaged_tree(node: str) -> None:
    known = cards(node)
    with open(os.path.join(node, "sys/module/enflame/version"), "wb") as handle:
        handle.write(b"\xff\n")
    report = health.check(node, known)  # must not raise
    assert set(report.reasons().values()) == {"driver not loaded"}
