"""Keeps the plugin's node state current for the extender (``--node-state``): its own Lease.

The state (:mod:`enflame_gcu.node_state`) comes from what the plugin already knows: the cards,
their health, which cards it serves whole or as slices, and the holders the kubelet's
PodResources API reports. It lives on one Lease per node (:func:`node_state.lease`: named as
the node, held by it, in the plugin's namespace): the state's annotation is written only when
its content changed, and otherwise every ``refresh`` seconds the Lease's ``renewTime`` alone is
renewed with the last PodResources read's time (a merge patch of one field), so the extender
can tell a plugin that stopped writing from a quiet node. Never while the holders are unknown:
the Lease then ages, and the extender treats a state older than its bound as unknown (neutral).

On the Node the plugin keeps only the vendor's gcushare annotation
(``enflame.com/gcu-shared-capacity``) for gcushare's tools, patched only when its value changes
(the Node is read once at the first write, so a restart writes nothing when it is current); the
first write also removes the state annotation earlier versions kept on the Node. A failed write
is one WARNING (then DEBUG while it keeps failing) and is tried again after ``retry`` seconds;
the plugin keeps serving the kubelet throughout. On a clean shutdown :meth:`NodeAnnotator.clear`
deletes the Lease and removes the gcushare annotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from enflame_gcu import devices, health, holders, node_state, sharing
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import resources

log = logging.getLogger(__name__)
SETTLE = 0.2  # seconds: a health change and a holdings read arriving together make one write
CLEAR_TIMEOUT = 5.0  # seconds the shutdown waits to remove the state (the kubelet grants 30)
Annotations = Mapping[str, str | None]


class NodeApi(Protocol):
    """The node-state writer's API: its Node's annotations and its node-state Lease."""

    namespace: str  # the Leases' namespace

    async def patch_annotations(self, node: str, annotations: Annotations) -> None:
        """Merge-patch ``metadata.annotations`` of ``node`` (``None`` removes one)."""
        ...

    async def node_annotations(self, node: str) -> Mapping[str, str]:
        """The Node's annotations (one GET)."""
        ...

    async def patch_lease(self, name: str, patch: Mapping[str, Any]) -> bool:
        """Merge-patch the Lease ``name``; False when there is no such Lease."""
        ...

    async def create_lease(self, body: Mapping[str, Any]) -> None:
        """Create a Lease."""
        ...

    async def delete_lease(self, name: str) -> None:
        """Delete the Lease ``name`` (none is fine)."""
        ...


