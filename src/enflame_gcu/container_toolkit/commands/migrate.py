"""``enflame-ctk migrate``: adopt what topscloud left on the node and take its plugin's place."""

from __future__ import annotations

import argparse
from typing import Any

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit import migrate, migrate_plugin
from enflame_gcu.container_toolkit.commands import common


def register(subparsers: Any) -> None:
    """Add the ``migrate`` subcommand."""
    parser = subparsers.add_parser(
        "migrate",
        help="move a node off topscloud: adopt its runtime entries, take its plugin's socket",
        description="Find what Enflame's topscloud left on this node (enflame runtime entries "
        "in docker's, containerd's and CRI-O's configs, its runtime config, its device plugin "
        "on enflame.sock), back the files up, adopt the entries so `runtime unconfigure` "
        "removes them exactly, set aside a runtime config ours cannot read, and hand the plugin "
        "socket to our (standing-by) device plugin with no moment without GCUs. Then run "
        "`enflame-ctk install --mode auto`. A second run finds nothing left.",
    )
    common.add_host_root(parser, "read and write")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (stdout) and change nothing"
    )
    parser.add_argument(
        "--plugin-dir",
        default=migrate_plugin.PLUGIN_DIR,
        metavar="DIR",
        help=f"the kubelet's device-plugin directory on the host (default: "
        f"{migrate_plugin.PLUGIN_DIR})",
    )
    parser.add_argument(
        "--handover-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long our device plugin may take to serve the socket once the vendor's is "
        "moved aside; after that it is put back (default: 60)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the plan (--dry-run) or migrate; exit 1 when something was refused."""
    fileio.require_confined(args.host_root, devices.DISCOVERY_PATHS)
    if args.dry_run:
        found = migrate.survey(args.host_root, plugin_dir=args.plugin_dir)
        for line in migrate.plan(found):
            print(line)
        return common.EXIT_OK
    for line in migrate.run(
        args.host_root, plugin_dir=args.plugin_dir, handover_timeout=args.handover_timeout
    ):
        common.note(line)
    return common.EXIT_OK
