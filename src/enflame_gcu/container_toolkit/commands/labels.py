"""``enflame-ctk labels``: the node's GCU labels as a Node Feature Discovery feature file."""

from __future__ import annotations

import argparse
import os
from typing import Any

from enflame_gcu import devices, fileio
from enflame_gcu.presentation import labels

DEFAULT_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/enflame-gcu"


def register(subparsers: Any) -> None:
    """Add the ``labels`` subcommand."""
    parser = subparsers.add_parser(
        "labels",
        help="write the node's enflame.com/gcu.* labels as an NFD feature file",
        description=(
            "Discover the node's GCUs and write enflame.com/gcu.present, .count, .model, "
            ".family, .memory and .driver.version as a Node Feature Discovery local feature "
            "file (NFD must allow the enflame.com label namespace: extraLabelNs)."
        ),
    )
    parser.add_argument("--root", default="/", help="host root to inspect (default: /)")
    parser.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help=f"feature file to write atomically, or - for stdout (default: {DEFAULT_OUTPUT})",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Discover under --root and write (or print) the feature file."""
    # Discovery joins paths lexically: refuse a root where that would read outside it.
    fileio.require_confined(args.root, devices.DISCOVERY_PATHS)
    text = labels.feature_file(labels.for_inventory(devices.discover(args.root)))
    if args.output == "-":
        print(text, end="")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    fileio.atomic_write_text(args.output, text, mode=0o644)
    print(f"wrote {text.count(chr(10))} labels to {args.output}")
    return 0
