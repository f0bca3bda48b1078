"""Make a container engine load its new config: SIGHUP or systemctl, from the host or its pod.

The one place that reloads engines: ``enflame-ctk runtime configure --restart`` calls
:func:`reload`, the installer :func:`reload_or_warn` (chrooted into the host from a pod).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence

from enflame_gcu import fileio
from enflame_gcu.container_toolkit import engines
from enflame_gcu.errors import EnflameError, EngineConfigError

UNITS = {"docker": "docker", "containerd": "containerd", "crio": "crio"}
DOCKER_PID_FILES = ("/var/run/docker.pid", "/run/docker.pid")

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
Signaller = Callable[[int, int], None]


def reload(
    change: engines.Change, host_root: str = "/", units: tuple[str, ...] | None = None
) -> str:
    """Signal or restart the engine so it loads ``change``; returns what was done.

    ``units``: the systemd units that may run the engine (k3s: ``k3s``, ``k3s-agent``); the
    first one active is restarted. None: the engine's own unit.
    """
    runtimes_only = all(path.startswith("runtimes.") for path in change.paths)
    return signal_or_restart(change.engine, runtimes_only, host_root, units=units)


def reload_chrooted(
    change: engines.Change, host_root: str, units: tuple[str, ...] | None = None
) -> str:
    """Signal or restart the engine; from a container, systemctl runs chrooted into the host."""
    if host_root in ("", "/"):
        return reload(change, host_root, units)
    runtimes_only = all(path.startswith("runtimes.") for path in change.paths)

    def chrooted(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["chroot", host_root, *command],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def which(name: str) -> str | None:
        found = (f"{d}/{name}" for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"))
        return next((p for p in found if os.access(fileio.resolve(host_root, p), os.X_OK)), None)

    return signal_or_restart(
        change.engine, runtimes_only, host_root, runner=chrooted, which=which, units=units
    )


def reload_or_warn(
    change: engines.Change, host_root: str, units: tuple[str, ...] | None = None
) -> str:
    """What reloading did, or a warning line: the config change stands either way."""
    try:
        return reload_chrooted(change, host_root, units)
    except EnflameError as exc:
        return f"warning: {exc}"


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=120)


def signal_or_restart(
    engine: str,
    runtimes_only: bool,
    host_root: str = "/",
    *,
    runner: Runner = _run,
    signaller: Signaller = os.kill,
    which: Callable[[str], str | None] = shutil.which,
    units: tuple[str, ...] | None = None,
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
    candidates = units or (UNITS[engine],)
    unit = candidates[0]
    systemd_running = os.path.isdir(fileio.resolve(host_root, "/run/systemd/system"))
    if which("systemctl") is None or not systemd_running:
        raise EngineConfigError(
            f"the config was written, but {engine} was not restarted: systemd does not manage "
            f"this host from here; restart it yourself (e.g. `systemctl restart {unit}`)"
        )
    if len(candidates) > 1:
        # k3s/RKE2: a server runs k3s (rke2-server), an agent k3s-agent (rke2-agent).
        active = [
            u
            for u in candidates
            if runner(["systemctl", "is-active", "--quiet", u]).returncode == 0
        ]
        if not active:
            raise EngineConfigError(
                f"the config was written, but none of {', '.join(candidates)} is active, so "
                f"{engine} was not restarted; restart the one that runs it yourself"
            )
        unit = active[0]
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
            return int(fileio.read_regular(fileio.resolve(host_root, pid_file), 64).strip())
        except (OSError, ValueError, EnflameError):
            continue
    return None
