"""The create path's fast lane: answer a device request from the node's prepared edits file.

``enflame-ctk cdi generate --prepared-edits FILE`` (and the installer) write FILE: the node's
CDI specs, i.e. ``ContainerEdits.to_cdi`` renderings, plus the root they describe. Reading it
needs only ``json``; discovery needs ``dataclasses`` and its class set-up, which cost more
than runc itself. Before anything is used it is checked against the live node with a few
stats: every node to inject must be the same character device (major:minor), the driver must
be loaded and, for ``all``, ``/dev/gcuN`` must list exactly the prepared cards. Anything the
file cannot answer or that disagrees raises :class:`Unavailable`; the caller then runs
discovery, which is always right and words the errors. Standard library only.
"""

from __future__ import annotations

import json
import os
import stat

from enflame_gcu import naming, oci_edits
from enflame_gcu.container_toolkit import device_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from enflame_gcu.container_toolkit.runtime_config import RuntimeConfig

FORMAT_KEY = "enflamePreparedEdits"
FORMAT_VERSION = "v1"
CONTROL_NODE = "/dev/gcuctl"
# Discovery marks every card unusable without it; one stat keeps the fast path in step.
DRIVER_VERSION_FILE = "/sys/module/enflame/version"
_KINDS = {f"{device_request.CDI_VENDOR}/gcu": "gcu", f"{device_request.CDI_VENDOR}/vgcu": "vgcu"}


class Unavailable(Exception):
    """The prepared edits cannot answer this request; the message says why (for the log)."""


class Prepared:
    """The parsed file: each device's own nodes by name, the common nodes, the card names."""

    __slots__ = ("cards", "common", "devices", "path")

    def __init__(
        self,
        path: str,
        devices: dict[str, list[dict[str, Any]]],
        common: list[dict[str, Any]],
        cards: list[str],
    ) -> None:
        self.path = path
        self.devices = devices
        self.common = common
        self.cards = cards


def _host(root: str, path: str) -> str:
    # fileio.host_path's rule, inlined: fileio would add contextlib to this path.
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def load(path: str, root: str) -> Prepared:
    """Read and check the prepared edits file written for ``root``; raise Unavailable."""
    if not path:
        raise Unavailable("prepared-edits is off in the config")
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read())
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
        kind = _KINDS[spec["kind"]]
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
    return Prepared(path, devices, list(common.values()), cards)


def _checked(node: Any) -> dict[str, Any]:
    if not isinstance(node["path"], str) or not isinstance(node["hostPath"], str):
        raise TypeError(f"device node paths must be strings: {node!r}")
    if not isinstance(node["major"], int) or not isinstance(node["minor"], int):
        raise TypeError(f"device node numbers must be integers: {node!r}")
    return dict(node)


def _live(root: str, node: dict[str, Any]) -> dict[str, Any]:
    """The node as injected now: numbers checked against the host, mode and owner read now.

    Discovery-made edits read mode and owner at create time too, so both paths agree even
    after a chmod/chown of the node.
    """
    host = node["hostPath"]
    try:
        info = os.stat(_host(root, host))
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
        entries = os.listdir(_host(root, "/dev"))
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
    # edits._node_order on the rendering: cards by minor, then vGCUs, the control node last.
    path: str = node["path"]
    return (1 if path == CONTROL_NODE else 0, path.rstrip("0123456789"), node["minor"])


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
        if not os.path.exists(_host(root, DRIVER_VERSION_FILE)):
            raise Unavailable(f"the driver is not loaded ({DRIVER_VERSION_FILE} is missing)")
        chosen = {n["path"]: n for name in names for n in prepared.devices[name]}
        for node in prepared.common:
            chosen.setdefault(node["path"], node)
        nodes = sorted((_live(root, node) for node in chosen.values()), key=_node_order)
    env = {device_request.VISIBLE_DEVICES_ENV: device_request.visible_value(names)}
    env.update(config.env)
    rendered: dict[str, Any] = {"env": [f"{key}={value}" for key, value in env.items()]}
    if nodes:
        rendered["deviceNodes"] = nodes
    if config.mounts:
        rendered["mounts"] = [oci_edits.render_mount(h, c) for h, c in config.mounts]
    return names, rendered
