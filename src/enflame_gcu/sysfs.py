"""Low-level sysfs reading under a host root; every failure becomes a precise problem text.

sysfs is input like any other: a damaged or hostile tree (non-UTF-8 bytes, absurd numbers,
entry names with newlines or non-ASCII digits, a FIFO or symlink where an attribute belongs)
yields a problem naming the path, never an exception or a blocked read. Names and numbers are
ASCII only; every text that reaches a message goes through :func:`printable`.
"""

from __future__ import annotations

import os
import re
import stat

from enflame_gcu import fileio, naming

# A sysfs attribute is at most one page; anything longer is not what the kernel wrote.
MAX_ATTRIBUTE_BYTES = 4096
# Linux device numbers: 12-bit major, 20-bit minor (kdev_t); NUMA nodes: at most 1024.
MAX_MAJOR = (1 << 12) - 1
MAX_MINOR = (1 << 20) - 1
MAX_NUMA_NODE = 1023
# Exactly gcu/vgcu + ASCII digits without a leading zero (gcu02 would alias gcu2).
NODE_NAME = re.compile(r"(v?gcu)(0|[1-9][0-9]{0,6})")
# domain:bus:device.function; VMD domains have more than four hex digits.
BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HEX = re.compile(r"(0x)?[0-9a-fA-F]{1,64}")
_DECIMAL = re.compile(r"-?[0-9]{1,64}")
_DEV = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")


def printable(text: str) -> str:
    """``text`` with control characters, lone surrogates and the like escaped: one safe line."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def node_name(entry: str) -> tuple[str, int] | None:
    """``("gcu"|"vgcu", number)`` when ``entry`` is exactly such a name, else None."""
    match = NODE_NAME.fullmatch(entry)
    if match is None or int(match.group(2)) > MAX_MINOR:
        return None
    return match.group(1), int(match.group(2))


def is_bdf(entry: str) -> bool:
    """True when ``entry`` is a PCI address as sysfs spells it."""
    return BDF.fullmatch(entry) is not None


def read(root: str, path: str, problems: list[str], *, missing_ok: bool = False) -> str | None:
    """Read a small sysfs attribute under root, stripped; on failure record why, return None.

    Only a regular file is read (never a FIFO, device or symlink in an attribute's place), at
    most one page, and it must be printable UTF-8 text.
    """
    shown = printable(path)
    try:
        fd = os.open(
            fileio.host_path(root, path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
        )
    except FileNotFoundError:
        if not missing_ok:
            problems.append(f"{shown} is missing")
        return None
    except OSError as exc:
        problems.append(f"cannot read {shown}: {exc.strerror or exc}")
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            problems.append(f"cannot read {shown}: not a regular file")
            return None
        data = os.read(fd, MAX_ATTRIBUTE_BYTES + 1)
    except OSError as exc:
        problems.append(f"cannot read {shown}: {exc.strerror or exc}")
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_ATTRIBUTE_BYTES:
        problems.append(f"{shown} is longer than {MAX_ATTRIBUTE_BYTES} bytes")
        return None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        problems.append(f"{shown} is not UTF-8 text")
        return None
    if not text.isprintable():
        problems.append(f"{shown} has unexpected content {printable(text)!r}")
        return None
    return text


def parse_int(
    text: str | None, base: int, what: str, problems: list[str], limits: tuple[int, int]
) -> int | None:
    """An ASCII number within ``limits`` (inclusive), or None with a problem naming ``what``."""
    if text is None:
        return None
    pattern = _HEX if base == 16 else _DECIMAL
    if pattern.fullmatch(text) is None:
        problems.append(f"{printable(what)} has unexpected content {printable(text)!r}")
        return None
    value = int(text, base)
    low, high = limits
    if not low <= value <= high:
        problems.append(f"{printable(what)} is out of range: {text} (want {low}..{high})")
        return None
    return value


def read_driver_version(root: str = "/") -> str | None:
    """The enflame kernel module's version, or None when the module is not loaded (or its
    version file is not plain text: unusable counts as absent)."""
    problems: list[str] = []
    text = read(root, naming.DRIVER_VERSION_FILE, problems)
    return text or None


def pci_chain(root: str, bdf: str, problems: list[str]) -> tuple[str, tuple[str, ...]]:
    """Root complex and bridge chain of a PCI device from where its sysfs link points."""
    link = fileio.host_path(root, f"{naming.PCI_DEVICES}/{bdf}")
    devices_dir = os.path.realpath(fileio.host_path(root, naming.SYS_DEVICES))
    target = os.path.realpath(link)
    relative = os.path.relpath(target, devices_dir)
    parts = relative.split(os.sep)
    if relative.startswith("..") or len(parts) < 2 or not parts[0].startswith("pci"):
        problems.append(
            f"{naming.PCI_DEVICES}/{bdf} does not lead into {naming.SYS_DEVICES}/pci*/ "
            f"({printable(target)})"
        )
        return "", ()
    if parts[-1] != bdf:
        problems.append(
            f"{naming.PCI_DEVICES}/{bdf} leads to {printable(parts[-1])}, not to itself"
        )
    chain = tuple(part for part in parts[1:-1] if is_bdf(part))
    return printable(parts[0]), chain


def driver_nodes(
    root: str, bdf: str, warnings: list[str]
) -> tuple[str | None, list[tuple[str, int]]]:
    """The driver dir name used by this card and the gcuN/vgcuN entries inside it.

    An entry that starts like a node name but is not exactly one (``gcu2\\n``, ``gcu02``,
    non-ASCII digits) is skipped with a warning naming its path.
    """
    for dirname in naming.DRIVER_DIRS:
        relative = f"{naming.PCI_DEVICES}/{bdf}/{dirname}"
        try:
            entries = sorted(os.listdir(fileio.host_path(root, relative)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return dirname, []
        nodes = []
        for entry in entries:
            parsed = node_name(entry)
            if parsed is not None:
                nodes.append(parsed)
            elif entry.startswith(("gcu", "vgcu")):
                warnings.append(
                    f"ignoring {relative}/{printable(entry)}: not gcu or vgcu followed by a card "
                    "number (ASCII digits, no leading zero)"
                )
        return dirname, nodes
    return None, []


def major_minor(root: str, path: str, problems: list[str]) -> tuple[int | None, int | None]:
    """The ``major:minor`` in a sysfs ``dev`` file."""
    text = read(root, path, problems)
    if text is None:
        return None, None
    match = _DEV.fullmatch(text)
    if match is None:
        problems.append(f"{path} has unexpected content {printable(text)!r} (want major:minor)")
        return None, None
    major, minor = int(match.group(1)), int(match.group(2))
    if major > MAX_MAJOR or minor > MAX_MINOR:
        problems.append(
            f"{path} is out of range: {text} (major <= {MAX_MAJOR}, minor <= {MAX_MINOR})"
        )
        return None, None
    return major, minor


def numa_node(root: str, bdf: str, problems: list[str]) -> int | None:
    """A PCI device's NUMA node; None when sysfs says -1 (unknown) or has no such file."""
    path = f"{naming.PCI_DEVICES}/{bdf}/numa_node"
    text = read(root, path, problems, missing_ok=True)
    value = parse_int(text, 10, path, problems, (-1, MAX_NUMA_NODE))
    return None if value is None or value < 0 else value
