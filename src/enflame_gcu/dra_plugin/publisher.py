"""Keep the node's ResourceSlices equal to what the node offers, through any disturbance.

The pool is the node's name; its slices are rebuilt from :class:`node.NodeDevices` and
compared with what the API server holds. Only a real difference is written, with the pool
generation raised by one (a restart that finds its own slices unchanged writes nothing).
Triggers: a device or health change, a watch event on our slices (the kubelet deletes every
slice of its node when it starts, and of a driver that went away: we publish again), and a
periodic resync for anything a watch may miss. An update refused with 409 Conflict (someone
else wrote the slice in between) is retried from a fresh list.

After a write the returned objects are checked for fields the API server dropped: a cluster
without device taints loses the NoSchedule taint of an unhealthy card, so the publisher then
leaves unhealthy devices out instead; one without consumable capacity loses sharing, so cards
are published exclusive (and say ``shareable: false``); one without partitionable devices
(``DRAPartitionableDevices``: off by default before 1.36) stores slices without
``sharedCounters`` and ``consumesCounters`` and says nothing, so DRS cards are then published
whole only (their partitions would be independent devices the scheduler could hand out beside
the whole card).

Device order (``order="topology"``, the default): the scheduler's allocator takes devices in
published order, first fit (DRA.md §5), so the devices are published busiest group first
(``resourceslices.allocation_order``) from the cards the driver's prepared claims hold; a
claim prepared or unprepared re-orders them (:meth:`Publisher.claims_changed`). Such a write
waits :data:`REORDER_DELAY` after the change and after the previous write, so a burst of claims
is one write and a busy node writes at most once per delay. A device never moves to another
slice (only within its own), and the write is like any other change: every slice of the pool
at the next generation. ``order="index"`` keeps minor order: slices change only with the
devices.

A server that keeps storing something other than what was written (a field it drops that this
driver does not know) would make every sync write again: after :data:`MAX_UNCONVERGED` such
writes in a row the publisher stops writing for a while (doubling up to
:data:`MAX_BACKOFF`), and says why in the log, the metrics and ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import node, observability
from enflame_gcu.support import aio

log = logging.getLogger(__name__)

RESYNC_INTERVAL = 60.0
CONFLICT_RETRIES = 5
WATCH_RETRY_DELAY = 1.0
MAX_UNCONVERGED = 3  # writes in a row that the server stored otherwise, then back off
FIRST_BACKOFF = 30.0
MAX_BACKOFF = 600.0
REORDER_DELAY = 1.0  # seconds after a claim change, and at least between two re-orderings
ORDERS = resourceslices.ORDERS
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE]|m|)$")
_FACTORS = {
    "": 1,
    "m": 0.001,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


class Conflict(Exception):
    """The API server refused an update: the object changed since we read it (409)."""


class NameTaken(Exception):
    """A create was refused: an object of that name exists (409 AlreadyExists). Ours are all
    listed first, so it belongs to another node or driver."""


class SliceApi(Protocol):
    """The ResourceSlice endpoints the publisher uses (scoped to one node and driver)."""

    async def list_slices(self) -> tuple[list[dict[str, Any]], str]:
        """Our slices and the list's resourceVersion."""
        ...

    async def create_slice(self, document: dict[str, Any]) -> dict[str, Any]:
        """Create; returns the stored object; NameTaken when the name is in use."""
        ...

    async def replace_slice(self, document: dict[str, Any]) -> dict[str, Any]:
        """Update (the document carries the resourceVersion read); Conflict on 409."""
        ...

    async def delete_slice(self, name: str) -> None:
        """Delete; an absent slice is fine."""
        ...

    def watch_slices(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events on our slices after ``resource_version``."""
        ...

    async def node_uid(self) -> str | None:
        """The Node's UID (for owner references), None when it cannot be read."""
        ...


def quantity_value(text: str) -> float:
    """A Kubernetes quantity as a number (``32Gi`` and ``32768Mi`` are equal)."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        return float("nan")
    return float(match.group(1)) * _FACTORS[match.group(2)]


def _normal_capacity(capacity: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, entry in capacity.items():
        normal: dict[str, Any] = {"value": quantity_value(entry.get("value", ""))}
        policy = entry.get("requestPolicy") or {}
        if policy:
            normal["requestPolicy"] = {
                "default": quantity_value(policy.get("default", "")),
                "validRange": {
                    key: quantity_value(value)
                    for key, value in (policy.get("validRange") or {}).items()
                },
            }
        result[name] = normal
    return result


def _normal_counters(counters: Mapping[str, Any]) -> dict[str, float]:
    return {
        name: quantity_value((entry or {}).get("value", "")) for name, entry in counters.items()
    }


def comparable(resource_slice: Mapping[str, Any]) -> dict[str, Any]:
    """What must be equal for a stored slice to count as ours unchanged.

    Ignores what the server adds or rewrites: the generation (compared on its own), metadata
    beyond name and owners, a taint's ``timeAdded`` and the spelling of quantities.
    """
    metadata = resource_slice.get("metadata") or {}
    spec = dict(resource_slice.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    device_list = []
    for stored in spec.get("devices") or []:
        device = dict(stored)
        if "capacity" in device:
            device["capacity"] = _normal_capacity(device["capacity"])
        if "taints" in device:
            device["taints"] = [
                {k: v for k, v in taint.items() if k != "timeAdded"} for taint in device["taints"]
            ]
        device_list.append(device)
    spec["devices"] = device_list
    if "sharedCounters" in spec:
        spec["sharedCounters"] = [
            {**entry, "counters": _normal_counters(entry.get("counters") or {})}
            for entry in spec["sharedCounters"]
        ]
    for device in device_list:
        if "consumesCounters" in device:
            device["consumesCounters"] = [
                {**entry, "counters": _normal_counters(entry.get("counters") or {})}
                for entry in device["consumesCounters"]
            ]
    owners = [
        {key: owner.get(key) for key in ("kind", "name", "uid")}
        for owner in metadata.get("ownerReferences") or []
    ]
    return {"name": metadata.get("name"), "owners": owners, "spec": spec}


def _generation(resource_slice: Mapping[str, Any]) -> int:
    return int(((resource_slice.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _pair(
    wanted: Sequence[dict[str, Any]], existing: Sequence[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any] | None]], list[dict[str, Any]]]:
    """Each wanted slice with the stored one it replaces (None: create), and the stored ones
    left over (delete). The same name pairs first; a wanted slice whose name another object
    took keeps the generated name it was created under, so any unpaired stored slice of ours
    is reused (renamed to it) before one is created."""
    by_name = {s["metadata"]["name"]: s for s in existing}
    pairs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for document in wanted:
        pairs.append((document, by_name.pop(document["metadata"]["name"], None)))
    spare = sorted(by_name.values(), key=lambda s: str(s["metadata"]["name"]))
    for index, (document, old) in enumerate(pairs):
        if old is None and spare:
            reused = spare.pop(0)
            document["metadata"]["name"] = reused["metadata"]["name"]
            pairs[index] = (document, reused)
    return pairs, spare


def _counters_dropped(sent: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]) -> bool:
    """Counters were sent and the server kept none of them."""

    def counters(slices: Sequence[dict[str, Any]]) -> int:
        total = 0
        for document in slices:
            spec = document.get("spec") or {}
            total += len(spec.get("sharedCounters") or [])
            total += sum(bool(d.get("consumesCounters")) for d in spec.get("devices") or [])
        return total

    return counters(sent) > 0 and counters(stored) == 0


class Publisher:
    """Publishes one node's pool and keeps it current."""

    def __init__(
        self,
        api: SliceApi,
        devices: node.NodeDevices,
        node_name: str,
        *,
        resync_interval: float = RESYNC_INTERVAL,
        metrics: observability.DriverMetrics | None = None,
        order: str = "topology",
        busy: Callable[[], Collection[str]] | None = None,
        reorder_delay: float = REORDER_DELAY,
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"device order {order!r} is not one of {', '.join(ORDERS)}")
        self.api = api
        self.order = order
        self.busy = busy or frozenset
        self.reorder_delay = reorder_delay
        self._claims_changed = asyncio.Event()
        self.metrics = metrics
        self.devices = devices
        self.node_name = node_name
        self.resync_interval = resync_interval
        self.generation = 0
        self.writes = 0
        self.conflicts = 0
        self.name_conflicts = 0
        self.dropped: set[str] = set()
        self.unconverged = 0  # writes in a row the server stored other than sent
        self.stalled = ""  # why writing is paused, "" while converging
        self._quiet_until = 0.0
        self._backoff = FIRST_BACKOFF
        self._node_uid: str | None = None
        self._wake = asyncio.Event()
        self._resource_version = ""

    def desired(self, generation: int) -> list[dict[str, Any]]:
        """The slices the node should have at ``generation``."""
        return resourceslices.build_slices(
            self.node_name,
            self._node_uid,
            self.ordered(self.devices.published()),
            generation,
            self.devices.options,
            counter_sets=self.devices.counter_sets(),
        )

    def ordered(self, device_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The devices in publishing order; each stays in the slice its index puts it in."""
        if self.order == "index":
            return device_list
        busy = set(self.busy())
        size = max(1, min(self.devices.options.devices_per_slice, resourceslices.MAX_DEVICES))
        result: list[dict[str, Any]] = []
        for start in range(0, len(device_list), size):
            result += resourceslices.allocation_order(device_list[start : start + size], busy)
        return result

    def claims_changed(self) -> None:
        """A claim was prepared or unprepared: re-order the devices soon (debounced)."""
        if self.order != "index":
            self._claims_changed.set()

    async def _settle_claims(self, stop: asyncio.Event) -> None:
        """Wait out the re-ordering delay: the claims changing meanwhile make one write."""
        await aio.first(stop.wait(), asyncio.sleep(self.reorder_delay))
        self._claims_changed.clear()

    async def sync(self) -> bool:
        """Make the API server hold the desired slices; True when something was written."""
        if self._node_uid is None:
            self._node_uid = await self.api.node_uid()
        for _ in range(CONFLICT_RETRIES):
            existing, self._resource_version = await self.api.list_slices()
            try:
                wrote = await self._sync_once(existing)
                if self.metrics is not None:
                    self.metrics.observe_published(self.generation)
                    self.metrics.observe_devices(self.devices.published())
                return wrote
            except Conflict as exc:
                self.conflicts += 1
                log.info("a ResourceSlice changed while we updated it (%s); listing again", exc)
        raise Conflict(f"gave up after {CONFLICT_RETRIES} conflicting updates")

    async def _sync_once(self, existing: Sequence[dict[str, Any]]) -> bool:
        generations = {_generation(s) for s in existing}
        base = max([self.generation, *generations])
        current, unused = _pair(self.desired(base), existing)
        if (
            len(generations) == 1
            and not unused
            and all(old is not None and comparable(old) == comparable(new) for new, old in current)
        ):
            self.generation = base
            self._converged()
            return False
        if self.stalled and asyncio.get_running_loop().time() < self._quiet_until:
            return False  # backing off: the server does not keep what is written
        wanted, unused = _pair(self.desired(base + 1), existing)
        results = []
        for document, old in wanted:
            if old is not None:
                document["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                results.append(await self.api.replace_slice(document))
            else:
                results.append(await self._create(document))
        for old in unused:
            await self.api.delete_slice(old["metadata"]["name"])
        wanted_documents = [document for document, _ in wanted]
        self.generation = base + 1
        self.writes += 1
        log.info(
            "published %d device(s) in %d ResourceSlice(s), pool %s generation %d",
            sum(len(d["spec"].get("devices") or []) for d in wanted_documents),
            len(wanted),
            self.node_name,
            self.generation,
        )
        if self._check_dropped(wanted_documents, results):
            return await self._sync_once(await self._relist())
        self._check_stored(wanted_documents, results)
        return True

    def _converged(self) -> None:
        if self.stalled:
            log.info("ResourceSlices converged again: %s", self.stalled)
        self.unconverged = 0
        self.stalled = ""
        self._backoff = FIRST_BACKOFF
        self._report()

    def _check_stored(
        self, sent: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]
    ) -> None:
        """Count writes the server stored otherwise; back off after too many in a row."""
        differing = [
            str((document.get("metadata") or {}).get("name") or "?")
            for document, kept in zip(sent, stored, strict=False)
            if comparable(document)["spec"] != comparable(kept)["spec"]
        ]
        if not differing:
            self._converged()
            return
        self.unconverged += 1
        if self.unconverged < MAX_UNCONVERGED:
            return
        self._quiet_until = asyncio.get_running_loop().time() + self._backoff
        self.stalled = (
            f"the API server stored ResourceSlice(s) {', '.join(differing)} other than written, "
            f"{self.unconverged} writes in a row; not writing again for {self._backoff:.0f}s"
        )
        log.warning("%s", self.stalled)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)
        self._report()

    def _report(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_publishing(self.stalled, self.dropped)

    async def _create(self, document: dict[str, Any]) -> dict[str, Any]:
        """Create under the usual name; when another node's or driver's object has it, under a
        name the API server makes unique (the slices are found by node and driver, not name)."""
        try:
            return await self.api.create_slice(document)
        except NameTaken:
            name = document["metadata"].pop("name")
            document["metadata"]["generateName"] = f"{name}-"
            self.name_conflicts += 1
            log.warning(
                "a ResourceSlice named %s already exists and is not this node's %s slice (another "
                "node or driver made it): publishing under a generated name %s-<random> instead",
                name,
                resourceslices.DRIVER,
                name,
            )
            return await self.api.create_slice(document)

    async def _relist(self) -> list[dict[str, Any]]:
        existing, self._resource_version = await self.api.list_slices()
        return existing

    def _check_dropped(
        self, sent: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]
    ) -> bool:
        """Adapt to fields the server dropped; True when the slices must be written again."""
        sent_devices = [d for s in sent for d in s["spec"].get("devices") or []]
        kept = {d["name"]: d for s in stored for d in (s.get("spec") or {}).get("devices") or []}
        options = self.devices.options
        changed = False
        if any("taints" in d and "taints" not in kept.get(d["name"], {}) for d in sent_devices):
            self.dropped.add("taints")
            log.warning(
                "the API server dropped device taints (DRADeviceTaints is off on this cluster): "
                "unhealthy GCUs are left out of the slices instead"
            )
            options = dataclasses.replace(options, unhealthy="omit")
            changed = True
        if any(
            d.get("allowMultipleAllocations")
            and not kept.get(d["name"], {}).get("allowMultipleAllocations")
            for d in sent_devices
        ):
            self.dropped.add("allowMultipleAllocations")
            log.warning(
                "the API server dropped allowMultipleAllocations (consumable capacity is off "
                "on this cluster: Kubernetes < 1.36 without DRAConsumableCapacity): GCUs are "
                "published exclusive, time-sharing is unavailable"
            )
            options = dataclasses.replace(options, shared_slices=0)
            changed = True
        if self.devices.partitions and _counters_dropped(sent, stored):
            self.dropped.add("counters")
            log.warning(
                "the API server dropped sharedCounters/consumesCounters (partitionable devices "
                "are off on this cluster: Kubernetes < 1.36, or DRAPartitionableDevices "
                "disabled): DRS cards are published whole only, without partitions"
            )
            self.devices.partitions = False
            changed = True
        self.devices.options = options
        if changed:
            self._report()
        return changed

    def wake(self) -> None:
        """Ask for a sync soon."""
        self._wake.set()

    async def _watch(self) -> None:
        while True:
            try:
                async for kind, document in self.api.watch_slices(self._resource_version):
                    name = (document.get("metadata") or {}).get("name")
                    log.debug("ResourceSlice %s: %s", name, kind)
                    self.wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the watch is only a trigger; the resync still runs
                log.info("watching ResourceSlices failed (%s); watching again", exc)
            await asyncio.sleep(WATCH_RETRY_DELAY)
            self.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Publish now and after every trigger until ``stop``."""
        watcher: asyncio.Task[None] | None = None
        seen = -1
        delay = 0.5
        try:
            while not stop.is_set():
                self._wake.clear()
                if self._claims_changed.is_set() and self.devices.version == seen:
                    await self._settle_claims(stop)  # only claims changed: coalesce them
                self._claims_changed.clear()
                seen = self.devices.version
                try:
                    await self.sync()
                    delay = 0.5
                except Exception as exc:
                    log.warning(
                        "publishing ResourceSlices failed: %s; retrying in %.1fs", exc, delay
                    )
                    await aio.first(stop.wait(), asyncio.sleep(delay))
                    delay = min(delay * 2, 30.0)
                    continue
                if watcher is None or watcher.done():
                    watcher = asyncio.ensure_future(self._watch())
                await aio.first(
                    stop.wait(),
                    self._wake.wait(),
                    self.devices.changed(seen),
                    self._claims_changed.wait(),
                    asyncio.sleep(self.resync_interval),
                )
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def delete_all(self) -> int:
        """Delete every slice of this node and driver (uninstall); returns how many."""
        existing, _ = await self.api.list_slices()
        for document in existing:
            await self.api.delete_slice(document["metadata"]["name"])
        return len(existing)
