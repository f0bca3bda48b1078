"""What one resource currently offers: discovery, health and policy, with change notification.

The gRPC service reads a :class:`Snapshot` (a resource kind from :mod:`.resources` plus device
health); health updates and rediscovery replace it. Each replacement wakes every ListAndWatch
stream, which then sends the whole new list.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from enflame_gcu import allocation, devices
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import resources
from enflame_gcu.errors import EnflameError, InvalidRequestError

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


# Bounds of a request message and of what an error message repeats from it. Our IDs are
# gcuN, vgcuN and gcuN-sliceK: a longer one cannot be ours, and a request naming more IDs than
# the resource has must repeat or invent some.
MAX_SHOWN = 5
MAX_SHOWN_CHARS = 40
MAX_LISTED = 16


def show_ids(ids: Sequence[str], limit: int = MAX_SHOWN) -> str:
    """The first ``limit`` IDs (each cut to 40 characters and escaped) and how many in all."""
    shown = ", ".join(_show_one(device_id) for device_id in ids[:limit])
    if len(ids) > limit:
        shown += f", ... ({len(ids)} in all)"
    return shown or "none"


def _show_one(device_id: str) -> str:
    if len(device_id) > MAX_SHOWN_CHARS:
        return repr(device_id[:MAX_SHOWN_CHARS]) + f"... ({len(device_id)} characters)"
    text = repr(device_id)
    return device_id if text[1:-1] == device_id else text


def check_size(snapshot: Snapshot, items: Sequence[object], what: str) -> None:
    """InvalidRequestError when there are more ``items`` (IDs, container requests) than the
    resource has devices: no valid request can have that many."""
    count = len(snapshot.kind.catalog)
    if len(items) > count:
        named = [i for i in items[:MAX_SHOWN] if isinstance(i, str)]
        shown = f": {show_ids(named)}, ... ({len(items)} in all)" if named else ""
        raise InvalidRequestError(f"{len(items)} {what} for a resource of {count} device(s){shown}")


def check_allocatable(snapshot: Snapshot, ids: list[str]) -> None:
    """InvalidRequestError naming the first few unknown, unhealthy or repeated IDs (with their
    counts) and the healthy ones; linear in the request, bounded in length."""
    devices = snapshot.devices()
    healthy = show_ids([d.id for d in devices if d.healthy], MAX_LISTED)
    if not ids:
        raise InvalidRequestError(f"no device IDs requested; healthy devices: {healthy}")
    check_size(snapshot, ids, "device IDs requested")
    known = {d.id: d.healthy for d in devices}
    counts = collections.Counter(ids)
    unknown = [i for i in counts if i not in known]
    unhealthy = [i for i in counts if known.get(i) is False]
    repeated = [i for i, n in counts.items() if n > 1]
    problems = []
    if unknown:
        problems.append(f"unknown device(s) {show_ids(unknown)}")
    if unhealthy:
        problems.append(f"unhealthy device(s) {show_ids(unhealthy)}")
    if repeated:
        problems.append(f"repeated device(s) {show_ids(repeated)}")
    if problems:
        raise InvalidRequestError(f"{'; '.join(problems)}; healthy devices: {healthy}")


def grants(
    snapshot: Snapshot, requests: Sequence[list[str]], config: plugin_config.PluginConfig
) -> list[resources.Grant]:
    """Check and grant every container of one Allocate: the whole request or nothing.

    One step per container: its IDs must be known, healthy and given once
    (:func:`check_allocatable`), then the resource kind checks its own rules as it builds the
    grant. A bad request raises InvalidRequestError naming the container; a node that cannot
    give what it advertises (EnflameError, e.g. /dev/gcuctl vanished) is raised only once
    every container's request has been found valid.
    """
    granted: list[resources.Grant] = []
    node_problem: EnflameError | None = None
    for index, ids in enumerate(requests):
        try:
            check_allocatable(snapshot, ids)
            granted.append(snapshot.kind.grant(ids, config))
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"container request {index}: {exc}") from exc
        except EnflameError as exc:
            node_problem = node_problem or exc
    if node_problem is not None:
        raise node_problem
    return granted


def check_known(snapshot: Snapshot, ids: list[str]) -> None:
    """Raise InvalidRequestError naming IDs this resource never advertised, and the known ones."""
    known = [d.id for d in snapshot.devices()]
    advertised = set(known)
    unknown = [i for i in dict.fromkeys(ids) if i not in advertised]
    if unknown:
        raise InvalidRequestError(
            f"unknown device(s) {show_ids(unknown)}; devices: {show_ids(known, MAX_LISTED)}"
        )
