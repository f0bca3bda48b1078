"""What the node's processes were started with: command lines, flags and kubelet settings."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import yaml

from enflame_gcu import fileio
from enflame_gcu.container_toolkit.doctor.model import Node

KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"


def read_processes(root: str) -> tuple[tuple[str, ...], ...]:
    """Command lines of the processes under ``root``/proc (the host's, with hostPID)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(fileio.resolve(root, "/proc")):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                with open(fileio.resolve(root, f"/proc/{entry}/cmdline"), "rb") as handle:
                    words = handle.read().decode("utf-8", "replace").split("\0")
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
        with open(node.path(config), encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        return None
    return data.get(key) if isinstance(data, dict) else None
