"""GCU discovery: cards, control node and vGCUs read from sysfs and /dev under a host root."""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass, field

from enflame_gcu import fileio, naming, products, sysfs

VENDOR_ID = 0x1E36
ACCELERATOR_CLASS = 0x12
read_driver_version = sysfs.read_driver_version
SIMULATION_MARKER = ".enflame-sim"
# Where discovery reads under a root; commands taking --root keep each inside it.
DISCOVERY_PATHS = (naming.PCI_DEVICES, naming.SYS_DEVICES, "/sys/module", "/dev")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A character device node on the host, as found under the host root."""

    path: str
    major: int | None = None
    minor: int | None = None
    is_char: bool = False
    present: bool = False

    @property
    def usable(self) -> bool:
        """True when the node exists with known numbers."""
        return self.present and self.major is not None and self.minor is not None


@dataclass(frozen=True, slots=True)
class Card:
    """One physical GCU card: a PCI device of vendor 0x1e36 bound to the enflame driver."""

    minor: int
    bdf: str
    device_id: int
    model: str
    numa_node: int | None
    root_complex: str
    pci_chain: tuple[str, ...]
    driver_dir: str
    node: DeviceNode
    problems: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``gcuN``: the card's node name and its device ID towards the kubelet."""
        return f"gcu{self.minor}"

    @property
    def dev_path(self) -> str:
        """The card's device node path as seen on the host (and in containers)."""
        return f"/dev/gcu{self.minor}"

    @property
    def usable(self) -> bool:
        """A card is usable when nothing is wrong with it."""
        return not self.problems

    @property
    def root_port(self) -> str | None:
        """The first bridge below the root complex, or None for a card on the root bus."""
        return self.pci_chain[0] if self.pci_chain else None

    @property
    def switch(self) -> str | None:
        """Upstream port of the PCIe switch the card sits under (its grandparent bridge).

        A card's parent is a switch downstream port; the downstream port's parent is the
        switch's upstream port, which every card under that switch shares. A card with fewer
        than two bridges above it hangs off a root port directly and has no switch.
        """
        return self.pci_chain[-2] if len(self.pci_chain) >= 2 else None


