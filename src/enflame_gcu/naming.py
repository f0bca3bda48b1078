"""The facts every layer spells the same: names and paths towards containers and on the host.

The env var, the mount dir, CDI names, the control node, the driver-version file, the order
of device nodes, the rendering of a mount and the health-check switch: the device plugin
writes these (through ``edits``), the runtime shim reads them back (``shim.request``,
``shim.prepared_edits``), discovery and the CDI generator use them, so each is defined here
once. Standard library only and no ``typing`` at run time: the runtime's create fast path
imports this module.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

VISIBLE_DEVICES_ENV = "ENFLAME_VISIBLE_DEVICES"
VOLUME_MOUNT_DIR = "/var/run/enflame-container-devices"
CDI_VENDOR = "enflame.com"
CDI_ANNOTATION_KEY = "cdi.k8s.io/enflame-gcu"
# CDI kind -> device-name prefix, for the kinds our specs define.
CDI_KINDS = {f"{CDI_VENDOR}/gcu": "gcu", f"{CDI_VENDOR}/vgcu": "vgcu"}
PROCESSED_ANNOTATION = "com.enflame.gcu.processed"
# The DRA driver's name: in ResourceSlices, claims' results and its CDI vendor (k8s.<driver>).
DRA_DRIVER = "gcu.enflame.com"
# Where discovery reads a card: its PCI function, the device tree, the driver's dirs in order.
PCI_DEVICES = "/sys/bus/pci/devices"
SYS_DEVICES = "/sys/devices"
DRIVER_DIRS = ("enflame", "zixiao")
# Every GCU container needs the control node besides its cards.
CONTROL_NODE = "/dev/gcuctl"
# Readable exactly when the driver is loaded; discovery marks every card unusable without it.
DRIVER_VERSION_FILE = "/sys/module/enflame/version"
# Turns health checks off (value ``all``), in the device plugin and the DRA driver alike.
DISABLE_HEALTHCHECKS_ENV = "ENFLAME_DISABLE_HEALTHCHECKS"
# Its 0.1 name, still read (with a warning) by both plugins until support.env_vars.OLD_NAMES_UNTIL.
OLD_DISABLE_HEALTHCHECKS_ENV = "DP_DISABLE_HEALTHCHECKS"
# Options of a mount in the CDI rendering; without "ro" the bind is writable.
_MOUNT_OPTIONS = ("nosuid", "nodev", "bind")


# Linux device minors have 20 bits (MINORBITS); no card index is larger.
MAX_INDEX = (1 << 20) - 1
_ASCII_DIGITS = frozenset("0123456789")
# Leading zeros are accepted ("007"), within reason: no index is spelled in more characters.
_MAX_INDEX_LENGTH = 10


def index(text: str) -> int | None:
    """The index (card minor) that ``text`` spells, or None when it is not an index.

    Only ASCII digits are digits here: ``str.isdigit`` and ``int`` also take ``²`` or ``٣``
    (other scripts), which no device plugin writes and which must not name a card. Values beyond the
    largest minor, or longer than 10 characters, are not indexes either (``int`` would even
    raise on digit strings past 4300 characters).
    """
    if not text or len(text) > _MAX_INDEX_LENGTH or not _ASCII_DIGITS.issuperset(text):
        return None
    value = int(text)
    return value if value <= MAX_INDEX else None


def device_index(name: str) -> tuple[str, int] | None:
    """``gcu3`` -> ``("gcu", 3)``, ``vgcu12`` -> ``("vgcu", 12)``; None for any other name."""
    for kind in ("vgcu", "gcu"):
        if name.startswith(kind):
            number = index(name[len(kind) :])
            return None if number is None else (kind, number)
    return None


def _order(name: str) -> tuple[int, int, str]:
    parsed = device_index(name)
    if parsed is None:
        return (2, 0, name)
    return (0 if parsed[0] == "gcu" else 1, parsed[1], name)


def index_order(names: Sequence[str]) -> list[str]:
    """Device names without repeats, cards by index, then vGCUs by index (then anything else).

    The kubelet lists allocated IDs in no particular order (a real one gave ``1,0``); sorting
    makes logical card 0 in a container the lowest physical card, whatever the request order.
    """
    return sorted(dict.fromkeys(names), key=_order)


def visible_value(names: Sequence[str]) -> str:
    """``ENFLAME_VISIBLE_DEVICES`` value for device names: minors of cards, names otherwise.

    ``["gcu1", "gcu0"]`` -> ``"0,1"`` (index order, see :func:`index_order`); vGCUs keep their
    name (``vgcu3``) so the grammar stays unambiguous; repeats collapse; no names -> ``"none"``.
    """
    if not names:
        return "none"
    return ",".join(name[3:] if name.startswith("gcu") else name for name in index_order(names))


def cdi_device_name(name: str) -> str:
    """Fully qualified CDI name of a device: ``gcu3`` -> ``enflame.com/gcu=3``."""
    kind = name.rstrip("0123456789")
    return f"{CDI_VENDOR}/{kind}={name[len(kind) :]}"


def node_order(path: str, minor: int) -> tuple[int, str, int]:
    """Sort key of a device node: cards by minor, then vGCUs by minor, the control node last.

    Every renderer (Allocate, CDI, the runtime's both paths) sorts with it: stable output.
    """
    return (1 if path == CONTROL_NODE else 0, path.rstrip("0123456789"), minor)


def render_mount(host_path: str, container_path: str, read_only: bool = True) -> dict[str, object]:
    """A bind mount in the CDI rendering (the shape ``ContainerEdits.to_cdi`` writes)."""
    options = ["ro", *_MOUNT_OPTIONS] if read_only else list(_MOUNT_OPTIONS)
    return {"hostPath": host_path, "containerPath": container_path, "options": options}
