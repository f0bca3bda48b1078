"""Prepare and unprepare claims: resolve, refuse double use, checkpoint, write CDI, recover.

A Prepare is two steps on disk: the checkpoint records the claim as ``preparing``, the CDI spec
is written, then the checkpoint says ``prepared``. Whatever stops the driver between them, the
next start finds the ``preparing`` entry and rolls it back (spec removed, entry dropped); the
kubelet, which got no answer, simply asks again. After a reboot (``/var/run/cdi`` is a tmpfs)
the specs of claims still prepared are written again from the checkpoint. Both calls are
idempotent; Unprepare needs nothing but the checkpoint, so it works while the API server is
away and after the claim is gone.

Two instances may run side by side during a rolling update with surge (their sockets carry the
pod UID): every call, and the recovery at start, holds an exclusive ``flock`` on
``serialize.lock`` in the state directory and reads the checkpoint afresh, so the instances
never prepare the same card twice nor roll back each other's Prepare in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu import claim_specs, fileio
from enflame_gcu.dra_plugin import checkpoint, claim_cdi, claims, node
from enflame_gcu.errors import ClaimError, EnflameError

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "serialize.lock"
LOCK_POLL = 0.01  # seconds between attempts at the lock held by another instance
SLICES = "slices"


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
    ) -> None:
        self.node_name = node_name
        self.devices = devices
        self.source = source
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint.Checkpoint(os.path.join(state_dir, CHECKPOINT_FILE))
        self.lock_path = os.path.join(state_dir, LOCK_FILE)
        self._fault = fault or (lambda point: None)
        self._lock = asyncio.Lock()
        self._claims: dict[str, checkpoint.PreparedClaim] = {}

    @property
    def prepared(self) -> Mapping[str, checkpoint.PreparedClaim]:
        """The claims on record, by UID."""
        return dict(self._claims)

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
            return self._recover()

    def _recover(self) -> list[str]:
        actions = []
        loaded = self.checkpoint.load()
        for uid, claim in sorted(loaded.items()):
            if claim.state == checkpoint.PREPARING:
                claim_cdi.remove(self.cdi_dir, uid)
                del loaded[uid]
                actions.append(f"rolled back the unfinished prepare of claim {self._name(claim)}")
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

    # --- Prepare ------------------------------------------------------------------------

    async def prepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, Outcome]:
        """Prepare each claim; a failing claim gets its error text, the others go on."""
        results: dict[str, Outcome] = {}
        try:
            async with self._serialized():
                for ref in refs:
                    try:
                        results[ref.uid] = await self._prepare_one(ref)
                    except (EnflameError, OSError) as exc:
                        log.warning("prepare of claim %s failed: %s", ref, exc)
                        results[ref.uid] = str(exc)
        except (EnflameError, OSError) as exc:  # the record cannot be read or locked
            log.error("cannot prepare claims: %s", exc)
            return {ref.uid: f"cannot prepare claim {ref}: {exc}" for ref in refs}
        return results

    async def _prepare_one(self, ref: claims.ClaimRef) -> list[PreparedDeviceResult]:
        if not ref.uid or not ref.name or not ref.namespace:
            raise ClaimError(f"claim {ref} lacks a namespace, name or uid")
        claims.check_ref(ref)
        existing = self._claims.get(ref.uid)
        if existing is not None and existing.state == checkpoint.PREPARED:
            if not os.path.exists(claim_cdi.spec_path(self.cdi_dir, ref.uid)):
                self._write_spec(existing)
            return self._results(existing)
        allocated = await self.source.allocated_devices(ref)
        claim = self._resolve(ref, allocated)
        self._claims[ref.uid] = claim
        self.checkpoint.save(self._claims)
        try:
            self._fault("after-checkpoint")
            self._write_spec(claim)
            self._fault("after-cdi")
        except (EnflameError, OSError):
            # A failure (not a crash) undoes the first step at once.
            claim_cdi.remove(self.cdi_dir, ref.uid)
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
            slices = _slices(item, ref)
            total = slices_of.get(node_name)
            shared = item.share_id is not None and slices is not None and total is not None
            if shared and slices is not None and total is not None and slices >= total:
                shared = False  # all slices: the card whole
            prepared.append(
                checkpoint.PreparedDevice(
                    request=item.request,
                    device=item.device,
                    node_name=node_name,
                    share_id=item.share_id if shared else None,
                    slices=slices if shared else None,
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
        """Unprepare each claim (unknown claims are fine); ``{uid: error or ""}``."""
        results: dict[str, str] = {}
        try:
            async with self._serialized():
                for ref in refs:
                    try:
                        claims.check_ref(ref)
                        claim_cdi.remove(self.cdi_dir, ref.uid)
                        self._fault("unprepare-after-cdi")
                        claim = self._claims.pop(ref.uid, None)
                        if claim is not None:
                            self.checkpoint.save(self._claims)
                            log.info("unprepared claim %s", ref)
                        results[ref.uid] = ""
                    except (EnflameError, OSError) as exc:
                        results[ref.uid] = f"cannot unprepare claim {ref}: {exc}"
        except (EnflameError, OSError) as exc:
            log.error("cannot unprepare claims: %s", exc)
            return {ref.uid: f"cannot unprepare claim {ref}: {exc}" for ref in refs}
        return results

    @staticmethod
    def _name(claim: checkpoint.PreparedClaim) -> str:
        return f"{claim.namespace}/{claim.name} (uid {claim.uid})"


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
