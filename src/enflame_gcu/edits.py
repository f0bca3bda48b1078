"""One model of what a container gets: device nodes, env and mounts.

The device plugin's Allocate, the runtime shim and the CDI generator all build a
``ContainerEdits`` with :func:`for_devices` and render it their own way (``to_allocate``-style
translation in the gRPC service, :meth:`ContainerEdits.apply_to` for an OCI spec,
:meth:`ContainerEdits.to_cdi` for a CDI spec), so all three inject exactly the same things.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from enflame_gcu import devices, fileio, naming, oci_edits
from enflame_gcu.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class DeviceNodeEdit:
    """A character device to create inside the container, with its host identity."""

    path: str
    host_path: str
    major: int
    minor: int
    permissions: str = "rwm"
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True, slots=True)
class MountEdit:
    """A bind mount from the host into the container."""

    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """Device nodes, env and mounts for one container; merge with :meth:`merged`."""

    device_nodes: tuple[DeviceNodeEdit, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    annotations: tuple[tuple[str, str], ...] = field(default=())

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """Union of two edits: nodes and mounts by path (first wins), env by key (last wins)."""
        nodes = {node.path: node for node in reversed(other.device_nodes + self.device_nodes)}
        mounts = {m.container_path: m for m in reversed(other.mounts + self.mounts)}
        env = dict(self.env)
        env.update(other.env)
        notes = dict(self.annotations)
        notes.update(other.annotations)
        return ContainerEdits(
            device_nodes=tuple(sorted(nodes.values(), key=_node_order)),
            env=tuple(env.items()),
            mounts=tuple(mounts[path] for path in sorted(mounts)),
            annotations=tuple(notes.items()),
        )

    def apply_to(self, spec: dict[str, Any]) -> None:
        """Add these edits to an OCI runtime spec in place, keeping every unknown field.

        Renders them (:meth:`to_cdi`) and hands them to :func:`oci_edits.apply`, the one
        applier the runtime's prepared-edits fast path uses too.
        """
        oci_edits.apply(spec, self.to_cdi(), dict(self.annotations))

    def to_cdi(self) -> dict[str, Any]:
        """The ``containerEdits`` object of a CDI spec (fields of cdiVersion 0.5.0)."""
        result: dict[str, Any] = {}
        if self.env:
            result["env"] = [f"{key}={value}" for key, value in self.env]
        if self.device_nodes:
            result["deviceNodes"] = [_cdi_node(node) for node in self.device_nodes]
        if self.mounts:
            result["mounts"] = [
                naming.render_mount(mount.host_path, mount.container_path, mount.read_only)
                for mount in self.mounts
            ]
        return result


def _node_order(node: DeviceNodeEdit) -> tuple[int, str, int]:
    return naming.node_order(node.path, node.minor)


def _cdi_node(node: DeviceNodeEdit) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "path": node.path,
        "hostPath": node.host_path,
        "type": "c",
        "major": node.major,
        "minor": node.minor,
        "permissions": node.permissions,
    }
    if node.file_mode is not None:
        entry["fileMode"] = node.file_mode
    if node.uid is not None:
        entry["uid"] = node.uid
    if node.gid is not None:
        entry["gid"] = node.gid
    return entry


def node_edit(root: str, node: devices.DeviceNode) -> DeviceNodeEdit:
    """A device node edit for a host node, with mode and owner read from the host."""
    if node.major is None or node.minor is None:
        raise InvalidRequestError(f"{node.path} has no known major:minor; cannot inject it")
    mode = uid = gid = None
    try:
        info = os.stat(fileio.host_path(root, node.path))
    except OSError:
        pass
    else:
        mode, uid, gid = stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid
    return DeviceNodeEdit(
        path=node.path,
        host_path=node.path,
        major=node.major,
        minor=node.minor,
        file_mode=mode,
        uid=uid,
        gid=gid,
    )


def for_devices(
    inventory: devices.Inventory,
    names: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    mounts: Iterable[MountEdit] = (),
    visible_env: bool = True,
) -> ContainerEdits:
    """Edits that give a container the named cards/vGCUs (``gcuN``/``vgcuN``) and gcuctl.

    Raises InvalidRequestError naming every unknown or unusable name and listing the valid ones.
    """
    by_name: dict[str, devices.DeviceNode] = {}
    usable: dict[str, bool] = {}
    for card in inventory.cards:
        by_name[card.name] = card.node
        usable[card.name] = card.usable
    for vgcu in inventory.vgcus:
        by_name[vgcu.name] = vgcu.node
        usable[vgcu.name] = vgcu.usable
    unknown = [name for name in names if name not in by_name]
    broken = [name for name in names if name in by_name and not usable[name]]
    if unknown or broken:
        valid = ", ".join(name for name in by_name if usable[name]) or "none"
        parts = []
        if unknown:
            parts.append(f"unknown device(s) {', '.join(unknown)}")
        if broken:
            parts.append(f"unusable device(s) {', '.join(broken)}")
        raise InvalidRequestError(f"{'; '.join(parts)}; usable devices on this node: {valid}")
    nodes = [node_edit(inventory.root, by_name[name]) for name in dict.fromkeys(names)]
    if names:
        if not inventory.control.usable:
            raise InvalidRequestError(
                f"{naming.CONTROL_NODE} is missing on this node; no GCU can be used without it"
            )
        nodes.append(node_edit(inventory.root, inventory.control))
    env_items: dict[str, str] = {}
    if visible_env:
        env_items[naming.VISIBLE_DEVICES_ENV] = naming.visible_value(names)
    env_items.update(env or {})
    return ContainerEdits(
        device_nodes=tuple(sorted(nodes, key=_node_order)),
        env=tuple(env_items.items()),
        mounts=tuple(mounts),
    )


# --- how the device plugin tells the runtime which devices a container got ------------------

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


@dataclass(frozen=True, slots=True)
class DeviceListEdits:
    """What Allocate returns to name the devices: env/mounts/annotations plus CRI CDI names."""

    edits: ContainerEdits
    cdi_devices: tuple[str, ...] = ()


def device_list(names: Sequence[str], strategies: Sequence[str]) -> DeviceListEdits:
    """Encode a device list for the runtime with each chosen strategy (they combine).

    Every encoding lists the devices in index order (:func:`naming.index_order`).

    - ``envvar``: ``ENFLAME_VISIBLE_DEVICES=0,1``.
    - ``volume-mounts``: ``/dev/null`` mounted at ``VOLUME_MOUNT_DIR/<name>``; the env var is
      set to ``VOLUME_MOUNT_DIR`` (unless envvar is also chosen) so an image's own
      ``ENFLAME_VISIBLE_DEVICES=all`` cannot widen the request.
    - ``cdi-annotations``: annotation ``CDI_ANNOTATION_KEY`` with the CDI names.
    - ``cdi-cri``: the CDI names in Allocate's ``cdi_devices`` field.
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise InvalidRequestError(
            f"unknown device list strategy {', '.join(unknown) or '(none given)'}; "
            f"valid: {', '.join(STRATEGIES)}"
        )
    env: dict[str, str] = {}
    mounts: list[MountEdit] = []
    notes: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    # Index order everywhere (the kubelet's order is arbitrary): logical card 0 is the lowest.
    names = naming.index_order(names)
    qualified = [naming.cdi_device_name(name) for name in names]
    if "volume-mounts" in strategies:
        env[naming.VISIBLE_DEVICES_ENV] = naming.VOLUME_MOUNT_DIR
        mounts = [MountEdit("/dev/null", f"{naming.VOLUME_MOUNT_DIR}/{name}") for name in names]
    if "envvar" in strategies:
        env[naming.VISIBLE_DEVICES_ENV] = naming.visible_value(names)
    if "cdi-annotations" in strategies:
        notes[naming.CDI_ANNOTATION_KEY] = ",".join(qualified)
    if "cdi-cri" in strategies:
        cdi = tuple(qualified)
    return DeviceListEdits(
        ContainerEdits(
            env=tuple(env.items()), mounts=tuple(mounts), annotations=tuple(notes.items())
        ),
        cdi,
    )
