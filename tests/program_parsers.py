"""Every command-line parser we ship, walked subcommand by subcommand, for the grammar tests."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from enflame_gcu.container_toolkit import cli
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import main as plugin_main
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.dra_plugin import main as dra_main


@dataclass(frozen=True)
class Found:
    """One parser: its command path, the help its parent gave it, the choices it declares."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str | None
    # Choices an option's own parser enforces (argparse does not see them): dest -> values.
    declared: dict[str, tuple[str, ...]]


def walk(
    parser: argparse.ArgumentParser,
    path: tuple[str, ...],
    declared: dict[str, tuple[str, ...]] | None = None,
    helptext: str | None = None,
) -> list[Found]:
    """The parser and every subcommand's parser below it (each with the help it is listed with)."""
    # A subcommand must be described where its parent lists it; a program, by its description.
    shown = parser.description if helptext is None else helptext
    found = [Found(path, parser, shown, declared or {})]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                found.extend(walk(child, (*path, name), None, helps.get(name) or ""))
    return found


def _device_plugin() -> list[Found]:
    declared = {o.field: tuple(c for c in o.choices if c) for o in plugin_config.OPTIONS}
    return walk(plugin_main.build_parser(), ("enflame-device-plugin",), declared)


# Every program with a parser (enflame-container-runtime has none: it takes runc's grammar and
# passes everything but --version through; see tests/shim for its --version).
PROGRAMS: dict[str, Callable[[], list[Found]]] = {
    "enflame-ctk": lambda: walk(cli.build_parser(), ("enflame-ctk",)),
    "enflame-device-plugin": _device_plugin,
    "enflame-dra-plugin": lambda: [
        *walk(dra_config.build_parser({}), ("enflame-dra-plugin",)),
        *walk(dra_main.cleanup_parser(), ("enflame-dra-plugin", "cleanup")),
    ],
}