class LightkubeNodeApi:
    """:class:`NodeApi` (and the label reader of :mod:`.named_configs`) through lightkube: the
    in-cluster service account, or a kubeconfig; Leases in the account's (or the kubeconfig
    context's) namespace."""

    def __init__(self, kubeconfig: str = "") -> None:
        # Imported here: a plugin without --node-state never loads the API client.
        from lightkube import AsyncClient, KubeConfig  # noqa: PLC0415

        config = KubeConfig.from_file(kubeconfig) if kubeconfig else None
        self.client: Any = AsyncClient(config=config, field_manager="enflame-device-plugin")
        self.namespace = str(self.client.namespace)

    async def patch_annotations(self, node: str, annotations: Annotations) -> None:
        """One merge patch of the Node's annotations."""
        from lightkube.resources.core_v1 import Node  # noqa: PLC0415
        from lightkube.types import PatchType  # noqa: PLC0415

        patch = {"metadata": {"annotations": dict(annotations)}}
        await self.client.patch(Node, node, patch, patch_type=PatchType.MERGE)

    async def node_annotations(self, node: str) -> Mapping[str, str]:
        """The Node's annotations."""
        from lightkube.resources.core_v1 import Node  # noqa: PLC0415

        found = await self.client.get(Node, node)
        return dict((found.metadata.annotations if found.metadata else None) or {})

    async def node_labels(self, node: str) -> Mapping[str, str]:
        """The Node's labels (for the named configs: one GET, never a list of Nodes)."""
        from lightkube.resources.core_v1 import Node  # noqa: PLC0415

        found = await self.client.get(Node, node)
        return dict((found.metadata.labels if found.metadata else None) or {})

    async def patch_lease(self, name: str, patch: Mapping[str, Any]) -> bool:
        """One merge patch of the Lease; False on 404."""
        from lightkube import ApiError  # noqa: PLC0415
        from lightkube.resources.coordination_v1 import Lease  # noqa: PLC0415
        from lightkube.types import PatchType  # noqa: PLC0415

        try:
            await self.client.patch(
                Lease, name, dict(patch), namespace=self.namespace, patch_type=PatchType.MERGE
            )
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            raise
        return True

    async def create_lease(self, body: Mapping[str, Any]) -> None:
        """Create the Lease."""
        from lightkube.resources.coordination_v1 import Lease  # noqa: PLC0415

        await self.client.create(Lease.from_dict(dict(body)), namespace=self.namespace)

    async def delete_lease(self, name: str) -> None:
        """Delete the Lease; one already gone is fine."""
        from lightkube import ApiError  # noqa: PLC0415
        from lightkube.resources.coordination_v1 import Lease  # noqa: PLC0415

        try:
            await self.client.delete(Lease, name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def close(self) -> None:
        """Close the HTTP client."""
        await self.client.close()


class NodeAnnotator:
    """The state last seen and last written; :meth:`run` writes whenever they differ."""

    def __init__(
        self,
        api: NodeApi,
        node_name: str,
        *,
        retry: float = 5.0,
        refresh: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.retry = retry
        self.refresh = refresh
        self._clock = clock
        self._sharing = sharing.SharingSettings()
        self._observed = 0.0
        self._content: str | None = None  # the last written state's text without its time
        self._renewed = 0.0  # the observed time last written to the Lease
        self._written_at = 0.0
        self._on_node: dict[str, str | None] | None = None  # our annotations on the Node
        self.writes = self.content_writes = self.heartbeats = self.node_writes = 0
        self._inventory: devices.Inventory | None = None
        self._health: dict[str, tuple[bool, str]] = {}
        self._whole: tuple[str, ...] = ()
        self._shared: dict[str, int] = {}
        self._resources: tuple[str, ...] = holders.DEFAULT_RESOURCES
        self._holdings: tuple[holders.Holding, ...] | None = None
        self._changed = asyncio.Event()
        self._trouble = ""

    def set_node(
        self,
        inventory: devices.Inventory,
        report: health.HealthReport,
        assignment: resources.Assignment,
        config: plugin_config.PluginConfig,
    ) -> None:
        """The cards, their health and how they are served (after discovery or a change)."""
        self._inventory = inventory
        self._health = {card.name: (card.healthy, card.reason) for card in report.cards}
        self._whole = tuple(card.name for card in assignment.whole)
        self._shared = {
            card.name: config.sharing.slices_for(card.name, card.model)
            for card in assignment.shared
        }
        self._resources = tuple(config.resource_names().values())
        self._sharing = config.sharing
        self._changed.set()

    def set_holdings(self, holdings: Sequence[holders.Holding] | None) -> None:
        """Who holds what per PodResources; None when it could not be read."""
        self._holdings = None if holdings is None else tuple(holdings)
        if holdings is not None:
            self._observed = self._clock()
        self._changed.set()

    def _state(self) -> node_state.NodeState | None:
        if self._inventory is None or self._holdings is None:
            return None
        return node_state.build(
            self._inventory,
            self._holdings,
            whole=self._whole,
            shared=self._shared,
            health=self._health,
            resources=self._resources,
            settings=self._sharing,
            observed=self._observed,
        )

    def wanted(self) -> dict[str, str | None] | None:
        """The state's text and the gcushare annotation now; None while something is unknown."""
        state = self._state()
        if state is None:
            return None
        return {
            node_state.ANNOTATION: state.to_json(),
            node_state.SHARED_CAPACITY_ANNOTATION: state.shared_capacity(),
        }

    async def write_once(self) -> bool:
        """Write what is due: the Lease's state when its content changed, else its renewal
        when ``refresh`` seconds passed and PodResources was read since; the gcushare
        annotation when it changed. False when a write failed (tried again next time)."""
        state = self._state()
        if state is None:
            return True
        try:
            await self._write_lease(state)
            await self._write_node(state.shared_capacity())
        except Exception as exc:  # any API or network failure: try again later
            if str(exc) != self._trouble:
                log.warning(
                    "cannot write the node state of %s (%s); trying again every %g s",
                    self.node_name,
                    exc,
                    self.retry,
                )
                self._trouble = str(exc)
            else:
                log.debug("still cannot write the node state of %s: %s", self.node_name, exc)
            return False
        if self._trouble:
            log.info("node state of %s written again", self.node_name)
            self._trouble = ""
        return True

    async def _write_lease(self, state: node_state.NodeState) -> None:
        content = dataclasses.replace(state, observed=0.0).to_json()
        if content != self._content:
            text = state.to_json()
            patch = node_state.content_patch(text, state.observed)
            if not await self.api.patch_lease(self.node_name, patch):
                body = node_state.lease(self.node_name, self.api.namespace, text, state.observed)
                await self.api.create_lease(body)
            self.content_writes += 1
        elif self._clock() - self._written_at >= self.refresh and state.observed > self._renewed:
            if not await self.api.patch_lease(self.node_name, node_state.heartbeat(state.observed)):
                self._content = None  # deleted under us: create it again at once
                await self._write_lease(state)
                return
            self.heartbeats += 1
        else:
            return
        self._content = content
        self._renewed = state.observed
        self._written_at = self._clock()
        self.writes += 1

    async def _write_node(self, capacity: str | None) -> None:
        """The gcushare annotation on the Node, only when it changed; the first time, from
        the Node as it is (also dropping the state annotation of earlier versions)."""
        if self._on_node is None:
            found = await self.api.node_annotations(self.node_name)
            self._on_node = {
                key: found.get(key)
                for key in (node_state.ANNOTATION, node_state.SHARED_CAPACITY_ANNOTATION)
            }
        wanted = {node_state.ANNOTATION: None, node_state.SHARED_CAPACITY_ANNOTATION: capacity}
        changed = {key: value for key, value in wanted.items() if self._on_node.get(key) != value}
        if not changed:
            return
        await self.api.patch_annotations(self.node_name, changed)
        self._on_node.update(changed)
        self.node_writes += 1

    async def clear(self, timeout: float = CLEAR_TIMEOUT) -> None:
        """Delete the Lease and remove the gcushare annotation (a clean shutdown: no state is
        better than a stale one), giving up after ``timeout`` seconds: an API server that does
        not answer must not hold the plugin's stop past the kubelet's grace period."""
        if self._content is None and not (self._on_node or {}).get(
            node_state.SHARED_CAPACITY_ANNOTATION
        ):
            return

        async def remove() -> None:
            await self.api.delete_lease(self.node_name)
            if (self._on_node or {}).get(node_state.SHARED_CAPACITY_ANNOTATION):
                removal = {node_state.SHARED_CAPACITY_ANNOTATION: None}
                await self.api.patch_annotations(self.node_name, removal)

        try:
            await asyncio.wait_for(remove(), timeout)
        except Exception as exc:  # the node keeps its last state; the extender ages it out
            why = f"no answer in {timeout:g} s" if isinstance(exc, asyncio.TimeoutError) else exc
            log.warning("cannot remove the node state of %s on shutdown: %s", self.node_name, why)
            return
        self._content = None
        self._on_node = None
        log.info("node state of %s removed", self.node_name)

    async def run(self) -> None:
        """Write after every change and every ``refresh`` seconds (and retry failures) until
        cancelled."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.refresh)
            await asyncio.sleep(SETTLE)
            self._changed.clear()
            if not await self.write_once():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.retry)
                self._changed.set()
