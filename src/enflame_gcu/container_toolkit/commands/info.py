"""``enflame-ctk info``: the node's driver, cards and PCIe tree, as text or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from enflame_gcu import devices
from enflame_gcu.presentation import report


def register(subparsers: Any) -> None:
    """Add the ``info`` subcommand."""
    parser = subparsers.add_parser("info", help="show the driver, the cards and their PCIe tree")
    parser.add_argument("--root", default="/", help="host root to inspect (default: /)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Discover under --root and print the report; exit 1 when no card is usable."""
    inventory = devices.discover(args.root)
    if args.json:
        print(json.dumps(report.as_dict(inventory), indent=2))
    else:
        print(report.render_text(inventory))
    return 0 if inventory.usable_cards() else 1
