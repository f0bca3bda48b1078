"""Choose a node's mode from its engine and version (install.sh, the toolkit DaemonSet, doctor).

The engine is the one the kubelet talks to when the node runs a kubelet (its CRI endpoint, read
by :mod:`.engines.cri` as doctor and deploy/k8s-config.sh read it), else the first engine
found; its version comes from the engine's own binary (``chroot HOST_ROOT <binary> --version``
from a container). See :mod:`enflame_gcu.node_modes` for the matrix itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence

from enflame_gcu import fileio, node_modes
from enflame_gcu.container_toolkit.doctor import engine_configs
from enflame_gcu.container_toolkit.engines import containerd_api, cri, hosts
from enflame_gcu.errors import InstallError

KUBELET_DIR = node_modes.KUBELET_EVIDENCE
BINARIES = {
    "containerd": ("/usr/bin/containerd", "/usr/local/bin/containerd"),
    "crio": ("/usr/bin/crio", "/usr/local/bin/crio"),
    "docker": ("/usr/bin/dockerd", "/usr/local/bin/dockerd"),
    "podman": ("/usr/bin/podman", "/usr/local/bin/podman"),
}


def engine_version(
    root: str, engine: str, containerd: hosts.ContainerdSite | None = None
) -> tuple[int, int] | None:
    """(major, minor) of ``engine`` under ``root``; None when it cannot be told.

    containerd is asked over its socket first (``containerd``'s, k3s/RKE2 included: their
    binary is not on the host's PATH), then its binary; other engines by their binary.
    A socket path that leads out of the root or is no socket raises (EnflameError).
    """
    if engine == "containerd":
        socket = (containerd or hosts.ContainerdSite()).socket
        answered = containerd_api.major_minor(containerd_api.version(root, socket))
        if answered is not None:
            return answered
    found = next(
        (p for p in BINARIES.get(engine, ()) if os.path.isfile(fileio.resolve(root, p))), None
    )
    if found is None:
        return None
    command = [fileio.resolve(root, found), "--version"]
    if root not in ("", "/"):
        command = ["chroot", root, found, "--version"]  # the host's binary with its own libc
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(?:^|\s)v?(\d+)\.(\d+)(?:\.\d+)?", result.stdout + result.stderr)
    return (int(match[1]), int(match[2])) if match else None


_NO_VIEW = engine_configs.EngineView("", None, False, None)


def _installed(root: str, containerd: hosts.ContainerdSite | None) -> list[str]:
    found = list(hosts.detect(root, containerd))
    if any(os.path.exists(fileio.resolve(root, p)) for p in BINARIES["podman"]):
        found.append("podman")
    return found


def detect(
    root: str,
    asked: Sequence[str] | None = None,
    containerd: hosts.ContainerdSite | None = None,
) -> node_modes.Engine:
    """The node's engine as :func:`node_modes.choose` needs it (``containerd``: its paths)."""
    kubelet = os.path.isdir(fileio.resolve(root, KUBELET_DIR))
    found = list(asked) if asked else _installed(root, containerd)
    name = ""
    if kubelet:
        # The kubelet's CRI endpoint, read as doctor and k8s-config.sh read it (engines.cri).
        endpoint = cri.kubelet_endpoint(root)
        said = endpoint.engine if endpoint is not None else None
        # docker's own containerd runs with its CRI plugin disabled: no kubelet can talk to it.
        seen = {v.engine: v for v in engine_configs.read_engines(root, containerd)}
        runs_cri = [
            e
            for e in found
            if e == "crio" or (e == "containerd" and not seen.get(e, _NO_VIEW).cri_disabled)
        ]
        name = said if said in found else (runs_cri[0] if runs_cri else "")
    if not name:
        # Without a kubelet: docker first (it also brings a containerd), then podman.
        order = ("docker", "podman", "crio", "containerd")
        name = next((e for e in order if e in found), "")
    cdi_enabled = None
    if name == "containerd":
        views = engine_configs.read_engines(root, containerd)
        views = tuple(v for v in views if v.engine == "containerd")
        cdi_enabled = views[0].cdi_enabled if views else None
    version = engine_version(root, name, containerd) if name else None
    return node_modes.Engine(name, version, cdi_enabled, kubelet)


def decide(root: str, asked_mode: str, engine: node_modes.Engine) -> node_modes.Record:
    """The mode for this node: ``auto`` chooses, an explicit mode is checked (InstallError)."""
    version = ".".join(map(str, engine.version)) if engine.version else ""
    chosen_by = "explicit"
    if asked_mode == node_modes.AUTO:
        try:
            choice = node_modes.read_choice(root)
        except ValueError as exc:
            raise InstallError(f"{exc}; nothing was changed") from exc
        if choice is None:
            mode, reason = node_modes.choose(engine)
            problem = node_modes.refuse(mode, engine)
            if problem is not None:  # no mode works here: said, not installed
                raise InstallError(f"--mode auto found no mode that works: {problem}; "
                                   "nothing was changed")  # fmt: skip
            return node_modes.Record(mode, engine.name, version, "auto", reason)
        asked_mode, chosen_by = choice, f"this node's {node_modes.CHOICE_FILE}"
    problem = node_modes.refuse(asked_mode, engine)
    if problem is not None:
        raise InstallError(f"{problem}; nothing was changed (choose another --mode, or auto)")
    reason = f"chosen explicitly ({chosen_by}) for {engine.describe()}"
    return node_modes.Record(asked_mode, engine.name, version, chosen_by, reason)


# How long a freshly started plugin may take to set up its SIGHUP handler (imports, config).
HANDLER_WAIT_SECONDS = 10.0


def _plugin_flags(argv: Sequence[str]) -> dict[str, str] | None:
    """The ``--flag value`` pairs of an enflame-device-plugin command line; None for others."""
    names = [os.path.basename(word) for word in argv[:2]]
    if "enflame-device-plugin" in names:
        start = names.index("enflame-device-plugin") + 1
    elif "enflame_gcu.device_plugin.main" in argv[:4]:
        start = list(argv).index("enflame_gcu.device_plugin.main") + 1
    else:
        return None
    flags: dict[str, str] = {}
    words = list(argv[start:])
    for index, word in enumerate(words):
        name, sep, value = word.partition("=")
        if not sep and index + 1 < len(words) and not words[index + 1].startswith("-"):
            value = words[index + 1]
        flags.setdefault(name, value)
    return flags


def catches_sighup(proc: str, pid: str) -> bool | None:
    """Whether process ``pid`` has a SIGHUP handler (``SigCgt`` in its status); None when it
    is gone. Until it has one, SIGHUP would kill it (the default action)."""
    try:
        status = fileio.read_regular(os.path.join(proc, pid, "status"), 1 << 16).decode("latin-1")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGHUP - 1) & 1)
    return False


