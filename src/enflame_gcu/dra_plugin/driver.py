"""Prepare and unprepare claims: resolve, refuse double use, checkpoint, write CDI, recover.

A Prepare is two steps on disk: the checkpoint records the claim as ``preparing``, the CDI spec
is written, then the checkpoint says ``prepared``. Whatever stops the driver between them, the
next start finds the ``preparing`` entry and rolls it back (spec removed, entry dropped); the
kubelet, which got no answer, simply asks again. After a reboot (``/var/run/cdi`` is a tmpfs)
the specs of claims still prepared are written again from the checkpoint. Both calls are
idempotent; Unprepare needs nothing but the checkpoint, so it works while the API server is
away and after the claim is gone.

A DRS partition adds a step in the middle: efsmi creates the instance and its id and UUID are
recorded in the checkpoint before the spec (which names ``DRS-<uuid>``) is written.
Unprepare destroys it. At start, the instances on DRS cards are reconciled with the record:
those of rolled-back claims and those nobody on record holds are destroyed; a prepared claim
whose instance is gone is reported and refused, never re-created silently (its pod would get
another partition's memory state under the same claim).

Two instances may run side by side during a rolling update with surge (their sockets carry the
pod UID): every call, and the recovery at start, holds an exclusive ``flock`` on
``serialize.lock`` in the state directory and reads the checkpoint afresh, so the instances
never prepare the same card twice nor roll back each other's Prepare in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from enflame_gcu import claim_specs, efsmi, fileio, resourceslices
from enflame_gcu.dra_plugin import checkpoint, claim_cdi, claims, node, observability
from enflame_gcu.errors import ClaimError, EfsmiError, EnflameError

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "serialize.lock"
LOCK_POLL = 0.01  # seconds between attempts at the lock held by another instance
SLICES = "slices"
# A DRS create is not started with less of the kubelet's deadline left than this (or than the
# slowest create seen, when longer): an answer that cannot arrive in time only makes a retry.
MIN_CREATE_SECONDS = 1.0
# Seconds between looks at the cards that hold prepared DRS instances: one efsmi listing per
# such card, so a reset the health monitor never saw is noticed within this time.
RECHECK_SECONDS = 60.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PreparedDeviceResult:
    """One device of a prepared claim, as the kubelet is told about it."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


Outcome = list[PreparedDeviceResult] | str  # the devices, or why the claim failed


