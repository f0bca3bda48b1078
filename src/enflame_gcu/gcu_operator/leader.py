"""Leader election on a coordination.k8s.io/v1 Lease, so two operator replicas are safe.

The holder renews the Lease every ``renew`` seconds; another replica takes it only after
``duration`` seconds without a renewal. Every write carries the Lease's resourceVersion, so when
two replicas race for an expired Lease the API server lets exactly one of them win (409 for the
other).
"""

from __future__ import annotations

import logging
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
    ) -> None:
        self._api = cluster
        self._namespace = namespace
        self._identity = identity
        self._duration = duration
        self._name = name

    def _spec(self, now: float, transitions: int, acquired: str | None) -> dict[str, Any]:
        stamp = pods.rfc3339(now).replace("Z", ".000000Z")
        return {
            "holderIdentity": self._identity,
            "leaseDurationSeconds": self._duration,
            "acquireTime": acquired or stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }

    def try_acquire(self, now: float) -> bool:
        """Take or renew the Lease; True while this replica leads."""
        try:
            lease = self._api.get(api.LEASE, self._name, self._namespace)
            if lease is None:
                self._api.create(
                    api.LEASE,
                    {
                        "apiVersion": api.LEASE.api_version,
                        "kind": "Lease",
                        "metadata": {"name": self._name, "namespace": self._namespace},
                        "spec": self._spec(now, 0, None),
                    },
                )
                LOG.info("became leader (created Lease %s/%s)", self._namespace, self._name)
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            renewed = pods.timestamp(spec.get("renewTime"))
            duration = int(spec.get("leaseDurationSeconds") or self._duration)
            expired = renewed is None or now - renewed > duration
            if holder != self._identity and holder and not expired:
                return False
            transitions = int(spec.get("leaseTransitions") or 0)
            mine = holder == self._identity
            lease["spec"] = self._spec(
                now,
                transitions if mine else transitions + 1,
                spec.get("acquireTime") if mine else None,
            )
            self._api.replace(api.LEASE, lease)
            if not mine:
                LOG.info("became leader (Lease %s/%s, was %s)", self._namespace, self._name, holder)
            return True
        except api.ApiError as exc:
            if exc.status == api.CONFLICT:
                return False
            raise

    def release(self) -> None:
        """Give the Lease up at shutdown, so a standby replica takes over at once."""
        try:
            lease = self._api.get(api.LEASE, self._name, self._namespace)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._identity:
                return
            lease["spec"]["holderIdentity"] = None
            self._api.replace(api.LEASE, lease)
        except api.ApiError as exc:
            LOG.warning("could not release the Lease: %s", exc)
