"""How well a node's free GCUs fit a pod: the scheduler extender's scores, in one place.

Whole cards are chosen exactly as the device plugin will choose them on the node
(:class:`allocation.TopologyPolicy`): pods bound to the node but not yet counted in its state
take their cards first, in the order they were bound, then this pod's set is chosen and scored.
The score (0..10, the extender protocol's range) ranks by how local that set is, then by how
many free groups taking it breaks (best fit, so the next multi-card pod still finds a whole
group somewhere):

    =====================  ======  =====================================================
    the pod's set is       score   minus one for each of these the set breaks
    =====================  ======  =====================================================
    one card or one switch 10..7   an intact switch; an intact root port or NUMA node;
                                   a node with every card free
    one root port          6..5    an intact NUMA node or a node with every card free
    one NUMA node          4..3    a node with every card free
    wider                  2..1    a node with every card free
    not enough free cards  0       (the default scheduler may still admit it)
    =====================  ======  =====================================================

A group is intact when every card it has is free; breaking it means taking some of its cards
but not all. Shared slices (``enflame.com/shared-gcu``): the node's own slice policy (``packed``
or ``distributed``, published in its state with its per-container cap) is replayed container
by container, exactly as the plugin will choose; a container may span cards when the policy
does. A node that fits scores 10 when it uses only cards already in use with nothing left
over on them, 9 when only cards already in use, 7 when it must start an idle card; a node that
does not fit is filtered out. A node whose state is unknown scores ``NEUTRAL`` (5), never the
"does not fit" 0. Every answer is a pure function of its arguments and cached.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from enflame_gcu import allocation, holders, node_state, sharing, topology

MAX_SCORE = 10
NO_FIT = 0  # the pod does not fit here (whole cards: the default scheduler may still admit it)
# A node the extender knows nothing current about (no state, unreadable, unknown version, too
# old): mid-scale, so it neither wins nor loses against nodes whose state is known.
NEUTRAL = 5
_BASE = {"single": 7, "switch": 7, "root_port": 5, "numa": 3, "spread": 1}
_PENALTIES = {"single": 3, "switch": 3, "root_port": 1, "numa": 1, "spread": 1}


@dataclass(frozen=True, slots=True)
class Fit:
    """A node's answer for one pod: a score, whether it fits at all, and why."""

    score: int
    fits: bool
    reason: str
    # Not fitting for a reason no preemption can change (the node's per-container cap), as
    # opposed to slices or cards that pods ending would free.
    unresolvable: bool = False


@functools.lru_cache(maxsize=256)
def _policy(places: tuple[topology.Placement, ...]) -> allocation.TopologyPolicy:
    return allocation.TopologyPolicy(topology.Topology.from_placements(places))


@functools.lru_cache(maxsize=256)
def _topology(places: tuple[topology.Placement, ...]) -> topology.Topology:
    return topology.Topology.from_placements(places)


def whole_cards(state: node_state.NodeState, pending: tuple[int, ...], size: int) -> Fit:
    """Score ``size`` whole cards on a node after ``pending`` bound pods take theirs."""
    if state.shape < 0:  # more layouts than the intern table holds: no cache
        return _score(state.placements, state.free, pending, size)
    return _whole(state.shape, state.free, pending, size)


@functools.lru_cache(maxsize=65536)
def _whole(shape: int, free: frozenset[str], pending: tuple[int, ...], size: int) -> Fit:
    return _score(node_state.shape(shape), free, pending, size)


def _score(
    places: tuple[topology.Placement, ...],
    free: frozenset[str],
    pending: tuple[int, ...],
    size: int,
) -> Fit:
    policy = _policy(places)
    order = {p.name: p.minor for p in places}
    left = sorted(free, key=lambda name: order.get(name, 1 << 30))
    for count in pending:
        taken = policy.choose(left, [], count) if 0 < count <= len(left) else left
        left = [name for name in left if name not in taken]
    if size > len(left):
        return Fit(NO_FIT, False, f"{len(left)} free card(s) for {size} after bound pods")
    chosen = policy.choose(left, [], size)
    topo = _topology(places)
    where = holders.locality(topo, chosen)
    broken = _broken(topo, places, frozenset(left), frozenset(chosen), where)
    score = _BASE[where] + _PENALTIES[where] - min(broken, _PENALTIES[where])
    return Fit(score, True, f"{'+'.join(chosen)} {where}, breaks {broken} free group(s)")


