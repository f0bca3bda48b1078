"""What the node's processes were started with: command lines, flags and kubelet settings."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import yaml

from enflame_gcu import fileio
from enflame_gcu.container_toolkit.doctor.model import Node
from enflame_gcu.errors import EnflameError
from enflame_gcu.support import env_vars

KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
# A command line or environment longer than this is skipped (the kernel allows 2 MiB).
_PROC_LIMIT = 4 << 20


def _read_proc(root: str, pid: str, name: str) -> bytes:
    return fileio.read_regular(fileio.resolve(root, f"/proc/{pid}/{name}"), _PROC_LIMIT)


def read_processes(root: str) -> tuple[tuple[str, ...], ...]:
    """Command lines of the processes under ``root``/proc (the host's, with hostPID)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(fileio.resolve(root, "/proc")):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                raw = _read_proc(root, entry, "cmdline")
                words = raw.decode("utf-8", "replace").split("\0")
                if words and words[0]:
                    found.append(tuple(w for w in words if w))
    return tuple(found)


def flags(node: Node, program: str) -> Iterator[tuple[str, str]]:
    """``(--flag, value)`` pairs of running ``program`` processes (``--a=b`` and ``--a b``)."""
    for words in node.processes:
        # A console script runs as "python /path/to/program ARGS": its name is the second word.
        if os.path.basename(words[0]) == program:
            first = 1
        elif len(words) > 1 and os.path.basename(words[1]) == program:
            first = 2
        else:
            continue
        for index, word in enumerate(words[first:], start=first):
            name, sep, value = word.partition("=")
            if not sep and index + 1 < len(words) and not words[index + 1].startswith("-"):
                value = words[index + 1]
            yield name, value


def kubelet_setting(node: Node, key: str, flag: str) -> Any:
    """A kubelet setting: its command-line flag wins over its config file."""
    for name, value in flags(node, "kubelet"):
        if name == flag:
            return value
    config = dict(flags(node, "kubelet")).get("--config", KUBELET_CONFIG)
    try:
        data = fileio.parse_bounded(yaml.safe_load, fileio.read_text(node.path(config)), config)
    except (OSError, yaml.YAMLError, ValueError, EnflameError):
        return None
    return data.get(key) if isinstance(data, dict) else None


PLUGIN = "enflame-device-plugin"
PLUGIN_MODULES = ("enflame_gcu.device_plugin.main", "enflame_gcu.device_plugin")


def plugin_arguments(words: tuple[str, ...]) -> tuple[str, ...] | None:
    """The plugin's own arguments when ``words`` is a device plugin process, else None.

    However it was started: the console script (``enflame-device-plugin``, or the interpreter
    running it, as the kernel shows a script with a ``#!`` line), ``python -m
    enflame_gcu.device_plugin.main``, or the image's entrypoint (the console script).
    """
    for index, word in enumerate(words[:3]):
        if os.path.basename(word) == PLUGIN:
            return words[index + 1 :]
    for index, word in enumerate(words[:-1]):
        if word == "-m" and words[index + 1] in PLUGIN_MODULES:
            return words[index + 2 :]
    return None


def _plugin_pids(root: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    with contextlib.suppress(OSError):
        for entry in os.listdir(fileio.resolve(root, "/proc")):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                raw = _read_proc(root, entry, "cmdline")
                words = tuple(w for w in raw.decode("utf-8", "replace").split("\0") if w)
                arguments = plugin_arguments(words)
                if arguments is not None:
                    yield entry, arguments


def _environ(root: str, pid: str) -> dict[str, str]:
    try:
        raw = _read_proc(root, pid, "environ").decode("utf-8", "replace")
    except (OSError, EnflameError):
        return {}
    return dict(item.partition("=")[::2] for item in raw.split("\0") if "=" in item)


def _config_flags(root: str, pid: str, path: str) -> dict[str, Any]:
    """The ``flags`` of the plugin's config file, read through the process's own root."""
    if not path.startswith("/"):
        return {}
    try:
        text = fileio.read_text(fileio.resolve(root, f"/proc/{pid}/root{path}"))
        data = fileio.parse_bounded(yaml.safe_load, text, path)
    except (OSError, yaml.YAMLError, ValueError, EnflameError):
        return {}
    found = data.get("flags") if isinstance(data, dict) else None
    return found if isinstance(found, dict) else {}


def plugin_switch(node: Node, flag: str, env: str, key: str) -> bool | None:
    """A device plugin on/off setting as the running plugin has it: None when none runs.

    Same precedence as the plugin: command line (``--x`` / ``--no-x``), environment, the
    config file's ``flags`` (``--config-file`` or ``ENFLAME_CONFIG_FILE``), default off.
    ``env`` is the setting's 0.1 variable name (``PASS_DEVICE_SPECS``).
    """
    seen = False
    for pid, arguments in _plugin_pids(node.root):
        seen = True
        value: bool | None = None
        config_file = ""
        for index, word in enumerate(arguments):
            name, sep, text = word.partition("=")
            if name == flag:
                value = (text.lower() in ("1", "true", "yes", "on")) if sep else True
            elif name == "--no-" + flag.removeprefix("--"):
                value = False
            elif name == "--config-file":
                following = arguments[index + 1] if index + 1 < len(arguments) else ""
                config_file = text if sep else following
        environ = _environ(node.root, pid)
        # The plugin's names first, then their 0.1 spellings it still reads (support.env_vars).
        given = env_vars.lookup(environ, env_vars.for_option(flag.removeprefix("--")), (env,))[0]
        if value is None and given:
            value = given.strip().lower() in ("1", "true", "yes", "on")
        named = env_vars.lookup(environ, "ENFLAME_CONFIG_FILE", ("CONFIG_FILE",))[0]
        config_file = config_file or named or ""
        if value is None and config_file:
            setting = _config_flags(node.root, pid, config_file).get(key)
            value = setting if isinstance(setting, bool) else None
        if value:
            return True
    return False if seen else None


def kubelet_known(node: Node) -> bool:
    """Whether there is a kubelet to ask: a running one, or its config file."""
    if any(os.path.basename(words[0]) == "kubelet" for words in node.processes):
        return True
    config = dict(flags(node, "kubelet")).get("--config", KUBELET_CONFIG)
    return os.path.isfile(node.path(config))
