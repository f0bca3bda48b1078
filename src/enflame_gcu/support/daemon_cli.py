"""What the four daemons spell alike: ``--http-address``, ``--version``, the logging options and
``ENFLAME_<OPTION>`` environment defaults (docs/user-guide.md, "Options every daemon shares").

``enflame-device-plugin``, ``enflame-dra-plugin``, ``enflame-scheduler-extender`` and
``enflame-gcu-operator`` each serve their probes (and metrics) on one ``--http-address
HOST:PORT``; the old spellings of its parts (``--metrics-port``, ``--port``, ``--health-address``
...) still work, hidden from ``--help``, with one deprecation line on stderr when used.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from enflame_gcu import __version__
from enflame_gcu.support import cli_options, env_vars, logs

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
HTTP_ADDRESS = "--http-address"
HTTP_METAVAR = "HOST:PORT"
# Clients and servers that log every request: WARNING and above unless --log-level debug.
CHATTY = ("grpc", "asyncio", "httpx", "httpx2", "httpcore", "httpcore2")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def env_help(env: str, default: str) -> str:
    """The suffix every option's help ends with: ``[env NAME; default VALUE]``."""
    return f"[env {env}; default {default or 'unset'}]"


def split_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; ``:PORT`` = every address) as ``(host, port)``."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or int(port) > 65535 or any(c in host for c in " /[]"):
        raise ValueError(f"{text!r} is not HOST:PORT (such as 127.0.0.1:9402, [::1]:9402, :9402)")
    return host, int(port)


