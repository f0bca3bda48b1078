"""What runc is asked to do, parsed from its argument vector, and how errors reach the engine.

runc's global flags are parsed properly (a container named ``create`` triggers no edits), and
an error is one line on stderr plus, when runc was given ``--log``, one line in that file in
runc's own format. Standard library only: the pass-through path imports this module.
"""

from __future__ import annotations

import os
import sys

PROG = "enflame-container-runtime"
EDITING_COMMANDS = frozenset({"create", "run"})
# runc's and crun's global flags that take a value; every other global flag is a switch.
_GLOBAL_VALUE_FLAGS = frozenset(
    {"root", "log", "log-format", "criu", "rootless", "log-level", "cgroup-manager"}
)
# Flags of runc create/run that take a value (so their value is not mistaken for the id).
_CREATE_VALUE_FLAGS = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"})


class Invocation:
    """What runc is being asked to do, parsed from the argument vector."""

    __slots__ = (
        "argv",
        "bundle",
        "command",
        "container_id",
        "help",
        "log_file",
        "log_format",
        "version",
    )

    def __init__(
        self,
        argv: list[str],
        command: str | None,
        *,
        bundle: str | None = None,
        container_id: str | None = None,
        log_file: str | None = None,
        log_format: str = "text",
        help: bool = False,
    ) -> None:
        self.argv = argv
        self.command = command
        self.bundle = bundle
        self.container_id = container_id
        self.log_file = log_file
        self.log_format = log_format
        self.help = help
        self.version = False

    @property
    def edits_spec(self) -> bool:
        """True for ``create``/``run`` (not their ``--help``): the calls that get GCUs."""
        return self.command in EDITING_COMMANDS and not self.help

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Invocation({fields})"


def _flag(arg: str) -> tuple[str, str | None]:
    """``--name=value`` / ``-name`` -> (name, value or None); runc takes one or two dashes."""
    name, sep, value = arg.lstrip("-").partition("=")
    return name, (value if sep else None)


def parse_argv(argv: list[str]) -> Invocation:
    """Find runc's global flags, the subcommand, and for create/run the bundle and container id."""
    log_file: str | None = None
    log_format = "text"
    index = 1
    command: str | None = None
    wants_help = False
    wants_version = False
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            index += 1
            command = argv[index] if index < len(argv) else None
            break
        if not arg.startswith("-") or arg == "-":
            command = arg
            break
        name, value = _flag(arg)
        if name in _GLOBAL_VALUE_FLAGS and value is None:
            value = argv[index + 1] if index + 1 < len(argv) else ""
            index += 1
        if name == "log":
            log_file = value
        elif name == "log-format":
            log_format = value or "text"
        elif name in ("help", "h", "version", "v"):
            wants_help = True
            wants_version = wants_version or name in ("version", "v")
        index += 1
    invocation = Invocation(argv, command, log_file=log_file, log_format=log_format)
    invocation.help = wants_help
    invocation.version = wants_version and command is None
    if command in EDITING_COMMANDS:
        _parse_create(argv[index + 1 :], invocation)
    return invocation


def _parse_create(args: list[str], invocation: Invocation) -> None:
    bundle = None
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            if index + 1 < len(args) and invocation.container_id is None:
                invocation.container_id = args[index + 1]
            break
        if arg.startswith("-") and arg != "-":
            name, value = _flag(arg)
            if name in _CREATE_VALUE_FLAGS and value is None:
                value = args[index + 1] if index + 1 < len(args) else None
                index += 1
            if name in ("bundle", "b"):
                bundle = value
            elif name in ("help", "h"):
                invocation.help = True
        elif invocation.container_id is None:
            invocation.container_id = arg
        index += 1
    # No bundle flag means the current directory, as runc does.
    invocation.bundle = os.path.abspath(bundle or ".")


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    named = _NAMED_ESCAPES.get(char)
    if named:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` for one log line: control, format and other unprintable characters escaped.

    Requests carry text a pod author chose (an env value, a mount path, an annotation); a
    newline in it must not start a forged line in a log, nor a lone surrogate break a write.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape_char(char) for char in text)


def warn(message: str) -> None:
    """One warning line on stderr (never stdout: CRI-O parses runc's stdout)."""
    sys.stderr.write(f"{PROG}: warning: {escape(message)}\n")
    sys.stderr.flush()


def report_error(invocation: Invocation | None, message: str) -> None:
    """Tell the engine: one line on stderr and, when runc was given ``--log``, in its format."""
    message = escape(message)
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()
    if invocation is None or not invocation.log_file:
        return
    import json  # only on the error path
    import time

    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"
    if invocation.log_format == "json":
        line = json.dumps({"level": "error", "msg": f"{PROG}: {message}", "time": stamp})
    else:
        line = f"time={json.dumps(stamp)} level=error msg={json.dumps(f'{PROG}: {message}')}"
    try:
        with open(invocation.log_file, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError as exc:
        sys.stderr.write(f"{PROG}: cannot append to --log file {invocation.log_file}: {exc}\n")
