"""The create path's fast lane: answer a device request from the node's prepared edits file.

``enflame-ctk cdi generate --prepared-edits FILE`` (and the installer) write FILE: the node's
CDI specs, i.e. ``ContainerEdits.to_cdi`` renderings, the root they describe and, per device,
the sysfs state discovery judged it by. Reading it needs only ``json``; discovery needs
``dataclasses`` and its class set-up, which cost more than runc itself. Before anything is
used it is checked against the live node: every device to inject must still have the same
sysfs state (:func:`sysfs_state`: the raw text of every sysfs file discovery reads for it, so
the same inputs give discovery's same verdict), every node must be the same character device
(major:minor), the driver must be loaded and, for ``all``, ``/dev/gcuN`` must list exactly the
prepared cards. So the fast path never grants more than discovery would: a card whose sysfs
entry went away (unbound, unplugged, driver unloaded) while its ``/dev`` node stayed is not
granted. Anything the file cannot answer or that disagrees raises :class:`Unavailable`; the
caller then runs discovery, which is always right and words the errors. Standard library only.
"""

from __future__ import annotations

import os
import stat

from enflame_gcu import fileio, naming
from enflame_gcu.shim import request as device_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from enflame_gcu.shim.config import RuntimeConfig

FORMAT_KEY = "enflamePreparedEdits"
# v2 added the per-device sysfs state; a v1 file (without it) is not used.
FORMAT_VERSION = "v2"
# What each item of sysfs_state() is, for the log line that says why the file was not used.
STATE_PARTS = ("bus link", "vendor", "device", "numa_node", "dev")
_BDF_CHARS = frozenset("0123456789abcdef:.")


class Unavailable(Exception):
    """The prepared edits cannot answer this request; the message says why (for the log)."""


class Prepared:
    """The parsed file: each device's own nodes by name, the common nodes, the card names."""

    __slots__ = ("cards", "common", "devices", "path", "sysfs")

    def __init__(
        self,
        path: str,
        devices: dict[str, list[dict[str, Any]]],
        common: list[dict[str, Any]],
        cards: list[str],
        sysfs: dict[str, tuple[str, str, list[str | None]]] | None = None,
    ) -> None:
        self.path = path
        self.devices = devices
        self.common = common
        self.cards = cards
        # Device name -> (PCI bus id, driver dir, sysfs_state when the file was written).
        self.sysfs = sysfs or {}


