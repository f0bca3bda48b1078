"""PodResources ``List`` for the real-kubelet tier: the product's client, holdings only."""

from __future__ import annotations

from enflame_gcu import holders
from enflame_gcu.kubelet_api import podresources

SOCKET = podresources.SOCKET
Holding = holders.Holding


def list_holdings(socket_path: str = SOCKET, timeout: float = 10.0) -> list[Holding]:
    """Call ``List`` and flatten the answer to one entry per container and resource."""
    listing = podresources.list_resources(socket_path, timeout, allocatable=False)
    return list(listing.holdings)
