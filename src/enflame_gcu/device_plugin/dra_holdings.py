"""Cards DRA claims hold on this node (a node moved from DRA back to the device plugin).

The kubelet's PodResources ``List`` (``dynamic_resources``, kubelets >= 1.34) names the DRA
devices each container's claims hold; every ``gcu.enflame.com`` device is mapped to its card
and the plugin advertises that card's devices Unhealthy until the claim is released, so the
kubelet neither chooses nor allocates them. A kubelet that cannot be read keeps the last answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from enflame_gcu import devices, holders, naming
from enflame_gcu.errors import KubeletApiError
from enflame_gcu.kubelet_api import podresources

log = logging.getLogger(__name__)


class Withholding(Protocol):
    """What the poller needs of the plugin's node (``runner.NodeResources``)."""

    @property
    def inventory(self) -> devices.Inventory: ...

    def withhold_dra(self, cards: frozenset[str]) -> None: ...


def held_by_dra(
    holdings: Iterable[holders.Holding], inventory: devices.Inventory
) -> frozenset[str]:
    """The cards (``gcuN``) whose devices DRA claims of our driver hold."""
    parents = {
        vgcu.name: f"gcu{vgcu.parent_minor}" if vgcu.parent_minor is not None else None
        for vgcu in inventory.vgcus
    }
    cards = set()
    for holding in holdings:
        if not holding.claim or holding.resource != naming.DRA_DRIVER:
            continue
        for device_id in holding.device_ids:
            card = holders.parent_card(device_id, parents)
            if card is not None:
                cards.add(card)
    return frozenset(cards)


async def run(node: Withholding, socket_path: str, interval: float) -> None:
    """Read PodResources now and every ``interval`` seconds until cancelled."""
    client = podresources.Client(socket_path)
    trouble = ""
    try:
        while True:
            try:
                listing = await client.list_resources()
                node.withhold_dra(held_by_dra(listing.holdings, node.inventory))
                trouble = ""
            except KubeletApiError as exc:
                if str(exc) != trouble:
                    # INFO, not WARNING: on a node that never ran DRA nothing is missed.
                    log.info(
                        "cannot read the kubelet's PodResources at %s; cards DRA claims hold "
                        "are not known meanwhile",
                        socket_path,
                    )
                    trouble = str(exc)
            await asyncio.sleep(interval)
    finally:
        await client.close()
