"""The grammar every ``enflame-ctk`` command shares: host root, ``--json``, messages, exit codes.

One spelling per option: ``--host-root`` is the host's ``/`` as seen from here for every
command (the old ``--root`` still works, hidden, with a warning); options common to all
commands (``--log-level``) are accepted before or after the subcommand. Results go to stdout;
errors, warnings and notes go to stderr as ``enflame-ctk: ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from enflame_gcu import fileio
from enflame_gcu.support import cli_options

PROG = "enflame-ctk"
# Exit codes, the same for every command (documented in docs/user-guide*.md "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1  # a check failed, or the command could not do what it was asked
EXIT_USAGE = 2  # bad option or value (argparse's convention); nothing was changed
EXIT_WARNINGS = 3  # doctor: warnings, no failure
# Version of every --json document's layout; raised when a field changes meaning or goes away.
SCHEMA_VERSION = 1
LOG_LEVELS = ("debug", "info", "warning", "error")


class Parser(argparse.ArgumentParser):
    """argparse with our prefix on usage errors and the usage exit code."""

    def error(self, message: str) -> NoReturn:
        """Print usage and ``<prog>: error: ...`` on stderr, exit with EXIT_USAGE."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped (``\\n``, ``\\x1b``,
    ``\\u202e``): for strings others wrote (a mode record, pod names from the kubelet, sysfs)
    on a terminal, where a newline would forge a line and an escape sequence would act."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def note(message: str) -> None:
    """A message for the operator (not the command's result): stderr, our prefix on each line."""
    lines = message.splitlines() or [""]
    print("".join(f"{PROG}: {line}\n" for line in lines), end="", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """A warning: stderr, with our prefix."""
    note(f"warning: {message}")


# Keys of these maps are data (locality, label, resource or CDI device names), not field names.
DATA_MAPS = frozenset({"byLocality", "labels", "allocatable", "duplicates"})
# --json keys are camelCase only (as Kubernetes objects and node-mode.json spell them): printing
# the 0.1 snake_case twin beside each doubled every document. A script still reading the old
# names sets this variable to 1 and gets the twins back until LEGACY_KEYS_UNTIL.
LEGACY_KEYS_ENV = "ENFLAME_CTK_JSON_SNAKE_CASE"
LEGACY_KEYS_UNTIL = "0.2.0"


def camel(name: str) -> str:
    """``numa_node`` -> ``numaNode``: every --json key is camelCase, as Kubernetes spells them."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def json_keys(value: Any, *, legacy: bool = False) -> Any:
    """``value`` with every field name camelCase; with ``legacy`` (:data:`LEGACY_KEYS_ENV`) the
    0.1 snake_case name of a renamed field follows it with the same value."""
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            name = camel(key)
            converted = item if name in DATA_MAPS else json_keys(item, legacy=legacy)
            result[name] = converted
            if legacy and name != key:
                result[key] = converted
        return result
    if isinstance(value, list | tuple):
        return [json_keys(item, legacy=legacy) for item in value]
    return value


def json_document(kind: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """A ``--json`` document: ``schemaVersion`` and ``kind`` first, camelCase keys."""
    converted: dict[str, Any] = json_keys(document, legacy=os.environ.get(LEGACY_KEYS_ENV) == "1")
    return {"schemaVersion": SCHEMA_VERSION, "kind": kind, **converted}


def print_json(kind: str, document: Mapping[str, Any]) -> None:
    """Print a ``--json`` document (:func:`json_document`) on stdout."""
    print(json.dumps(json_document(kind, document), indent=2))


def existing_dir(value: str) -> str:
    """argparse type: a directory that exists (a usage error names the problem otherwise)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    if not os.path.exists(value):
        raise argparse.ArgumentTypeError(f"{value} does not exist")
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value} is not a directory")
    return value


def add_deprecated(
    parser: argparse.ArgumentParser,
    old: str,
    new: str,
    dest: str,
    *,
    flag: bool = False,
    type: Any = None,
) -> None:
    """Accept ``old`` as a hidden alias of ``new`` (same dest), with a warning when used."""
    cli_options.add_deprecated(parser, old, new, dest, prog=PROG, flag=flag, type=type)


def _checked_dir(value: str) -> str:
    try:
        return existing_dir(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"host root {exc}") from None


def add_host_root(parser: argparse.ArgumentParser, what: str = "read") -> None:
    """``--host-root DIR``: the host's / as seen from here; the command stays inside it."""
    parser.add_argument(
        "--host-root",
        default="/",
        metavar="DIR",
        type=_checked_dir,
        help=f"the host's / as seen from here (e.g. /host in a DaemonSet); every host path "
        f"the command {what}s is taken inside DIR (default: /)",
    )
    add_deprecated(parser, "--root", "--host-root", "host_root", type=_checked_dir)


def add_json(parser: argparse.ArgumentParser) -> None:
    """``--json``: machine-readable output with a ``schemaVersion``."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print the result as one JSON document (schemaVersion {SCHEMA_VERSION})",
    )


def global_options() -> argparse.ArgumentParser:
    """Options every command accepts before or after the subcommand (a parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="log messages at this level and above on stderr (default: warning)",
    )
    return parent


def host_file(root: str, path: str) -> str:
    """A default host path (``/etc/...``) as seen from here: inside ``root``, links jailed."""
    return fileio.resolve(root, path)
