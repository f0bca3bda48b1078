"""``enflame-ctk``: the toolkit CLI; each subcommand group lives in ``commands/<group>.py``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from enflame_gcu import __version__
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.errors import EnflameError

# Subcommand groups, in the order --help lists them: module (commands/<module>.py, each with
# register(subparsers)) -> the commands it registers. Only the chosen command's module is
# imported (a node command starts in a third of the time: `allocations` alone pulls in gRPC,
# `doctor` nearly everything); --help and an unknown command import them all.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "info": ("info",),
    "labels": ("labels",),
    "allocations": ("allocations",),
    "sim": ("sim",),
    "cdi": ("cdi",),
    "runtime": ("runtime",),
    "system": ("system",),
    "install": ("install", "uninstall"),
    "migrate": ("migrate",),
    "doctor": ("doctor",),
}


class _CommandModule(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[Any]) -> None: ...


EPILOG = """\
options common to every command (before or after it): --log-level LEVEL
every command that reads the node takes --host-root DIR (the host's / as seen from here)
every command that reports takes --json (one document with a schemaVersion)
results (--json, a dry run's plan) go to stdout; progress, notes, warnings and errors go
to stderr, every line prefixed "enflame-ctk: " (a real install or configure: stderr only)

exit status: 0 success; 1 a check failed or the command could not do what was asked;
2 usage error (unknown option, bad value, missing --host-root directory): nothing was changed;
3 doctor found warnings and no failure.
"""


def chosen_modules(argv: Sequence[str]) -> list[str]:
    """The command modules ``argv`` needs: the chosen command's; none for ``--version``
    without a command; all for ``--help`` or an unknown command (argparse then lists the
    valid ones)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            for module, commands in COMMAND_MODULES.items():
                if word in commands:
                    return [module]
            return list(COMMAND_MODULES)
        elif word in ("-h", "--help"):
            return list(COMMAND_MODULES)
        elif word == "--version":
            return []
    return list(COMMAND_MODULES)


def build_parser(modules: Sequence[str] = tuple(COMMAND_MODULES)) -> argparse.ArgumentParser:
    """The argument parser with the given command modules' commands (by default every one:
    also used by tests that check documented commands exist)."""
    parser = common.Parser(
        prog=common.PROG,
        description="Enflame GCU container toolkit: inspect, simulate and configure GCU nodes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common.global_options()],
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"enflame-ctk {__version__}",
        help="print the version and exit",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in modules:
        module: _CommandModule = importlib.import_module(
            f"enflame_gcu.container_toolkit.commands.{name}"
        )
        module.register(subparsers)
    _add_global_options(parser, top=True)
    return parser


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Give every subcommand (at any depth) the global options, so they may follow it."""
    if not top and not any(a.dest == "log_level" for a in parser._actions):
        for action in common.global_options()._actions:
            parser._add_action(action)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_global_options(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, dispatch to the chosen subcommand's handler, map project errors to exit 1."""
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(chosen_modules(words)).parse_args(words)
    level = getattr(args, "log_level", "warning")
    logging.basicConfig(level=level.upper(), format="enflame-ctk: %(levelname)s: %(message)s")
    try:
        return int(args.handler(args))
    except EnflameError as exc:
        common.note(str(exc))
        return common.EXIT_FAILED
    except OSError as exc:
        # Permissions, a full disk, a read-only host path: name it, never a traceback.
        common.note(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        return common.EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
