"""The values every doctor check shares: a check's Result and the Node it inspects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit.doctor import engine_configs
from enflame_gcu.container_toolkit.engines import cri, hosts

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
    # The engine the kubelet runs, found as deploy/k8s-config.sh finds it (engines.cri).
    cri: cri.Detection | None = None
    # Where containerd keeps its config and socket (k3s, RKE2); None: the stock paths.
    containerd: hosts.ContainerdSite | None = None

    @property
    def checked_engines(self) -> tuple[engine_configs.EngineView, ...]:
        """The engines held to the GCU setup: the kubelet's when its endpoint names it, else all.

        An engine the kubelet does not use (docker next to a containerd kubelet) runs no pod,
        so its config does not decide whether pods get GCUs.
        """
        if self.cri is not None and self.cri.source == "kubelet":
            return tuple(view for view in self.engines if view.engine == self.cri.engine)
        return self.engines

    def path(self, host_path: str, follow: bool = True) -> str:
        """``host_path`` as seen from here, its symlinks followed inside the root (a jail)."""
        return fileio.resolve(self.root, host_path, follow=follow)
