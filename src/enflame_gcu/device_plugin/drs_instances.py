"""DRS instances of ``enflame.com/drs-gcu``: created at Allocate, destroyed when no container
holds their slices any more, orphans destroyed at start (gcushare's resource, our lifecycle).

The kubelet gives a container N slice IDs of one card (``gcuN-sliceK``); Allocate creates an
instance of the card's profile with N compute slices through :mod:`enflame_gcu.efsmi` and
records ``{uuid: card, ids}`` in ``/var/lib/enflame-gcu/drs-instances.json`` on the host
(atomic, durable) before it answers. Not in the kubelet's device-plugin directory: a kubelet
(1.20 among others) deletes the files there that are not sockets when it starts, and the next
plugin start would then destroy instances running containers use. A record an older version
left there is moved over (merged when both exist) the first time the record is read. When the
directory is missing (a manifest that does not mount it), the record stays where it was, and
the log says what a cleaning kubelet would do to it.

The device plugin API never says when a container is gone, so the
PodResources API is read every few seconds: an instance whose IDs no container holds, and
that is older than :data:`GRACE` (the kubelet records an allocation only after Allocate
returns), is destroyed. The same IDs allocated again (a kubelet retry) get the same instance;
IDs of a recorded instance given to a new container mean the old holder is gone: its instance
is destroyed first. Before a create, the card's instances are recorded as pending: at start,
an instance that appeared during a create that was never recorded (the plugin died in
between) is destroyed; any other instance the record does not know is left alone, since the
DRA driver may hold it (gcushare refuses to start instead).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu import drs, efsmi, fileio
from enflame_gcu.errors import AllocationError, ConfigError, EfsmiError

log = logging.getLogger(__name__)
STATE_DIR = "/var/lib/enflame-gcu"  # on the host (under --host-root); no kubelet cleans it
RECORD_FILE = "drs-instances.json"
OLD_RECORD_FILE = "enflame-drs-instances.json"  # in the device-plugin directory, before
GRACE = 30.0  # seconds an instance may wait for the kubelet to list its container


@dataclass(frozen=True, slots=True)
class Held:
    """One recorded instance: its card, efsmi index, id, UUID, the slice IDs, when made."""

    card: str
    index: int
    instance_id: str
    uuid: str
    ids: tuple[str, ...]
    created: float


class DrsInstances:
    """The record and the efsmi calls; thread-safe (Allocate may run beside the poller)."""

    def __init__(
        self,
        state_dir: str,
        tool: efsmi.Efsmi,
        grace: float = GRACE,
        *,
        old_dir: str | None = None,
    ) -> None:
        self.path = os.path.join(state_dir, RECORD_FILE)
        self.old_path = os.path.join(old_dir, OLD_RECORD_FILE) if old_dir else None
        self.tool = tool
        self.grace = grace
        self.layouts: dict[str, drs.Layout] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_node(
        cls, host_root: str, plugin_dir: str, tool: efsmi.Efsmi, grace: float = GRACE
    ) -> DrsInstances:
        """The record under ``<host root>/var/lib/enflame-gcu`` when that directory exists (the
        chart mounts it), else in the device-plugin directory as before."""
        state = fileio.host_path(host_root, STATE_DIR)
        if os.path.isdir(state):
            return cls(state, tool, grace, old_dir=plugin_dir)
        log.warning(
            "%s does not exist (mount the host's %s there): the DRS record stays in %s, whose "
            "files some kubelets (1.20) delete when they start; the plugin's next start would "
            "then destroy the instances of running containers",
            state,
            STATE_DIR,
            plugin_dir,
        )
        record = cls(plugin_dir, tool, grace)
        record.path = os.path.join(plugin_dir, OLD_RECORD_FILE)
        return record

    # --- the record ------------------------------------------------------------------------

    def load(self) -> list[Held]:
        """The recorded instances; a damaged record is an error, never reset silently. A record
        left in the device-plugin directory by an older version is moved here first."""
        held = self._read(self.path)
        if self.old_path is not None and os.path.lexists(self.old_path):
            held = self._migrate(held, self.old_path)
        return held

    def _pending(self) -> dict[int, set[str]]:
        """Creates started and not finished on record: ``{efsmi index: UUIDs before}``."""
        try:
            data = fileio.read_json(self.path)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the DRS record {self.path} cannot be read: {exc}") from exc
        try:
            return {
                int(e["index"]): {str(u) for u in e["before"]} for e in data.get("pending") or []
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"the DRS record {self.path} is damaged ({exc})") from exc

    def _migrate(self, held: list[Held], old_path: str) -> list[Held]:
        older = self._read(old_path)
        known = {entry.uuid for entry in held}
        merged = [*held, *(entry for entry in older if entry.uuid not in known)]
        self._save(merged)
        os.unlink(old_path)
        log.info(
            "moved the DRS record %s (%d instance(s)) to %s, where no kubelet cleans it",
            old_path,
            len(older),
            self.path,
        )
        return merged

    @staticmethod
    def _read(path: str) -> list[Held]:
        try:
            data = fileio.read_json(path)  # a regular file, bounded in size and nesting
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the DRS record {path} cannot be read: {exc}") from exc
        try:
            return [
                Held(
                    str(e["card"]),
                    int(e["index"]),
                    str(e["id"]),
                    str(e["uuid"]),
                    tuple(str(i) for i in e["ids"]),
                    float(e["created"]),
                )
                for e in data["instances"]
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"the DRS record {path} is damaged ({exc})") from exc

    def _save(
        self, held: Sequence[Held], pending: Mapping[int, Iterable[str]] | None = None
    ) -> None:
        document: dict[str, object] = {
            "version": 1,
            "instances": [
                {
                    "card": h.card,
                    "index": h.index,
                    "id": h.instance_id,
                    "uuid": h.uuid,
                    "ids": list(h.ids),
                    "created": h.created,
                }
                for h in held
            ],
        }
        if pending:
            document["pending"] = [
                {"index": index, "before": sorted(before)} for index, before in pending.items()
            ]
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fileio.atomic_write_text(self.path, json.dumps(document, indent=1) + "\n", mode=0o600)

    # --- cards -----------------------------------------------------------------------------

    def learn(self, cards: Iterable[tuple[str, str]]) -> dict[str, str]:
        """Ask efsmi for the layout of each ``(card name, bus id)`` (turning DRS on where it
        is off); returns ``{card: problem}`` for the cards that cannot be partitioned."""
        problems: dict[str, str] = {}
        wanted = list(cards)
        if not wanted:
            return problems
        try:
            listed = {card.bus_id: card for card in self.tool.cards()}
        except EfsmiError as exc:
            return {name: str(exc) for name, _ in wanted}
        for name, bus_id in wanted:
            found = listed.get(bus_id)
            try:
                if found is None:
                    raise EfsmiError("not-found", f"efsmi does not list {bus_id}")
                if not found.drs_on:
                    self.tool.set_drs(found.index, True)
                layout = drs.Layout.from_profiles(found.index, self.tool.profiles(found.index))
            except EfsmiError as exc:
                problems[name] = str(exc)
                continue
            self.layouts[name] = layout
        return problems

    # --- lifecycle -------------------------------------------------------------------------

    def acquire(self, card: str, ids: Sequence[str]) -> Held:
        """The instance for a container's slice IDs on ``card``: recorded, or created now."""
        wanted = tuple(sorted(ids))
        with self._lock:
            held = self.load()
            for entry in held:
                if entry.ids == wanted:
                    return entry  # the kubelet asking again for the same container
            layout = self.layouts.get(card)
            if layout is None:
                raise AllocationError(f"{card} is not partitioned with DRS on this node")
            profile = next((p for p in layout.profiles if p.slices == len(wanted)), None)
            if profile is None:
                offered = ", ".join(f"{p.name} ({p.slices})" for p in layout.profiles)
                raise AllocationError(
                    f"{card} has no DRS profile of {len(wanted)} slice(s); it offers {offered}"
                )
            stale = [e for e in held if set(e.ids) & set(wanted)]
            for entry in stale:  # their slices were given to a new container: the old is gone
                self._destroy(entry)
            held = [e for e in held if e not in stale]
            # The card's UUIDs before the create, on record: whatever appears besides them
            # if this process dies before the next save is ours to destroy at the next start.
            before = {i.uuid for i in self.tool.instances(layout.index)}
            self._save(held, {layout.index: before})
            try:
                made = self.tool.create_instance(layout.index, profile.profile_id, before)
            except EfsmiError:
                self._settle(layout.index, before, held)
                raise
            entry = Held(card, layout.index, made.instance_id, made.uuid, wanted, time.time())
            self._save([*held, entry])
            log.info("created DRS instance %s (%s on %s)", made.uuid, profile.name, card)
            return entry

    def _settle(self, index: int, before: set[str], held: Sequence[Held]) -> None:
        """A create failed: destroy what appeared on the card since (kept pending on record
        when efsmi cannot tell, for the next start)."""
        known = {e.uuid for e in held} | before
        try:
            for found in self.tool.instances(index):
                if found.uuid not in known:
                    self.tool.destroy_instance(index, found.instance_id, found.uuid)
                    log.info("destroyed DRS instance %s, left by a failed create", found.uuid)
        except EfsmiError as exc:
            log.warning("cannot clean up after a failed DRS create yet: %s", exc)
            return
        self._save(held)

    def _destroy(self, entry: Held) -> None:
        self.tool.destroy_instance(entry.index, entry.instance_id, entry.uuid)
        log.info("destroyed DRS instance %s on %s", entry.uuid, entry.card)

    def release_unheld(self, held_ids: set[str], now: float | None = None) -> list[str]:
        """Destroy instances none of whose IDs a container holds (past the grace period)."""
        now = time.time() if now is None else now
        released = []
        with self._lock:
            kept = []
            for entry in self.load():
                if set(entry.ids) & held_ids or now - entry.created < self.grace:
                    kept.append(entry)
                    continue
                try:
                    self._destroy(entry)
                except EfsmiError as exc:
                    log.warning("cannot destroy DRS instance %s yet: %s", entry.uuid, exc)
                    kept.append(entry)
                    continue
                released.append(entry.uuid)
            if released:
                self._save(kept)
        return released

    def reconcile(self) -> list[str]:
        """At start: destroy instances that appeared on a card during a create this plugin
        started and never recorded (it died in between), and forget recorded ones that no
        longer exist. Instances the record knows nothing else of are left alone: another owner
        (the DRA driver, before the node moved to the device plugin) may hold them for a
        running container. Returns what was done."""
        actions = []
        by_index: Mapping[int, str] = {lay.index: name for name, lay in self.layouts.items()}
        with self._lock:
            held = self.load()
            pending = self._pending()
            known = {(e.index, e.instance_id, e.uuid) for e in held}
            existing = self.tool.instances()
            for instance in existing:
                card = by_index.get(instance.index)
                if card is None or (instance.index, instance.instance_id, instance.uuid) in known:
                    continue
                before = pending.get(instance.index)
                if before is None or instance.uuid in before:
                    log.info(
                        "DRS instance %s on %s is not on this plugin's record: left alone "
                        "(another owner may hold it)",
                        instance.uuid,
                        card,
                    )
                    continue
                self.tool.destroy_instance(instance.index, instance.instance_id, instance.uuid)
                actions.append(
                    f"destroyed orphan DRS instance {instance.uuid} on {card} (created by an "
                    "Allocate that did not finish)"
                )
            alive = {(i.index, i.instance_id, i.uuid) for i in existing}
            kept = [e for e in held if (e.index, e.instance_id, e.uuid) in alive]
            if len(kept) != len(held):
                actions.append(f"forgot {len(held) - len(kept)} recorded instance(s) now gone")
            if len(kept) != len(held) or pending:
                self._save(kept)
        for action in actions:
            log.info("%s", action)
        return actions
