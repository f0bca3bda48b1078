"""Allocation policies: pure functions of a request, chosen by name when the config loads.

A policy never remembers earlier answers: the kubelet's ``available`` list already excludes
devices in use, so two concurrent pods are decided from what each request says alone and can
never be given inconsistent sets (the vendor plugin's documented limitation, SPEC §6.1).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from enflame_gcu import topology
from enflame_gcu.errors import AllocationError, ConfigError


class AllocationPolicy(Protocol):
    """Chooses ``size`` devices from ``available``, always including ``required``."""

    @property
    def name(self) -> str:
        """The policy's config name."""
        ...

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """Return exactly ``size`` IDs from ``available`` containing every ``required`` ID."""
        ...


def check_request(available: Sequence[str], required: Sequence[str], size: int) -> None:
    """Raise AllocationError unless the request can be satisfied at all."""
    if size < 1:
        raise AllocationError(f"allocation size must be at least 1, got {size}")
    if len(set(available)) != len(available):
        dupes = sorted({d for d in available if available.count(d) > 1})
        raise AllocationError(f"available list repeats {', '.join(dupes)}")
    missing = [d for d in required if d not in available]
    if missing:
        raise AllocationError(
            f"must-include device(s) {', '.join(missing)} are not in the available list "
            f"({', '.join(available) or 'empty'})"
        )
    if len(set(required)) > size:
        raise AllocationError(f"{len(set(required))} must-include devices exceed the size {size}")
    if size > len(available):
        raise AllocationError(
            f"asked for {size} device(s) but only {len(available)} are available "
            f"({', '.join(available) or 'none'})"
        )


@dataclass(frozen=True, slots=True)
class SimplePolicy:
    """Required devices, then the lowest-numbered others: for nodes without topology."""

    name: str = "simple"

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """Required first, then the rest in natural order."""
        check_request(available, required, size)
        rest = sorted((d for d in available if d not in required), key=_natural)
        chosen = list(dict.fromkeys(required)) + rest[: size - len(set(required))]
        return sorted(chosen, key=_natural)


def _natural(name: str) -> tuple[str, int, str]:
    digits = name[len(name.rstrip("0123456789")) :]
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)


# Cost of a choice: a tuple summed over the groups the choice touches. Tuples compare
# lexicographically and addition keeps that order, so the dynamic programme below finds the
# exact optimum without enumerating sets. The fields, most important first:
#
#   0-3   how local THIS request's set is, as topology.SetScore ranks it: NUMA nodes, root
#         ports, switches, then -(pairs of chosen cards sharing a group, summed over the three
#         levels), which is the pair-distance sum up to a constant
#   4-6   intact groups split (switch, root port, NUMA node): a group is intact when every card
#         it has is in ``available``; taking some of its cards but not all splits it
#   7-9   free cards left in the groups the choice touches (switch, root port, NUMA node):
#         best fit, so that the biggest free groups stay whole for the next request
#   10    cards under the switches touched: a card alone under its switch is worth the least to
#         a later multi-card pod, and a free card whose switch partner is busy becomes part of
#         a free pair again when the partner is released
#   11    -(bitmask of the chosen cards, the lowest minor the highest bit): lowest minors win
#
# Fields 4-11 only break ties between sets that are equally local for this request: the next
# request's benefit never costs this one any locality.
_Cost = tuple[int, ...]
_Table = dict[int, _Cost]  # cards taken -> the cost of the best way to take that many
_LEVELS = (topology.Level.NUMA, topology.Level.PORT, topology.Level.SWITCH)  # fields 0, 1, 2
_SPLIT = {topology.Level.SWITCH: 4, topology.Level.PORT: 5, topology.Level.NUMA: 6}
_LEFT = {topology.Level.SWITCH: 7, topology.Level.PORT: 8, topology.Level.NUMA: 9}
_SWITCH_SIZE = 10
_WIDTH = 12
_ZERO: _Cost = (0,) * _WIDTH


def _add(a: _Cost, b: _Cost) -> _Cost:
    return tuple(map(operator.add, a, b))


def _combine(children: Iterable[_Table]) -> _Table:
    """Best cost of taking n cards from disjoint groups, for every n."""
    table: _Table = {0: _ZERO}
    for child in children:
        merged: _Table = {}
        for have, cost in table.items():
            for take, child_cost in child.items():
                candidate = _add(cost, child_cost)
                incumbent = merged.get(have + take)
                if incumbent is None or candidate < incumbent:
                    merged[have + take] = candidate
        table = merged
    return table


@dataclass(frozen=True, slots=True)
class _Group:
    """One switch, root port or NUMA node as a request sees it."""

    level: topology.Level
    size: int  # its cards, free or not
    free: int  # its cards in ``available``


