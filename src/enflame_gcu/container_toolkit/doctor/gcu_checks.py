"""Doctor checks of the GCUs themselves: the enflame driver and the device nodes.

Both read the inventory ``devices.discover`` built, so doctor judges a node exactly as the
device plugin sees it.
"""

from __future__ import annotations

from enflame_gcu import naming
from enflame_gcu.container_toolkit.doctor.model import Node, Result

RELOAD_DRIVER = "rmmod enflame && modprobe enflame   # then see: dmesg | grep -i enflame"


def check_driver(node: Node) -> list[Result]:
    """The enflame kernel module is loaded and every Enflame PCI function is bound to it."""
    inventory = node.inventory
    if not inventory.driver_loaded:
        return [
            Result(
                "driver",
                "fail",
                f"not loaded: {naming.DRIVER_VERSION_FILE} is missing",
                "install the Enflame driver package, then: modprobe enflame",
            )
        ]
    if inventory.unbound:
        return [
            Result(
                "driver",
                "fail",
                f"driver {inventory.driver_version} loaded, but not bound to "
                + ", ".join(inventory.unbound),
                RELOAD_DRIVER,
            )
        ]
    return [Result("driver", "pass", f"enflame driver {inventory.driver_version} loaded")]


def check_devices(node: Node) -> list[Result]:
    """``/dev/gcu*`` and ``/dev/gcuctl`` exist and match sysfs."""
    inventory = node.inventory
    if not inventory.cards:
        detail = "no GCU found (no enflame/gcuN entry under /sys/bus/pci/devices)"
        return [
            Result("devices", "fail", detail, "lspci -d 1e36:   # cards seen? " + RELOAD_DRIVER)
        ]
    problems = [
        f"{card.name}: {'; '.join(card.problems)}" for card in inventory.cards if card.problems
    ]
    if not inventory.control.present:
        problems.append(f"{naming.CONTROL_NODE} is missing (every GCU container needs it)")
    if problems:
        return [Result("devices", "fail", " | ".join(problems), RELOAD_DRIVER)]
    names = [card.name for card in inventory.cards]
    models = sorted({card.model for card in inventory.cards})
    detail = (
        f"{len(names)} card(s) {', '.join(names)} ({', '.join(models)}) and {naming.CONTROL_NODE}"
    )
    return [Result("devices", "pass", detail + "; nodes match sysfs")]
