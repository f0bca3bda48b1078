"""``enflame-ctk info``: the node's driver, cards and PCIe tree, as text or JSON."""

from __future__ import annotations

import argparse
from typing import Any

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.presentation import report


def register(subparsers: Any) -> None:
    """Add the ``info`` subcommand."""
    parser = subparsers.add_parser(
        "info",
        help="show the driver, the cards and their PCIe tree (exit 1: no usable card)",
        description="Discover the node's GCUs (sysfs and /dev) and show the driver, every card "
        "with its problems, and the PCIe switch/root-port groups. Exit 1 when no card is usable.",
    )
    common.add_host_root(parser)
    common.add_json(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Discover under --host-root and print the report; exit 1 when no card is usable."""
    fileio.require_confined(args.host_root, devices.DISCOVERY_PATHS)
    inventory = devices.discover(args.host_root)
    if args.json:
        common.print_json("Info", report.as_dict(inventory))
    else:
        print(report.render_text(inventory))
    return common.EXIT_OK if inventory.usable_cards() else common.EXIT_FAILED
