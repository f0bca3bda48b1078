"""Which container engines a host has and where their configs live (reloading: :mod:`reload`)."""

from __future__ import annotations

import os

from enflame_gcu import fileio
from enflame_gcu.errors import EngineConfigError

DEFAULT_CONFIGS = {
    "docker": "/etc/docker/daemon.json",
    "containerd": "/etc/containerd/config.toml",
    "crio": "/etc/crio/crio.conf",
}

# Any one of these under the host root means the engine is installed or running.
MARKERS = {
    "docker": (
        "/usr/bin/dockerd",
        "/usr/local/bin/dockerd",
        "/etc/docker",
        "/var/run/docker.sock",
        "/run/docker.sock",
    ),
    "containerd": (
        "/usr/bin/containerd",
        "/usr/local/bin/containerd",
        "/etc/containerd",
        "/run/containerd/containerd.sock",
    ),
    "crio": (
        "/usr/bin/crio",
        "/usr/local/bin/crio",
        "/etc/crio",
        "/var/run/crio/crio.sock",
        "/run/crio/crio.sock",
    ),
}


def detect(host_root: str = "/") -> list[str]:
    """Names of the engines found under ``host_root``, in the order docker, containerd, crio."""
    return [
        engine
        for engine, markers in MARKERS.items()
        if any(os.path.lexists(fileio.resolve(host_root, m, follow=False)) for m in markers)
    ]


def default_config_path(engine: str, host_root: str = "/") -> str:
    """The engine's main config file under ``host_root``: its directories resolved in the jail.

    The file itself may be a symlink: the editors follow it (inside the jail) when they read
    and write, so the link stays a link.
    """
    if engine not in DEFAULT_CONFIGS:
        raise EngineConfigError(f"unknown engine {engine!r}; known: {', '.join(DEFAULT_CONFIGS)}")
    return fileio.resolve(host_root, DEFAULT_CONFIGS[engine], follow=False)
