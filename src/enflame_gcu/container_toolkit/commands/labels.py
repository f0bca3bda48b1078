"""``enflame-ctk labels``: the node's GCU labels as a Node Feature Discovery feature file."""

from __future__ import annotations

import argparse
import os
from typing import Any

from enflame_gcu import devices, fileio, node_modes
from enflame_gcu.container_toolkit.commands import common
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
            "file (NFD must allow the enflame.com label namespace: extraLabelNs). With "
            "--host-root DIR the default feature file is DIR's, never this machine's."
        ),
    )
    common.add_host_root(parser, "read and write")
    parser.add_argument(
        "--output",
        metavar="FILE",
        help=f"feature file to write atomically, or - for stdout (default: {DEFAULT_OUTPUT} "
        "inside the host root)",
    )
    common.add_json(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Discover under --host-root and write (or print) the feature file."""
    # Discovery joins paths lexically: refuse a root where that would read outside it.
    fileio.require_confined(args.host_root, devices.DISCOVERY_PATHS)
    try:
        record = node_modes.read(args.host_root)
    except ValueError as exc:
        common.warn(f"no node-mode label: {exc}")
        record = None
    found = labels.for_inventory(
        devices.discover(args.host_root), node_mode=record.mode if record else None
    )
    text = labels.feature_file(found)
    if args.output == "-":
        if args.json:
            common.print_json("Labels", {"labels": found, "output": None})
        else:
            print(text, end="")
        return common.EXIT_OK
    if args.output is None:
        path = common.host_file(args.host_root, DEFAULT_OUTPUT)
    else:
        path = fileio.confine(args.host_root, args.output)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fileio.atomic_write_text(path, text, mode=0o644)
    if args.json:
        common.print_json("Labels", {"labels": found, "output": path})
    else:
        common.note(f"wrote {len(found)} labels to {path}")
    return common.EXIT_OK
