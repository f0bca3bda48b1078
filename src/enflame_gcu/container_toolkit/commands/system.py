"""``enflame-ctk system``: node-level chores (``/dev/char`` links, the runtime launcher)."""

from __future__ import annotations

import argparse
from typing import Any

from enflame_gcu.container_toolkit import dev_char
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.shim import launcher


def register(subparsers: Any) -> None:
    """Add the ``system`` subcommand group."""
    parser = subparsers.add_parser("system", help="node-level setup for GCU containers")
    actions = parser.add_subparsers(dest="system_action", metavar="ACTION", required=True)

    links = actions.add_parser(
        "create-dev-char-symlinks",
        help="create /dev/char/<major>:<minor> links for GCU nodes (runc issue 3671)",
    )
    common.add_host_root(links, "read and write")
    links.add_argument("--dry-run", action="store_true", help="only report what would change")
    links.set_defaults(handler=_links)

    install = actions.add_parser(
        "install-runtime-launcher",
        help="write a minimal-start enflame-container-runtime launcher (python -IS)",
    )
    install.add_argument(
        "--output",
        required=True,
        metavar="FILE",
        help="where to write the launcher, e.g. /usr/bin/enflame-container-runtime",
    )
    install.add_argument(
        "--python", metavar="PATH", help="interpreter (default: the one running this command)"
    )
    install.add_argument(
        "--package-dir", metavar="DIR", help="directory holding enflame_gcu (default: detected)"
    )
    install.set_defaults(handler=_install)


def _links(args: argparse.Namespace) -> int:
    actions = dev_char.create_links(args.host_root, dry_run=args.dry_run)
    for action in actions:
        line = f"{action.link} -> {action.target}: {action.action}"
        # A dry run's plan is its result (stdout); a real run reports what it did (stderr).
        print(line) if args.dry_run else common.note(line)
    if not actions:
        common.note(f"no GCU device nodes under {args.host_root.rstrip('/')}/dev")
    return 1 if any(a.action.startswith("skipped") for a in actions) else 0


def _install(args: argparse.Namespace) -> int:
    launcher.write_launcher(args.output, args.python, args.package_dir)
    common.note(f"wrote {args.output}")
    return 0
