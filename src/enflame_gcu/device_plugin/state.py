"""What one resource currently offers: discovery, health and policy, with change notification.

The gRPC service reads a :class:`Snapshot` (a resource kind from :mod:`.resources` plus device
health); health updates and rediscovery replace it. Each replacement wakes every ListAndWatch
stream, which then sends the whole new list.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from enflame_gcu import allocation, devices
from enflame_gcu.device_plugin import resources
from enflame_gcu.errors import InvalidRequestError

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device as advertised: ID, health and NUMA node (None = unknown)."""

    id: str
    healthy: bool
    numa_node: int | None

    @property
    def health(self) -> str:
        """``Healthy`` or ``Unhealthy``, as the kubelet spells them."""
        return HEALTHY if self.healthy else UNHEALTHY


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything an RPC needs, immutable; ``generation`` grows with every change."""

    kind: resources.DeviceKind
    health: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    generation: int = 0

    @property
    def inventory(self) -> devices.Inventory:
        """The discovery behind the devices."""
        return self.kind.inventory

    @property
    def policy(self) -> allocation.AllocationPolicy:
        """The resource's GetPreferredAllocation policy."""
        return self.kind.policy

    def devices(self) -> tuple[DeviceInfo, ...]:
        """Every advertised device in order; a device without a health verdict is unhealthy."""
        return tuple(
            DeviceInfo(d.id, self.health.get(d.id, False), d.numa_node) for d in self.kind.catalog
        )

    def healthy_ids(self) -> list[str]:
        """IDs that may be allocated now."""
        return [d.id for d in self.devices() if d.healthy]


def snapshot_for(
    inventory: devices.Inventory, policy_name: str, health: Mapping[str, bool] | None = None
) -> Snapshot:
    """Whole cards, every card of a discovery; without ``health`` as discovery found them."""
    kind = resources.whole_cards(inventory, inventory.cards, policy_name)
    if health is None:
        health = {card.name: card.usable for card in inventory.cards}
    return Snapshot(kind, MappingProxyType(dict(health)))


class PluginState:
    """The current snapshot of one resource and an awaitable "it changed" signal."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._changed = asyncio.Event()

    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot."""
        return self._snapshot

    def replace(self, snapshot: Snapshot) -> None:
        """Install a new discovery (keeps the generation growing) and wake the watchers."""
        self._publish(dataclasses.replace(snapshot, generation=self._snapshot.generation + 1))

    def set_health(self, health: Mapping[str, bool]) -> None:
        """New health verdicts; watchers wake only when something changed."""
        if dict(health) == dict(self._snapshot.health):
            return
        self._publish(
            dataclasses.replace(
                self._snapshot,
                health=MappingProxyType(dict(health)),
                generation=self._snapshot.generation + 1,
            )
        )

    def _publish(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed(self, generation: int) -> Snapshot:
        """Wait until the snapshot is newer than ``generation``; return it."""
        while self._snapshot.generation <= generation:
            await self._changed.wait()
        return self._snapshot


def check_allocatable(snapshot: Snapshot, ids: list[str]) -> None:
    """InvalidRequestError naming every unknown, unhealthy or repeated ID and the healthy ones."""
    known = {d.id: d.healthy for d in snapshot.devices()}
    healthy = ", ".join(snapshot.healthy_ids()) or "none"
    if not ids:
        raise InvalidRequestError(f"no device IDs requested; healthy devices: {healthy}")
    problems = []
    unknown = [i for i in dict.fromkeys(ids) if i not in known]
    unhealthy = [i for i in dict.fromkeys(ids) if known.get(i) is False]
    repeated = sorted({i for i in ids if ids.count(i) > 1}, key=ids.index)
    if unknown:
        problems.append(f"unknown device(s) {', '.join(unknown)}")
    if unhealthy:
        problems.append(f"unhealthy device(s) {', '.join(unhealthy)}")
    if repeated:
        problems.append(f"repeated device(s) {', '.join(repeated)}")
    if problems:
        raise InvalidRequestError(f"{'; '.join(problems)}; healthy devices: {healthy}")
    snapshot.kind.check(ids)


def check_known(snapshot: Snapshot, ids: list[str]) -> None:
    """Raise InvalidRequestError naming IDs this resource never advertised, and the known ones."""
    known = [d.id for d in snapshot.devices()]
    advertised = set(known)
    unknown = [i for i in dict.fromkeys(ids) if i not in advertised]
    if unknown:
        raise InvalidRequestError(
            f"unknown device(s) {', '.join(unknown)}; devices: {', '.join(known) or 'none'}"
        )
