"""The values every doctor check shares: a check's Result and the Node it inspects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit.doctor import engine_configs

Status = Literal["pass", "warn", "fail"]
RANK: dict[str, int] = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True, slots=True)
class Result:
    """One check's verdict; ``fix`` is the command (or step) that resolves a warn or fail."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Node:
    """Everything the checks share: the root, the GCU inventory and the engines' configs."""

    root: str
    inventory: devices.Inventory
    engines: tuple[engine_configs.EngineView, ...]
    processes: tuple[tuple[str, ...], ...]
    # The device plugin's --device-list-strategy, when the operator named it to doctor.
    strategies: tuple[str, ...] | None = None

    def path(self, host_path: str, follow: bool = True) -> str:
        """``host_path`` as seen from here, its symlinks followed inside the root (a jail)."""
        return fileio.resolve(self.root, host_path, follow=follow)