def _group_cost(group: _Group, taken: int, spare_groups: bool) -> _Cost:
    """What taking ``taken`` cards of a group adds to a choice's cost."""
    if taken == 0:
        return _ZERO
    cost = [0] * _WIDTH
    cost[_LEVELS.index(group.level)] = 1
    cost[3] = -(taken * (taken - 1) // 2)
    if spare_groups:
        cost[_SPLIT[group.level]] = int(group.free == group.size and taken < group.free)
        cost[_LEFT[group.level]] = group.free - taken
        if group.level is topology.Level.SWITCH:
            cost[_SWITCH_SIZE] = group.size
    return tuple(cost)


def _close(table: _Table, group: _Group, spare_groups: bool) -> _Table:
    return {
        taken: _add(cost, _group_cost(group, taken, spare_groups)) for taken, cost in table.items()
    }


class TopologyPolicy:
    """The most local set for this request; among equally local sets, the one that keeps the
    biggest free groups whole (best fit); then the lowest minors.

    Local means, outermost level first: fewest NUMA nodes, then root ports, then switches, then
    the smallest pair-distance sum (the order of :class:`topology.SetScore`). Keeping groups
    whole means: fewest intact switches split, then intact root ports, then intact NUMA nodes;
    then the fewest free cards left in the switches, root ports and NUMA nodes touched (best
    fit); then cards of small switches first.
    ``spare_groups=False`` skips that second step (lowest minors directly), which is how the
    policy chose before; benchmarks compare the two.
    """

    name = "topology"

    def __init__(self, topo: topology.Topology, *, spare_groups: bool = True) -> None:
        self._topology = topo
        self._spare_groups = spare_groups
        self._sizes = {
            level: {key: len(cards) for key, cards in topo.groups(level).items()}
            for level in _LEVELS
        }

    def _place(self, name: str, index: int) -> topology.Placement:
        try:
            return self._topology.placement(name)
        except KeyError:
            # A device the topology does not know (e.g. appeared since): its own group.
            own = f"unknown:{name}"
            return topology.Placement(name, 1_000_000 + index, own, own, own)

    def _group(self, level: topology.Level, key: str, free: int) -> _Group:
        return _Group(level, self._sizes[level].get(key, 1), free)

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """The best set of ``size`` devices from ``available`` containing ``required``."""
        check_request(available, required, size)
        must = set(required)
        places = sorted(
            (self._place(name, i) for i, name in enumerate(available)),
            key=lambda p: (p.minor, p.name),
        )
        bit = {p.name: 1 << (len(places) - 1 - rank) for rank, p in enumerate(places)}
        tree: dict[str, dict[str, dict[str, list[topology.Placement]]]] = {}
        for p in places:
            tree.setdefault(p.numa, {}).setdefault(p.port, {}).setdefault(p.switch, []).append(p)
        spare = self._spare_groups
        numa_tables = []
        for numa, ports in tree.items():
            port_tables = []
            for port, switches in ports.items():
                switch_tables = [
                    _close(
                        _switch_table(cards, must, bit),
                        self._group(topology.Level.SWITCH, switch, len(cards)),
                        spare,
                    )
                    for switch, cards in switches.items()
                ]
                free = sum(len(cards) for cards in switches.values())
                group = self._group(topology.Level.PORT, port, free)
                port_tables.append(_close(_combine(switch_tables), group, spare))
            free = sum(len(cards) for switches in ports.values() for cards in switches.values())
            group = self._group(topology.Level.NUMA, numa, free)
            numa_tables.append(_close(_combine(port_tables), group, spare))
        best = _combine(numa_tables).get(size)
        if best is None:  # unreachable after check_request; kept as a guard with a clear text
            raise AllocationError(f"no set of {size} device(s) contains {sorted(must)}")
        return [p.name for p in places if -best[-1] & bit[p.name]]


def _switch_table(cards: list[topology.Placement], must: set[str], bit: dict[str, int]) -> _Table:
    """Cost of taking n cards of one switch: its required cards, then its lowest minors."""
    forced = [c for c in cards if c.name in must]
    free = [c for c in cards if c.name not in must]
    table: _Table = {}
    for extra in range(len(free) + 1):
        mask = sum(bit[c.name] for c in forced + free[:extra])
        table[len(forced) + extra] = (*_ZERO[:-1], -mask)
    return table


PolicyFactory = Callable[[topology.Topology], AllocationPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "topology": TopologyPolicy,
    "simple": lambda _topo: SimplePolicy(),
}


def policy_by_name(name: str, topo: topology.Topology) -> AllocationPolicy:
    """The named policy for a topology; ConfigError lists the valid names."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown allocation policy {name!r}; valid: {', '.join(sorted(POLICIES))}"
        ) from None
    return factory(topo)
