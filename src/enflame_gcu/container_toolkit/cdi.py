"""CDI specs for ``enflame.com/gcu`` (and ``enflame.com/vgcu``): generate, list and validate.

Cards are named by minor (``enflame.com/gcu=0``), by PCI address (``enflame.com/gcu=0000:11:00.0``,
the name that stays when minors are handed out in another order), plus ``all``; vGCUs by minor.
``/dev/gcuctl`` and the
configured driver mounts/env go into the spec-wide ``containerEdits``. The per-device edits come
from :func:`edits.for_devices`, the same model Allocate and the runtime use, so all three inject
the same nodes. One deliberate difference: no per-device ``ENFLAME_VISIBLE_DEVICES``, because
CDI merges env by "last device wins", which would hide all but one card of a multi-card request.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from enflame_gcu import cdispec, devices, edits, fileio, naming
from enflame_gcu.errors import SpecError
from enflame_gcu.shim import prepared_edits

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_OUTPUT_DIR = "/var/run/cdi"
# Version facts live in the domain (the DRA driver writes CDI specs too).
KNOWN_VERSIONS = cdispec.KNOWN_VERSIONS
BASE_VERSION = cdispec.BASE_VERSION
version_key = cdispec.version_key
required_version = cdispec.required_version


@dataclass(frozen=True, slots=True)
class NamedSpec:
    """A CDI spec and the file name it is written under."""

    file_name: str
    spec: dict[str, Any]


def _device_entry(inventory: devices.Inventory, name: str, names: Sequence[str]) -> dict[str, Any]:
    full = edits.for_devices(inventory, names, visible_env=False)
    own = edits.ContainerEdits(
        device_nodes=tuple(n for n in full.device_nodes if n.path != naming.CONTROL_NODE)
    )
    return {"name": name, "containerEdits": own.to_cdi()}


def build_specs(
    inventory: devices.Inventory,
    mounts: Iterable[edits.MountEdit] = (),
    env: Iterable[tuple[str, str]] = (),
) -> list[NamedSpec]:
    """One spec per device kind present: cards (``gcu``) always when usable, vGCUs when any."""
    if not inventory.control.usable:
        raise SpecError(
            f"{naming.CONTROL_NODE} is missing under {inventory.root}; "
            "no CDI device can work without it"
        )
    common = edits.ContainerEdits(
        device_nodes=(edits.node_edit(inventory.root, inventory.control),),
        mounts=tuple(mounts),
        env=tuple(env),
    ).to_cdi()
    cards = [card.name for card in inventory.usable_cards()]
    vgcus = [vgcu.name for vgcu in inventory.vgcus if vgcu.usable]
    if not cards and not vgcus:
        problems = "; ".join(inventory.problems) or "no GCU found"
        raise SpecError(f"no usable GCU under {inventory.root}: {problems}")
    specs = []
    for kind, names in (("gcu", cards), ("vgcu", vgcus)):
        if not names:
            continue
        entries = [_device_entry(inventory, name[len(kind) :], [name]) for name in names]
        if kind == "gcu":
            by_name = inventory.card_by_name()
            entries += [_device_entry(inventory, by_name[name].bdf, [name]) for name in names]
            entries.append(_device_entry(inventory, "all", names))
        spec: dict[str, Any] = {
            "cdiVersion": BASE_VERSION,
            "kind": f"{naming.CDI_VENDOR}/{kind}",
            "devices": entries,
            "containerEdits": common,
        }
        spec["cdiVersion"] = required_version(spec)
        specs.append(NamedSpec(f"{naming.CDI_VENDOR}-{kind}", spec))
    return specs


def render(spec: dict[str, Any], fmt: str) -> str:
    """The spec as YAML or JSON text."""
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    return str(yaml.safe_dump(spec, sort_keys=False, default_flow_style=False))


def write(specs: Sequence[NamedSpec], output_dir: str, fmt: str) -> list[str]:
    """Write each spec atomically as ``<dir>/enflame.com-<kind>.<fmt>``; return the paths."""
    os.makedirs(output_dir, exist_ok=True)
    written = []
    for named in specs:
        path = os.path.join(output_dir, f"{named.file_name}.{fmt}")
        fileio.atomic_write_text(path, render(named.spec, fmt), mode=0o644)
        written.append(path)
    return written


def prepared_edits_document(
    inventory: devices.Inventory, root: str | None = None
) -> dict[str, Any]:
    """The runtime's prepared edits for this node: its CDI specs and the root they describe.

    ``root`` is the runtime's view of the host root (default: where discovery ran); the
    runtime uses the file only when its own ``root`` setting is the same. Driver mounts and
    env are left out on purpose: the runtime takes them from its config at create time.
    ``sysfs`` records, per usable device, the sysfs inputs of discovery's verdict (read under
    the discovery root), which the runtime compares with the live node on every create.
    """
    specs = [named.spec for named in build_specs(inventory)]
    cards = inventory.card_by_name()
    where: dict[str, tuple[str, str]] = {c.name: (c.bdf, c.driver_dir) for c in inventory.cards}
    for vgcu in inventory.vgcus:
        parent = cards.get(f"gcu{vgcu.parent_minor}")
        if parent is not None:  # a vGCU with no card in sysfs is left to discovery
            where[vgcu.name] = (parent.bdf, parent.driver_dir)
    usable = [card.name for card in inventory.usable_cards()]
    usable += [vgcu.name for vgcu in inventory.vgcus if vgcu.usable]
    sysfs = {
        name: prepared_edits.sysfs_record(inventory.root, name, *where[name])
        for name in usable
        if name in where
    }
    return {
        prepared_edits.FORMAT_KEY: prepared_edits.FORMAT_VERSION,
        "root": inventory.root if root is None else root,
        "specs": specs,
        "sysfs": sysfs,
    }


def refresh_prepared_edits(
    path: str, inventory: devices.Inventory, root: str | None = None
) -> bool:
    """Write the prepared edits file atomically; on a node with no usable GCU remove it.

    Returns True when written. A removed (or never written) file only means the runtime
    discovers the devices on each create, which is slower but always right.
    """
    try:
        document = prepared_edits_document(inventory, root)
    except SpecError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fileio.atomic_write_text(path, json.dumps(document, separators=(",", ":")) + "\n", mode=0o644)
    return True


def load_file(path: str) -> dict[str, Any]:
    """Read a CDI spec file (``.json`` or ``.yaml``/``.yml``)."""
    try:
        text = fileio.read_regular(path).decode("utf-8")
        parse = json.loads if path.endswith(".json") else yaml.safe_load
        data = fileio.parse_bounded(parse, text, path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read CDI spec {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a CDI spec must be a mapping, got {type(data).__name__}")
    return data


def spec_files(directories: Iterable[str]) -> list[str]:
    """CDI spec files in the given directories (missing directories are skipped)."""
    found: list[str] = []
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        found.extend(
            os.path.join(directory, name)
            for name in names
            if name.endswith((".json", ".yaml", ".yml"))
        )
    return found


def list_devices(directories: Iterable[str]) -> list[tuple[str, str]]:
    """Fully qualified device names and the file defining each, from every spec found."""
    result = []
    for path in spec_files(directories):
        spec = load_file(path)
        for device in spec.get("devices") or []:
            result.append((f"{spec.get('kind')}={device.get('name')}", path))
    return result


def duplicates(found: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``{device name: [files]}`` for each name more than one spec file defines.

    An engine resolves such a name from one file only (CDI: the later directory wins, so a
    copy in /var/run/cdi hides the one in /etc/cdi): the other copy goes stale unnoticed.
    """
    files: dict[str, list[str]] = {}
    for name, path in found:
        files.setdefault(name, []).append(path)
    return {name: paths for name, paths in files.items() if len(set(paths)) > 1}
