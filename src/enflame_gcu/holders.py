"""Who holds which card: the kubelet's per-container device lists laid onto the node's cards.

A pure view. The holdings come from the kubelet's PodResources API (read by an adapter, see
:mod:`enflame_gcu.kubelet_api.podresources`), the cards from discovery and health. Whole cards
(``gcuN``), shared slices (``gcuN-sliceK``) and vGCUs (``vgcuN``) all appear on their parent card;
a device ID that maps to no card of this node is kept aside (``unplaced``), never dropped.

Locality of a set of cards, closest first: ``single`` (one card), ``switch`` (one PCIe switch),
``root_port`` (one root port), ``numa`` (one known NUMA node), ``spread`` (anything wider).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu import devices, resourceslices, topology, virtual

DEFAULT_RESOURCES = ("enflame.com/gcu", "enflame.com/vgcu", "enflame.com/shared-gcu")
LOCALITIES = ("single", "switch", "root_port", "numa", "spread")
_CARD = re.compile(r"^gcu\d+$")
_SLICE = re.compile(r"^(gcu\d+)-slice\d+$")
_DRA_DEVICE = re.compile(r"^(v?gcu-\d+|gcu-\d+-\d+g-\d+gb-\d+)$")
DRA_RESOURCE = resourceslices.DRIVER  # how DRA claims of our driver show up among holdings
_WORDS = {
    "switch": "same switch",
    "root_port": "same root port",
    "numa": "same NUMA node",
    "spread": "spread",
}


@dataclass(frozen=True, slots=True)
class Holding:
    """One container's devices of one resource, as the kubelet reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    claim: str = ""  # a DRA claim (``namespace/name``); the resource is then the driver


@dataclass(frozen=True, slots=True)
class Holder:
    """One device held by one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device: str
    claim: str = ""

    @property
    def pod_key(self) -> tuple[str, str]:
        """``(namespace, pod)``."""
        return (self.namespace, self.pod)


@dataclass(frozen=True, slots=True)
class CardView:
    """One card: what it is, whether it is healthy (and why not) and who holds it."""

    card: devices.Card
    healthy: bool
    reason: str
    holders: tuple[Holder, ...]

    @property
    def free(self) -> bool:
        """Nobody holds any device of the card."""
        return not self.holders


@dataclass(frozen=True, slots=True)
class PodView:
    """A pod holding devices on more than one card, and how close those cards are."""

    namespace: str
    pod: str
    cards: tuple[str, ...]
    locality: str


@dataclass(frozen=True, slots=True)
class NodeView:
    """Every card with its holders, the multi-card pods and devices on no known card."""

    cards: tuple[CardView, ...]
    multi_card_pods: tuple[PodView, ...]
    unplaced: tuple[Holder, ...]

    def by_locality(self) -> dict[str, int]:
        """Multi-card pods counted by locality (every locality listed, closest first)."""
        counts = dict.fromkeys(LOCALITIES[1:], 0)
        for pod in self.multi_card_pods:
            counts[pod.locality] += 1
        return counts

    def summary(self) -> str:
        """One line: cards held, multi-card pods and how many are switch-local."""
        held = sum(1 for view in self.cards if not view.free)
        pods = self.multi_card_pods
        line = f"{held} of {counted(len(self.cards), 'card')} held"
        if not pods:
            return f"{line}; no multi-card pods"
        counts = {k: v for k, v in self.by_locality().items() if v}
        detail = ", ".join(f"{count} {_WORDS[name]}" for name, count in counts.items())
        local = counts.get("switch", 0)
        return f"{line}; {local} of {counted(len(pods), 'multi-card pod')} switch-local ({detail})"


def counted(number: int, noun: str) -> str:
    """``1 card``, ``2 cards``: a count and its noun in the right number."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def parent_card(device_id: str, vgcu_parents: Mapping[str, str | None]) -> str | None:
    """The card a device ID lives on (``gcu3``, ``gcu3-slice1`` -> ``gcu3``; ``vgcu5`` -> its
    parent by sysfs); None when the ID names nothing we know."""
    if _CARD.match(device_id):
        return device_id
    match = _SLICE.match(device_id)
    if match:
        return match.group(1)
    if _DRA_DEVICE.match(device_id):  # a DRA device: gcu-3, gcu-3-1g-8gb-0, vgcu-5
        return parent_card(resourceslices.node_device(device_id), vgcu_parents)
    return vgcu_parents.get(device_id)


def locality(topo: topology.Topology, cards: Sequence[str]) -> str:
    """How close a set of cards is (see the module docstring); unknown cards count as spread."""
    names = list(dict.fromkeys(cards))
    if len(names) <= 1:
        return "single"
    try:
        score = topo.set_score(names)
    except KeyError:
        return "spread"
    if score.switches == 1:
        return "switch"
    if score.root_ports == 1:
        return "root_port"
    if score.numa_nodes == 1 and all(topo.placement(n).numa != "numa?" for n in names):
        return "numa"
    return "spread"


def flatten(holdings: Iterable[Holding], resources: Iterable[str]) -> list[Holder]:
    """One :class:`Holder` per device of ``resources`` (other resources are ignored)."""
    wanted = set(resources)
    return [
        Holder(h.namespace, h.pod, h.container, h.resource, device, h.claim)
        for h in holdings
        if h.resource in wanted
        for device in h.device_ids
    ]


def build(
    inventory: devices.Inventory,
    holdings: Iterable[Holding],
    *,
    resources: Iterable[str] = DEFAULT_RESOURCES,
    health: Mapping[str, tuple[bool, str]] | None = None,
) -> NodeView:
    """Lay ``holdings`` onto the cards of ``inventory``.

    ``health`` is ``{card: (healthy, reason)}``; a card missing from it keeps its discovery
    verdict (usable, problems).
    """
    parents = virtual.parents(inventory)
    known = {card.name for card in inventory.cards}
    on_card: dict[str, list[Holder]] = {name: [] for name in known}
    unplaced: list[Holder] = []
    for holder in flatten(holdings, resources):
        parent = parent_card(holder.device, parents)
        if parent is not None and parent in known:
            on_card[parent].append(holder)
        else:
            unplaced.append(holder)
    views = []
    for card in inventory.cards:
        healthy, reason = (health or {}).get(card.name, (card.usable, "; ".join(card.problems)))
        views.append(CardView(card, healthy, "" if healthy else reason, tuple(on_card[card.name])))
    topo = topology.Topology.from_inventory(inventory)
    pods: dict[tuple[str, str], list[str]] = {}
    for view in views:
        for key in dict.fromkeys(h.pod_key for h in view.holders):
            pods.setdefault(key, []).append(view.card.name)
    multi = tuple(
        PodView(namespace, pod, tuple(cards), locality(topo, cards))
        for (namespace, pod), cards in pods.items()
        if len(cards) > 1
    )
    return NodeView(tuple(views), multi, tuple(unplaced))
