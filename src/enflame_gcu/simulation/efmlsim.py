"""The simulated libefml: its values files under a simulated node, and building the library.

The C source (``efml/libefml_sim.c``) exports libefml's symbols with its struct layouts and reads
every value from ``<root>/.enflame-sim/efml/card<I>`` (``key value`` lines, I = the library's card
index) and ``.../efml/node``. :func:`write_defaults` gives each card plausible readings when the
node is made; :func:`set_values` changes them (a temperature, an ECC count) or injects a fault
(``fail`` an error code, ``hang`` a call that blocks); :func:`install` compiles the library with
the system's C compiler into ``<root>/usr/lib/libefml.so``, where the binding looks on a node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from importlib import resources

from enflame_gcu import fileio
from enflame_gcu.errors import SimulationError
from enflame_gcu.simulation.topofile import SimCard, SimTopology

EFML_DIR = os.path.join(".enflame-sim", "efml")
LIBRARY_PATH = "/usr/lib/libefml.so"
GiB = 1 << 30
CC = os.environ.get("CC", "gcc")


def card_values(index: int, card: SimCard) -> dict[str, str]:
    """Plausible readings of an idle, healthy card (a 48 GiB GCU300 on PCIe Gen4 x16)."""
    domain, bus, rest = card.bdf.split(":")
    dev, func = rest.split(".")
    values = {
        "name": "S60",
        "sku": "S60",
        "uuid": f"{card.minor:08x}-5117-4a3e-8e2a-{int(bus, 16):012x}",
        "sn": f"SIMSN{card.minor:06d}",
        "pn": "EF-S60-48G",
        "fw_version": "33.5.2",
        "slot": f"OAM{index}",
        "vendor_id": str(0x1E36),
        "device_id": str(card.device_id),
        "domain": str(int(domain, 16)),
        "bus": str(int(bus, 16)),
        "dev": str(int(dev, 16)),
        "func": str(int(func, 16)),
        "logic_id": str(card.minor),
        "arch": "2",
        "mem_total_bytes": str(48 * GiB),
        "mem_used_mib": "0",
        "usage": "0",
        "sip_usage": "0",
        "clusters": "2",
        "cluster_usage": "0 0",
        "pgs": "0",
        "hbm_clock_mhz": "1600",
        "dtu_clock_mhz": "1400",
        "max_dtu_clock_mhz": "1500",
        "asic_temp": "38",
        "mem_temp": "36",
        "board_temp": "33",
        "power": "75",
        "power_capability": "400",
        "power_mode": "1",
        "ecc_enabled": "1",
        "ecc_sbe": "0",
        "ecc_dbe": "0",
        "link_speed": "4",
        "max_link_speed": "4",
        "link_width": "16",
        "max_link_width": "16",
        "pcie_tx": "0",
        "pcie_rx": "0",
        "pcie_tx_nak": "0",
        "pcie_rx_nak": "0",
        "virt_mode": "1" if card.vgcus else "0",
    }
    if card.vgcus:
        values["vdevs"] = " ".join(str(v) for v in card.vgcus)
        for vgcu in card.vgcus:
            values[f"vgcu{vgcu}_usage"] = "0"
            values[f"vgcu{vgcu}_mem_total_bytes"] = str(48 * GiB // len(card.vgcus))
            values[f"vgcu{vgcu}_mem_used_mib"] = "0"
    return values


def _render(values: Mapping[str, str]) -> str:
    for key, value in values.items():
        if not key or " " in key or "\n" in key or "\n" in value:
            raise SimulationError(
                f"simulated libefml value {key!r}={value!r}: no spaces or newlines"
            )
    return "".join(f"{key} {value}\n" for key, value in values.items())


def _folder(root: str) -> str:
    return os.path.join(root, EFML_DIR)


def write_defaults(root: str, topo: SimTopology) -> None:
    """The node file and one values file per card, in description order (library index)."""
    os.makedirs(_folder(root), exist_ok=True)
    node = {
        "driver_ver": topo.driver_version,
        "lib_ver": "1.2.3.5",
        "access_point": "/sys/bus/pci/devices/",
    }
    fileio.atomic_write_text(os.path.join(_folder(root), "node"), _render(node))
    for index, card in enumerate(topo.cards):
        path = os.path.join(_folder(root), f"card{index}")
        fileio.atomic_write_text(path, _render(card_values(index, card)))


def index_of(topo: SimTopology, minor: int) -> int:
    """The library's index of card ``gcu<minor>``."""
    for index, card in enumerate(topo.cards):
        if card.minor == minor:
            return index
    raise SimulationError(f"no card gcu{minor}; cards: {[f'gcu{c.minor}' for c in topo.cards]}")


