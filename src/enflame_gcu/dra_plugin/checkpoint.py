"""The driver's record of prepared claims, kept on disk so that restarts and reboots keep it.

One JSON file in the plugin's data directory (``/var/lib/kubelet/plugins/<driver>``, which
survives a reboot, unlike ``/var/run/cdi``), replaced atomically with fsync on every change.
A claim is written as ``preparing`` before its CDI spec exists and as ``prepared`` after, so a
crash between the two leaves a ``preparing`` entry that the next start rolls back. A DRS
partition's instance is recorded (id and UUID) as soon as efsmi created it, before the spec is
written: the next start destroys what a rolled-back claim or nobody on record holds. Before a
create starts, the UUIDs the card already has are recorded with the device (``drsBefore``): a
Prepare that finds its claim still ``preparing`` adopts or destroys what was created since.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from enflame_gcu import fileio
from enflame_gcu.dra_plugin import claims
from enflame_gcu.errors import ConfigError

FORMAT_VERSION = 1
PREPARING = "preparing"
PREPARED = "prepared"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim: its request, published and node names, and share."""

    request: str
    device: str
    node_name: str
    share_id: str | None = None
    slices: int | None = None
    drs_profile: str | None = None  # a DRS partition of the card: its profile
    drs_instance: str | None = None  # the efsmi instance id, once created
    drs_uuid: str | None = None  # and its UUID (TOPS_VISIBLE_DEVICES=DRS-<uuid>)
    # A create was started and its outcome is not on record yet: the UUIDs the card had
    # before it, so that what was created since can be adopted or destroyed, never doubled.
    drs_before: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim the driver prepared (or was preparing when it stopped)."""

    uid: str
    namespace: str
    name: str
    state: str
    devices: tuple[PreparedDevice, ...]
    cdi_ids: tuple[tuple[str, str], ...] = ()  # (request, fully qualified CDI name)

    def with_state(self, state: str) -> PreparedClaim:
        """A copy in another state."""
        return PreparedClaim(self.uid, self.namespace, self.name, state, self.devices, self.cdi_ids)


def _claim_to_json(claim: PreparedClaim) -> dict[str, Any]:
    return {
        "namespace": claim.namespace,
        "name": claim.name,
        "state": claim.state,
        "devices": [
            {
                "request": d.request,
                "device": d.device,
                "nodeName": d.node_name,
                **({"shareID": d.share_id} if d.share_id else {}),
                **({"slices": d.slices} if d.slices is not None else {}),
                **({"drsProfile": d.drs_profile} if d.drs_profile else {}),
                **({"drsInstance": d.drs_instance} if d.drs_instance else {}),
                **({"drsUUID": d.drs_uuid} if d.drs_uuid else {}),
                **({"drsBefore": list(d.drs_before)} if d.drs_before is not None else {}),
            }
            for d in claim.devices
        ],
        "cdiDevices": [{"request": r, "id": i} for r, i in claim.cdi_ids],
    }


def _claim_from_json(uid: str, data: Mapping[str, Any]) -> PreparedClaim:
    if not claims.valid_uid(uid):
        raise ValueError(f"claim uid {uid!r} is not a UID")
    state = data["state"]
    if state not in (PREPARING, PREPARED):
        raise ValueError(f"unknown state {state!r}")
    devices = tuple(
        PreparedDevice(
            request=str(d["request"]),
            device=str(d["device"]),
            node_name=str(d["nodeName"]),
            share_id=str(d["shareID"]) if d.get("shareID") else None,
            slices=int(d["slices"]) if d.get("slices") is not None else None,
            drs_profile=str(d["drsProfile"]) if d.get("drsProfile") else None,
            drs_instance=str(d["drsInstance"]) if d.get("drsInstance") else None,
            drs_uuid=str(d["drsUUID"]) if d.get("drsUUID") else None,
            drs_before=_uuids(d["drsBefore"]) if "drsBefore" in d else None,
        )
        for d in data["devices"]
    )
    cdi_ids = tuple((str(e["request"]), str(e["id"])) for e in data.get("cdiDevices") or [])
    return PreparedClaim(uid, str(data["namespace"]), str(data["name"]), state, devices, cdi_ids)


def _uuids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"drsBefore {value!r} is not a list of UUIDs")
    return tuple(value)


class Checkpoint:
    """Load and save the prepared claims; a damaged file is an error, never silently reset."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        """Claims by UID; an absent file is an empty record."""
        try:
            raw = fileio.read_regular(self.path)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"cannot read the DRA checkpoint {self.path}: {exc}") from exc
        try:
            data = fileio.parse_json(raw, self.path)
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {data.get('version')!r}, want {FORMAT_VERSION}")
            return {uid: _claim_from_json(uid, entry) for uid, entry in data["claims"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"the DRA checkpoint {self.path} is damaged ({exc}); it records which claims "
                "hold which GCUs, so the driver will not guess: move it aside to start "
                "without it (claims prepared before are then not protected from double use)"
            ) from exc

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Replace the file atomically (and durably) with ``claims``."""
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        document = {
            "version": FORMAT_VERSION,
            "claims": {uid: _claim_to_json(claims[uid]) for uid in sorted(claims)},
        }
        fileio.atomic_write_text(self.path, json.dumps(document, indent=1) + "\n", mode=0o600)
