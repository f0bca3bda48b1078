"""Low-level sysfs reading under a host root; every failure becomes a precise problem text."""

from __future__ import annotations

import os
import re

from enflame_gcu import fileio

PCI_DEVICES = "/sys/bus/pci/devices"
SYS_DEVICES = "/sys/devices"
DRIVER_VERSION_FILE = "/sys/module/enflame/version"
DRIVER_DIRS = ("enflame", "zixiao")
NODE_NAME = re.compile(r"^(v?gcu)(\d+)$")
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def read(root: str, path: str, problems: list[str]) -> str | None:
    """Read a small sysfs file under root; on failure record a precise problem and return None."""
    full = fileio.host_path(root, path)
    try:
        with open(full, encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        problems.append(f"{path} is missing")
    except OSError as exc:
        problems.append(f"cannot read {path}: {exc.strerror or exc}")
    return None


def parse_int(text: str | None, base: int, what: str, problems: list[str]) -> int | None:
    """``int(text, base)``, or None with a problem naming ``what`` when it is not a number."""
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        problems.append(f"{what} has unexpected content {text!r}")
        return None


def read_driver_version(root: str = "/") -> str | None:
    """The enflame kernel module's version, or None when the module is not loaded."""
    problems: list[str] = []
    text = read(root, DRIVER_VERSION_FILE, problems)
    return text or None


def pci_chain(root: str, bdf: str, problems: list[str]) -> tuple[str, tuple[str, ...]]:
    """Root complex and bridge chain of a PCI device from where its sysfs link points."""
    link = fileio.host_path(root, f"{PCI_DEVICES}/{bdf}")
    devices_dir = os.path.realpath(fileio.host_path(root, SYS_DEVICES))
    target = os.path.realpath(link)
    relative = os.path.relpath(target, devices_dir)
    parts = relative.split(os.sep)
    if relative.startswith("..") or len(parts) < 2 or not parts[0].startswith("pci"):
        problems.append(f"{PCI_DEVICES}/{bdf} does not lead into {SYS_DEVICES}/pci*/ ({target})")
        return "", ()
    if parts[-1] != bdf:
        problems.append(f"{PCI_DEVICES}/{bdf} leads to {parts[-1]}, not to itself")
    chain = tuple(part for part in parts[1:-1] if BDF.match(part))
    return parts[0], chain


def driver_nodes(root: str, bdf: str) -> tuple[str | None, list[tuple[str, int]]]:
    """The driver dir name used by this card and the gcuN/vgcuN entries inside it."""
    for dirname in DRIVER_DIRS:
        directory = fileio.host_path(root, f"{PCI_DEVICES}/{bdf}/{dirname}")
        try:
            entries = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return dirname, []
        nodes = []
        for entry in entries:
            match = NODE_NAME.match(entry)
            if match:
                nodes.append((match.group(1), int(match.group(2))))
        return dirname, nodes
    return None, []


def major_minor(root: str, path: str, problems: list[str]) -> tuple[int | None, int | None]:
    """The ``major:minor`` in a sysfs ``dev`` file."""
    text = read(root, path, problems)
    if text is None:
        return None, None
    major, sep, minor = text.partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        problems.append(f"{path} has unexpected content {text!r} (want major:minor)")
        return None, None
    return int(major), int(minor)


def numa_node(root: str, bdf: str, problems: list[str]) -> int | None:
    """A PCI device's NUMA node; None when sysfs says -1 (unknown) or has no file."""
    ignored: list[str] = []
    text = read(root, f"{PCI_DEVICES}/{bdf}/numa_node", ignored)
    value = parse_int(text, 10, f"{PCI_DEVICES}/{bdf}/numa_node", problems)
    return None if value is None or value < 0 else value
