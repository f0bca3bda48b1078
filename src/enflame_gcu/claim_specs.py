"""The DRA driver's per-claim CDI specs as the runtime reads them back (standard library only).

The driver writes one spec file per claim (``k8s.gcu.enflame.com-claim_<uid>.json``) with one
CDI device ``<uid>-<request>`` per request. On nodes whose engine does not apply CDI itself
(containerd 1.6) the kubelet's ``cdi.k8s.io/...`` annotation reaches our runtime instead: it
finds the named device here and takes its ``ENFLAME_VISIBLE_DEVICES`` list, then injects the
cards from its own discovery, so nothing but the card list is taken from the file. The
runtime's create path imports this module: no typing, no dataclasses at run time.
"""

from __future__ import annotations

import os
import stat

from enflame_gcu import fileio, naming

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

DRIVER = naming.DRA_DRIVER
CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
FILE_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"
FILE_SUFFIX = ".json"
_VISIBLE = "ENFLAME_VISIBLE_DEVICES="
_MAX_SPEC_BYTES = 1 << 20


class ClaimSpecError(Exception):
    """A per-claim CDI device cannot be found or its spec file is not to be trusted."""


def file_name(claim_uid: str) -> str:
    """The spec file name of a claim."""
    return f"{FILE_PREFIX}{claim_uid}{FILE_SUFFIX}"


def _load(path: str) -> dict[str, Any]:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ClaimSpecError(f"{path} is not a regular file")
    if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
        raise ClaimSpecError(f"{path} is writable by others than its root owner; not used")
    if info.st_size > _MAX_SPEC_BYTES:
        raise ClaimSpecError(f"{path} is larger than {_MAX_SPEC_BYTES} bytes")
    try:
        data = fileio.read_json(path, _MAX_SPEC_BYTES)
    except (OSError, ValueError) as exc:
        raise ClaimSpecError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != CDI_KIND:
        raise ClaimSpecError(f"{path} is not a {CDI_KIND} spec")
    return data


def visible_devices(device_name: str, directories: Sequence[str]) -> str:
    """The ``ENFLAME_VISIBLE_DEVICES`` value of CDI device ``device_name`` (``<uid>-<request>``)."""
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            uid = name[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
            if not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
                continue
            if not device_name.startswith(f"{uid}-"):
                continue
            path = os.path.join(directory, name)
            for device in _load(path).get("devices") or []:
                if not isinstance(device, dict) or device.get("name") != device_name:
                    continue
                edits = device.get("containerEdits") or {}
                env = edits.get("env") if isinstance(edits, dict) else None
                values = [
                    item[len(_VISIBLE) :]
                    for item in env or []
                    if isinstance(item, str) and item.startswith(_VISIBLE)
                ]
                if len(values) != 1:
                    raise ClaimSpecError(f"{path}: device {device_name} has no single card list")
                return values[0]
    searched = ", ".join(directories) or "no directory (cdi-spec-dirs is empty)"
    raise ClaimSpecError(
        f"no per-claim CDI spec defines {CDI_KIND}={device_name} (searched {searched}); the "
        "DRA driver writes it when the kubelet prepares the claim"
    )
