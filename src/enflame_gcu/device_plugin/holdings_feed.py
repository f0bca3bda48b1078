"""Reads the kubelet's PodResources API every few seconds and tells the metrics (and the node
annotation, with ``--node-state``) who holds what.

A kubelet without the socket (or one that does not answer) is one WARNING, then DEBUG repeats,
then one INFO when it works again; the plugin keeps serving throughout and the per-card metrics
carry no holders meanwhile (``enflame_gcu_pod_resources_up`` is 0). An Allocate makes the next
read come sooner, so a new pod shows up within about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from enflame_gcu import holders
from enflame_gcu.device_plugin import metrics
from enflame_gcu.errors import KubeletApiError
from enflame_gcu.kubelet_api import podresources

log = logging.getLogger(__name__)
AFTER_ALLOCATE = 1.0  # the kubelet records an allocation after Allocate returns


Sink = Callable[[Sequence[holders.Holding] | None], None]


class HoldingsFeed:
    """The PodResources poller feeding :class:`~.metrics.Metrics` and further ``sinks``."""

    def __init__(
        self,
        exported: metrics.Metrics | None,
        socket_path: str,
        interval: float,
        sinks: Sequence[Sink] = (),
    ) -> None:
        self.sinks = ([exported.set_holdings] if exported is not None else []) + list(sinks)
        self.interval = interval
        self.client = podresources.Client(socket_path)
        self._soon = asyncio.Event()
        self._trouble: str | None = None

    def poke(self) -> None:
        """Read again shortly (after an Allocate)."""
        self._soon.set()

    async def read_once(self) -> None:
        """One read; failures are logged and leave the holders unknown."""
        try:
            listing = await self.client.list_resources()
        except KubeletApiError as exc:
            if str(exc) != self._trouble:
                log.warning("%s; the plugin keeps serving, holders are unknown meanwhile", exc)
                self._trouble = str(exc)
            else:
                log.debug("still failing: %s", exc)
            self._tell(None)
            return
        if self._trouble is not None:
            log.info("the kubelet's PodResources API answers again")
            self._trouble = None
        self._tell(listing.holdings)

    def _tell(self, holdings: Sequence[holders.Holding] | None) -> None:
        for sink in self.sinks:
            sink(holdings)

    async def run(self) -> None:
        """Read now, then every ``interval`` seconds (sooner after an Allocate), until cancelled."""
        try:
            while True:
                await self.read_once()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._soon.wait(), self.interval)
                if self._soon.is_set():
                    await asyncio.sleep(AFTER_ALLOCATE)
                    self._soon.clear()
        finally:
            await self.client.close()