def join_address(host: str, port: int) -> str:
    """``(host, port)`` as ``HOST:PORT``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _address(text: str) -> str:
    if not text.strip():
        return ""
    try:
        split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _one_of(valid: Sequence[str]) -> Callable[[str], str]:
    # Case-insensitive, as the environment variables have always been read.
    def parse(text: str) -> str:
        if text.lower() not in valid:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(valid)}")
        return text.lower()

    return parse


class _SplitAddress(argparse.Action):
    """``--http-address`` for a program that keeps the host and the port apart."""

    def __init__(self, *args: Any, into: tuple[str, str] = ("", ""), **kwargs: Any) -> None:
        self.into = into
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        host, port = split_address(str(values)) if values else ("", 0)
        setattr(namespace, self.into[0], host)
        setattr(namespace, self.into[1], port)


def add_http_address(
    parser: argparse.ArgumentParser,
    *,
    serves: str,
    default: str,
    environ: Mapping[str, str],
    into: tuple[str, str] | None = None,
    shown: str = "",
) -> None:
    """``--http-address HOST:PORT`` (env ``ENFLAME_HTTP_ADDRESS``; empty = off).

    ``into``: store the host and the port in these two destinations instead of ``http_address``
    (a program whose code, and whose old flags, keep them apart).
    """
    env = env_vars.for_option("http-address")
    value = environ.get(env, default)
    text = f"{serves} {env_help(env, shown or default or 'off')}"
    if into is None:
        parser.add_argument(
            HTTP_ADDRESS, metavar=HTTP_METAVAR, type=_address, default=value, help=text
        )
        return
    try:
        host, port = split_address(value) if value.strip() else ("", 0)
    except ValueError as exc:
        parser.error(f"invalid {env}: {exc}")
    parser.set_defaults(**{into[0]: host, into[1]: port})
    parser.add_argument(
        HTTP_ADDRESS, metavar=HTTP_METAVAR, type=_address, action=_SplitAddress, into=into,
        dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=text,
    )  # fmt: skip


def add_old_address_part(
    parser: argparse.ArgumentParser, old: str, dest: str, *, prog: str, port: bool
) -> None:
    """An old spelling of the host or the port of ``--http-address``: hidden, warns when used."""
    cli_options.add_deprecated(
        parser, old, f"{HTTP_ADDRESS} {HTTP_METAVAR}", dest, prog=prog, type=_port if port else str
    )


def _port(text: str) -> int:
    if not text.strip().isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)")
    return int(text)


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: ``<prog> <package version>``."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def add_logging(
    parser: argparse.ArgumentParser,
    environ: Mapping[str, str],
    warnings: list[str] | None = None,
    old_level_env: str | None = None,
) -> None:
    """``--log-level`` (its choices in ``--help``) and ``--log-format text|json``."""
    for option, valid, old, text in (
        ("log-level", LOG_LEVELS, old_level_env, "log messages at this level and above"),
        ("log-format", LOG_FORMATS, None, "text, or json: one JSON object per line, UTC times"),
    ):
        env = env_vars.for_option(option)
        value, warning = env_vars.lookup(environ, env, () if old is None else (old,))
        if warning is not None and warnings is not None:
            warnings.append(warning)
        fallback = "info" if option == "log-level" else "text"
        # A string default goes through ``type`` too: a bad variable is refused like a flag.
        parser.add_argument(
            f"--{option}",
            metavar="{" + ",".join(valid) + "}",
            type=_one_of(valid),
            default=fallback if value is None else value,
            help=f"{text} {env_help(env, fallback)}",
        )


def configure_logging(level: str, log_format: str) -> None:
    """The root logger at ``level`` in ``log_format``; request chatter only with ``debug``."""
    logs.configure(log_format)
    numeric = logging.getLevelName(level.upper())
    logging.getLogger().setLevel(numeric if isinstance(numeric, int) else logging.INFO)
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def apply_env_defaults(
    parser: argparse.ArgumentParser,
    environ: Mapping[str, str],
    *,
    skip: Collection[str] = (),
    shown: Mapping[str, str] | None = None,
    old_prefix: str = "",
    warnings: list[str] | None = None,
) -> None:
    """Give every visible option not yet tied to a variable its ``ENFLAME_<OPTION>`` default.

    ``skip``: destinations that are commands, not settings (``--once``). ``shown``: the default
    to print where the code computes one (the host name). ``old_prefix``: the program's old
    prefix (``EXTENDER_``), still read with a warning. A value the option's type refuses stops
    the program, naming the variable.
    """
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        help_text = action.help or ""
        if (
            not longs
            or action.dest in skip
            or help_text == argparse.SUPPRESS
            or "[env " in help_text
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            continue
        option = longs[0][2:]
        env = env_vars.for_option(option)
        old = (old_prefix + option.upper().replace("-", "_"),) if old_prefix else ()
        value, warning = env_vars.lookup(environ, env, old)
        default = (shown or {}).get(action.dest, _shown(action.default))
        action.help = f"{help_text} {env_help(env, default)}".strip()
        if value is None:
            continue
        if warning is not None and warnings is not None:
            warnings.append(warning)
        action.default = _from_env(parser, action, env, value)


def _shown(default: Any) -> str:
    if default is None or default == "" or isinstance(default, bool):
        return "unset" if not isinstance(default, bool) else str(default).lower()
    return str(default)


def _from_env(
    parser: argparse.ArgumentParser, action: argparse.Action, env: str, value: str
) -> Any:
    """The option's default from ``value``, checked as its command-line value would be."""
    if action.nargs == 0:  # a switch
        if value.strip().lower() not in (*_TRUE, *_FALSE):
            parser.error(f"invalid {env}: {value!r} is not a boolean (true/false, 1/0)")
        return value.strip().lower() in _TRUE
    try:
        parsed = action.type(value) if callable(action.type) else value
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(f"invalid {env}: {value!r}: {exc}")
    if action.choices is not None and parsed not in action.choices:
        choices = ", ".join(map(str, action.choices))
        parser.error(f"invalid {env}: {value!r} is not one of {choices}")
    return parsed


def stderr_warnings(prog: str, warnings: Sequence[str]) -> None:
    """Each warning as one ``<prog>: warning: ...`` line on stderr (before logging is set up)."""
    for warning in warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr, flush=True)
