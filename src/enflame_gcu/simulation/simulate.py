"""A simulated GCU node: a fake sysfs and /dev tree under a directory, built from a description.

The description format lives in :mod:`topofile`; this module writes the tree it
describes (exactly as SPEC §2 lays a real node out) and changes it later: unplug and replug a
card, unload and reload the driver, change the driver's version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import stat
from dataclasses import dataclass

from enflame_gcu import devices, fileio, naming
from enflame_gcu.errors import SimulationError
from enflame_gcu.simulation import efmlsim, topofile
from enflame_gcu.simulation.topofile import SimCard, SimTopology

BRIDGE_VENDOR = 0x10B5  # PLX/Broadcom: the usual PCIe switch vendor
BRIDGE_DEVICE = 0x8747
BRIDGE_CLASS = 0x060400
CARD_CLASS = 0x120000
STATE_DIR = devices.SIMULATION_MARKER


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
    return fileio.host_path(root, os.path.join(naming.SYS_DEVICES, *parts))


def _link_function(root: str, directory: str, bdf: str) -> None:
    link = fileio.host_path(root, f"{naming.PCI_DEVICES}/{bdf}")
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
    fileio.atomic_write_text(os.path.join(folder, "topology.topo"), topofile.render(topo))
    fileio.atomic_write_text(
        os.path.join(folder, "state.json"), json.dumps(dataclasses.asdict(state), indent=2) + "\n"
    )


def open_node(root: str) -> tuple[SimTopology, SimState]:
    """The description and state of a simulated node made by :func:`create`."""
    folder = os.path.join(root, STATE_DIR)
    try:
        with open(os.path.join(folder, "topology.topo"), encoding="utf-8") as handle:
            topo = topofile.parse(handle.read())
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
    _write(fileio.host_path(root, naming.DRIVER_VERSION_FILE), topo.driver_version)
    _mknod(
        fileio.host_path(root, naming.CONTROL_NODE), topo.major, topo.control_minor, char_devices
    )
    for card in topo.cards:
        _plug(root, topo, card, state)
    # The simulated libefml's readings (the library itself is built only on request).
    efmlsim.write_defaults(root, topo)
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
        os.unlink(fileio.host_path(root, f"{naming.PCI_DEVICES}/{card.bdf}"))
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
        os.unlink(fileio.host_path(root, naming.CONTROL_NODE))
    _save(root, topo, dataclasses.replace(state, driver_loaded=False))


def load_driver(root: str, version: str | None = None) -> None:
    """Load the driver (optionally a new version): nodes of plugged cards come back."""
    topo, state = open_node(root)
    state = dataclasses.replace(
        state, driver_loaded=True, driver_version=version or state.driver_version
    )
    _mknod(
        fileio.host_path(root, naming.CONTROL_NODE),
        topo.major,
        topo.control_minor,
        state.char_devices,
    )
    for card in topo.cards:
        if card.minor not in state.unplugged:
            _bind(root, topo, card, state)
    _write(fileio.host_path(root, naming.DRIVER_VERSION_FILE), state.driver_version)
    _save(root, topo, state)
    efmlsim.driver_reloaded(root, state.driver_version)


def set_driver_version(root: str, version: str) -> None:
    """Upgrade in place: the version file is replaced atomically, as a module reload would."""
    topo, state = open_node(root)
    if not state.driver_loaded:
        raise SimulationError("the driver is not loaded; use 'sim load-driver --version' instead")
    fileio.atomic_write_text(fileio.host_path(root, naming.DRIVER_VERSION_FILE), version + "\n")
    _save(root, topo, dataclasses.replace(state, driver_version=version))
    efmlsim.driver_reloaded(root, version)
