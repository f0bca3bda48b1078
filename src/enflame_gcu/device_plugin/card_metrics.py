"""Per-card allocation metrics: health, who holds what, and the holder join.

Computed from one :class:`~enflame_gcu.holders.NodeView` (swapped whole by
:meth:`CardCollector.update`). The holder (pod, namespace, container) is a label of
``enflame_gcu_allocation_info`` (one series per held device, the join every other family uses)
and of ``enflame_gcu_card_allocated`` (one series per holder of a card, counting its devices);
``enflame_gcu_card_healthy`` and the telemetry families have one series per card whoever holds
it, so a card shared by six slice holders is not six copies of each gauge.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from enflame_gcu import holders

# gcu-exporter's names for the holder: the Prometheus Operator's target labels (namespace, pod,
# container) never overwrite them (docs/metrics.md, "Pod attribution").
POD_LABELS = ("pod_namespace", "pod_name", "container_name")


def _numa(view: holders.CardView) -> str:
    return "" if view.card.numa_node is None else str(view.card.numa_node)


class CardCollector(Collector):
    """Yields the ``enflame_gcu_card*`` families from the latest view."""

    def __init__(self, host: str | None = None) -> None:
        # The Hostname label the telemetry families carry, for joins without relabeling.
        self.host = host or os.environ.get("NODE_NAME") or socket.gethostname()
        self._view: holders.NodeView | None = None
        self._known = False
        self._version = 0

    def update(self, view: holders.NodeView, *, known: bool) -> None:
        """Publish a new view; ``known`` is False while PodResources cannot be read."""
        if (view, known) != (self._view, self._known):  # the same content is no change
            self._view, self._known = view, known
            self._version += 1

    def version(self) -> int:
        """Changes whenever the view's content does (the scrape's cache key)."""
        return self._version

    def current(self) -> tuple[holders.NodeView | None, bool]:
        """The latest view and whether its holders are known (read by the telemetry families)."""
        return self._view, self._known

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """No fixed description: the families depend on the view."""
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The families for one scrape."""
        view, known = self._view, self._known
        if view is None:
            return
        healthy = GaugeMetricFamily(
            "enflame_gcu_card_healthy",
            "1 when the card is healthy (its holders: enflame_gcu_allocation_info)",
            labels=["card", "model", "numa_node"],
        )
        unhealthy = GaugeMetricFamily(
            "enflame_gcu_card_unhealthy",
            "1 for each unhealthy card, with the reason",
            labels=["card", "reason"],
        )
        cards = GaugeMetricFamily(
            "enflame_gcu_cards", "Cards on the node by health", labels=["health"]
        )
        allocated = GaugeMetricFamily(
            "enflame_gcu_card_allocated",
            "Devices of the card (1 for a whole card; vGCUs or slices) each container holds "
            "now, per the kubelet's PodResources API; 0 with empty labels for a free card",
            labels=["card", "model", "resource", *POD_LABELS],
        )
        held = GaugeMetricFamily(
            "enflame_gcu_cards_allocated", "Cards any container holds now (PodResources)"
        )
        info = GaugeMetricFamily(
            "enflame_gcu_allocation_info",
            "1 for each device (a card, vGCU or slice) a container holds now, naming the card; "
            "join per-card counters to their holder on (node, card) or (Hostname, card)",
            labels=["card", "device", "resource", "Hostname", *POD_LABELS],
        )
        for card in view.cards:
            base = [card.card.name, card.card.model]
            healthy.add_metric([*base, _numa(card)], 1 if card.healthy else 0)
            if not card.healthy:
                unhealthy.add_metric([card.card.name, card.reason or "unknown"], 1)
            if known:
                counts: dict[tuple[str, str, str, str], int] = {}
                for h in card.holders:
                    key = (h.resource, h.namespace, h.pod, h.container)
                    counts[key] = counts.get(key, 0) + 1
                for key, count in (counts or {("", "", "", ""): 0}).items():
                    allocated.add_metric([*base, *key], count)
                held_by = dict.fromkeys(
                    (h.device, h.resource, h.namespace, h.pod, h.container) for h in card.holders
                )
                for device, resource, *pod_labels in held_by:
                    info.add_metric([card.card.name, device, resource, self.host, *pod_labels], 1)
        total = len(view.cards)
        good = sum(1 for card in view.cards if card.healthy)
        cards.add_metric(["Healthy"], good)
        cards.add_metric(["Unhealthy"], total - good)
        families = [cards, healthy, unhealthy]
        if known:
            held.add_metric([], sum(1 for card in view.cards if not card.free))
            families += [allocated, held, info]
        yield from families
