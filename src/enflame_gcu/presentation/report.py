"""What ``enflame-ctk info`` shows: the inventory as a dict, a card table and a PCIe tree."""

from __future__ import annotations

import itertools
from typing import Any

from enflame_gcu import devices, products, topology


def as_dict(inventory: devices.Inventory) -> dict[str, Any]:
    """Machine-readable view of an inventory and its topology groups."""
    topo = topology.Topology.from_inventory(inventory)
    switch_of = {name: i for i, group in enumerate(topo.switch_groups()) for name in group}
    port_of = {name: i for i, group in enumerate(topo.port_groups()) for name in group}
    return {
        "root": inventory.root,
        "simulated": inventory.simulated,
        "driver": {"loaded": inventory.driver_loaded, "version": inventory.driver_version},
        "control_node": {
            "path": inventory.control.path,
            "present": inventory.control.present,
            "major": inventory.control.major,
            "minor": inventory.control.minor,
        },
        "cards": [
            {
                "name": card.name,
                "minor": card.minor,
                "device_node": card.dev_path,
                "major": card.node.major,
                "bdf": card.bdf,
                "device_id": f"0x{card.device_id:04x}",
                "model": card.model,
                "family": products.product_family(card.model),
                "numa_node": card.numa_node,
                "root_complex": card.root_complex,
                "pci_chain": list(card.pci_chain),
                "root_port": card.root_port,
                "switch": card.switch,
                "switch_group": switch_of[card.name],
                "root_port_group": port_of[card.name],
                "driver_dir": card.driver_dir,
                "usable": card.usable,
                "problems": list(card.problems),
            }
            for card in inventory.cards
        ],
        "switch_groups": [list(group) for group in topo.switch_groups()],
        "root_port_groups": [list(group) for group in topo.port_groups()],
        "vgcus": [
            {
                "name": vgcu.name,
                "device_node": vgcu.dev_path,
                "parent": None if vgcu.parent_minor is None else f"gcu{vgcu.parent_minor}",
                "usable": vgcu.usable,
                "problems": list(vgcu.problems),
            }
            for vgcu in inventory.vgcus
        ],
        "unbound_pci_devices": list(inventory.unbound),
        "problems": list(inventory.problems),
    }


def card_table(inventory: devices.Inventory) -> str:
    """A fixed-width table of the cards, one row each."""
    data = as_dict(inventory)
    header = ("GCU", "NODE", "BDF", "MODEL", "NUMA", "SWITCH", "PORT", "STATUS")
    rows = [header]
    for card in data["cards"]:
        rows.append(
            (
                card["name"],
                card["device_node"],
                card["bdf"],
                card["model"],
                "-" if card["numa_node"] is None else str(card["numa_node"]),
                f"S{card['switch_group']}",
                f"P{card['root_port_group']}",
                "usable" if card["usable"] else "NOT USABLE: " + "; ".join(card["problems"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def pci_tree(inventory: devices.Inventory) -> str:
    """The PCIe hierarchy from each root complex down to the cards, drawn with box characters."""
    children: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    switch_ports = {card.switch for card in inventory.cards if card.switch}
    root_ports = {card.root_port for card in inventory.cards if card.root_port}
    for card in inventory.cards:
        path = [card.root_complex, *card.pci_chain, card.bdf]
        for upper, lower in itertools.pairwise(path):
            siblings = children.setdefault(upper, [])
            if lower not in siblings:
                siblings.append(lower)
        numa = "-" if card.numa_node is None else str(card.numa_node)
        state = "" if card.usable else "  (not usable)"
        labels[card.bdf] = f"{card.bdf}  {card.name}  {card.model}  numa {numa}{state}"
    for bdf in switch_ports:
        labels[bdf] = f"{bdf}  [switch]"
    for bdf in root_ports:
        labels[bdf] = f"{bdf}  [root port]"
    tops = sorted({card.root_complex for card in inventory.cards})
    lines = ["cpu"]

    def draw(node: str, prefix: str, last: bool) -> None:
        lines.append(f"{prefix}{'└── ' if last else '├── '}{labels.get(node, node)}")
        kids = sorted(children.get(node, []))
        for i, kid in enumerate(kids):
            draw(kid, prefix + ("    " if last else "│   "), i == len(kids) - 1)

    for i, top in enumerate(tops):
        draw(top, "", i == len(tops) - 1)
    return "\n".join(lines)


def render_text(inventory: devices.Inventory) -> str:
    """The full human-readable report of ``enflame-ctk info``."""
    version = inventory.driver_version or "NOT LOADED"
    ctl = "present" if inventory.control.present else "MISSING"
    lines = [
        f"Host root:      {inventory.root}{'  (simulated node)' if inventory.simulated else ''}",
        f"Driver:         enflame {version}",
        f"Control node:   {inventory.control.path} {ctl}",
        f"Cards:          {len(inventory.usable_cards())} usable of {len(inventory.cards)}",
    ]
    if inventory.vgcus:
        lines.append(f"vGCUs:          {', '.join(v.name for v in inventory.vgcus)}")
    lines += [""] + (
        [card_table(inventory), "", pci_tree(inventory)]
        if inventory.cards
        else ["No GCU cards found (no PCI device of vendor 0x1e36 bound to the enflame driver)."]
    )
    if inventory.problems:
        lines += ["", "Problems:"] + [f"  - {problem}" for problem in inventory.problems]
    return "\n".join(lines)
