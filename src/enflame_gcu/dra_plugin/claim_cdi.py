"""Per-claim CDI specs: one transient spec file per claim, one CDI device per request.

A request's cards go into one CDI device, so its ``ENFLAME_VISIBLE_DEVICES`` lists them all
(CDI merges env by "last device wins": a device per card would leave only one card in the
variable). The edits come from :func:`edits.for_devices`, the model Allocate and the runtime
use, so a container gets the same nodes whichever way it asked. Files live in ``/var/run/cdi``
(a tmpfs: the driver writes them again after a reboot for claims still prepared).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from enflame_gcu import cdispec, claim_specs, devices, edits, fileio, sharing
from enflame_gcu.dra_plugin import checkpoint, claims
from enflame_gcu.errors import ClaimError, SpecError

# The spellings live where the runtime reads them back (claim_specs, standard library only).
CDI_VENDOR = claim_specs.CDI_VENDOR
CDI_CLASS = claim_specs.CDI_CLASS
CDI_KIND = claim_specs.CDI_KIND
DRS_ENV = "TOPS_VISIBLE_DEVICES"  # how a container names its DRS instance (gcushare's name)


def device_name(claim_uid: str, request: str) -> str:
    """CDI device name of one request of a claim: ``<claim UID>-<request>``."""
    return f"{claim_uid}-{request}"


def qualified_name(claim_uid: str, request: str) -> str:
    """Fully qualified CDI name, as returned to the kubelet."""
    return f"{CDI_KIND}={device_name(claim_uid, request)}"


def spec_path(cdi_dir: str, claim_uid: str) -> str:
    """Where the claim's spec file lives; ClaimError for a UID that is not one (it would
    lead elsewhere: ``x/../../victim``)."""
    if not claims.valid_uid(claim_uid):
        raise ClaimError(f"claim uid {claim_uid!r} is not a UID; no file is named after it")
    return os.path.join(cdi_dir, claim_specs.file_name(claim_uid))


def requests_of(devices_list: Sequence[checkpoint.PreparedDevice]) -> dict[str, list[str]]:
    """Node device names by the claim's request (first-seen order)."""
    result: dict[str, list[str]] = {}
    for device in devices_list:
        base = device.request.partition("/")[0]
        result.setdefault(base, []).append(device.node_name)
    return result


def _share_env(
    devices_list: Sequence[checkpoint.PreparedDevice], slices_of: Mapping[str, int]
) -> dict[str, str]:
    shares = [d for d in devices_list if d.share_id is not None and d.slices is not None]
    if not shares:
        return {}
    cards = tuple(d.node_name for d in shares)
    held = tuple(
        (int(d.slices or 0), slices_of.get(d.node_name, int(d.slices or 0))) for d in shares
    )
    return sharing.SliceGrant(cards, held).env()


def _drs_env(devices_list: Sequence[checkpoint.PreparedDevice]) -> dict[str, str]:
    partitions = [d for d in devices_list if d.drs_profile is not None]
    if not partitions:
        return {}
    missing = [d.device for d in partitions if not d.drs_uuid]
    if missing:
        raise SpecError(f"DRS partition(s) {', '.join(missing)} have no instance yet")
    return {DRS_ENV: ",".join(f"DRS-{d.drs_uuid}" for d in partitions)}


def build_spec(
    inventory: devices.Inventory,
    claim: checkpoint.PreparedClaim,
    slices_of: Mapping[str, int],
) -> dict[str, Any]:
    """The claim's CDI spec; InvalidRequestError when a device is not usable on the node."""
    entries = []
    for request, names in requests_of(claim.devices).items():
        own = [d for d in claim.devices if d.request.partition("/")[0] == request]
        env = {**_share_env(own, slices_of), **_drs_env(own)}
        request_edits = edits.for_devices(inventory, list(dict.fromkeys(names)), env=env)
        entries.append(
            {"name": device_name(claim.uid, request), "containerEdits": request_edits.to_cdi()}
        )
    spec: dict[str, Any] = {
        "cdiVersion": cdispec.BASE_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
    }
    spec["cdiVersion"] = cdispec.required_version(spec)
    return spec


def write(cdi_dir: str, claim_uid: str, spec: Mapping[str, Any]) -> str:
    """Write the claim's spec atomically; return its path."""
    os.makedirs(cdi_dir, exist_ok=True)
    path = spec_path(cdi_dir, claim_uid)
    # Atomic for every reader, but not fsynced: /var/run/cdi is a tmpfs that a reboot empties
    # anyway, and the checkpoint (which is durable) brings the spec back.
    fileio.atomic_write(path, (json.dumps(spec, indent=1) + "\n").encode(), 0o644, durable=False)
    return path


def remove(cdi_dir: str, claim_uid: str) -> bool:
    """Remove the claim's spec; False when there was none."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(spec_path(cdi_dir, claim_uid))
        return True
    return False


def claim_uids_on_disk(cdi_dir: str) -> set[str]:
    """UIDs of every per-claim spec of ours in ``cdi_dir``."""
    prefix, suffix = claim_specs.FILE_PREFIX, claim_specs.FILE_SUFFIX
    try:
        names = os.listdir(cdi_dir)
    except FileNotFoundError:
        return set()
    return {
        name[len(prefix) : -len(suffix)]
        for name in names
        if name.startswith(prefix) and name.endswith(suffix)
    }
