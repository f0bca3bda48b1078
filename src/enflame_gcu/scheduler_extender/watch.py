"""Keeps the cache current from the API server: a list, then a watch, of the node-state Leases
(one per node, in one namespace, :mod:`enflame_gcu.node_state`), bound Pods and Pods waiting to
be scheduled (the only pods the extender will hold a guess for). Nodes are not watched: every
Node change of the cluster would cross this process for nothing.

One task per kind. A watch that ends with an error (the API server restarted, a resource version
expired with 410) is logged once and followed by a fresh list after a short pause, so the cache
is never built on a gap of missed events. Objects cross into the cache as plain dicts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lightkube import AsyncClient, KubeConfig, operators
from lightkube.core.client import FieldSelector, LabelSelector
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod

from enflame_gcu import node_state
from enflame_gcu.errors import ConfigError
from enflame_gcu.scheduler_extender import cache as extender_cache

log = logging.getLogger(__name__)
RETRY_SECONDS = 2.0
BOUND: FieldSelector = {"spec.nodeName": operators.not_equal("")}
WAITING: FieldSelector = {"spec.nodeName": operators.equal("")}
LEASES: LabelSelector = dict(node_state.LEASE_LABELS)


def connect(kubeconfig: str = "") -> AsyncClient:
    """A client from a kubeconfig file, else from the pod's service account."""
    try:
        config = (
            KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
        )
    except Exception as exc:  # lightkube raises several kinds for a bad or missing config
        where = kubeconfig or "the in-cluster service account"
        raise ConfigError(f"cannot configure the API client from {where}: {exc}") from exc
    return AsyncClient(config=config, field_manager="enflame-scheduler-extender")


def _name(obj: Any) -> str:
    return str(obj.metadata.name) if obj.metadata is not None else ""


class Watcher:
    """The two follow loops and whether both have listed once."""

    def __init__(
        self, client: AsyncClient, cache: extender_cache.ClusterCache, namespace: str = ""
    ) -> None:
        self.client = client
        self.cache = cache
        # The node-state Leases' namespace: the extender's own unless told.
        self.namespace = namespace or str(client.namespace)
        self.synced = {
            "leases": asyncio.Event(),
            "pods": asyncio.Event(),
            "waiting": asyncio.Event(),
        }

    def ready(self) -> tuple[bool, str]:
        """Ready when every kind has been listed at least once."""
        missing = [kind for kind, done in self.synced.items() if not done.is_set()]
        return (False, f"not listed yet: {', '.join(missing)}") if missing else (True, "ok")

    async def run(self) -> None:
        """Follow nodes, bound and waiting pods until cancelled."""
        await asyncio.gather(*(self._follow(kind) for kind in self.synced))

    async def _follow(self, kind: str) -> None:
        trouble = ""
        while True:
            try:
                version = await self._list(kind)
                self.synced[kind].set()
                if trouble:
                    log.info("watching %s again", kind)
                    trouble = ""
                await self._watch(kind, version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any API or network failure: relist after a pause
                if str(exc) != trouble:
                    log.warning("watching %s failed (%s); listing again in %.0f s", kind, exc,
                                RETRY_SECONDS)  # fmt: skip
                    trouble = str(exc)
                await asyncio.sleep(RETRY_SECONDS)

    async def _list_leases(self) -> str:
        listing = self.client.list(
            Lease, namespace=self.namespace, labels=LEASES
        )  # fmt: skip
        leases = {_name(found): found.to_dict() async for found in listing}
        self.cache.replace_leases(leases)
        return str(listing.resourceVersion or "")

    async def _list_pods(self, fields: FieldSelector) -> tuple[list[dict[str, Any]], str]:
        listing = self.client.list(Pod, namespace="*", fields=fields)
        pods = [pod.to_dict() async for pod in listing]
        return pods, str(listing.resourceVersion or "")

    async def _list(self, kind: str) -> str:
        if kind == "leases":
            return await self._list_leases()
        pods, version = await self._list_pods(BOUND if kind == "pods" else WAITING)
        (self.cache.replace_pods if kind == "pods" else self.cache.replace_waiting)(pods)
        return version

    async def _watch(self, kind: str, version: str) -> None:
        if kind == "leases":
            events = self.client.watch(
                Lease,
                namespace=self.namespace,
                labels=LEASES,
                resource_version=version or None,
            )
            async for event, found in events:
                if event == "DELETED":
                    self.cache.delete_lease(_name(found))
                else:
                    self.cache.set_lease(_name(found), found.to_dict())
        else:
            fields = BOUND if kind == "pods" else WAITING
            pods = self.client.watch(
                Pod, namespace="*", fields=fields, resource_version=version or None
            )
            async for event, pod in pods:
                uid = str((pod.metadata.uid if pod.metadata is not None else None) or "")
                if event == "DELETED":
                    # Leaving the waiting selection means bound (or gone): not a deletion.
                    (self.cache.delete_pod if kind == "pods" else self.cache.unwait)(uid)
                else:
                    self.cache.set_pod(pod.to_dict())
