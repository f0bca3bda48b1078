"""What a ResourceClaim allocated to this driver: read from the claim's status, checked.

The kubelet names claims only (namespace, name, UID); the allocation comes from the API server
(DRA.md §2). :class:`ClaimSource` is the seam: the API client implements it in production,
tests hand in a fake. :func:`allocated_devices` turns a claim object (as JSON) into the
devices of our driver, refusing a claim whose UID does not match or that is not allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from enflame_gcu import resourceslices
from enflame_gcu.errors import ClaimError


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