def load(path: str, root: str) -> Prepared:
    """Read and check the prepared edits file written for ``root``; raise Unavailable."""
    if not path:
        raise Unavailable("prepared-edits is off in the config")
    try:
        data = fileio.read_json(path)
    except FileNotFoundError:
        raise Unavailable(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise Unavailable(f"cannot read {path}: {exc}") from None
    try:
        return _parse(path, data, root)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise Unavailable(f"{path} has an unexpected shape ({exc!r})") from None


def _parse(path: str, data: Any, root: str) -> Prepared:
    if data.get(FORMAT_KEY) != FORMAT_VERSION:
        raise Unavailable(f"{path} is not a {FORMAT_KEY} {FORMAT_VERSION} file")
    if data["root"] != root:
        raise Unavailable(f"{path} describes root {data['root']!r}, not {root!r}")
    devices: dict[str, list[dict[str, Any]]] = {}
    common: dict[str, dict[str, Any]] = {}
    cards: list[str] = []
    for spec in data["specs"]:
        kind = naming.CDI_KINDS[spec["kind"]]
        for node in spec["containerEdits"].get("deviceNodes") or []:
            common.setdefault(_checked(node)["path"], node)
        for device in spec["devices"]:
            name = device["name"]
            if naming.index(name) is None:
                continue  # "all": the card list below says the same, per card
            devices[f"{kind}{name}"] = [
                _checked(n) for n in device["containerEdits"]["deviceNodes"]
            ]
            if kind == "gcu":
                cards.append(f"gcu{name}")
    sysfs = {}
    for name, entry in data["sysfs"].items():
        bdf, driver_dir, state = entry["bdf"], entry["driverDir"], entry["state"]
        if not isinstance(bdf, str) or not bdf or not _BDF_CHARS.issuperset(bdf):
            raise ValueError(f"bad bus id {bdf!r} for {name}")
        if driver_dir not in naming.DRIVER_DIRS or not isinstance(state, list):
            raise ValueError(f"bad sysfs record for {name}: {entry!r}")
        sysfs[name] = (bdf, driver_dir, state)
    return Prepared(path, devices, list(common.values()), cards, sysfs)


def _checked(node: Any) -> dict[str, Any]:
    if not isinstance(node["path"], str) or not isinstance(node["hostPath"], str):
        raise TypeError(f"device node paths must be strings: {node!r}")
    if not node["hostPath"].startswith("/"):
        raise ValueError(f"device node host paths must be absolute: {node!r}")
    if not isinstance(node["major"], int) or not isinstance(node["minor"], int):
        raise TypeError(f"device node numbers must be integers: {node!r}")
    return dict(node)


# Stands for "there, but not a readable regular file" (discovery: a problem), which must
# differ from None ("missing", which numa_node may be). No attribute text contains a NUL.
UNREADABLE = "\x00unreadable"
# sysfs.MAX_ATTRIBUTE_BYTES: discovery refuses longer attributes, so the state keeps the cut.
_MAX_ATTRIBUTE_BYTES = 4096


def _read(path: str) -> str | None:
    """An attribute's bytes as text (latin-1: every byte kept); None when missing.

    Opened the way discovery opens it (no symlink, no FIFO, no blocking, regular files only).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return UNREADABLE
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return UNREADABLE
        return os.read(fd, _MAX_ATTRIBUTE_BYTES + 1).decode("latin-1")
    except OSError:
        return UNREADABLE
    finally:
        os.close(fd)


def function_state(root: str, bdf: str) -> list[str | None]:
    """What discovery reads of a PCI function: bus link target, vendor, device, numa_node."""
    base = fileio.host_path(root, f"{naming.PCI_DEVICES}/{bdf}")
    try:
        link: str | None = os.readlink(base)
    except OSError:
        link = None
    return [link, _read(base + "/vendor"), _read(base + "/device"), _read(base + "/numa_node")]


def sysfs_state(
    root: str, bdf: str, driver_dir: str, name: str, function: list[str | None] | None = None
) -> list[str | None]:
    """The raw sysfs inputs of discovery's verdict on one device (``gcuN``/``vgcuN``).

    The PCI function's :func:`function_state`, the device's ``dev`` file in its driver dir,
    and whether each driver dir discovery would try first exists. Recorded when the prepared
    file is written and compared on every create: equal inputs, equal verdict.
    """
    state = function_state(root, bdf) if function is None else list(function)
    base = fileio.host_path(root, f"{naming.PCI_DEVICES}/{bdf}")
    state.append(_read(f"{base}/{driver_dir}/{name}/dev"))
    for earlier in naming.DRIVER_DIRS[: naming.DRIVER_DIRS.index(driver_dir)]:
        state.append("dir" if os.path.isdir(f"{base}/{earlier}") else None)
    return state


def sysfs_record(root: str, name: str, bdf: str, driver_dir: str) -> dict[str, Any]:
    """The ``sysfs`` entry the prepared file keeps for one device (see :func:`sysfs_state`)."""
    return {"bdf": bdf, "driverDir": driver_dir, "state": sysfs_state(root, bdf, driver_dir, name)}


def check_sysfs(root: str, prepared: Prepared, names: list[str]) -> None:
    """Raise Unavailable unless every device's sysfs state is what it was when prepared."""
    functions: dict[str, list[str | None]] = {}
    for name in names:
        record = prepared.sysfs.get(name)
        if record is None:
            raise Unavailable(f"{name} has no recorded sysfs state")
        bdf, driver_dir, recorded = record
        function = functions.get(bdf)
        if function is None:
            function = functions[bdf] = function_state(root, bdf)
        now = sysfs_state(root, bdf, driver_dir, name, function)
        if now != recorded:
            changed = next(
                (i for i, (a, b) in enumerate(zip(now, recorded, strict=False)) if a != b),
                min(len(now), len(recorded)),
            )
            part = STATE_PARTS[changed] if changed < len(STATE_PARTS) else "driver dir"
            raise Unavailable(
                f"{name}: sysfs changed since the edits were prepared "
                f"({naming.PCI_DEVICES}/{bdf} {part})"
            )


def _live(root: str, node: dict[str, Any]) -> dict[str, Any]:
    """The node as injected now: numbers checked against the host, mode and owner read now.

    Discovery-made edits read mode and owner at create time too, so both paths agree even
    after a chmod/chown of the node.
    """
    host = node["hostPath"]
    try:
        info = os.stat(fileio.host_path(root, host))
    except OSError as exc:
        raise Unavailable(f"{host}: {exc.strerror or exc}") from None
    if not stat.S_ISCHR(info.st_mode):
        raise Unavailable(f"{host} is not a character device")
    found = (os.major(info.st_rdev), os.minor(info.st_rdev))
    if found != (node["major"], node["minor"]):
        raise Unavailable(
            f"{host} is {found[0]}:{found[1]}, prepared {node['major']}:{node['minor']}"
        )
    live = dict(node)
    live.update(fileMode=stat.S_IMODE(info.st_mode), uid=info.st_uid, gid=info.st_gid)
    return live


def _dev_cards(root: str) -> list[str]:
    try:
        entries = os.listdir(fileio.host_path(root, "/dev"))
    except OSError as exc:
        raise Unavailable(f"cannot list /dev: {exc.strerror or exc}") from None
    return sorted(
        name for name in entries if naming.device_index(name) is not None and name[0] == "g"
    )


def names_for(request: device_request.DeviceRequest, prepared: Prepared, root: str) -> list[str]:
    """Device names for a request, as ``device_request.resolve`` gives them from discovery."""
    names: list[str] = []
    for source in request.sources:
        for token in source.tokens:
            if token == "all":  # noqa: S105 - a keyword of the grammar, not a secret
                if not prepared.cards:
                    raise Unavailable("no cards were prepared")
                if _dev_cards(root) != sorted(prepared.cards):
                    raise Unavailable("the /dev/gcuN nodes differ from the prepared cards")
                names.extend(prepared.cards)
            elif ":" in token:
                raise Unavailable(f"bus id {token} is resolved by discovery")
            elif token in prepared.devices:
                names.append(token)
            else:
                raise Unavailable(f"{token} is not among the prepared devices")
    return naming.index_order(names)


def _node_order(node: dict[str, Any]) -> tuple[int, str, int]:
    return naming.node_order(node["path"], node["minor"])


def resolve(
    request: device_request.DeviceRequest, config: RuntimeConfig
) -> tuple[list[str], dict[str, Any]]:
    """Device names and the rendered edits (``to_cdi`` shape) for a request; or Unavailable."""
    names: list[str] = []
    nodes: list[dict[str, Any]] = []
    if request.sources:  # "none" alone needs no devices, so no file
        root = config.root
        prepared = load(config.prepared_edits, root)
        names = names_for(request, prepared, root)
        if not os.path.exists(fileio.host_path(root, naming.DRIVER_VERSION_FILE)):
            raise Unavailable(f"the driver is not loaded ({naming.DRIVER_VERSION_FILE} is missing)")
        check_sysfs(root, prepared, names)
        chosen = {n["path"]: n for name in names for n in prepared.devices[name]}
        for node in prepared.common:
            chosen.setdefault(node["path"], node)
        nodes = sorted((_live(root, node) for node in chosen.values()), key=_node_order)
    env = {naming.VISIBLE_DEVICES_ENV: naming.visible_value(names)}
    env.update(config.env)
    rendered: dict[str, Any] = {"env": [f"{key}={value}" for key, value in env.items()]}
    if nodes:
        rendered["deviceNodes"] = nodes
    if config.mounts:
        rendered["mounts"] = [naming.render_mount(h, c) for h, c in config.mounts]
    return names, rendered