@dataclass(frozen=True, slots=True)
class VirtualDevice:
    """A vGCU node ``/dev/vgcuN`` exposed by the driver's vGCU mode."""

    minor: int
    node: DeviceNode
    parent_minor: int | None = None
    problems: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``vgcuN``: the node name and device ID towards the kubelet."""
        return f"vgcu{self.minor}"

    @property
    def dev_path(self) -> str:
        """The node path as seen on the host."""
        return f"/dev/vgcu{self.minor}"

    @property
    def usable(self) -> bool:
        """Usable when nothing is wrong with it."""
        return not self.problems


@dataclass(frozen=True, slots=True)
class Inventory:
    """Everything discovery found under one host root."""

    root: str
    driver_version: str | None
    cards: tuple[Card, ...]
    control: DeviceNode
    vgcus: tuple[VirtualDevice, ...] = ()
    unbound: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())
    simulated: bool = False

    @property
    def driver_loaded(self) -> bool:
        """True when /sys/module/enflame/version was readable."""
        return self.driver_version is not None

    def usable_cards(self) -> tuple[Card, ...]:
        """Cards with no problems, in minor order."""
        return tuple(card for card in self.cards if card.usable)

    def card_by_name(self) -> dict[str, Card]:
        """Map of ``gcuN`` to card."""
        return {card.name: card for card in self.cards}


def is_simulated(root: str) -> bool:
    """True when ``root`` is a simulated node (made by :mod:`enflame_gcu.simulation.simulate`)."""
    return root not in ("", "/") and os.path.isdir(os.path.join(root, SIMULATION_MARKER))


def stat_node(root: str, path: str, simulated: bool) -> tuple[DeviceNode, str | None]:
    """Stat a device node under root; return the node and a problem text if it is unusable.

    A simulated node made without root privileges holds regular files; their numbers come from
    the caller (sysfs), so a regular file is accepted only on a simulated node.
    """
    full = fileio.host_path(root, path)
    try:
        info = os.stat(full)
    except FileNotFoundError:
        return DeviceNode(path), f"{path} is missing"
    except OSError as exc:
        return DeviceNode(path), f"cannot stat {path}: {exc.strerror or exc}"
    if stat.S_ISCHR(info.st_mode):
        major, minor = os.major(info.st_rdev), os.minor(info.st_rdev)
        return DeviceNode(path, major, minor, is_char=True, present=True), None
    if simulated and stat.S_ISREG(info.st_mode):
        return DeviceNode(path, present=True), None
    return DeviceNode(path, present=True), f"{path} is not a character device"


def _discover_card(
    root: str, bdf: str, driver_loaded: bool, simulated: bool, warnings: list[str]
) -> tuple[list[Card], list[VirtualDevice], bool]:
    """Cards and vGCUs behind one Enflame PCI function; the flag says it was bound at all."""
    problems: list[str] = []
    device_path = f"{naming.PCI_DEVICES}/{bdf}/device"
    device_id = sysfs.parse_int(
        sysfs.read(root, device_path, problems), 16, device_path, problems, (0, 0xFFFF)
    )
    root_complex, chain = sysfs.pci_chain(root, bdf, problems)
    numa = sysfs.numa_node(root, bdf, problems)
    driver_dir, nodes = sysfs.driver_nodes(root, bdf, warnings)
    if driver_dir is None:
        return [], [], False
    cards: list[Card] = []
    vgcus: list[VirtualDevice] = []
    card_minors = [minor for kind, minor in nodes if kind == "gcu"]
    for kind, minor in nodes:
        node_problems = list(problems)
        sys_path = f"{naming.PCI_DEVICES}/{bdf}/{driver_dir}/{kind}{minor}/dev"
        major, sys_minor = sysfs.major_minor(root, sys_path, node_problems)
        if sys_minor is not None and sys_minor != minor:
            node_problems.append(
                f"{sys_path} says minor {sys_minor} but the entry is {kind}{minor}"
            )
        node, node_problem = stat_node(root, f"/dev/{kind}{minor}", simulated)
        if node_problem:
            node_problems.append(node_problem)
        elif node.is_char and major is not None and (node.major, node.minor) != (major, sys_minor):
            node_problems.append(
                f"/dev/{kind}{minor} is {node.major}:{node.minor} but {sys_path} says "
                f"{major}:{sys_minor}"
            )
        elif not node.is_char:
            node = DeviceNode(node.path, major, sys_minor, is_char=False, present=True)
        if not driver_loaded:
            node_problems.append(f"driver not loaded ({naming.DRIVER_VERSION_FILE} is missing)")
        if kind == "gcu":
            cards.append(
                Card(
                    minor=minor,
                    bdf=bdf,
                    device_id=device_id if device_id is not None else 0,
                    model=products.product_name(device_id) if device_id is not None else "unknown",
                    numa_node=numa,
                    root_complex=root_complex,
                    pci_chain=chain,
                    driver_dir=driver_dir,
                    node=node,
                    problems=tuple(node_problems),
                )
            )
        else:
            parent = card_minors[0] if card_minors else None
            vgcus.append(VirtualDevice(minor, node, parent, tuple(node_problems)))
    return cards, vgcus, True


def recheck(root: str, card: Card, *, driver_loaded: bool, simulated: bool) -> tuple[str, ...]:
    """What discovery would say is wrong with ``card`` now (health uses this, so the plugin
    never advertises a card the runtime would refuse); empty when nothing is."""
    ignored: list[str] = []
    cards, _, bound = _discover_card(root, card.bdf, driver_loaded, simulated, ignored)
    for fresh in cards:
        if fresh.minor == card.minor:
            return fresh.problems
    if not bound:
        return (f"{card.bdf} has no enflame/ or zixiao/ directory (driver not bound)",)
    return (f"{naming.PCI_DEVICES}/{card.bdf}/{card.driver_dir}/{card.name} is gone",)


def _claimed_twice(cards: list[Card]) -> list[Card]:
    """Cards whose minor another PCI function claims too get a problem naming both."""
    owners: dict[int, list[str]] = {}
    for card in cards:
        owners.setdefault(card.minor, []).append(card.bdf)
    return [
        dataclasses.replace(
            card,
            problems=(
                *card.problems,
                f"{card.name} is claimed by {' and '.join(owners[card.minor])}",
            ),
        )
        if len(owners[card.minor]) > 1
        else card
        for card in cards
    ]


def _loose_vgcus(root: str, known: set[int], simulated: bool) -> list[VirtualDevice]:
    """``/dev/vgcuN`` nodes that sysfs does not link to any card."""
    try:
        entries = os.listdir(fileio.host_path(root, "/dev"))
    except OSError:
        return []
    found = []
    for entry in sorted(entries):
        parsed = sysfs.node_name(entry)
        if parsed is None or parsed[0] != "vgcu" or parsed[1] in known:
            continue
        node, problem = stat_node(root, f"/dev/{entry}", simulated)
        found.append(VirtualDevice(parsed[1], node, None, (problem,) if problem else ()))
    return found


def discover(root: str = "/") -> Inventory:
    """Find every GCU under ``root`` (``/`` in production, a simulated node in tests).

    Never raises for a single bad card: each problem names the path and the card is reported
    unusable. Node-wide problems (no PCI bus, driver missing) go into ``Inventory.problems``.
    """
    simulated = is_simulated(root)
    node_problems: list[str] = []
    driver_version = read_driver_version(root)
    if driver_version is None:
        node_problems.append(f"driver not loaded: {naming.DRIVER_VERSION_FILE} is missing")
    pci_dir = fileio.host_path(root, naming.PCI_DEVICES)
    try:
        functions = sorted(os.listdir(pci_dir))
    except OSError as exc:
        node_problems.append(f"cannot list {naming.PCI_DEVICES}: {exc.strerror or exc}")
        functions = []
    cards: list[Card] = []
    vgcus: list[VirtualDevice] = []
    unbound: list[str] = []
    for bdf in functions:
        ignored: list[str] = []
        vendor = sysfs.parse_int(
            sysfs.read(root, f"{naming.PCI_DEVICES}/{bdf}/vendor", ignored),
            16,
            "",
            ignored,
            (0, 0xFFFF),
        )
        if vendor != VENDOR_ID:
            continue
        if not sysfs.is_bdf(bdf):
            node_problems.append(
                f"ignoring {naming.PCI_DEVICES}/{sysfs.printable(bdf)}: not a PCI address "
                "(domain:bus:device.function)"
            )
            continue
        found_cards, found_vgcus, bound = _discover_card(
            root, bdf, driver_version is not None, simulated, node_problems
        )
        if not bound:
            unbound.append(bdf)
        cards.extend(found_cards)
        vgcus.extend(found_vgcus)
    vgcus.extend(_loose_vgcus(root, {v.minor for v in vgcus}, simulated))
    control, control_problem = stat_node(root, naming.CONTROL_NODE, simulated)
    if control_problem and cards:
        node_problems.append(control_problem)
    if unbound:
        node_problems.append(
            f"{len(unbound)} Enflame PCI device(s) without an enflame/ or zixiao/ directory "
            f"(driver not bound): {', '.join(unbound)}"
        )
    return Inventory(
        root=root,
        driver_version=driver_version,
        cards=tuple(sorted(_claimed_twice(cards), key=lambda card: (card.minor, card.bdf))),
        control=control,
        vgcus=tuple(sorted(vgcus, key=lambda vgcu: vgcu.minor)),
        unbound=tuple(unbound),
        problems=tuple(node_problems),
        simulated=simulated,
    )
