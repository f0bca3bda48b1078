"""Keeps the plugin's own Node annotated with its GCU state (``--node-state``), for the extender.

The state (:mod:`enflame_gcu.node_state`) comes from what the plugin already knows: the cards,
their health, which cards it serves whole or as slices, and the holders the kubelet's
PodResources API reports. It is written as a JSON merge patch of the two annotations only when
its content changed, and otherwise every ``refresh`` seconds with a new ``observed`` time (the
last PodResources read), so the extender can tell a plugin that stopped writing from a quiet
node. Never while the holders are unknown: the state then ages, and the extender treats a state
older than its bound as unknown (neutral). A failed write is one WARNING (then DEBUG while it
keeps failing) and is tried again after ``retry`` seconds; the plugin keeps serving the kubelet
throughout. On a clean shutdown :meth:`NodeAnnotator.clear` removes both annotations.
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
        self._written_at = 0.0
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
        """The annotations the node should carry now; None while something is unknown."""
        state = self._state()
        if state is None:
            return None
        return {
            node_state.ANNOTATION: state.to_json(),
            node_state.SHARED_CAPACITY_ANNOTATION: state.shared_capacity(),
        }

    def _due(self) -> tuple[dict[str, str | None], str] | None:
        """What to write now (annotations, content without time); None when nothing is."""
        state = self._state()
        if state is None:
            return None
        content = dataclasses.replace(state, observed=0.0).to_json()
        fresh = self._clock() - self._written_at < self.refresh
        if content == self._content and fresh:
            return None
        wanted = {
            node_state.ANNOTATION: state.to_json(),
            node_state.SHARED_CAPACITY_ANNOTATION: state.shared_capacity(),
        }
        return (wanted, content) if wanted != self._written else None

    async def write_once(self) -> bool:
        """Write the wanted state if its content changed or its time is due for a refresh;
        False when the write failed."""
        due = self._due()
        if due is None:
            return True
        wanted, content = due
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
        self._content = content
        self._written_at = self._clock()
        self.writes += 1
        return True

    async def clear(self, timeout: float = CLEAR_TIMEOUT) -> None:
        """Remove both annotations (a clean shutdown: no state is better than a stale one),
        giving up after ``timeout`` seconds: an API server that does not answer must not hold
        the plugin's stop past the kubelet's grace period."""
        if self._written is None:
            return
        removal = dict.fromkeys(self._written)
        try:
            await asyncio.wait_for(self.api.patch_annotations(self.node_name, removal), timeout)
        except Exception as exc:  # the node keeps its last state; the extender ages it out
            why = f"no answer in {timeout:g} s" if isinstance(exc, asyncio.TimeoutError) else exc
            log.warning("cannot remove the node state of %s on shutdown: %s", self.node_name, why)
            return
        self._written = self._content = None
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
