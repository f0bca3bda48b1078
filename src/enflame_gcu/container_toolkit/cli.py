"""``enflame-ctk``: the toolkit CLI; each subcommand group lives in ``commands/<group>.py``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from enflame_gcu import __version__
from enflame_gcu.container_toolkit.commands import (
    allocations,
    cdi,
    doctor,
    info,
    install,
    labels,
    runtime,
    sim,
    system,
)
from enflame_gcu.errors import EnflameError

# Subcommand groups, in the order --help lists them. Each module has register(subparsers).
COMMAND_MODULES = (info, labels, allocations, sim, cdi, runtime, system, install, doctor)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by tests that check documented commands exist)."""
    parser = argparse.ArgumentParser(
        prog="enflame-ctk",
        description="Enflame GCU container toolkit: inspect, simulate and configure GCU nodes.",
    )
    parser.add_argument("--version", action="version", version=f"enflame-ctk {__version__}")
    parser.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"]
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, dispatch to the chosen subcommand's handler, map project errors to exit 1."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args))
    except EnflameError as exc:
        print(f"enflame-ctk: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
