"""The one applier of container edits to an OCI spec, on plain dicts, standard library only.

Input is the rendering :meth:`edits.ContainerEdits.to_cdi` makes (a CDI ``containerEdits``
object: ``deviceNodes``, ``env``, ``mounts``). ``ContainerEdits.apply_to`` renders and calls
:func:`apply`; the runtime's prepared-edits fast path calls it on nodes read from the prepared
CDI rendering, so every path injects the same entries. No ``dataclasses``/``typing`` here: the
runtime imports this module on every ``create`` and each of those costs milliseconds there.
"""

from __future__ import annotations

from enflame_gcu import naming

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Options of a bind mount in the OCI spec; CDI renders read-only as "ro" among its options.
_BIND_OPTIONS = ("rbind", "nosuid", "nodev")


def apply(
    spec: dict[str, Any],
    rendered: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> None:
    """Add rendered edits to an OCI spec in place, keeping every unknown field.

    Order (devices, env, mounts, annotations) is fixed, so equal edits give equal JSON bytes.
    """
    # Only touch linux.* when there are nodes: edits without devices (mounts/env only)
    # must not add empty lists to a spec.
    nodes = rendered.get("deviceNodes")
    if nodes:
        add_device_nodes(spec, nodes)
    env = rendered.get("env")
    if env:
        set_env(spec, env)
    mounts = rendered.get("mounts")
    if mounts:
        add_mounts(spec, mounts)
    if annotations:
        spec.setdefault("annotations", {}).update(annotations)


def add_device_nodes(spec: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    """A ``linux.devices`` entry per node plus its ``linux.resources.devices`` allow rule.

    runc does not derive the cgroup rule from the device list, so both are always written.
    """
    linux = spec.setdefault("linux", {})
    spec_devices: list[dict[str, Any]] = linux.setdefault("devices", [])
    existing = {entry.get("path") for entry in spec_devices}
    rules: list[dict[str, Any]] = linux.setdefault("resources", {}).setdefault("devices", [])
    for node in nodes:
        kind = node.get("type", "c")
        if node["path"] not in existing:
            entry: dict[str, Any] = {
                "path": node["path"],
                "type": kind,
                "major": node["major"],
                "minor": node["minor"],
            }
            for key in ("fileMode", "uid", "gid"):
                if node.get(key) is not None:
                    entry[key] = node[key]
            spec_devices.append(entry)
            existing.add(node["path"])
        rule = {
            "allow": True,
            "type": kind,
            "major": node["major"],
            "minor": node["minor"],
            "access": node.get("permissions", "rwm"),
        }
        if rule not in rules:
            rules.append(rule)


def set_env(spec: dict[str, Any], env: list[str]) -> None:
    """Set ``KEY=VALUE`` items in ``process.env``, dropping earlier definitions of each key."""
    process = spec.setdefault("process", {})
    env_list: list[str] = process.setdefault("env", [])
    keys = {item.partition("=")[0] for item in env}
    env_list[:] = [item for item in env_list if item.partition("=")[0] not in keys]
    env_list.extend(env)


def add_mounts(spec: dict[str, Any], mounts: list[dict[str, Any]]) -> None:
    """Bind mounts from CDI-rendered mounts; a destination the spec already has is kept."""
    spec_mounts: list[dict[str, Any]] = spec.setdefault("mounts", [])
    taken = {mount.get("destination") for mount in spec_mounts}
    for mount in mounts:
        if mount["containerPath"] in taken:
            continue
        read_only = "ro" in (mount.get("options") or ())
        spec_mounts.append(
            {
                "destination": mount["containerPath"],
                "type": "bind",
                "source": mount["hostPath"],
                "options": [*_BIND_OPTIONS, "ro"] if read_only else list(_BIND_OPTIONS),
            }
        )


def is_processed(spec: dict[str, Any]) -> bool:
    """True when an earlier run already edited this spec."""
    return naming.PROCESSED_ANNOTATION in (spec.get("annotations") or {})


def mark_processed(spec: dict[str, Any], value: str) -> None:
    """Record that the spec was edited (and with which devices), so it is never edited twice."""
    spec.setdefault("annotations", {})[naming.PROCESSED_ANNOTATION] = value
