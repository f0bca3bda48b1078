"""PCIe and NUMA topology of a node's cards: pair distances, set scores and groupings.

The score table, in one place. Two cards are at the distance of the closest level they share:

    ======  ==========  ======================================================
    level   distance    the two cards ...
    ======  ==========  ======================================================
    CARD    0           are the same card
    SWITCH  10          sit under one PCIe switch (same upstream port)
    PORT    20          sit under one root port, through different switches
    NUMA    30          hang off different root ports of one NUMA node
    SYSTEM  40          sit on different NUMA nodes (traffic crosses the CPU link)
    ======  ==========  ======================================================

A set of cards is scored outermost level first: fewest NUMA nodes, then fewest root ports, then
fewest switches, then the smallest sum of pair distances; the lowest minors break the last tie.
This order is what keeps a request inside one root port whenever one root port can hold it
(SPEC §2: a set never spans both root ports when a set under one root port exists).
A NUMA node of ``None`` (sysfs says -1) counts as one shared unknown node.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from enflame_gcu import devices


class Level(enum.IntEnum):
    """Closest shared level of two cards, as a distance (lower is closer)."""

    CARD = 0
    SWITCH = 10
    PORT = 20
    NUMA = 30
    SYSTEM = 40


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a card sits: the keys of its NUMA node, root port and switch groups."""

    name: str
    minor: int
    numa: str
    port: str
    switch: str


def placement(card: devices.Card) -> Placement:
    """Group keys for a card; a card without a switch or port is its own group at that level."""
    numa = "numa?" if card.numa_node is None else f"numa{card.numa_node}"
    port = f"{card.root_complex}/{card.root_port}" if card.root_port else f"own:{card.name}"
    switch = f"{card.root_complex}/{card.switch}" if card.switch else f"own:{card.name}"
    return Placement(card.name, card.minor, numa, port, switch)


@dataclass(frozen=True, slots=True)
class SetScore:
    """Score of a card set; compare with ``<`` (lower is better)."""

    numa_nodes: int
    root_ports: int
    switches: int
    distance_sum: int
    minors: tuple[int, ...]

    def key(self) -> tuple[int, int, int, int, tuple[int, ...]]:
        """The comparison key, outermost level first."""
        return (self.numa_nodes, self.root_ports, self.switches, self.distance_sum, self.minors)

    def __lt__(self, other: SetScore) -> bool:
        return self.key() < other.key()


class Topology:
    """Topology of a node's cards, built from discovery; keyed by device name (``gcuN``)."""

    def __init__(self, cards: Iterable[devices.Card]) -> None:
        self._cards = {card.name: card for card in cards}
        self._place = {name: placement(card) for name, card in self._cards.items()}

    @classmethod
    def from_placements(cls, places: Iterable[Placement]) -> Topology:
        """Topology of cards known only by their group keys (a node-state annotation)."""
        topo = cls(())
        topo._place = {place.name: place for place in places}
        return topo

    @classmethod
    def from_inventory(cls, inventory: devices.Inventory) -> Topology:
        """Topology of every discovered card (usable or not: health changes, topology doesn't)."""
        return cls(inventory.cards)

    @property
    def names(self) -> tuple[str, ...]:
        """Card names in minor order."""
        return tuple(sorted(self._place, key=lambda name: self._place[name].minor))

    def placement(self, name: str) -> Placement:
        """Group keys of one card; KeyError names the known cards."""
        try:
            return self._place[name]
        except KeyError:
            raise KeyError(f"unknown card {name!r}; known: {', '.join(self.names)}") from None

    def pair_distance(self, a: str, b: str) -> Level:
        """Distance of two cards by the table in this module's docstring."""
        pa, pb = self.placement(a), self.placement(b)
        if a == b:
            return Level.CARD
        if pa.switch == pb.switch:
            return Level.SWITCH
        if pa.port == pb.port:
            return Level.PORT
        if pa.numa == pb.numa:
            return Level.NUMA
        return Level.SYSTEM

    def set_score(self, names: Sequence[str]) -> SetScore:
        """Score of a set of cards (see the module docstring)."""
        places = [self.placement(name) for name in names]
        return SetScore(
            numa_nodes=len({p.numa for p in places}),
            root_ports=len({p.port for p in places}),
            switches=len({p.switch for p in places}),
            distance_sum=sum(
                int(self.pair_distance(a, b)) for a, b in itertools.combinations(names, 2)
            ),
            minors=tuple(sorted(p.minor for p in places)),
        )

    def groups(self, level: Level) -> dict[str, tuple[str, ...]]:
        """Cards grouped by SWITCH, PORT or NUMA key, each group in minor order."""
        attribute = {Level.SWITCH: "switch", Level.PORT: "port", Level.NUMA: "numa"}[level]
        result: dict[str, list[str]] = {}
        for name in self.names:
            result.setdefault(getattr(self._place[name], attribute), []).append(name)
        return {key: tuple(value) for key, value in result.items()}

    def switch_groups(self) -> list[tuple[str, ...]]:
        """Cards grouped by PCIe switch, groups ordered by their lowest minor."""
        return sorted(self.groups(Level.SWITCH).values(), key=lambda g: self._place[g[0]].minor)

    def port_groups(self) -> list[tuple[str, ...]]:
        """Cards grouped by root port, groups ordered by their lowest minor."""
        return sorted(self.groups(Level.PORT).values(), key=lambda g: self._place[g[0]].minor)