def read_values(root: str, name: str) -> dict[str, str]:
    """The values of ``card<I>`` or ``node``."""
    path = os.path.join(_folder(root), name)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise SimulationError(f"{root} has no simulated libefml values {name}: {exc}") from exc
    pairs = (line.partition(" ") for line in lines if line)
    return {key: value for key, _, value in pairs}


def set_values(root: str, name: str, changes: Mapping[str, str | None]) -> None:
    """Change (or with None remove) values of ``card<I>`` or ``node``, atomically."""
    values = read_values(root, name)
    for key, value in changes.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    fileio.atomic_write_text(os.path.join(_folder(root), name), _render(values))


def driver_reloaded(root: str, version: str) -> None:
    """Tell the simulated libefml the driver was (re)loaded at ``version``: its calls answer
    UNINITIALIZED until EfmlInit runs again. Nothing to do on a node without its values."""
    if os.path.exists(os.path.join(_folder(root), "node")):
        set_values(root, "node", {"driver_ver": version})


def source_dir() -> str:
    """Where the C source and header are (inside the installed package)."""
    return str(resources.files("enflame_gcu.simulation").joinpath("efml"))


def _compile(source: str, flags: list[str], libs: list[str]) -> str:
    """``source`` compiled to a shared library in the temp dir, cached by content and flags."""
    folder = source_dir()
    digest = hashlib.sha256()
    for name in (source, "efml_types.h"):
        with open(os.path.join(folder, name), "rb") as handle:
            digest.update(handle.read())
    digest.update(" ".join([*flags, *libs]).encode())
    stem = os.path.splitext(source)[0]
    cache = os.path.join(tempfile.gettempdir(), f"enflame-{stem}-{digest.hexdigest()[:16]}.so")
    if not os.path.exists(cache):
        if shutil.which(CC) is None:
            raise SimulationError(f"no C compiler {CC!r}: install gcc (scripts/bootstrap.sh does)")
        partial = f"{cache}.{os.getpid()}"
        command = [CC, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
                   "-fvisibility=hidden", *flags, "-o", partial,
                   os.path.join(folder, source), *libs]  # fmt: skip
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=120
            )
        except OSError as exc:
            raise SimulationError(f"building the simulated libefml: {CC}: {exc}") from exc
        if result.returncode != 0:
            raise SimulationError(f"building the simulated libefml failed: {result.stderr[-2000:]}")
        os.replace(partial, cache)
    return cache


def build(target: str, *, legacy: bool = False) -> str:
    """Compile the library to ``target`` (cached by source hash); ``legacy`` leaves out the
    optional and GCU300-only calls. SimulationError names the compiler's complaint."""
    cache = _compile("libefml_sim.c", ["-DEFML_SIM_LEGACY"] if legacy else [], [])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(cache, target)
    return target


VENDOR_DIR = "/usr/local/efsmi/lib"
VENDOR_NAME = "libefml.so.1.2.3"
DEP_NAME = "libefsmi_sim.so"


def install(root: str, *, legacy: bool = False, vendor_layout: bool = False) -> str:
    """Build the library into ``<root>/usr/lib/libefml.so`` (where a node's libefml lives).

    ``vendor_layout``: as the vendor installs it, the library and a library it depends on under
    ``<root>/usr/local/efsmi/lib`` and ``/usr/lib/libefml.so`` a link to it (an absolute target,
    as on a host): a container that mounts only /usr/lib sees a dangling link.
    """
    link = fileio.host_path(root, LIBRARY_PATH)
    if not vendor_layout:
        return build(link, legacy=legacy)
    folder = fileio.host_path(root, VENDOR_DIR)
    os.makedirs(folder, exist_ok=True)
    dep = _compile("efsmi_dep.c", [f"-Wl,-soname,{DEP_NAME}"], [])
    shutil.copyfile(dep, os.path.join(folder, DEP_NAME))
    flags = ["-DEFML_SIM_DEP", *(["-DEFML_SIM_LEGACY"] if legacy else [])]
    # Needed by its soname, found next to the library ($ORIGIN), as an installed library is.
    libs = [f"-L{os.path.dirname(dep)}", f"-l:{os.path.basename(dep)}", "-Wl,-rpath,$ORIGIN"]
    built = _compile("libefml_sim.c", flags, libs)
    shutil.copyfile(built, os.path.join(folder, VENDOR_NAME))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(f"{VENDOR_DIR}/{VENDOR_NAME}", link)
    return link
