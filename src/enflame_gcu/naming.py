"""How devices are spelled towards containers: the env var, the mount dir and CDI names.

The device plugin writes these spellings (through ``edits``) and the runtime shim reads them
(through ``container_toolkit.device_request``), so they live here once. Standard library only
and no ``typing`` at run time: the runtime's create fast path imports this module.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

VISIBLE_DEVICES_ENV = "ENFLAME_VISIBLE_DEVICES"
VOLUME_MOUNT_DIR = "/var/run/enflame-container-devices"
CDI_VENDOR = "enflame.com"
CDI_ANNOTATION_KEY = "cdi.k8s.io/enflame-gcu"
PROCESSED_ANNOTATION = "com.enflame.gcu.processed"


def visible_value(names: Sequence[str]) -> str:
    """``ENFLAME_VISIBLE_DEVICES`` value for device names: minors of cards, names otherwise.

    ``["gcu0", "gcu1"]`` -> ``"0,1"``; vGCUs keep their name (``vgcu3``) so the grammar stays
    unambiguous; repeats collapse; no names -> ``"none"``.
    """
    if not names:
        return "none"
    return ",".join(name[3:] if name.startswith("gcu") else name for name in dict.fromkeys(names))


def cdi_device_name(name: str) -> str:
    """Fully qualified CDI name of a device: ``gcu3`` -> ``enflame.com/gcu=3``."""
    kind = name.rstrip("0123456789")
    return f"{CDI_VENDOR}/{kind}={name[len(kind) :]}"