def _broken(
    topo: topology.Topology,
    places: tuple[topology.Placement, ...],
    free: frozenset[str],
    chosen: frozenset[str],
    where: str,
) -> int:
    """Count the levels (switch, root port or NUMA node, node) whose intact groups break."""

    def breaks(level: topology.Level) -> bool:
        for cards in topo.groups(level).values():
            group = set(cards)
            if group <= free and 0 < len(group & chosen) < len(group):
                return True
        return False

    node = {p.name for p in places}
    broken = int(node <= free and len(chosen) < len(node))
    if where in ("single", "switch"):
        broken += int(breaks(topology.Level.SWITCH))
    if where in ("single", "switch", "root_port"):
        broken += int(breaks(topology.Level.PORT) or breaks(topology.Level.NUMA))
    return broken


def shared_slices(
    state: node_state.NodeState, pending: Sequence[Sequence[int]], containers: Sequence[int]
) -> Fit:
    """Whether the plugin would give each container its slices, after ``pending`` pods: the
    node's own slice policy (``state.policy``) replayed container by container, as the kubelet
    asks the plugin, over the free slices the state counts."""
    cards = tuple((card.name, card.slices, card.free) for card in state.shared)
    return _slices(
        state.policy,
        state.max_per_container,
        cards,
        tuple(tuple(pod) for pod in pending),
        tuple(containers),
    )


@functools.lru_cache(maxsize=65536)
def _slices(
    policy_name: str,
    cap: int,
    cards: tuple[tuple[str, int, int], ...],
    pending: tuple[tuple[int, ...], ...],
    containers: tuple[int, ...],
) -> Fit:
    wanted = [count for count in containers if count > 0]
    if cap and any(count > cap for count in wanted):
        return Fit(
            NO_FIT,
            False,
            f"a container asks for {max(wanted)} slices; this node allows at most {cap} "
            "per container (sharing.maxSlicesPerContainer)",
            unresolvable=True,
        )
    total = {name: slices for name, slices, _ in cards}
    policy = sharing.policy_by_name(policy_name, total)
    available = [sharing.slice_id(name, index) for name, _, free in cards for index in range(free)]
    for pod in pending:
        for count in pod:
            taken = policy.choose(available, [], count) if 0 < count <= len(available) else []
            available = [slice for slice in available if slice not in taken]
    before = _per_card(available)
    chosen: list[str] = []
    for count in wanted:
        if count > len(available):
            shown = ", ".join(f"{name} {free}" for name, free in before.items()) or "none"
            return Fit(
                NO_FIT,
                False,
                f"{len(available)} free slice(s) for {count} after bound pods (free: {shown})",
            )
        taken = policy.choose(available, [], count)
        chosen += taken
        available = [slice for slice in available if slice not in taken]
    after = _per_card(available)
    used = sorted({sharing.parse_slice_id(slice)[0] for slice in chosen}, key=_card_minor)
    idle = any(before.get(name) == total[name] for name in used)
    exact = all(after.get(name, 0) == 0 for name in used)
    score = 7 if idle else MAX_SCORE if exact else MAX_SCORE - 1
    return Fit(score, True, f"slices on {'+'.join(used)} ({policy_name})")


def _per_card(available: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for slice in available:
        card = sharing.parse_slice_id(slice)[0]
        counts[card] = counts.get(card, 0) + 1
    return counts


def _card_minor(name: str) -> int:
    return int(name[3:]) if name[3:].isdigit() else 1 << 30
