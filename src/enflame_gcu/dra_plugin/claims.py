"""What a ResourceClaim allocated to this driver: read from the claim's status, checked.

The kubelet names claims only (namespace, name, UID); the allocation comes from the API server
(DRA.md §2). :class:`ClaimSource` is the seam: the API client implements it in production,
tests hand in a fake. :func:`allocated_devices` turns a claim object (as JSON) into the
devices of our driver, refusing a claim whose UID does not match or that is not allocated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from enflame_gcu import resourceslices
from enflame_gcu.errors import ClaimError

# What the API server accepts for each (a claim UID is a UUID; letters, digits and dashes
# cover every UID form while keeping "/", "." and ".." out of the file names built from it).
# Matched with fullmatch: ``$`` would also accept a trailing newline.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def valid_uid(uid: str) -> bool:
    """True when ``uid`` can be a claim UID (and is safe in a file name)."""
    return bool(_UID.fullmatch(uid))


def check_ref(ref: ClaimRef) -> None:
    """ClaimError unless the namespace is a DNS label, the name a DNS subdomain and the UID a
    UID: the UID becomes a file name, so ``x/../../victim`` must never get that far."""
    problems = []
    if not _DNS_LABEL.fullmatch(ref.namespace):
        problems.append(f"namespace {ref.namespace!r} is not a DNS label")
    if not _DNS_SUBDOMAIN.fullmatch(ref.name):
        problems.append(f"name {ref.name!r} is not a DNS subdomain")
    if not valid_uid(ref.uid):
        problems.append(f"uid {ref.uid!r} is not a UID (letters, digits and '-')")
    if problems:
        raise ClaimError(f"refused a claim the kubelet named: {'; '.join(problems)}")


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of our driver: request (``req`` or ``req/alternative``) and device.

    ``share_id`` and ``consumed`` are set when the device was allocated as a share of a
    consumable-capacity device (``consumed`` maps capacity names to quantities).
    """

    request: str
    pool: str
    device: str
    share_id: str | None = None
    consumed: tuple[tuple[str, str], ...] = ()

    @property
    def base_request(self) -> str:
        """The claim's request name (without a ``/alternative`` of firstAvailable)."""
        return self.request.partition("/")[0]


class ClaimSource(Protocol):
    """Where the driver reads a claim's allocation from (the API server in production)."""

    async def allocated_devices(self, claim: ClaimRef) -> list[AllocatedDevice]:
        """Our driver's devices in the claim's allocation; ClaimError when there are none."""
        ...


def allocated_devices(
    claim: ClaimRef, document: Mapping[str, Any], driver: str = resourceslices.DRIVER
) -> list[AllocatedDevice]:
    """Our driver's allocation results from a ResourceClaim object (``resource.k8s.io/v1``)."""
    metadata = document.get("metadata") or {}
    uid = metadata.get("uid")
    if uid != claim.uid:
        raise ClaimError(
            f"claim {claim.namespace}/{claim.name} has uid {uid}, not {claim.uid}: the kubelet "
            "asks for a claim that was deleted and re-created; nothing prepared"
        )
    allocation = (document.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    if not allocation:
        raise ClaimError(f"claim {claim} is not allocated; nothing to prepare")
    found = []
    for result in results:
        if not isinstance(result, Mapping) or result.get("driver") != driver:
            continue
        try:
            request, pool, device = (str(result[key]) for key in ("request", "pool", "device"))
        except KeyError as exc:
            raise ClaimError(f"claim {claim}: an allocation result lacks {exc}") from None
        # The request names a CDI device (<uid>-<request>): DNS labels only, as the API allows.
        if not all(_DNS_LABEL.fullmatch(part) for part in request.split("/", 1)):
            raise ClaimError(f"claim {claim}: request name {request!r} is not a DNS label")
        consumed = result.get("consumedCapacity") or {}
        found.append(
            AllocatedDevice(
                request=request,
                pool=pool,
                device=device,
                share_id=str(result["shareID"]) if result.get("shareID") else None,
                consumed=tuple(sorted((str(k), str(v)) for k, v in consumed.items())),
            )
        )
    if not found:
        raise ClaimError(f"claim {claim} has no device of driver {driver} in its allocation")
    return found
