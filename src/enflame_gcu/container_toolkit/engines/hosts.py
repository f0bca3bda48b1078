"""Which container engines a host has, where their configs live, and how to reload them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence

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

UNITS = {"docker": "docker", "containerd": "containerd", "crio": "crio"}
DOCKER_PID_FILES = ("/var/run/docker.pid", "/run/docker.pid")

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
Signaller = Callable[[int, int], None]


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


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=120)


def reload_engine(
    engine: str,
    runtimes_only: bool,
    host_root: str = "/",
    *,
    runner: Runner = _run,
    signaller: Signaller = os.kill,
    which: Callable[[str], str | None] = shutil.which,
) -> str:
    """Make ``engine`` load its new config; returns what was done, raises if it could not.

    dockerd reloads ``runtimes`` on SIGHUP but needs a restart for anything else; containerd
    and CRI-O always need a restart.
    """
    if engine == "docker" and runtimes_only:
        pid = _docker_pid(host_root)
        if pid is not None:
            signaller(pid, signal.SIGHUP)
            return f"sent SIGHUP to dockerd (pid {pid}) so it reloads its runtimes"
    unit = UNITS[engine]
    systemd_running = os.path.isdir(fileio.resolve(host_root, "/run/systemd/system"))
    if which("systemctl") is None or not systemd_running:
        raise EngineConfigError(
            f"the config was written, but {engine} was not restarted: systemd does not manage "
            f"this host from here; restart it yourself (e.g. `systemctl restart {unit}`)"
        )
    result = runner(["systemctl", "restart", unit])
    if result.returncode != 0:
        raise EngineConfigError(
            f"the config was written, but `systemctl restart {unit}` failed "
            f"(exit {result.returncode}): {result.stderr.strip()}"
        )
    return f"restarted {unit} with systemctl"


def _docker_pid(host_root: str) -> int | None:
    for pid_file in DOCKER_PID_FILES:
        try:
            with open(fileio.resolve(host_root, pid_file), encoding="ascii") as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            continue
    return None
