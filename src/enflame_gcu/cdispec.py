"""CDI spec facts shared by every writer: version ordering and the lowest version a spec needs.

Pure functions over spec dictionaries; the toolkit's static specs (``container_toolkit.cdi``)
and the DRA driver's per-claim specs both pick their ``cdiVersion`` here, because podman 4.3
ignores specs newer than it knows (SPEC §5).
"""

from __future__ import annotations

from typing import Any

# The cdiVersion each field first appeared in (CDI spec version history).
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
BASE_VERSION = "0.3.0"


def version_key(version: str) -> tuple[int, ...]:
    """Sortable form of a version string: ``0.5.0`` -> ``(0, 5, 0)``."""
    return tuple(int(part) for part in version.split("."))


def required_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion that covers every field the spec uses (older podman ignores newer)."""
    needed = BASE_VERSION
    all_edits = [spec.get("containerEdits") or {}] + [
        device.get("containerEdits") or {} for device in spec.get("devices") or []
    ]

    def need(version: str) -> None:
        nonlocal needed
        if version_key(version) > version_key(needed):
            needed = version

    for container_edits in all_edits:
        if any("type" in mount for mount in container_edits.get("mounts") or []):
            need("0.4.0")
        if any("hostPath" in node for node in container_edits.get("deviceNodes") or []):
            need("0.5.0")
        if "intelRdt" in container_edits or "additionalGids" in container_edits:
            need("0.7.0")
    has_annotations = "annotations" in spec or any(
        "annotations" in device for device in spec.get("devices") or []
    )
    if has_annotations or "." in str(spec.get("kind", "")).partition("/")[2]:
        need("0.6.0")
    return needed
