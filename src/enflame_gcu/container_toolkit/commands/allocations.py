"""``enflame-ctk allocations``: the node's cards and the pod/container holding each of them.

The holders come from the kubelet's PodResources API. Its gRPC client is imported inside
:func:`run` only, so every other ``enflame-ctk`` command stays free of grpc.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from enflame_gcu import devices, fileio, health, holders, topology
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.errors import KubeletApiError

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def register(subparsers: Any) -> None:
    """Add the ``allocations`` subcommand."""
    parser = subparsers.add_parser(
        "allocations",
        help="show which pod and container holds each GCU (kubelet PodResources)",
        description=(
            "List the node's cards with model, health, NUMA node, switch and root port, and "
            "the pod/namespace/container holding each (whole cards, vGCUs and shared slices on "
            "their card), asking the kubelet's PodResources API; then one summary line. "
            "Exit 0, or 1 when the PodResources API cannot be read (the cards are still shown)."
        ),
    )
    common.add_host_root(parser)
    parser.add_argument(
        "--pod-resources-socket",
        default=None,
        help=f"the kubelet's PodResources socket (default: {DEFAULT_SOCKET} under --host-root)",
    )
    parser.add_argument(
        "--resource",
        action="append",
        default=None,
        help="extended resource to show, repeatable (default: "
        + ", ".join((*holders.DEFAULT_RESOURCES, holders.DRA_RESOURCE))
        + "; DRA claims show under the driver's name)",
    )
    parser.add_argument("--json", action="store_true", help="stable JSON (schemaVersion 1)")
    parser.set_defaults(handler=run)


def _health(inventory: devices.Inventory) -> dict[str, tuple[bool, str]]:
    report = health.check(inventory.root, inventory.cards)
    return {card.name: (card.healthy, card.reason) for card in report.cards}


def _holder(holder: holders.Holder) -> dict[str, str]:
    return {
        "namespace": holder.namespace,
        "pod": holder.pod,
        "container": holder.container,
        "resource": holder.resource,
        "device": holder.device,
        **({"claim": holder.claim} if holder.claim else {}),  # DRA: the claim, by namespace/name
    }


def as_dict(
    view: holders.NodeView,
    inventory: devices.Inventory,
    source: dict[str, Any],
) -> dict[str, Any]:
    """The document (snake_case; ``--json`` prints it camelCase): cards, pods, summary."""
    known = source["available"]
    return {
        "root": inventory.root,
        "pod_resources": source,
        "cards": [
            {
                "name": card.card.name,
                "minor": card.card.minor,
                "bdf": card.card.bdf,
                "model": card.card.model,
                "healthy": card.healthy,
                "reason": card.reason,
                "numa_node": card.card.numa_node,
                "switch": card.card.switch,
                "root_port": card.card.root_port,
                "free": card.free if known else None,
                "holders": [_holder(h) for h in card.holders] if known else None,
            }
            for card in view.cards
        ],
        "multi_card_pods": [
            {
                "namespace": pod.namespace,
                "pod": pod.pod,
                "cards": list(pod.cards),
                "locality": pod.locality,
            }
            for pod in view.multi_card_pods
        ],
        "unplaced": [_holder(h) for h in view.unplaced],
        "summary": {
            "cards": len(view.cards),
            "held": sum(1 for c in view.cards if not c.free) if known else None,
            "multi_card_pods": len(view.multi_card_pods),
            "by_locality": view.by_locality(),
            "text": view.summary() if known else "holders unknown",
        },
    }


def _held_by(card: holders.CardView, known: bool) -> str:
    if not known:
        return "?"
    if card.free:
        return "free"
    parts = []
    for holder in card.holders:
        who = f"{holder.namespace}/{holder.pod}/{holder.container}"
        if holder.claim:  # DRA: the device and the claim it came through
            parts.append(f"{who} ({holder.device}, claim {holder.claim})")
            continue
        parts.append(who if holder.device == card.card.name else f"{who} ({holder.device})")
    return ", ".join(parts)


def render_text(view: holders.NodeView, document: dict[str, Any]) -> str:
    """The human-readable table and the summary line."""
    known = document["pod_resources"]["available"]
    topo = topology.Topology([c.card for c in view.cards])
    groups = {n: f"S{i}" for i, g in enumerate(topo.switch_groups()) for n in g}
    ports = {n: f"P{i}" for i, g in enumerate(topo.port_groups()) for n in g}
    header = ("GCU", "MODEL", "HEALTH", "NUMA", "SWITCH", "PORT", "HELD BY")
    rows = [header]
    for card in view.cards:
        rows.append(
            (
                card.card.name,
                card.card.model,
                "healthy" if card.healthy else "UNHEALTHY",
                "-" if card.card.numa_node is None else str(card.card.numa_node),
                groups.get(card.card.name, "-"),
                ports.get(card.card.name, "-"),
                _held_by(card, known),
            )
        )
    # Names come from the kubelet's PodResources (pods name them) and sysfs: escaped.
    rows = [tuple(common.printable(cell) for cell in row) for row in rows]  # type: ignore[misc]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    if not view.cards:
        lines = ["No GCU cards found on this node."]
    for card in view.cards:
        if not card.healthy and card.reason:
            lines.append(common.printable(f"  {card.card.name}: {card.reason}"))
    for holder in view.unplaced:
        lines.append(
            common.printable(
                f"  {holder.device} ({holder.resource}) held by {holder.namespace}/{holder.pod}/"
                f"{holder.container} is on no card of this node"
            )
        )
    if known:
        lines.append(common.printable(view.summary()))
    else:
        # Why goes to stderr, once (run() prints it): the table's own last line only says so.
        lines.append("holders unknown: the PodResources API is not available (why: on stderr)")
    return "\n".join(line.rstrip() for line in lines)


NO_GRPC = (
    "the PodResources API needs grpcio and protobuf, which this install leaves out (the node "
    "packages, install.sh and the bundle carry only what the runtime needs: {why}); the cards "
    "are shown without holders. For holders run it in the device plugin's pod: kubectl -n "
    "kube-system exec ds/enflame-device-plugin-daemonset -- enflame-ctk allocations, or install "
    "'enflame-gcu[plugin]' into this install's virtualenv"
)


def _listing(socket: str) -> tuple[Any, str | None]:
    """(the kubelet's listing, None) or (None, why it cannot be had)."""
    try:
        from enflame_gcu.kubelet_api import podresources  # noqa: PLC0415 (grpc only here)
    except ImportError as exc:
        return None, NO_GRPC.format(why=exc)
    try:
        return podresources.list_resources(socket), None
    except KubeletApiError as exc:
        return None, str(exc)


def run(args: argparse.Namespace) -> int:
    """Discover under --root, ask PodResources, print; exit 1 when PodResources is unavailable."""
    inventory = devices.discover(args.host_root)
    resources = tuple(args.resource or (*holders.DEFAULT_RESOURCES, holders.DRA_RESOURCE))
    # The host's socket, as every other default path: under --host-root (links kept inside).
    socket = (
        common.host_file(args.host_root, DEFAULT_SOCKET)
        if args.pod_resources_socket is None
        else fileio.confine(args.host_root, args.pod_resources_socket)
    )
    source: dict[str, Any] = {"socket": socket, "available": True}
    listing, error = _listing(socket)
    if listing is None:
        source.update(available=False, error=error)
    if listing is not None:
        source.update(
            error=None,
            allocatable=None
            if listing.allocatable is None
            else {name: list(listing.allocatable.get(name, ())) for name in resources},
            allocatable_note=listing.allocatable_note,
        )
    view = holders.build(
        inventory,
        listing.holdings if listing else (),
        resources=resources,
        health=_health(inventory),
    )
    document = as_dict(view, inventory, source)
    if args.json:
        common.print_json("Allocations", document)
    else:
        print(render_text(view, document))
    if listing is None:
        print(f"enflame-ctk: {source['error']}", file=sys.stderr)
        return 1
    return 0
