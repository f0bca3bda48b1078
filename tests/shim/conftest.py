"""Fixtures for runtime unit tests: OCI bundles (no rootfs needed) and runtime configs."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from enflame_gcu import naming
from enflame_gcu.shim import config as runtime_config

# A complete, schema-valid spec in the shape `runc spec` writes, with an unknown extra field.
BASE_SPEC: dict[str, Any] = {
    "ociVersion": "1.0.2-dev",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": ["ls", "/dev"],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"],
        "cwd": "/",
        "capabilities": {
            "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
        },
        "noNewPrivileges": True,
    },
    "root": {"path": "rootfs", "readonly": True},
    "hostname": "runc",
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": "pid"}, {"type": "mount"}],
        "x-unknown-linux-field": {"kept": True},
    },
    "x-unknown-top-field": [1, 2, 3],
}

MakeBundle = Callable[..., str]
# The OCI mount containerd writes for the device plugin's read-only /dev/null bind.
PLUGIN_MOUNT_OPTIONS = ("rbind", "rprivate", "ro")


def plugin_mount(name: str) -> dict[str, Any]:
    """A device-list volume mount exactly as the device plugin's Allocate makes it reach a spec."""
    return {
        "destination": f"{naming.VOLUME_MOUNT_DIR}/{name}",
        "type": "bind",
        "source": "/dev/null",
        "options": list(PLUGIN_MOUNT_OPTIONS),
    }


WriteConfig = Callable[..., str]


def make_spec(
    env: list[str] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    privileged: bool = False,
) -> dict[str, Any]:
    """A copy of BASE_SPEC with extra env, mounts, annotations, or CAP_SYS_ADMIN."""
    spec = copy.deepcopy(BASE_SPEC)
    spec["process"]["env"].extend(env or [])
    spec["mounts"].extend(mounts or [])
    if annotations:
        spec["annotations"] = dict(annotations)
    if privileged:
        for key in ("bounding", "effective", "permitted"):
            spec["process"]["capabilities"][key].append("CAP_SYS_ADMIN")
    return spec


@pytest.fixture
def make_bundle(tmp_path_factory: pytest.TempPathFactory) -> MakeBundle:
    """Write a bundle dir with config.json made by :func:`make_spec`; returns the bundle path."""

    def make(**kwargs: Any) -> str:
        bundle = str(tmp_path_factory.mktemp("bundle"))
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(make_spec(**kwargs), handle, indent=2)
        return bundle

    return make


@pytest.fixture
def write_config(tmp_path_factory: pytest.TempPathFactory) -> WriteConfig:
    """Write a runtime config.toml from keyword values; returns its path."""

    def write(**values: Any) -> str:
        directory = str(tmp_path_factory.mktemp("rtconfig"))
        keyed = {key.replace("_", "-"): value for key, value in values.items()}
        keyed.setdefault("log-file", os.path.join(directory, "runtime.log"))
        lines = [f"{key} = {json.dumps(value)}" for key, value in keyed.items()]
        path = os.path.join(directory, "config.toml")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        return path

    return write


@pytest.fixture
def node_config(vendor_node: str, tmp_path: os.PathLike[str]) -> runtime_config.RuntimeConfig:
    """A runtime config pointing at the simulated vendor 8-card node."""
    return runtime_config.RuntimeConfig(
        root=vendor_node, log_file=os.path.join(str(tmp_path), "runtime.log")
    )