def _wait_for_handler(proc: str, pid: str, deadline: float) -> bool | None:
    while True:
        caught = catches_sighup(proc, pid)
        if caught is not False or time.monotonic() >= deadline:
            return caught
        time.sleep(0.05)


def _argv(proc: str, pid: str) -> list[str] | None:
    try:
        raw = fileio.read_regular(os.path.join(proc, pid, "cmdline"), 4 << 20)
    except OSError:
        return None
    return [w for w in raw.decode("utf-8", "replace").split("\0") if w]


def _reads_record(proc: str, pid: str, argv: Sequence[str], ours: os.stat_result) -> bool:
    """Whether ``argv`` is a plugin in ``--node-mode=auto`` whose record is the file ``ours``."""
    flags = _plugin_flags(argv)
    if flags is None or flags.get("--node-mode") != node_modes.AUTO:
        return False
    their_root = flags.get("--host-root") or "/"
    theirs = os.path.join(proc, pid, "root", their_root.lstrip("/"), node_modes.MODE_FILE[1:])
    try:
        seen = os.stat(theirs)
    except OSError:
        return False
    return (seen.st_dev, seen.st_ino) == (ours.st_dev, ours.st_ino)


@contextlib.contextmanager
def _pidfd(proc: str, pid: int) -> Iterator[int | None]:
    """A pidfd for ``pid`` (None when ``proc`` is not this kernel's /proc, or pidfds are not
    available: the re-check before the signal is then the only guard)."""
    fd = None
    if os.path.realpath(proc) == "/proc" and hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def notify_plugins(
    root: str, proc: str = "/proc", wait: float = HANDLER_WAIT_SECONDS
) -> list[tuple[int, bool]]:
    """SIGHUP every device plugin in ``--node-mode=auto`` that reads the record under ``root``;
    ``(pid, told)`` for each one found.

    A plugin qualifies only when the record it would read (through ``/proc/PID/root`` and its
    own ``--host-root``) is the very file just written (same device and inode), so plugins of
    other nodes, tests or host roots on the same machine are never signalled. SIGHUP makes the
    plugin re-resolve its settings without ending its registration (device_plugin.runner).
    A plugin still starting has no handler yet and would be killed by the signal: it is waited
    for (``wait`` seconds in all), and left alone (``told`` False) when it never gets one.
    """
    try:
        ours = os.stat(node_modes.local_path(root))
    except OSError:
        return []
    told: list[tuple[int, bool]] = []
    deadline = time.monotonic() + wait
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        # A pidfd taken before the checks names the process they are made on: when it exits
        # and its PID is reused meanwhile, the signal fails instead of reaching the newcomer.
        with _pidfd(proc, int(entry)) as pidfd:
            argv = _argv(proc, entry)
            if argv is None or not _reads_record(proc, entry, argv, ours):
                continue
            caught = _wait_for_handler(proc, entry, deadline)
            if caught is None:
                continue  # gone meanwhile
            if not caught:
                told.append((int(entry), False))
                continue
            # Up to ``wait`` seconds passed: the PID must still run the very plugin found
            # (same command line, same record), or it is not signalled.
            if _argv(proc, entry) != argv or not _reads_record(proc, entry, argv, ours):
                continue
            with contextlib.suppress(ProcessLookupError):
                if pidfd is None:
                    os.kill(int(entry), signal.SIGHUP)
                else:
                    signal.pidfd_send_signal(pidfd, signal.SIGHUP)
                told.append((int(entry), True))
    return told
