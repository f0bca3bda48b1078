"""Fake host roots for the installer, install.sh and doctor tests, and a tree snapshot."""

from __future__ import annotations

import os
import shutil
import stat
import sys

DAEMON_JSON = """\
{
    "log-driver": "json-file",
    "features": {"buildkit": true},
    "data-root": "/var/lib/docker"
}
"""

CONTAINERD_V2 = """\
# containerd config written by the node's provisioning; keep this comment.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""

CRIO_CONF = """\
[crio.runtime]
default_runtime = "runc"

[crio.runtime.runtimes.runc]
runtime_path = "/usr/bin/runc"
runtime_type = "oci"
runtime_root = "/run/runc"
"""

Snapshot = dict[str, tuple[str, int, str]]


def write(root: str, path: str, text: str, mode: int = 0o644) -> str:
    """Write ``text`` to ``path`` under ``root``; returns the local path."""
    local = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(local), exist_ok=True)
    with open(local, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(local, mode)
    return local


def fake_host(
    root: str, *, docker: bool = True, containerd: bool = True, crio: bool = False
) -> str:
    """A host with the given engines (marker binaries + configs) and a /usr/bin/python3."""
    if docker:
        write(root, "/usr/bin/dockerd", "#!/bin/sh\n", 0o755)
        write(root, "/etc/docker/daemon.json", DAEMON_JSON)
    if containerd:
        write(root, "/usr/bin/containerd", "#!/bin/sh\n", 0o755)
        write(root, "/etc/containerd/config.toml", CONTAINERD_V2)
    if crio:
        write(root, "/usr/bin/crio", "#!/bin/sh\n", 0o755)
        write(root, "/etc/crio/crio.conf", CRIO_CONF)
    # The launcher runs with the host's python3; the real one stands in for it. Not a link to
    # it: an absolute link is followed inside the host root (a jail), so it would dangle.
    # Laid out as Debian does: python3 -> python3.X, which tells the installer the version.
    real = shutil.which("python3") or "/usr/bin/python3"
    versioned = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    write(root, f"/usr/bin/{versioned}", f'#!/bin/sh\nexec {real} "$@"\n', 0o755)
    os.symlink(versioned, os.path.join(root, "usr/bin/python3"))
    return root


def snapshot(root: str) -> Snapshot:
    """Every path under ``root`` with its type, permission bits and content or link target."""
    found: Snapshot = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            local = os.path.join(directory, name)
            rel = os.path.relpath(local, root)
            info = os.lstat(local)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", mode, os.readlink(local))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", mode, "")
            elif stat.S_ISCHR(info.st_mode):  # a simulated GCU node: compare its numbers
                found[rel] = ("char", mode, f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}")
            else:
                with open(local, "rb") as handle:
                    found[rel] = ("file", mode, handle.read().decode("utf-8", "replace"))
    return found


def diff(before: Snapshot, after: Snapshot) -> list[str]:
    """Readable differences between two snapshots (empty when identical)."""
    lines = [f"only before: {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"only after: {p}" for p in sorted(after.keys() - before.keys())]
    lines += [
        f"changed: {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]
    ]
    return lines


def wheel_args(wheelhouse: str) -> tuple[str, ...]:
    """install.sh's options to install our wheel from ``wheelhouse`` and nothing else."""
    [wheel] = [n for n in os.listdir(wheelhouse) if n.startswith("enflame_gcu-")]
    return ("--wheel", os.path.join(wheelhouse, wheel),
            "--pip-args", f"--no-index --find-links {wheelhouse}")  # fmt: skip
