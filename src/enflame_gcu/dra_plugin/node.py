"""The node as the driver sees it: discovered GCUs, their health, and who is waiting for changes.

Both the kubelet's health stream and the ResourceSlice publisher follow this one object: the
health monitor feeds it, :meth:`NodeDevices.changed` wakes every waiter, and a driver version
change (an upgrade) re-discovers the node (SPEC §6.4).

Hot-plug: the monitor reports device nodes that the last discovery did not make usable (a card
plugged in, bound or repaired after start); the node is then discovered again and the new
cards and vGCUs join the inventory at the next rescan, so they are published within the
health interval. A card the driver already knew and that is gone now stays in the inventory:
its health turns it unhealthy (tainted or left out, as configured) until it comes back. The
discovery and the efsmi calls of an arriving DRS card run in a thread; only their result is
applied on the event loop, which goes on serving the kubelet meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from enflame_gcu import devices, drs, efsmi, health, resourceslices
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.errors import EfsmiError
from enflame_gcu.support import aio

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """Health of one published device, as the kubelet's health stream reports it."""

    name: str
    healthy: bool
    reason: str
    since: int


@dataclass(frozen=True, slots=True)
class _Looked:
    """What an update's discovery found: the new inventory (None: nothing usable arrived) and
    the DRS layouts and problems of arriving cards."""

    inventory: devices.Inventory | None
    layouts: dict[str, drs.Layout]
    problems: dict[str, str]
    rediscover: bool = False


