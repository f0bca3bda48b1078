"""A simulated GCU node: a fake sysfs and /dev tree under a directory, built from a description.

Description format (``*.topo``, see docs/topology-format.md): ``key: value`` header lines, then
one line per card in the vendor manual's own notation, leaf first::

    driver-version: 1.0.20230110
    gcu0 0000:11:00.0 <- 0000:10:00.0 <- 0000:0f:00.0 <- 0000:0c:02.0 <- cpu  numa=0

Headers: ``name``, ``description``, ``driver-version``, ``major`` (default 238),
``control-minor`` (255), ``vgcu-major`` (239), ``device`` (default PCI device id, 0x0021).
Card options: ``numa=N`` (-1 = unknown), ``device=0xNNNN``, ``dir=enflame|zixiao``,
``vgcus=A,B`` (vGCU minors on this card). ``#`` starts a comment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from importlib import resources

from enflame_gcu import devices, fileio
from enflame_gcu.errors import SimulationError, TopologyError

BRIDGE_VENDOR = 0x10B5  # PLX/Broadcom: the usual PCIe switch vendor
BRIDGE_DEVICE = 0x8747
BRIDGE_CLASS = 0x060400
CARD_CLASS = 0x120000
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_CARD = re.compile(r"^gcu(\d+)$")
STATE_DIR = devices.SIMULATION_MARKER


@dataclass(frozen=True, slots=True)
class SimCard:
    """One card of a description: minor, BDF, bridges from the root port down, options."""

    minor: int
    bdf: str
    bridges: tuple[str, ...]
    numa: int | None = None
    device_id: int = 0x0021
    driver_dir: str = "enflame"
    vgcus: tuple[int, ...] = ()

    @property
    def root_complex(self) -> str:
        """``pci<domain>:<bus>`` of the root port (or of the card on a root bus)."""
        top = self.bridges[0] if self.bridges else self.bdf
        return f"pci{top[:7]}"


@dataclass(frozen=True, slots=True)
class SimTopology:
    """A parsed description: the node-wide settings and its cards."""

    name: str
    description: str
    driver_version: str
    cards: tuple[SimCard, ...]
    major: int = 238
    control_minor: int = 255
    vgcu_major: int = 239


def _int(value: str, what: str, line_no: int) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise TopologyError(f"line {line_no}: {what} must be a number, got {value!r}") from None


def _parse_card(tokens: list[str], default_device: int, line_no: int) -> SimCard:
    match = _CARD.match(tokens[0])
    if not match:
        raise TopologyError(f"line {line_no}: a card line starts with gcuN, got {tokens[0]!r}")
    chain: list[str] = []
    options: dict[str, str] = {}
    rest = tokens[1:]
    for position, token in enumerate(rest):
        if "=" in token:
            key, _, value = token.partition("=")
            options[key] = value
        elif token == "<-":  # noqa: S105 (an arrow, not a password)
            continue
        elif token == "cpu":  # noqa: S105 (the root complex, not a password)
            if any("=" not in t for t in rest[position + 1 :]):
                raise TopologyError(f"line {line_no}: nothing but options may follow 'cpu'")
        elif _BDF.match(token):
            chain.append(token)
        else:
            raise TopologyError(f"line {line_no}: {token!r} is not a PCI address like 0000:11:00.0")
    if not chain or "cpu" not in rest:
        raise TopologyError(f"line {line_no}: want 'gcuN <BDF> <- <bridge> ... <- cpu'")
    unknown = set(options) - {"numa", "device", "dir", "vgcus"}
    if unknown:
        raise TopologyError(
            f"line {line_no}: unknown option(s) {', '.join(sorted(unknown))}; "
            "valid: numa, device, dir, vgcus"
        )
    numa = _int(options.get("numa", "-1"), "numa", line_no)
    driver_dir = options.get("dir", "enflame")
    if driver_dir not in devices.DRIVER_DIRS:
        raise TopologyError(f"line {line_no}: dir must be enflame or zixiao, got {driver_dir!r}")
    vgcus = tuple(_int(v, "vgcus", line_no) for v in options.get("vgcus", "").split(",") if v)
    return SimCard(
        minor=int(match.group(1)),
        bdf=chain[0],
        bridges=tuple(reversed(chain[1:])),
        numa=None if numa < 0 else numa,
        device_id=_int(options["device"], "device", line_no)
        if "device" in options
        else default_device,
        driver_dir=driver_dir,
        vgcus=vgcus,
    )


def parse(text: str, name: str = "custom") -> SimTopology:
    """Parse a description; TopologyError names the line and what was wrong."""
    headers: dict[str, str] = {}
    cards: list[SimCard] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        if sep and " " not in key and not _CARD.match(key.strip()):
            headers[key.strip()] = value.strip()
            continue
        default_device = _int(headers.get("device", "0x0021"), "device", line_no)
        cards.append(_parse_card(line.split(), default_device, line_no))
    known = {
        "name",
        "description",
        "driver-version",
        "major",
        "control-minor",
        "vgcu-major",
        "device",
    }
    if set(headers) - known:
        raise TopologyError(
            f"unknown header(s) {', '.join(sorted(set(headers) - known))}; "
            f"valid: {', '.join(sorted(known))}"
        )
    _check_consistent(cards)
    return SimTopology(
        name=headers.get("name", name),
        description=headers.get("description", ""),
        driver_version=headers.get("driver-version", "1.0.20230110"),
        cards=tuple(sorted(cards, key=lambda c: c.minor)),
        major=_int(headers.get("major", "238"), "major", 0),
        control_minor=_int(headers.get("control-minor", "255"), "control-minor", 0),
        vgcu_major=_int(headers.get("vgcu-major", "239"), "vgcu-major", 0),
    )


def _check_consistent(cards: list[SimCard]) -> None:
    minors = [c.minor for c in cards]
    if len(set(minors)) != len(minors):
        raise TopologyError(f"card minors repeat: {sorted(minors)}")
    parent: dict[str, str] = {}
    for card in cards:
        path = (card.root_complex, *card.bridges, card.bdf)
        for upper, lower in itertools.pairwise(path):
            if parent.setdefault(lower, upper) != upper:
                raise TopologyError(
                    f"{lower} has two parents ({parent[lower]} and {upper}); the PCI tree "
                    "must be a tree"
                )
    if len({c.bdf for c in cards}) != len(cards):
        raise TopologyError("two cards share a PCI address")


def builtin_names() -> list[str]:
    """Names of the topologies shipped with the package."""
    folder = resources.files("enflame_gcu") / "topologies"
    return sorted(p.name[: -len(".topo")] for p in folder.iterdir() if p.name.endswith(".topo"))


def load(name_or_path: str) -> SimTopology:
    """A built-in topology by name, or a description file by path."""
    if os.path.sep in name_or_path or name_or_path.endswith(".topo"):
        try:
            with open(name_or_path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise TopologyError(f"cannot read topology file {name_or_path}: {exc}") from exc
        return parse(text, os.path.basename(name_or_path).removesuffix(".topo"))
    if name_or_path not in builtin_names():
        raise TopologyError(
            f"no built-in topology {name_or_path!r}; built-in: {', '.join(builtin_names())} "
            "(or give a path to a .topo file)"
        )
    resource = resources.files("enflame_gcu") / "topologies" / f"{name_or_path}.topo"
    return parse(resource.read_text(encoding="utf-8"), name_or_path)


def render(topo: SimTopology) -> str:
    """A description text that parses back to ``topo``."""
    lines = [f"name: {topo.name}"]
    if topo.description:
        lines.append(f"description: {topo.description}")
    lines += [
        f"driver-version: {topo.driver_version}",
        f"major: {topo.major}",
        f"control-minor: {topo.control_minor}",
        f"vgcu-major: {topo.vgcu_major}",
    ]
    for card in topo.cards:
        chain = " <- ".join([card.bdf, *reversed(card.bridges), "cpu"])
        opts = [f"numa={-1 if card.numa is None else card.numa}", f"device=0x{card.device_id:04x}"]
        if card.driver_dir != "enflame":
            opts.append(f"dir={card.driver_dir}")
        if card.vgcus:
            opts.append("vgcus=" + ",".join(str(v) for v in card.vgcus))
        lines.append(f"gcu{card.minor} {chain} {' '.join(opts)}")
    return "\n".join(lines) + "\n"


# --- the tree on disk -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimState:
    """What a simulated node currently looks like, kept in DIR/.enflame-sim/state.json."""

    driver_loaded: bool = True
    driver_version: str = ""
    unplugged: tuple[int, ...] = ()
    char_devices: bool = True


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


def _mknod(path: str, major: int, minor: int, char_devices: bool) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    if char_devices:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        # GCU nodes are world-accessible on real hosts too; cgroups decide who may use them.
        os.chmod(path, 0o666)  # noqa: S103
    else:
        _write(path, f"{major}:{minor} (simulated: not a character device)")


def _pci_dir(root: str, card: SimCard, upto: str | None = None) -> str:
    parts = [card.root_complex, *card.bridges, card.bdf]
    if upto is not None:
        parts = parts[: parts.index(upto) + 1]
    return fileio.host_path(root, os.path.join(devices.SYS_DEVICES, *parts))


def _link_function(root: str, directory: str, bdf: str) -> None:
    link = fileio.host_path(root, f"{devices.PCI_DEVICES}/{bdf}")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    os.symlink(os.path.relpath(directory, os.path.dirname(link)), link)


def _plug(root: str, topo: SimTopology, card: SimCard, state: SimState) -> None:
    for bridge in card.bridges:
        directory = _pci_dir(root, card, upto=bridge)
        _write(f"{directory}/vendor", f"0x{BRIDGE_VENDOR:04x}")
        _write(f"{directory}/device", f"0x{BRIDGE_DEVICE:04x}")
        _write(f"{directory}/class", f"0x{BRIDGE_CLASS:06x}")
        _link_function(root, directory, bridge)
    directory = _pci_dir(root, card)
    _write(f"{directory}/vendor", f"0x{devices.VENDOR_ID:04x}")
    _write(f"{directory}/device", f"0x{card.device_id:04x}")
    _write(f"{directory}/class", f"0x{CARD_CLASS:06x}")
    _write(f"{directory}/numa_node", str(-1 if card.numa is None else card.numa))
    _link_function(root, directory, card.bdf)
    if state.driver_loaded:
        _bind(root, topo, card, state)


def _bind(root: str, topo: SimTopology, card: SimCard, state: SimState) -> None:
    directory = _pci_dir(root, card)
    _write(f"{directory}/{card.driver_dir}/gcu{card.minor}/dev", f"{topo.major}:{card.minor}")
    _mknod(
        fileio.host_path(root, f"/dev/gcu{card.minor}"), topo.major, card.minor, state.char_devices
    )
    for vgcu in card.vgcus:
        _write(f"{directory}/{card.driver_dir}/vgcu{vgcu}/dev", f"{topo.vgcu_major}:{vgcu}")
        _mknod(
            fileio.host_path(root, f"/dev/vgcu{vgcu}"), topo.vgcu_major, vgcu, state.char_devices
        )


def _unbind(root: str, card: SimCard) -> None:
    shutil.rmtree(f"{_pci_dir(root, card)}/{card.driver_dir}", ignore_errors=True)
    for name in [f"gcu{card.minor}", *(f"vgcu{v}" for v in card.vgcus)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fileio.host_path(root, f"/dev/{name}"))


def _save(root: str, topo: SimTopology, state: SimState) -> None:
    folder = os.path.join(root, STATE_DIR)
    os.makedirs(folder, exist_ok=True)
    fileio.atomic_write_text(os.path.join(folder, "topology.topo"), render(topo))
    fileio.atomic_write_text(
        os.path.join(folder, "state.json"), json.dumps(dataclasses.asdict(state), indent=2) + "\n"
    )


def open_node(root: str) -> tuple[SimTopology, SimState]:
    """The description and state of a simulated node made by :func:`create`."""
    folder = os.path.join(root, STATE_DIR)
    try:
        with open(os.path.join(folder, "topology.topo"), encoding="utf-8") as handle:
            topo = parse(handle.read())
        with open(os.path.join(folder, "state.json"), encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SimulationError(
            f"{root} is not a simulated node made by 'sim create': {exc}"
        ) from exc
    return topo, SimState(
        driver_loaded=raw["driver_loaded"],
        driver_version=raw["driver_version"],
        unplugged=tuple(raw["unplugged"]),
        char_devices=raw["char_devices"],
    )


def create(root: str, topo: SimTopology, char_devices: bool | None = None) -> SimState:
    """Write the node under ``root``; device nodes are real only when we may mknod (root)."""
    if char_devices is None:
        char_devices = os.geteuid() == 0
    if os.path.exists(os.path.join(root, STATE_DIR)):
        raise SimulationError(f"{root} already holds a simulated node; remove it first")
    state = SimState(driver_version=topo.driver_version, char_devices=char_devices)
    os.makedirs(root, exist_ok=True)
    _write(fileio.host_path(root, devices.DRIVER_VERSION_FILE), topo.driver_version)
    _mknod(
        fileio.host_path(root, devices.CONTROL_NODE), topo.major, topo.control_minor, char_devices
    )
    for card in topo.cards:
        _plug(root, topo, card, state)
    _save(root, topo, state)
    return state


def _card(topo: SimTopology, minor: int) -> SimCard:
    for card in topo.cards:
        if card.minor == minor:
            return card
    raise SimulationError(
        f"no card gcu{minor} on this node; cards: {', '.join(f'gcu{c.minor}' for c in topo.cards)}"
    )


def unplug(root: str, minor: int) -> None:
    """Make a card vanish: its PCI directory, bus link and device nodes go away."""
    topo, state = open_node(root)
    card = _card(topo, minor)
    _unbind(root, card)
    shutil.rmtree(_pci_dir(root, card), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fileio.host_path(root, f"{devices.PCI_DEVICES}/{card.bdf}"))
    unplugged = tuple(sorted(set(state.unplugged) | {minor}))
    _save(root, topo, dataclasses.replace(state, unplugged=unplugged))


def replug(root: str, minor: int) -> None:
    """Bring an unplugged card back exactly as it was."""
    topo, state = open_node(root)
    card = _card(topo, minor)
    _plug(root, topo, card, state)
    unplugged = tuple(m for m in state.unplugged if m != minor)
    _save(root, topo, dataclasses.replace(state, unplugged=unplugged))


def unload_driver(root: str) -> None:
    """Unload the driver: the module dir, every card's driver dir and every GCU node vanish."""
    topo, state = open_node(root)
    shutil.rmtree(fileio.host_path(root, "/sys/module/enflame"), ignore_errors=True)
    for card in topo.cards:
        _unbind(root, card)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fileio.host_path(root, devices.CONTROL_NODE))
    _save(root, topo, dataclasses.replace(state, driver_loaded=False))


def load_driver(root: str, version: str | None = None) -> None:
    """Load the driver (optionally a new version): nodes of plugged cards come back."""
    topo, state = open_node(root)
    state = dataclasses.replace(
        state, driver_loaded=True, driver_version=version or state.driver_version
    )
    _mknod(
        fileio.host_path(root, devices.CONTROL_NODE),
        topo.major,
        topo.control_minor,
        state.char_devices,
    )
    for card in topo.cards:
        if card.minor not in state.unplugged:
            _bind(root, topo, card, state)
    _write(fileio.host_path(root, devices.DRIVER_VERSION_FILE), state.driver_version)
    _save(root, topo, state)


def set_driver_version(root: str, version: str) -> None:
    """Upgrade in place: the version file is replaced atomically, as a module reload would."""
    topo, state = open_node(root)
    if not state.driver_loaded:
        raise SimulationError("the driver is not loaded; use 'sim load-driver --version' instead")
    fileio.atomic_write_text(fileio.host_path(root, devices.DRIVER_VERSION_FILE), version + "\n")
    _save(root, topo, dataclasses.replace(state, driver_version=version))
