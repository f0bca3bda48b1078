"""Run a busybox command in a real runc container through ``enflame-container-runtime``.

Used by the demo to show what a pod's container really gets: a bundle made from ``runc spec``
and busybox-static, the env, mounts and annotations of an Allocate answer added the way the
kubelet and containerd would, and our runtime (configured to look at a simulated node) in front
of the real runc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CONFIG_ENV = "ENFLAME_CONTAINER_RUNTIME_CONFIG"
BUSYBOX_APPLETS = ("sh", "ls", "cat", "true", "echo")


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount the kubelet asked for (Allocate's Mount)."""

    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerRun:
    """What a container run printed and how it ended."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def missing_tools() -> list[str]:
    """What is missing to run real containers here (empty when runc and busybox exist)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("real containers need root")
    if not _runc():
        problems.append("runc is not installed")
    if not os.path.exists(_busybox()):
        problems.append("busybox-static is not installed")
    return problems


def _runc() -> str | None:
    return shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")


def _busybox() -> str:
    return shutil.which("busybox") or "/bin/busybox"


def runtime_wrapper() -> str:
    """The ``enflame-container-runtime`` installed next to this interpreter."""
    return os.path.join(os.path.dirname(sys.executable), "enflame-container-runtime")


def _bundle(
    work: str,
    args: Iterable[str],
    env: Mapping[str, str],
    mounts: Iterable[Mount],
    annotations: Mapping[str, str],
) -> str:
    bundle = os.path.join(work, f"bundle-{uuid.uuid4().hex[:8]}")
    os.makedirs(os.path.join(bundle, "rootfs", "bin"))
    subprocess.run([str(_runc()), "spec", "--bundle", bundle], check=True)
    shutil.copy2(_busybox(), os.path.join(bundle, "rootfs", "bin", "busybox"))
    for applet in BUSYBOX_APPLETS:
        os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", applet))
    path = os.path.join(bundle, "config.json")
    with open(path, encoding="utf-8") as handle:
        spec: dict[str, Any] = json.load(handle)
    spec["process"].update(terminal=False, args=list(args))
    spec["process"]["env"].extend(f"{key}={value}" for key, value in env.items())
    spec["mounts"].extend(
        {
            "destination": m.container_path,
            "type": "bind",
            "source": m.host_path,
            "options": ["rbind", "ro"] if m.read_only else ["rbind"],
        }
        for m in mounts
    )
    if annotations:
        spec["annotations"] = dict(annotations)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle, indent=1)
    return bundle


def run(
    node_root: str,
    work: str,
    args: Iterable[str],
    *,
    env: Mapping[str, str] | None = None,
    mounts: Iterable[Mount] = (),
    annotations: Mapping[str, str] | None = None,
) -> ContainerRun:
    """``runc run`` ``args`` in a busybox container through our runtime; foreground, removed after.

    The runtime's config points at ``node_root`` (a simulated node) and at the real runc.
    """
    os.makedirs(work, exist_ok=True)
    bundle = _bundle(work, args, env or {}, mounts, annotations or {})
    config = os.path.join(work, "runtime-config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(f"runtimes = [{json.dumps(_runc())}]\n")
        handle.write(f"root = {json.dumps(node_root)}\n")
        handle.write(f"log-file = {json.dumps(os.path.join(work, 'runtime.log'))}\n")
    state = os.path.join(work, "runc-state")
    argv = (
        runtime_wrapper(),
        "--root",
        state,
        "run",
        "--bundle",
        bundle,
        f"demo-{uuid.uuid4().hex[:8]}",
    )
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, **{CONFIG_ENV: config}),
    )
    return ContainerRun(argv, result.returncode, result.stdout, result.stderr)
