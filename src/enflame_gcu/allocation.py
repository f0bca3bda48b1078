"""Allocation policies: pure functions of a request, chosen by name when the config loads.

A policy never remembers earlier answers: the kubelet's ``available`` list already excludes
devices in use, so two concurrent pods are decided from what each request says alone and can
never be given inconsistent sets (the vendor plugin's documented limitation, SPEC §6.1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


# Cost of a choice, summed over groups: (NUMA nodes, root ports, switches, -pairs sharing a
# group). Tuples compare lexicographically and addition keeps that order, so the dynamic
# programme below finds the exact optimum of topology.SetScore without enumerating sets.
_Cost = tuple[int, int, int, int]
_Best = dict[int, tuple[_Cost, tuple[int, ...], tuple[str, ...]]]
_ZERO: _Cost = (0, 0, 0, 0)


def _add(a: _Cost, b: _Cost) -> _Cost:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _better(
    candidate: tuple[_Cost, tuple[int, ...], tuple[str, ...]],
    incumbent: tuple[_Cost, tuple[int, ...], tuple[str, ...]] | None,
) -> bool:
    # Equal costs: the set with the lower sorted minors wins, which for disjoint parts is
    # decided part by part, so choosing each part's best keeps the whole optimal.
    return incumbent is None or (candidate[0], candidate[1]) < (incumbent[0], incumbent[1])


def _level_cost(level: int, taken: int) -> _Cost:
    if taken == 0:
        return _ZERO
    cost = [0, 0, 0, -(taken * (taken - 1) // 2)]
    cost[level] = 1
    return (cost[0], cost[1], cost[2], cost[3])


def _combine(children: list[_Best], level: int | None) -> _Best:
    table: _Best = {0: (_ZERO, (), ())}
    for child in children:
        merged: _Best = {}
        for have, (cost, minors, names) in table.items():
            for take, (c_cost, c_minors, c_names) in child.items():
                candidate = (
                    _add(cost, c_cost),
                    tuple(sorted(minors + c_minors)),
                    names + c_names,
                )
                if _better(candidate, merged.get(have + take)):
                    merged[have + take] = candidate
        table = merged
    if level is None:
        return table
    return {
        taken: (_add(cost, _level_cost(level, taken)) if taken else cost, minors, names)
        for taken, (cost, minors, names) in table.items()
    }


class TopologyPolicy:
    """Fewest NUMA nodes, then root ports, then switches, then closest pairs; lowest minors."""

    name = "topology"

    def __init__(self, topo: topology.Topology) -> None:
        self._topology = topo

    def _place(self, name: str, index: int) -> topology.Placement:
        try:
            return self._topology.placement(name)
        except KeyError:
            # A device the topology does not know (e.g. appeared since): its own group.
            own = f"unknown:{name}"
            return topology.Placement(name, 1_000_000 + index, own, own, own)

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """The best-scoring set of ``size`` devices from ``available`` containing ``required``."""
        check_request(available, required, size)
        must = set(required)
        places = [self._place(name, i) for i, name in enumerate(available)]
        tree: dict[str, dict[str, dict[str, list[topology.Placement]]]] = {}
        for p in places:
            tree.setdefault(p.numa, {}).setdefault(p.port, {}).setdefault(p.switch, []).append(p)
        numa_tables = []
        for ports in tree.values():
            port_tables = []
            for switches in ports.values():
                switch_tables = [self._switch_table(cards, must) for cards in switches.values()]
                port_tables.append(_combine(switch_tables, level=1))
            numa_tables.append(_combine(port_tables, level=0))
        best = _combine(numa_tables, level=None).get(size)
        if best is None:  # unreachable after check_request; kept as a guard with a clear text
            raise AllocationError(f"no set of {size} device(s) contains {sorted(must)}")
        order = {p.name: p.minor for p in places}
        return sorted(best[2], key=lambda name: (order[name], name))

    @staticmethod
    def _switch_table(cards: list[topology.Placement], must: set[str]) -> _Best:
        forced = sorted((c for c in cards if c.name in must), key=lambda c: c.minor)
        free = sorted((c for c in cards if c.name not in must), key=lambda c: c.minor)
        table: _Best = {}
        for extra in range(len(free) + 1):
            chosen = forced + free[:extra]
            taken = len(chosen)
            table[taken] = (
                _level_cost(2, taken),
                tuple(sorted(c.minor for c in chosen)),
                tuple(c.name for c in chosen),
            )
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