class NodeDevices:
    """Inventory + health of one node; ``version`` grows on every change."""

    def __init__(
        self,
        root: str,
        options: resourceslices.PublishOptions,
        *,
        health_interval: float = health.DEFAULT_INTERVAL,
        health_disabled: bool = False,
        drs_selected: Callable[[devices.Card], bool] | None = None,
        tool: efsmi.Efsmi | None = None,
        defer_drs: bool = False,
    ) -> None:
        self.root = root
        self.options = options
        self.inventory = devices.discover(root)
        self.tool = tool
        self._drs_selected = drs_selected
        self.layouts: dict[str, drs.Layout] = {}
        self.drs_problems: dict[str, str] = {}
        self.waiting: dict[str, str] = {}  # DRS cards held whole by a claim: {card: claim}
        # False once the API server dropped the counters partitions need: DRS cards whole only.
        self.partitions = True
        # Deferred: the driver turns DRS on after it read its record (see load_drs).
        self.drs_deferred = defer_drs
        if not defer_drs:
            self._load_layouts(self.inventory.cards)
        self.monitor = health.HealthMonitor(
            root,
            self.inventory.cards,
            driver_version=self.inventory.driver_version,
            interval=health_interval,
            disabled=health_disabled,
        )
        # {gcuN: who}: cards device-plugin pods hold (PodResources), withheld until released.
        self.held_by_plugin: dict[str, str] = {}
        self.version = 0
        self._since: dict[str, int] = {}
        self._last: dict[str, bool] = {}
        self._changed = asyncio.Event()
        self.monitor.expect(_usable_nodes(self.inventory))
        self._stamp()

    @property
    def report(self) -> health.HealthReport:
        """The latest health report."""
        return self.monitor.report

    def healthy(self) -> dict[str, bool]:
        """``{gcuN: healthy}``."""
        return self.report.healthy()

    def load_drs(self, held_whole: Mapping[str, str]) -> None:
        """Turn DRS on and learn the layouts of the selected cards, except those a prepared
        claim holds as a whole card (``{card: claim}``): DRS is not switched on under a
        running claim; such a card is partitioned when it is released (:meth:`release`)."""
        self.drs_deferred = False
        self.waiting = dict(held_whole)
        for card, claim in sorted(held_whole.items()):
            self.drs_problems[card] = (
                f"held whole by claim {claim}: DRS is turned on when that claim is unprepared"
            )
            log.info("%s stays whole for now: %s", card, self.drs_problems[card])
        self._load_layouts(c for c in self.inventory.cards if c.name not in held_whole)
        self._stamp()

    def released(self, card: str) -> bool:
        """A card held whole while DRS waited is free now: partition it (True when it was
        waiting). Runs efsmi: call it from a thread."""
        if self.waiting.pop(card, None) is None:
            return False
        self.drs_problems.pop(card, None)
        self._load_layouts(c for c in self.inventory.cards if c.name == card)
        return True

    def _load_layouts(self, cards: Iterable[devices.Card]) -> None:
        """Ask efsmi for the DRS profiles of the selected cards (turning DRS on where it is
        off); a card efsmi cannot partition stays a whole card, and says why in the log."""
        self._take_layouts(*self._fetch_layouts(cards, self.inventory))

    def _take_layouts(self, layouts: dict[str, drs.Layout], problems: dict[str, str]) -> None:
        for name, problem in problems.items():
            self.drs_problems[name] = problem
        for name, layout in layouts.items():
            self.layouts[name] = layout
            self.drs_problems.pop(name, None)
            log.info(
                "%s offers DRS partitions: %s",
                name,
                ", ".join(f"{p.name} x{p.count}" for p in layout.profiles),
            )

    def _fetch_layouts(
        self, cards: Iterable[devices.Card], inventory: devices.Inventory
    ) -> tuple[dict[str, drs.Layout], dict[str, str]]:
        """The efsmi calls of :meth:`_load_layouts`, changing nothing here (safe in a thread):
        ``(layouts, problems)`` by card name."""
        layouts: dict[str, drs.Layout] = {}
        problems: dict[str, str] = {}
        if self._drs_selected is None or self.tool is None:
            return layouts, problems
        partitioned = {v.parent_minor for v in inventory.vgcus}
        wanted = [
            card
            for card in cards
            if card.usable and card.minor not in partitioned and self._drs_selected(card)
        ]
        if not wanted:
            return layouts, problems
        try:
            listed = {card.bus_id: card for card in self.tool.cards()}
        except EfsmiError as exc:
            log.warning("DRS unavailable, cards stay whole: %s", exc)
            return layouts, {card.name: str(exc) for card in wanted}
        for card in wanted:
            try:
                found = listed.get(card.bdf)
                if found is None:
                    raise EfsmiError("not-found", f"efsmi does not list {card.bdf}")
                if not found.drs_on:
                    self.tool.set_drs(found.index, True)
                    log.info("turned DRS on for %s (efsmi index %d)", card.name, found.index)
                layout = drs.Layout.from_profiles(found.index, self.tool.profiles(found.index))
                if not layout.profiles:
                    raise EfsmiError("not-found", "efsmi lists no DRS profile for it")
            except EfsmiError as exc:
                problems[card.name] = str(exc)
                log.warning("%s stays a whole card: %s", card.name, exc)
                continue
            layouts[card.name] = layout
        return layouts, problems

    def _published(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if self.layouts and self.partitions:
            published, counters = drs.node_devices(
                self.inventory, self.healthy(), self.options, self.layouts
            )
        else:
            published = resourceslices.node_devices(self.inventory, self.healthy(), self.options)
            counters = []
        return self._withhold(published), counters

    def _withhold(self, published: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Cards a device-plugin pod holds: tainted NoSchedule (left out with ``omit``, as
        unhealthy cards are where the cluster has no device taints)."""
        if not self.held_by_plugin:
            return published
        result = []
        for device in published:
            card = self.parent_of(resourceslices.node_device(str(device["name"])))
            if card not in self.held_by_plugin:
                result.append(device)
            elif self.options.unhealthy == "taint":
                taint = {"key": resourceslices.DEVICE_PLUGIN_TAINT, "effect": "NoSchedule"}
                result.append({**device, "taints": [*device.get("taints", []), taint]})
        return result

    def set_held_by_plugin(self, held: Mapping[str, str]) -> bool:
        """Take the cards device-plugin pods hold now (``{gcuN: who}``); True when it changed."""
        if dict(held) == self.held_by_plugin:
            return False
        for card in sorted(set(held) - set(self.held_by_plugin)):
            log.warning(
                "%s is held by %s through the device plugin: not offered to DRA claims until "
                "that pod ends",
                card,
                held[card],
            )
        for card in sorted(set(self.held_by_plugin) - set(held)):
            log.info("%s was released by the device plugin's pod: offered to DRA claims", card)
        self.held_by_plugin = dict(held)
        self.notify()
        return True

    def published(self) -> list[dict[str, Any]]:
        """The devices to publish now (see :func:`resourceslices.node_devices`, :mod:`drs`)."""
        return self._published()[0]

    def counter_sets(self) -> list[dict[str, Any]]:
        """The counter sets of the DRS cards published now."""
        return self._published()[1]

    def published_names(self) -> dict[str, str]:
        """``{published device name: node device name}`` of what is on offer now."""
        return {
            str(d["name"]): resourceslices.node_device(str(d["name"])) for d in self.published()
        }

    def slices_of(self) -> dict[str, int]:
        """Slices of each shareable card (``{gcuN: slices}``); empty when sharing is off."""
        if self.options.shared_slices <= 0:
            return {}
        return {card.name: self.options.shared_slices for card in self.inventory.cards}

    def parent_of(self, node_name: str) -> str | None:
        """The card a node device stands on: itself for a card, its card for a vGCU."""
        if node_name.startswith("gcu"):
            return node_name
        for vgcu in self.inventory.vgcus:
            if vgcu.name == node_name and vgcu.parent_minor is not None:
                return f"gcu{vgcu.parent_minor}"
        return None

    def device_health(self) -> list[DeviceHealth]:
        """Health of every published device; a vGCU follows its card."""
        healthy = self.healthy()
        reasons = self.report.reasons()
        result = []
        for published, node_name in self.published_names().items():
            card = self.parent_of(node_name)
            ok = card is not None and healthy.get(card, False)
            reason = "" if ok else reasons.get(card or "", "its card is unknown")
            result.append(DeviceHealth(published, ok, reason, self._since.get(published, 0)))
        return result

    def _stamp(self) -> None:
        # When each device last changed health: the stream's last_updated_time.
        now = int(time.time())
        healthy = self.healthy()
        for name, node_name in self.published_names().items():
            ok = healthy.get(self.parent_of(node_name) or "", False)
            if self._last.get(name) != ok:
                self._since[name] = now
                self._last[name] = ok

    def apply(self, update: health.HealthUpdate) -> None:
        """Take a health update (re-discovering the node after a driver change or when
        device nodes appeared), all at once: :meth:`run` does the slow part in a thread."""
        self._commit(update, self._look(update))

    def _look(self, update: health.HealthUpdate) -> _Looked | None:
        """The slow part of an update (sysfs discovery, efsmi for arriving DRS cards), which
        changes nothing here: run in a thread while the loop serves the kubelet."""
        if update.rediscover:
            return _Looked(devices.discover(self.root), {}, {}, rediscover=True)
        if not update.appeared:
            return None
        fresh = devices.discover(self.root)
        current = self.inventory
        cards = {card.name: card for card in current.cards}
        vgcus = {vgcu.name: vgcu for vgcu in current.vgcus}
        cards.update({card.name: card for card in fresh.cards if card.usable})
        vgcus.update({vgcu.name: vgcu for vgcu in fresh.vgcus if vgcu.usable})
        merged = dataclasses.replace(
            fresh,
            cards=tuple(sorted(cards.values(), key=lambda card: (card.minor, card.bdf))),
            vgcus=tuple(sorted(vgcus.values(), key=lambda vgcu: vgcu.minor)),
        )
        if merged.cards == current.cards and merged.vgcus == current.vgcus:
            log.debug("device node(s) %s present but not usable yet", ", ".join(update.appeared))
            return _Looked(None, {}, {})
        arrived = [
            card
            for card in merged.cards
            if card.name not in self.layouts and card.name not in self.waiting
        ]
        if self.drs_deferred:
            arrived = []  # DRS waits for the driver's record (load_drs)
        layouts, problems = self._fetch_layouts(arrived, merged)
        return _Looked(merged, layouts, problems)

    def _commit(self, update: health.HealthUpdate, looked: _Looked | None) -> None:
        """Apply what :meth:`_look` found (on the loop) and wake the waiters."""
        if looked is not None and looked.rediscover and looked.inventory is not None:
            self.inventory = looked.inventory
            self.monitor.reset(self.inventory.cards, self.inventory.driver_version)
            self.monitor.expect(_usable_nodes(self.inventory))
            log.info("re-discovered %d card(s) after a driver change", len(self.inventory.cards))
        elif looked is not None and looked.inventory is not None:
            merged = looked.inventory
            new = sorted(_usable_nodes(merged) - _usable_nodes(self.inventory))
            self.inventory = merged
            self._take_layouts(looked.layouts, looked.problems)
            self.monitor.reset(merged.cards, self.monitor.baseline)
            self.monitor.expect(_usable_nodes(merged))
            log.info("new device(s) on the node: %s", ", ".join(new) or "none usable")
        elif update.appeared and not update.report_changed:
            return  # the nodes are not usable yet: looked at again at the next rescan
        self.notify()

    def notify(self) -> None:
        """Wake everyone waiting for a change."""
        self._stamp()
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed(self, seen: int, timeout: float | None = None) -> int:
        """Wait until ``version`` passes ``seen`` (or ``timeout``); return the version."""
        if self.version == seen:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return self.version

    async def run(self) -> None:
        """Watch health until cancelled. An update's discovery and efsmi calls (up to three
        per arriving DRS card, each bounded by the efsmi time limit) run in a thread, one
        update after the other; the result is applied on the loop, which meanwhile serves
        Prepare, the health stream and the probes."""
        updates: asyncio.Queue[health.HealthUpdate] = asyncio.Queue()
        worker = asyncio.ensure_future(self._take_updates(updates))
        try:
            await aio.first(self.monitor.run(updates.put_nowait), worker)
            if worker.done() and not worker.cancelled() and worker.exception() is not None:
                raise worker.exception()  # type: ignore[misc]
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    async def _take_updates(self, updates: asyncio.Queue[health.HealthUpdate]) -> None:
        while True:
            update = await updates.get()
            looked = None
            if update.rediscover or update.appeared:
                looked = await asyncio.to_thread(self._look, update)
            self._commit(update, looked)


def _usable_nodes(inventory: devices.Inventory) -> frozenset[str]:
    usable = {card.name for card in inventory.cards if card.usable}
    return frozenset(usable | {vgcu.name for vgcu in inventory.vgcus if vgcu.usable})


def for_settings(settings: dra_config.DraConfig, *, defer_drs: bool = False) -> NodeDevices:
    """The node as the driver's settings describe it (DRS only when ``--drs`` selects cards;
    ``defer_drs``: not switched on until :meth:`NodeDevices.load_drs`, after the record)."""
    drs_on = bool(settings.drs_items())
    return NodeDevices(
        settings.root,
        settings.publish_options(),
        health_interval=settings.health_interval,
        health_disabled=settings.health_disabled,
        drs_selected=settings.drs_selects if drs_on else None,
        tool=efsmi.Efsmi(settings.efsmi, timeout=settings.efsmi_timeout) if drs_on else None,
        defer_drs=defer_drs and drs_on,
    )
