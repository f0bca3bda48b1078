"""Leader election on a coordination.k8s.io/v1 Lease, so two operator replicas are safe.

The holder renews the Lease on its own timer (every few seconds, apart from the reconcile
passes, which can take longer than the Lease lasts) and stops writing as soon as it has not
renewed within ``renew_deadline`` seconds, which is shorter than ``duration``: by the time a
standby may take over, the old leader has stopped. A standby measures the Lease's expiry from
when it last saw the record change, on its own clock, as client-go does: the holder's
``renewTime`` was written by another machine's clock and says nothing here. Every write carries
the Lease's resourceVersion, so when two replicas race for an expired Lease the API server lets
exactly one of them win (409 for the other). A leader renews with one PUT of the Lease as its own
last write left it (that resourceVersion proves nobody wrote since); only a 409, or a renewal
that came too late, makes it read the Lease again. So a converged leader costs the API server
one request per renewal, not a GET and a PUT.

Every duration (the renew deadline, a standby's expiry) is measured on a monotonic clock: a
wall clock stepped back by NTP or by hand must not keep a leader writing past its deadline, nor
one stepped forward end a healthy leadership. The wall clock only stamps the Lease's times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from enflame_gcu.gcu_operator import api, pods

LOG = logging.getLogger(__name__)
LEASE_NAME = "enflame-gcu-operator"


class LeaderElector:
    """Holds or waits for the operator's Lease."""

    def __init__(
        self,
        cluster: api.ClusterApi,
        namespace: str,
        identity: str,
        duration: int = 15,
        name: str = LEASE_NAME,
        *,
        renew_deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api = cluster
        self._clock = clock
        self._wall = wall
        self._namespace = namespace
        self._identity = identity
        self._duration = duration
        self._name = name
        self.renew_deadline = renew_deadline if renew_deadline is not None else duration * 2 / 3
        if not 0 < self.renew_deadline < duration:
            raise ValueError(
                f"the renew deadline ({self.renew_deadline} s) must be shorter than the Lease "
                f"({duration} s)"
            )
        # The other holder's record as last read, and when (our monotonic clock) it was first
        # seen so.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        # When (our monotonic clock) this replica last wrote the Lease as its holder, and the
        # Lease as the API server returned that write.
        self._renewed_at: float | None = None
        self._written: dict[str, Any] | None = None

    def leading(self, now: float | None = None) -> bool:
        """Whether this replica may write: it renewed the Lease within the renew deadline
        (``now`` on the monotonic clock; default: the clock's)."""
        if self._renewed_at is None:
            return False
        now = self._clock() if now is None else now
        return 0 <= now - self._renewed_at <= self.renew_deadline

    def _spec(self, transitions: int, acquired: str | None) -> dict[str, Any]:
        stamp = pods.rfc3339(self._wall()).replace("Z", ".000000Z")
        return {
            "holderIdentity": self._identity,
            "leaseDurationSeconds": self._duration,
            "acquireTime": acquired or stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }

    def _renew_blind(self, now: float) -> bool | None:
        """Renew from our own last write with one PUT: True when it took; None when the Lease
        must be read first (no write of ours, or it is too old to build on, or someone else
        wrote since: a 409)."""
        written, self._written = self._written, None
        if written is None or not self.leading(now):
            return None
        spec = written.get("spec") or {}
        written["spec"] = self._spec(
            int(spec.get("leaseTransitions") or 0), spec.get("acquireTime")
        )
        try:
            self._written = self._api.replace(api.LEASE, written)
        except api.ApiError as exc:
            if exc.status == api.CONFLICT:
                return None
            raise
        self._renewed_at = now
        return True

    def try_acquire(self, now: float | None = None) -> bool:
        """Take or renew the Lease; True while this replica leads (``now`` on the monotonic
        clock; default: the clock's)."""
        now = self._clock() if now is None else now
        try:
            if self._renew_blind(now):
                return True
            lease = self._api.get(api.LEASE, self._name, self._namespace)
            if lease is None:
                self._written = self._api.create(
                    api.LEASE,
                    {
                        "apiVersion": api.LEASE.api_version,
                        "kind": "Lease",
                        "metadata": {"name": self._name, "namespace": self._namespace},
                        "spec": self._spec(0, None),
                    },
                )
                LOG.info("became leader (created Lease %s/%s)", self._namespace, self._name)
                self._renewed_at = now
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            record = (
                holder,
                spec.get("renewTime"),
                spec.get("acquireTime"),
                spec.get("leaseTransitions"),
                lease.get("metadata", {}).get("resourceVersion"),
            )
            if record != self._observed:
                self._observed, self._observed_at = record, now
            duration = int(spec.get("leaseDurationSeconds") or self._duration)
            expired = now - self._observed_at > duration
            if holder != self._identity and holder and not expired:
                self._renewed_at = None
                return False
            transitions = int(spec.get("leaseTransitions") or 0)
            mine = holder == self._identity
            lease["spec"] = self._spec(
                transitions if mine else transitions + 1,
                spec.get("acquireTime") if mine else None,
            )
            self._written = self._api.replace(api.LEASE, lease)
            self._renewed_at = now
            self._observed = None
            if not mine:
                LOG.info("became leader (Lease %s/%s, was %s)", self._namespace, self._name, holder)
            return True
        except api.ApiError as exc:
            if exc.status == api.CONFLICT:
                return False
            raise

    def release(self) -> None:
        """Give the Lease up at shutdown, so a standby replica takes over at once."""
        self._renewed_at = None
        self._written = None
        try:
            lease = self._api.get(api.LEASE, self._name, self._namespace)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._identity:
                return
            lease["spec"]["holderIdentity"] = None
            self._api.replace(api.LEASE, lease)
        except api.ApiError as exc:
            LOG.warning("could not release the Lease: %s", exc)
