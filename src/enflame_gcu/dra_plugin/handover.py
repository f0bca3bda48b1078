"""A node moved from the device plugin to DRA: cards that device-plugin pods still hold.

The kubelet's PodResources ``List`` names, per container, the device IDs it allocated from each
device-plugin resource. Every ``enflame.com/*`` holding is mapped to its card (``gcu3``,
``gcu3-slice1``, a vGCU by its sysfs parent) and :meth:`NodeDevices.set_held_by_plugin`
withholds those cards from DRA until the pod ends. The first read happens before the first
publish, so a held card is never offered even for a moment; a kubelet that cannot be read keeps
the last answer (at start: nothing withheld, with a warning naming the socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from enflame_gcu import holders
from enflame_gcu.dra_plugin import node
from enflame_gcu.errors import KubeletApiError
from enflame_gcu.kubelet_api import podresources

log = logging.getLogger(__name__)
PLUGIN_PREFIX = "enflame.com/"  # every resource our device plugin serves
INTERVAL = 10.0


def held_cards(holdings: Iterable[holders.Holding], devices: node.NodeDevices) -> dict[str, str]:
    """``{gcuN: "<ns>/<pod> (<resource>)"}`` for the cards device-plugin pods hold."""
    parents = {
        vgcu.name: f"gcu{vgcu.parent_minor}" if vgcu.parent_minor is not None else None
        for vgcu in devices.inventory.vgcus
    }
    held: dict[str, str] = {}
    for holding in holdings:
        if holding.claim or not holding.resource.startswith(PLUGIN_PREFIX):
            continue
        for device_id in holding.device_ids:
            card = holders.parent_card(device_id, parents)
            if card is None:
                log.warning(
                    "%s/%s holds %s %r, which names no card here; it is not withheld",
                    holding.namespace,
                    holding.pod,
                    holding.resource,
                    device_id,
                )
                continue
            held.setdefault(card, f"pod {holding.namespace}/{holding.pod} ({holding.resource})")
    return held


class PluginHoldings:
    """Polls PodResources and tells :class:`node.NodeDevices` which cards to withhold."""

    def __init__(
        self, devices: node.NodeDevices, socket_path: str, interval: float = INTERVAL
    ) -> None:
        self.devices = devices
        self.interval = interval
        self.client = podresources.Client(socket_path)
        self._trouble: str | None = None

    async def read_once(self) -> bool:
        """One read; True when it answered. A failure keeps what was withheld."""
        try:
            listing = await self.client.list_resources()
        except KubeletApiError as exc:
            if str(exc) != self._trouble:
                log.warning(
                    "%s; cards device-plugin pods hold cannot be seen, so they are not withheld "
                    "from DRA until it answers (the last answer stays in force)",
                    exc,
                )
                self._trouble = str(exc)
            return False
        if self._trouble is not None:
            log.info("the kubelet's PodResources API answers again")
            self._trouble = None
        self.devices.set_held_by_plugin(held_cards(listing.holdings, self.devices))
        return True

    async def run(self) -> None:
        """Read every ``interval`` seconds until cancelled (the first read is the caller's)."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                await self.read_once()
        finally:
            with contextlib.suppress(Exception):
                await self.client.close()
