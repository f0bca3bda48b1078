"""vGCU devices (``enflame.com/vgcu``): which card each belongs to, and how to pick a set.

A card whose driver exposes vGCU nodes is partitioned: its vGCUs are handed out, never the card
itself. The policy keeps a container's vGCUs on as few cards as possible and, when it needs
several cards, on topology-close ones (the parent cards' NUMA node, root port and switch, scored
by :mod:`topology`); among equally good cards it packs onto cards already in use before it
opens an idle one. Like every policy here it decides from the request alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from enflame_gcu import devices, topology
from enflame_gcu.allocation import check_request

_Closeness = tuple[int, int, int, int, int]


def parents(inventory: devices.Inventory) -> dict[str, str | None]:
    """``{vgcuN: gcuM}`` for every vGCU; None when sysfs links it to no card."""
    return {
        vgcu.name: None if vgcu.parent_minor is None else f"gcu{vgcu.parent_minor}"
        for vgcu in inventory.vgcus
    }


def _minor(name: str) -> int:
    digits = name[len(name.rstrip("0123456789")) :]
    return int(digits) if digits else -1


@dataclass(frozen=True, slots=True)
class VgcuPolicy:
    """Same card first; then the card that holds the rest alone; then the closest cards.

    Between cards equally good by that rule, a card with a vGCU in use comes before an idle one
    (every vGCU of it free, counted from ``parent_of``), then the tightest fit.
    """

    parent_of: Mapping[str, str | None]
    topo: topology.Topology = field(default_factory=lambda: topology.Topology(()))
    name: str = "vgcu"

    def _group(self, vgcu: str) -> str:
        # A vGCU without a known card is a group of its own, placed after every real card.
        return self.parent_of.get(vgcu) or vgcu

    def _order(self, group: str) -> int:
        return _minor(group) if group.startswith("gcu") else 1_000_000 + _minor(group)

    def _closeness(self, groups: Sequence[str]) -> _Closeness:
        known = [g for g in groups if g in self.topo.names]
        unknown = len(groups) - len(known)
        if not known:
            return (unknown, 0, 0, 0, 0)
        score = self.topo.set_score(known)
        return (unknown, score.numa_nodes, score.root_ports, score.switches, score.distance_sum)

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """``size`` vGCUs from ``available`` including ``required``, in minor order."""
        check_request(available, required, size)
        chosen = list(dict.fromkeys(required))
        free: dict[str, list[str]] = {}
        for vgcu in sorted(available, key=_minor):
            if vgcu not in chosen:
                free.setdefault(self._group(vgcu), []).append(vgcu)
        idle = self._idle(available)
        used = list(dict.fromkeys(self._group(v) for v in chosen))
        for group in used:  # the cards the container already has come first
            take = free.pop(group, [])[: size - len(chosen)]
            chosen.extend(take)
        while len(chosen) < size:
            group = min(
                free,
                key=lambda g: self._rank(g, used, len(free[g]), size - len(chosen), g in idle),
            )
            chosen.extend(free.pop(group)[: size - len(chosen)])
            used.append(group)
        return sorted(chosen, key=_minor)

    def _idle(self, available: Sequence[str]) -> set[str]:
        """Cards every vGCU of which is in ``available``."""
        total: dict[str, int] = {}
        for vgcu in self.parent_of:
            total[self._group(vgcu)] = total.get(self._group(vgcu), 0) + 1
        free: dict[str, int] = {}
        for vgcu in available:
            free[self._group(vgcu)] = free.get(self._group(vgcu), 0) + 1
        return {group for group, count in free.items() if count == total.get(group)}

    def _rank(
        self, group: str, used: Sequence[str], count: int, remaining: int, idle: bool
    ) -> tuple[int, _Closeness, int, int, int]:
        fits = count >= remaining
        # A card that holds the rest alone wins, the tightest fit keeping bigger cards free;
        # otherwise the closest card with the most free vGCUs. Between those, a card in use
        # before an idle one.
        return (
            0 if fits else 1,
            self._closeness([*used, group]),
            int(idle),
            count if fits else -count,
            self._order(group),
        )