class Driver:
    """The kubelet-facing half of the driver, independent of gRPC."""

    def __init__(
        self,
        *,
        node_name: str,
        devices: node.NodeDevices,
        source: claims.ClaimSource,
        cdi_dir: str,
        state_dir: str,
        fault: Callable[[str], None] | None = None,
        metrics: observability.DriverMetrics | None = None,
    ) -> None:
        self.node_name = node_name
        self.metrics = metrics
        self.devices = devices
        self.source = source
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint.Checkpoint(os.path.join(state_dir, CHECKPOINT_FILE))
        self.lock_path = os.path.join(state_dir, LOCK_FILE)
        self._fault = fault or (lambda point: None)
        self._lock = asyncio.Lock()
        self._claims: dict[str, checkpoint.PreparedClaim] = {}
        self.lost: dict[str, str] = {}  # claim uid -> why its DRS instance is gone
        # Instances an Unprepare could not destroy because their card was gone: {card: UUIDs},
        # destroyed when the card is back.
        self.unsettled: dict[str, set[str]] = {}
        self.slowest_create = 0.0  # seconds, the slowest DRS create seen by this process
        # Seconds between looks at the cards holding prepared DRS instances (watch_cards).
        self.recheck_interval = RECHECK_SECONDS
        self._running: set[asyncio.Future[Any]] = set()
        # Called after a Prepare or Unprepare call changed the claims on record (the publisher
        # re-orders the devices: resourceslices.allocation_order).
        self.on_change: Callable[[], None] = lambda: None

    @property
    def prepared(self) -> Mapping[str, checkpoint.PreparedClaim]:
        """The claims on record, by UID."""
        return dict(self._claims)

    def held_devices(self) -> frozenset[str]:
        """Published names of the devices the claims on record hold (preparing or prepared)."""
        return frozenset(d.device for claim in self._claims.values() for d in claim.devices)

    def _changed(self, before: frozenset[str]) -> None:
        if self.held_devices() != before:
            self.on_change()

    # --- serialising with other instances ------------------------------------------------

    def _open_lock(self) -> int:
        os.makedirs(os.path.dirname(self.lock_path) or ".", exist_ok=True)
        return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextlib.contextmanager
    def _locked_blocking(self) -> Iterator[None]:
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextlib.asynccontextmanager
    async def _serialized(self) -> AsyncIterator[None]:
        """This process's calls one at a time, other instances' calls excluded, record fresh."""
        async with self._lock:
            fd = self._open_lock()
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(LOCK_POLL)  # polled: a cancelled call holds nothing
                self._claims = self.checkpoint.load()
                yield
            finally:
                os.close(fd)

    # --- start ---------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Load the checkpoint, roll back half-done Prepares, re-create missing specs.

        Returns what was done, one line per action (also logged). Raises ConfigError when the
        checkpoint is damaged: the driver does not guess which cards are in use.
        """
        with self._locked_blocking():
            actions = self._recover()
        self._observe_claims()
        return actions

    def _recover(self) -> list[str]:
        actions = []
        loaded = self.checkpoint.load()
        if self.devices.drs_deferred:  # DRS on only now, never under a claim holding a card
            self.devices.load_drs(
                {
                    device.node_name: self._name(claim)
                    for claim in loaded.values()
                    if claim.state == checkpoint.PREPARED
                    for device in claim.devices
                    if device.drs_profile is None and device.node_name.startswith("gcu")
                }
            )
        rolled_back = {}
        for uid, claim in sorted(loaded.items()):
            if claim.state == checkpoint.PREPARING:
                claim_cdi.remove(self.cdi_dir, uid)
                rolled_back[uid] = loaded.pop(uid)
                actions.append(f"rolled back the unfinished prepare of claim {self._name(claim)}")
        actions.extend(self._reconcile_instances(loaded, rolled_back))
        for uid, claim in sorted(loaded.items()):
            if os.path.exists(claim_cdi.spec_path(self.cdi_dir, uid)):
                continue
            try:
                self._write_spec(claim)
            except (EnflameError, OSError) as exc:
                actions.append(f"cannot re-create the CDI spec of claim {self._name(claim)}: {exc}")
            else:
                actions.append(f"re-created the CDI spec of claim {self._name(claim)}")
        for uid in sorted(claim_cdi.claim_uids_on_disk(self.cdi_dir) - set(loaded)):
            claim_cdi.remove(self.cdi_dir, uid)
            actions.append(f"removed the CDI spec of claim uid {uid}, which is not on record")
        for path in fileio.remove_stale_temps(self.cdi_dir, (claim_specs.FILE_PREFIX,)):
            actions.append(f"removed {path}, left by an interrupted write")
        self._claims = loaded
        self.checkpoint.save(self._claims)
        for action in actions:
            log.info("%s", action)
        return actions

    def _reconcile_instances(
        self,
        kept: Mapping[str, checkpoint.PreparedClaim],
        rolled_back: Mapping[str, checkpoint.PreparedClaim] | None = None,
    ) -> list[str]:
        """Destroy the DRS instances of rolled-back Prepares (recorded, or created since their
        create started); note prepared claims that lost theirs. An instance this record knows
        nothing of is left alone: another owner (the device plugin's ``drs-gcu``, before the
        node moved to DRA) may hold it for a running container."""
        tool = self.devices.tool
        rolled_back = rolled_back or {}
        indexes = {name: layout.index for name, layout in self.devices.layouts.items()}
        recorded: dict[tuple[str, str, str | None], checkpoint.PreparedClaim] = {
            (d.node_name, d.drs_instance, d.drs_uuid): claim
            for claim in kept.values()
            for d in claim.devices
            if d.drs_instance
        }
        undone = {
            d.drs_uuid: claim for claim in rolled_back.values() for d in claim.devices if d.drs_uuid
        }
        pending: dict[str, tuple[set[str], checkpoint.PreparedClaim]] = {}
        for claim in rolled_back.values():
            for d in claim.devices:
                if d.drs_before is not None and not d.drs_instance:
                    before, _ = pending.setdefault(d.node_name, (set(d.drs_before), claim))
                    before &= set(d.drs_before)
        if tool is None or not (indexes or recorded):
            return []
        try:
            existing = tool.instances()
        except EfsmiError as exc:
            return [f"cannot list DRS instances to reconcile them ({exc}); orphans are kept"]
        actions = []
        by_index = {index: name for name, index in indexes.items()}
        seen: set[tuple[str, str, str | None]] = set()
        held = {key[2] for key in recorded}
        for instance in existing:
            card = by_index.get(instance.index)
            if card is None:
                continue  # not a card this driver partitions: not ours to judge
            key: tuple[str, str, str | None] = (card, instance.instance_id, instance.uuid)
            if key in recorded:
                seen.add(key)
                continue
            owner = undone.get(instance.uuid)
            if owner is None and card in pending and instance.uuid not in held:
                before, claim = pending[card]
                owner = None if instance.uuid in before else claim
            if owner is None:
                log.info(
                    "DRS instance %s (%s on %s) is not on this driver's record: left alone "
                    "(another owner may hold it)",
                    instance.uuid,
                    instance.profile,
                    card,
                )
                continue
            try:
                tool.destroy_instance(instance.index, instance.instance_id, instance.uuid)
            except EfsmiError as exc:
                actions.append(f"cannot destroy orphan DRS instance {instance.uuid}: {exc}")
            else:
                actions.append(
                    f"destroyed DRS instance {instance.uuid} ({instance.profile} on {card}), "
                    f"which no prepared claim holds (made for claim {self._name(owner)}, "
                    "rolled back)"
                )
        self.lost = {}
        for key, claim in sorted(recorded.items(), key=lambda item: item[1].uid):
            if key not in seen and key[0] in indexes:  # a card not partitioned now: unknown
                self.lost[claim.uid] = (
                    f"its DRS instance {key[2]} on {key[0]} is gone (destroyed outside the "
                    "driver, or the card was reset); it is not re-created: delete the pod"
                )
                actions.append(f"claim {self._name(claim)}: {self.lost[claim.uid]}")
        return actions

    # --- Prepare ------------------------------------------------------------------------

    async def prepare(
        self, refs: Sequence[claims.ClaimRef], deadline: float | None = None
    ) -> dict[str, Outcome]:
        """Prepare each claim; a failing claim gets its error text, the others go on.

        ``deadline`` (``time.monotonic()`` seconds) is when the kubelet stops waiting: a DRS
        create is not started with less time left than one may take. A call cancelled at its
        deadline does not cut the work in half: it runs to its end (created, found, recorded)
        and the kubelet's retry finds the claim prepared.
        """
        return await self._unsplit(self._prepare_all(refs, deadline))

    async def _unsplit(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Run ``work`` to its end even when the caller is cancelled (the gRPC deadline)."""
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        """Wait for calls whose callers gave up but whose work goes on (shutdown, tests)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def _prepare_all(
        self, refs: Sequence[claims.ClaimRef], deadline: float | None
    ) -> dict[str, Outcome]:
        results: dict[str, Outcome] = {}
        before = self.held_devices()
        try:
            async with self._serialized():
                for ref in refs:
                    started = time.perf_counter()
                    failure: BaseException | None = None
                    try:
                        results[ref.uid] = await self._prepare_one(ref, deadline)
                    except (EnflameError, OSError) as exc:
                        log.warning("prepare of claim %s failed: %s", ref, exc)
                        results[ref.uid] = str(exc)
                        failure = exc
                    self._observe("prepare", started, failure)
        except (EnflameError, OSError) as exc:  # the record cannot be read or locked
            log.error("cannot prepare claims: %s", exc)
            self._observe("prepare", time.perf_counter(), exc)
            return {ref.uid: f"cannot prepare claim {ref}: {exc}" for ref in refs}
        finally:
            self._changed(before)
        return results

    def _observe(self, operation: str, started: float, failure: BaseException | None) -> None:
        if self.metrics is None:
            return
        self.metrics.observe_call(operation, time.perf_counter() - started, failure)
        self._observe_claims()

    def _observe_claims(self) -> None:
        if self.metrics is None:
            return
        held: dict[str, int] = {}
        for claim in self._claims.values():
            for device in claim.devices:
                if device.drs_instance:
                    held[device.node_name] = held.get(device.node_name, 0) + 1
        prepared = sum(c.state == checkpoint.PREPARED for c in self._claims.values())
        self.metrics.observe_claims(held, prepared)

    async def _prepare_one(
        self, ref: claims.ClaimRef, deadline: float | None = None
    ) -> list[PreparedDeviceResult]:
        if not ref.uid or not ref.name or not ref.namespace:
            raise ClaimError(f"claim {ref} lacks a namespace, name or uid")
        claims.check_ref(ref)
        existing = self._claims.get(ref.uid)
        if existing is not None and existing.state == checkpoint.PREPARED:
            if ref.uid in self.lost:
                raise ClaimError(f"claim {ref}: {self.lost[ref.uid]}")
            if not os.path.exists(claim_cdi.spec_path(self.cdi_dir, ref.uid)):
                self._write_spec(existing)
            return self._results(existing)
        allocated = await self.source.allocated_devices(ref)
        claim = self._resolve(ref, allocated)
        if existing is not None:  # still preparing: keep what an earlier attempt created
            claim = _carry_over(existing, claim)
        self._claims[ref.uid] = claim
        self.checkpoint.save(self._claims)
        try:
            self._fault("after-checkpoint")
            claim = await self._create_instances(claim, deadline)
            self._write_spec(claim)
            self._fault("after-cdi")
        except (EnflameError, OSError) as failure:
            # A failure (not a crash) undoes the first steps at once.
            claim_cdi.remove(self.cdi_dir, ref.uid)
            try:
                await self._destroy_instances(self._claims[ref.uid])
                await asyncio.to_thread(self._settle_pending, self._claims[ref.uid], None)
            except EfsmiError as exc:
                # Kept on record as preparing: the retry adopts the instance, the next start
                # rolls it back and destroys it (an instance off the record is never swept).
                log.warning("cannot destroy the DRS instance of claim %s yet: %s", ref, exc)
                raise failure from exc
            del self._claims[ref.uid]
            self.checkpoint.save(self._claims)
            raise
        self._claims[ref.uid] = claim.with_state(checkpoint.PREPARED)
        self.checkpoint.save(self._claims)
        self._fault("after-prepared")
        log.info(
            "prepared claim %s: %s",
            ref,
            ", ".join(f"{d.device} ({d.request})" for d in claim.devices),
        )
        return self._results(self._claims[ref.uid])

    def _efsmi(self) -> efsmi.Efsmi:
        if self.devices.tool is None:
            raise ClaimError("this driver was started without DRS (--drs): no efsmi to use")
        return self.devices.tool

    def _index(self, card: str) -> int:
        layout = self.devices.layouts.get(card)
        if layout is None:
            raise ClaimError(f"{card} is not partitioned with DRS on this node")
        return layout.index

    def create_budget(self) -> float:
        """The time a DRS create may take: the slowest seen here, at least the floor."""
        return max(MIN_CREATE_SECONDS, self.slowest_create)

    def _check_deadline(
        self, claim: checkpoint.PreparedClaim, card: str, deadline: float | None
    ) -> None:
        if deadline is None:
            return
        left = deadline - time.monotonic()
        need = self.create_budget()
        if left < need:
            raise ClaimError(
                f"claim {self._name(claim)}: the kubelet's deadline leaves {max(left, 0):.1f}s, "
                f"less than the {need:.1f}s a DRS create on {card} may take; the create was not "
                "started (the kubelet asks again)"
            )

    async def _create_instances(
        self, claim: checkpoint.PreparedClaim, deadline: float | None = None
    ) -> checkpoint.PreparedClaim:
        """Create each DRS partition's instance, recording it before going on.

        Each create is one step with its lookup and its record: the card's UUIDs are recorded
        first (``drs_before``), then efsmi creates and lists, then the new instance is recorded.
        A device found with ``drs_before`` and no instance had a create started whose outcome
        was never recorded: what appeared on the card since is adopted, not created again.
        """
        for number, device in enumerate(claim.devices):
            if device.drs_profile is None or device.drs_instance:
                continue
            layout = self.devices.layouts.get(device.node_name)
            profile = layout.profile(device.drs_profile) if layout else None
            if layout is None or profile is None:
                raise ClaimError(
                    f"claim {self._name(claim)}: {device.node_name} offers no DRS profile "
                    f"{device.drs_profile}"
                )
            instance = None
            if device.drs_before is not None:
                instance = await asyncio.to_thread(self._settle_pending, claim, device)
                if instance is not None:
                    log.info(
                        "adopted DRS instance %s (%s on %s), created for claim %s by an "
                        "earlier attempt",
                        instance.uuid,
                        device.drs_profile,
                        device.node_name,
                        self._name(claim),
                    )
            if instance is None:
                self._check_deadline(claim, device.node_name, deadline)
                tool = self._efsmi()
                before = tuple(
                    sorted(i.uuid for i in await asyncio.to_thread(tool.instances, layout.index))
                )
                claim = self._replace_device(
                    claim, number, dataclasses.replace(device, drs_before=before)
                )
                self.checkpoint.save(self._claims)
                started = time.monotonic()
                instance = await asyncio.to_thread(
                    tool.create_instance, layout.index, profile.profile_id, before
                )
                self.slowest_create = max(self.slowest_create, time.monotonic() - started)
            self._fault("drs-after-create")
            updated = dataclasses.replace(
                device, drs_instance=instance.instance_id, drs_uuid=instance.uuid, drs_before=None
            )
            claim = self._replace_device(claim, number, updated)
            self.checkpoint.save(self._claims)
            self._fault("drs-after-record")
            log.info(
                "created DRS instance %s (%s on %s) for claim %s",
                instance.uuid,
                device.drs_profile,
                device.node_name,
                self._name(claim),
            )
        return claim

    def _replace_device(
        self, claim: checkpoint.PreparedClaim, number: int, device: checkpoint.PreparedDevice
    ) -> checkpoint.PreparedClaim:
        claim = dataclasses.replace(
            claim, devices=(*claim.devices[:number], device, *claim.devices[number + 1 :])
        )
        self._claims[claim.uid] = claim
        return claim

    def _settle_pending(
        self, claim: checkpoint.PreparedClaim, keep: checkpoint.PreparedDevice | None
    ) -> efsmi.Instance | None:
        """Instances that appeared on a card since a create of ``claim`` started and that no
        claim on record holds: the one of ``keep``'s profile is returned (adopted), the others
        are destroyed. With ``keep`` None (a failed Prepare), every one is destroyed."""
        adopted = None
        tool = self._efsmi()
        recorded = {d.drs_uuid for c in self._claims.values() for d in c.devices if d.drs_uuid}
        for device in claim.devices:
            if device.drs_before is None or device.drs_instance:
                continue
            layout = self.devices.layouts.get(device.node_name)
            if layout is None:
                continue
            before = set(device.drs_before)
            for found in tool.instances(layout.index):
                if found.uuid in before or found.uuid in recorded:
                    continue
                if (
                    adopted is None
                    and keep is not None
                    and device.device == keep.device
                    and found.profile == keep.drs_profile
                ):
                    adopted = found
                    recorded.add(found.uuid)
                    continue
                tool.destroy_instance(found.index, found.instance_id, found.uuid)
                recorded.add(found.uuid)
                log.info(
                    "destroyed DRS instance %s on %s, created by an unfinished prepare of claim %s",
                    found.uuid,
                    device.node_name,
                    self._name(claim),
                )
        return adopted

    async def _destroy_instances(self, claim: checkpoint.PreparedClaim) -> None:
        """Destroy the claim's DRS instances (those already gone are fine, and so are those of
        a card that is gone or unhealthy: they went with it; the card is looked at again when
        it is back)."""
        for device in claim.devices:
            if not device.drs_instance:
                continue
            try:
                index = self._index(device.node_name)
            except ClaimError:
                continue  # the card is no longer partitioned here: its instances went with it
            try:
                await asyncio.to_thread(
                    self._efsmi().destroy_instance, index, device.drs_instance, device.drs_uuid
                )
            except EfsmiError as exc:
                gone = self._card_gone(device.node_name, exc)
                if gone is None:
                    raise
                self.unsettled.setdefault(device.node_name, set()).add(device.drs_uuid or "")
                log.warning(
                    "DRS instance %s of claim %s went with its card: %s; the card is checked "
                    "for leftovers when it is back",
                    device.drs_uuid,
                    self._name(claim),
                    gone,
                )
                continue
            log.info("destroyed DRS instance %s of claim %s", device.drs_uuid, self._name(claim))

    def _card_gone(self, card: str, exc: EfsmiError) -> str | None:
        """Why ``card``'s instances count as gone after efsmi failed on it, or None."""
        if exc.reason == "not-found":
            return f"efsmi does not know {card} ({exc})"
        if not self.devices.healthy().get(card, False):
            reason = self.devices.report.reasons().get(card, "unhealthy")
            return f"{card} is absent or unhealthy ({reason})"
        return None

    async def watch_cards(self) -> None:
        """Until cancelled: when a DRS card comes back healthy (a replug, a reset), look at its
        instances again (see :meth:`recheck`); and every :attr:`recheck_interval` seconds look
        at the healthy cards that hold prepared instances, so an instance destroyed while its
        card never looked unhealthy (a quick reset, a hand-run efsmi) is noticed then, not only
        at the next start."""
        was = self._drs_health()
        seen = self.devices.version
        while True:
            before = seen
            seen = await self.devices.changed(seen, self.recheck_interval)
            now = self._drs_health()
            back = {card for card, ok in now.items() if ok and not was.get(card, False)}
            back |= {card for card in self.unsettled if now.get(card)}
            if seen == before:  # the interval passed with no change
                back |= {card for card in self._holding_instances() if now.get(card)}
            was = now
            if not back:
                continue
            try:
                async with self._serialized():
                    await asyncio.to_thread(self._recheck, sorted(back))
            except (EnflameError, OSError) as exc:  # the record: looked at again next change
                log.warning("cannot look at the DRS cards %s again: %s", ", ".join(back), exc)

    def _holding_instances(self) -> set[str]:
        """Cards with a DRS instance of a prepared claim not already reported lost."""
        return {
            device.node_name
            for claim in self._claims.values()
            if claim.state == checkpoint.PREPARED and claim.uid not in self.lost
            for device in claim.devices
            if device.drs_instance
        }

    def _drs_health(self) -> dict[str, bool]:
        healthy = self.devices.healthy()
        return {card: healthy.get(card, False) for card in self.devices.layouts}

    def _recheck(self, cards: Sequence[str]) -> list[str]:
        """A card is back: the instances an Unprepare left on it while it was gone are
        destroyed, and claims whose instance is gone (the card was reset) are reported and
        refused, as at a start. Instances of no claim here are left alone (not ours)."""
        tool = self._efsmi()
        actions = []
        for card in cards:
            layout = self.devices.layouts.get(card)
            if layout is None:
                continue
            try:
                existing = tool.instances(layout.index)
            except EfsmiError as exc:
                log.warning("cannot list the DRS instances of %s yet: %s", card, exc)
                continue
            left = self.unsettled.pop(card, set())
            held = {
                (d.drs_instance, d.drs_uuid): claim
                for claim in self._claims.values()
                for d in claim.devices
                if d.node_name == card and d.drs_instance
            }
            found = {(i.instance_id, i.uuid) for i in existing}
            for instance in existing:
                if instance.uuid not in left or (instance.instance_id, instance.uuid) in held:
                    continue
                try:
                    tool.destroy_instance(instance.index, instance.instance_id, instance.uuid)
                except EfsmiError as exc:
                    actions.append(f"cannot destroy DRS instance {instance.uuid}: {exc}")
                    self.unsettled.setdefault(card, set()).add(instance.uuid)
                    continue
                actions.append(
                    f"destroyed DRS instance {instance.uuid} on {card}, left by the Unprepare "
                    "of a claim while the card was gone"
                )
            for (instance_id, uuid), claim in sorted(held.items(), key=lambda i: i[1].uid):
                if (
                    (instance_id, uuid) in found
                    or claim.state != checkpoint.PREPARED
                    or claim.uid in self.lost  # said once
                ):
                    continue
                self.lost[claim.uid] = (
                    f"its DRS instance {uuid} on {card} is gone (the card was reset or the "
                    "instance destroyed outside the driver); it is not re-created: delete the pod"
                )
                actions.append(f"claim {self._name(claim)}: {self.lost[claim.uid]}")
        for action in actions:
            log.warning("%s", action)
        return actions

    def _resolve(
        self, ref: claims.ClaimRef, allocated: Sequence[claims.AllocatedDevice]
    ) -> checkpoint.PreparedClaim:
        offered = self.devices.published_names()
        healthy = self.devices.healthy()
        reasons = self.devices.report.reasons()
        slices_of = self.devices.slices_of()
        prepared = []
        for item in allocated:
            if item.pool != self.node_name:
                raise ClaimError(
                    f"claim {ref}: {item.device} was allocated from pool {item.pool!r}, but this "
                    f"node's pool is {self.node_name!r}"
                )
            node_name = offered.get(item.device)
            if node_name is None:
                raise ClaimError(
                    f"claim {ref}: {item.device} is not a device this node offers; offered: "
                    f"{', '.join(sorted(offered)) or 'none'}"
                )
            card = self.devices.parent_of(node_name) or ""
            if not healthy.get(card, False):
                raise ClaimError(
                    f"claim {ref}: {item.device} is unhealthy ({reasons.get(card, 'unknown')})"
                )
            holder = self.devices.held_by_plugin.get(card)
            if holder is not None:  # tainted, but a claim may tolerate every taint
                raise ClaimError(
                    f"claim {ref}: {item.device} is on {card}, which {holder} holds through the "
                    "device plugin; it is offered to claims once that pod ends"
                )
            slices = _slices(item, ref)
            total = slices_of.get(node_name)
            shared = item.share_id is not None and slices is not None and total is not None
            if shared and slices is not None and total is not None and slices >= total:
                shared = False  # all slices: the card whole
            partition = resourceslices.parse_partition(item.device)
            prepared.append(
                checkpoint.PreparedDevice(
                    request=item.request,
                    device=item.device,
                    node_name=node_name,
                    share_id=item.share_id if shared else None,
                    slices=slices if shared else None,
                    drs_profile=partition[1] if partition else None,
                )
            )
        self._refuse_double_use(ref, prepared, slices_of)
        requests = claim_cdi.requests_of(prepared)
        return checkpoint.PreparedClaim(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=checkpoint.PREPARING,
            devices=tuple(prepared),
            cdi_ids=tuple((r, claim_cdi.qualified_name(ref.uid, r)) for r in requests),
        )

    def _refuse_double_use(
        self,
        ref: claims.ClaimRef,
        wanted: Sequence[checkpoint.PreparedDevice],
        slices_of: Mapping[str, int],
    ) -> None:
        for device in wanted:
            used = device.slices or 0
            for other in self._claims.values():
                if other.uid == ref.uid:
                    continue
                for held in other.devices:
                    if held.node_name != device.node_name:
                        continue
                    if held.drs_profile and device.drs_profile and held.device != device.device:
                        continue  # two partitions of a card: efsmi refuses what does not fit
                    if held.slices is None or device.slices is None:
                        raise ClaimError(
                            f"claim {ref}: {device.device} is already prepared for claim "
                            f"{self._name(other)}; a GCU is given to one claim at a time "
                            "unless both hold slices of it (unprepare the other claim first)"
                        )
                    used += held.slices
            total = slices_of.get(device.node_name)
            if device.slices is not None and total is not None and used > total:
                raise ClaimError(
                    f"claim {ref}: {device.device} has {total} slices and prepared claims "
                    f"would hold {used}"
                )

    def _write_spec(self, claim: checkpoint.PreparedClaim) -> None:
        spec = claim_cdi.build_spec(self.devices.inventory, claim, self.devices.slices_of())
        claim_cdi.write(self.cdi_dir, claim.uid, spec)

    def _results(self, claim: checkpoint.PreparedClaim) -> list[PreparedDeviceResult]:
        ids = dict(claim.cdi_ids)
        given: set[str] = set()
        results = []
        for device in claim.devices:
            request = device.request.partition("/")[0]
            # The request's one CDI device goes with its first device only: no duplicates.
            cdi = () if request in given else (ids[request],)
            given.add(request)
            results.append(
                PreparedDeviceResult(request, self.node_name, device.device, cdi, device.share_id)
            )
        return results

    # --- Unprepare ----------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, str]:
        """Unprepare each claim (unknown claims are fine); ``{uid: error or ""}``; like a
        Prepare, it runs to its end when the caller gives up."""
        return await self._unsplit(self._unprepare_all(refs))

    async def _unprepare_all(self, refs: Sequence[claims.ClaimRef]) -> dict[str, str]:
        results: dict[str, str] = {}
        before = self.held_devices()
        try:
            async with self._serialized():
                for ref in refs:
                    started = time.perf_counter()
                    failure: BaseException | None = None
                    try:
                        claims.check_ref(ref)
                        claim_cdi.remove(self.cdi_dir, ref.uid)
                        self._fault("unprepare-after-cdi")
                        held = self._claims.get(ref.uid)
                        if held is not None:
                            await self._destroy_instances(held)
                            self._fault("unprepare-after-destroy")
                        claim = self._claims.pop(ref.uid, None)
                        self.lost.pop(ref.uid, None)
                        if claim is not None:
                            self.checkpoint.save(self._claims)
                            log.info("unprepared claim %s", ref)
                            await self._release_waiting(claim)
                        results[ref.uid] = ""
                    except (EnflameError, OSError) as exc:
                        results[ref.uid] = f"cannot unprepare claim {ref}: {exc}"
                        failure = exc
                    self._observe("unprepare", started, failure)
        except (EnflameError, OSError) as exc:
            log.error("cannot unprepare claims: %s", exc)
            self._observe("unprepare", time.perf_counter(), exc)
            return {ref.uid: f"cannot unprepare claim {ref}: {exc}" for ref in refs}
        finally:
            self._changed(before)
        return results

    async def _release_waiting(self, claim: checkpoint.PreparedClaim) -> None:
        """Cards this claim held whole while DRS waited for them are partitioned now."""
        still = {d.node_name for c in self._claims.values() for d in c.devices}
        for device in claim.devices:
            card = device.node_name
            waiting = card in self.devices.waiting and card not in still
            if waiting and await asyncio.to_thread(self.devices.released, card):
                self.devices.notify()

    @staticmethod
    def _name(claim: checkpoint.PreparedClaim) -> str:
        return f"{claim.namespace}/{claim.name} (uid {claim.uid})"


def _carry_over(
    earlier: checkpoint.PreparedClaim, claim: checkpoint.PreparedClaim
) -> checkpoint.PreparedClaim:
    """``claim`` with the DRS instances (and creates started) of an earlier, unfinished
    attempt at the same devices."""
    by_device = {d.device: d for d in earlier.devices}
    devices = []
    for device in claim.devices:
        old = by_device.get(device.device)
        if old is None or old.drs_profile != device.drs_profile:
            devices.append(device)
            continue
        devices.append(
            dataclasses.replace(
                device,
                drs_instance=old.drs_instance,
                drs_uuid=old.drs_uuid,
                drs_before=old.drs_before,
            )
        )
    return dataclasses.replace(claim, devices=tuple(devices))


def _slices(item: claims.AllocatedDevice, ref: claims.ClaimRef) -> int | None:
    consumed = dict(item.consumed)
    if SLICES not in consumed:
        return None
    try:
        value = int(consumed[SLICES])
    except ValueError:
        raise ClaimError(
            f"claim {ref}: {item.device} consumed {consumed[SLICES]!r} slices, not a whole number"
        ) from None
    if value < 1:
        raise ClaimError(f"claim {ref}: {item.device} consumed {value} slices")
    return value
