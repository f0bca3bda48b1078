"""Apply a ContainerAllocateResponse to an OCI spec the way kubelet + containerd do.

envs -> process.env; mounts -> bind mounts; annotations -> spec annotations; DeviceSpecs ->
linux.devices plus a cgroup allow rule (containerd stats the host node); cdi_devices -> the
named device's and the spec-wide containerEdits from the CDI spec files. The only deviation
from a real node: host paths are looked up under the simulated node's root.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from enflame_gcu import fileio


def _add_device(spec: dict[str, Any], node: dict[str, Any], access: str) -> None:
    linux = spec.setdefault("linux", {})
    entries = linux.setdefault("devices", [])
    if all(entry["path"] != node["path"] for entry in entries):
        entries.append(node)
    rule = {
        "allow": True,
        "type": "c",
        "major": node["major"],
        "minor": node["minor"],
        "access": access,
    }
    linux.setdefault("resources", {}).setdefault("devices", []).append(rule)


def _set_env(spec: dict[str, Any], key: str, value: str) -> None:
    env = [item for item in spec["process"]["env"] if item.partition("=")[0] != key]
    spec["process"]["env"] = [*env, f"{key}={value}"]


def apply_response(
    spec: dict[str, Any], response: Any, host_root: str, cdi_specs: list[dict[str, Any]]
) -> None:
    """Edit ``spec`` in place with everything a ContainerAllocateResponse asks for."""
    for key, value in response.envs.items():
        _set_env(spec, key, value)
    for mount in response.mounts:
        spec["mounts"].append(
            {
                "destination": mount.container_path,
                "type": "bind",
                "source": mount.host_path,
                "options": ["rbind", "ro" if mount.read_only else "rw"],
            }
        )
    if response.annotations:
        spec.setdefault("annotations", {}).update(dict(response.annotations))
    for device in response.devices:
        info = os.stat(fileio.host_path(host_root, device.host_path))
        assert stat.S_ISCHR(info.st_mode), device.host_path
        node = {
            "path": device.container_path,
            "type": "c",
            "major": os.major(info.st_rdev),
            "minor": os.minor(info.st_rdev),
            "fileMode": stat.S_IMODE(info.st_mode),
            "uid": info.st_uid,
            "gid": info.st_gid,
        }
        _add_device(spec, node, device.permissions)
    for cdi_device in response.cdi_devices:
        apply_cdi(spec, cdi_device.name, cdi_specs)


def apply_cdi(spec: dict[str, Any], qualified: str, cdi_specs: list[dict[str, Any]]) -> None:
    """Inject one fully qualified CDI device (``enflame.com/gcu=0``) as a CDI runtime would."""
    kind, _, name = qualified.partition("=")
    for cdi_spec in cdi_specs:
        if cdi_spec["kind"] != kind:
            continue
        for device in cdi_spec["devices"]:
            if device["name"] == name:
                for container_edits in (device["containerEdits"], cdi_spec["containerEdits"]):
                    _apply_cdi_edits(spec, container_edits)
                return
    raise AssertionError(f"CDI device {qualified} is not in any spec")


def _apply_cdi_edits(spec: dict[str, Any], container_edits: dict[str, Any]) -> None:
    for item in container_edits.get("env", []):
        key, _, value = item.partition("=")
        _set_env(spec, key, value)
    for node in container_edits.get("deviceNodes", []):
        entry = {
            key: node[key]
            for key in ("path", "type", "major", "minor", "fileMode", "uid", "gid")
            if key in node
        }
        _add_device(spec, entry, node.get("permissions", "rwm"))
    for mount in container_edits.get("mounts", []):
        spec["mounts"].append(
            {
                "destination": mount["containerPath"],
                "type": "bind",
                "source": mount["hostPath"],
                "options": ["rbind", *mount.get("options", [])],
            }
        )
