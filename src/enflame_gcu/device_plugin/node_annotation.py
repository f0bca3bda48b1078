"""Keeps the plugin's own Node annotated with its GCU state (``--node-state``), for the extender.

The state (:mod:`enflame_gcu.node_state`) comes from what the plugin already knows: the cards,
their health, which cards it serves whole or as slices, and the holders the kubelet's
PodResources API reports. It is written as a JSON merge patch of the two annotations only when
its text changed, never while the holders are unknown (a stale state is safer than one that
calls held cards free: the extender counts bound pods the state does not list yet). A failed
write is one WARNING (then DEBUG while it keeps failing) and is tried again after ``retry``
seconds; the plugin keeps serving the kubelet throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from enflame_gcu import devices, health, holders, node_state
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import resources

log = logging.getLogger(__name__)
SETTLE = 0.2  # seconds: a health change and a holdings read arriving together make one write
Annotations = Mapping[str, str | None]


class NodeApi(Protocol):
    """Writes annotations of one Node (``None`` removes one)."""

    async def patch_annotations(self, node: str, annotations: Annotations) -> None:
        """Merge-patch ``metadata.annotations`` of ``node``."""
        ...


class LightkubeNodeApi:
    """:class:`NodeApi` (and the label reader of :mod:`.named_configs`) through lightkube: the
    in-cluster service account, or a kubeconfig."""

    def __init__(self, kubeconfig: str = "") -> None:
        # Imported here: a plugin without --node-state never loads the API client.
        from lightkube import AsyncClient, KubeConfig  # noqa: PLC0415

        config = KubeConfig.from_file(kubeconfig) if kubeconfig else None
        self.client: Any = AsyncClient(config=config, field_manager="enflame-device-plugin")

    async def patch_annotations(self, node: str, annotations: Annotations) -> None:
        """One merge patch of the Node's annotations."""
        from lightkube.resources.core_v1 import Node  # noqa: PLC0415
        from lightkube.types import PatchType  # noqa: PLC0415

        patch = {"metadata": {"annotations": dict(annotations)}}
        await self.client.patch(Node, node, patch, patch_type=PatchType.MERGE)

    async def node_labels(self, node: str) -> Mapping[str, str]:
        """The Node's labels (for the named configs: one GET, never a list of Nodes)."""
        from lightkube.resources.core_v1 import Node  # noqa: PLC0415

        found = await self.client.get(Node, node)
        return dict((found.metadata.labels if found.metadata else None) or {})

    async def close(self) -> None:
        """Close the HTTP client."""
        await self.client.close()


class NodeAnnotator:
    """The state last seen and last written; :meth:`run` writes whenever they differ."""

    def __init__(self, api: NodeApi, node_name: str, *, retry: float = 5.0) -> None:
        self.api = api
        self.node_name = node_name
        self.retry = retry
        self.writes = 0
        self._inventory: devices.Inventory | None = None
        self._health: dict[str, tuple[bool, str]] = {}
        self._whole: tuple[str, ...] = ()
        self._shared: dict[str, int] = {}
        self._resources: tuple[str, ...] = holders.DEFAULT_RESOURCES
        self._holdings: tuple[holders.Holding, ...] | None = None
        self._written: dict[str, str | None] | None = None
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
        self._changed.set()

    def set_holdings(self, holdings: Sequence[holders.Holding] | None) -> None:
        """Who holds what per PodResources; None when it could not be read."""
        self._holdings = None if holdings is None else tuple(holdings)
        self._changed.set()

    def wanted(self) -> dict[str, str | None] | None:
        """The annotations the node should carry now; None while something is unknown."""
        if self._inventory is None or self._holdings is None:
            return None
        state = node_state.build(
            self._inventory,
            self._holdings,
            whole=self._whole,
            shared=self._shared,
            health=self._health,
            resources=self._resources,
        )
        return {
            node_state.ANNOTATION: state.to_json(),
            node_state.SHARED_CAPACITY_ANNOTATION: state.shared_capacity(),
        }

    async def write_once(self) -> bool:
        """Write the wanted state if it changed; False when the write failed."""
        wanted = self.wanted()
        if wanted is None or wanted == self._written:
            return True
        try:
            await self.api.patch_annotations(self.node_name, wanted)
        except Exception as exc:  # any API or network failure: try again later
            if str(exc) != self._trouble:
                log.warning(
                    "cannot annotate node %s (%s); trying again every %g s",
                    self.node_name,
                    exc,
                    self.retry,
                )
                self._trouble = str(exc)
            else:
                log.debug("still cannot annotate node %s: %s", self.node_name, exc)
            return False
        if self._trouble:
            log.info("node %s annotated again", self.node_name)
            self._trouble = ""
        self._written = wanted
        self.writes += 1
        return True

    async def run(self) -> None:
        """Write after every change (and retry failures) until cancelled."""
        while True:
            await self._changed.wait()
            await asyncio.sleep(SETTLE)
            self._changed.clear()
            if not await self.write_once():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.retry)
                self._changed.set()
