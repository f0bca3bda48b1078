"""Churn traces for the whole-card policies: seeded arrivals and departures, replayed per policy.

A trace is decided by card counts alone (a pod is admitted exactly when enough cards are free,
whatever set a policy picks), so every policy replays the same pods, arriving and leaving at
the same moments; only which cards each pod holds differs. The replay counts, per policy:

- for each level (switch, root port, NUMA node), among multi-card requests small enough for one
  group of that level: how often such a set was free, and how often the pod got one;
- root-port and NUMA violations: a set over several root ports (NUMA nodes) while one root port
  (NUMA node) had enough free cards;
- splits of an intact switch (every card under it free, some but not all taken), and the
  avoidable ones: a set at least as local as the one chosen that splits no intact switch existed.

Everything here is written independently of the project's policy and decides by enumerating
every set: the best-fit reference takes the most local sets (the same per-request ranking)
and among them the classic best fit, the fewest free cards left in the switches, then root
ports, then NUMA nodes it touches, then the lowest minors.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from enflame_gcu import topology

Choose = Callable[[Sequence[str], int], list[str]]
LEVELS = ("switch", "port", "numa")
ENUMERATION_LIMIT = 20_000  # sets of one request enumerated at most (else: not checked)


@dataclass(frozen=True, slots=True)
class Event:
    """A pod arriving (``size`` > 0) or leaving (``size`` == 0)."""

    pod: int
    size: int


def make_trace(
    cards: int, mix: Mapping[int, float], arrive: float, seed: int, events: int
) -> list[Event]:
    """Seeded churn: each event is an arrival with probability ``arrive``, else a departure.

    A pod that does not fit in the free cards is still an arrival (the replay counts it as
    rejected); a departure picks a running pod at random.
    """
    rng = random.Random(seed)  # noqa: S311 - a reproducible trace, not a secret
    sizes, weights = list(mix), list(mix.values())
    running: list[tuple[int, int]] = []
    free = cards
    trace: list[Event] = []
    for pod in range(events):
        if running and rng.random() >= arrive:
            gone, size = running.pop(rng.randrange(len(running)))
            free += size
            trace.append(Event(gone, 0))
            continue
        size = rng.choices(sizes, weights)[0]
        trace.append(Event(pod, size))
        if size <= free:
            running.append((pod, size))
            free -= size
    return trace


@dataclass(frozen=True, slots=True)
class Candidate:
    """One set a request could get, scored."""

    cards: tuple[str, ...]
    locality: tuple[int, int, int, int]  # NUMA nodes, root ports, switches, -pairs sharing
    splits: int  # intact switches split
    left: tuple[int, int, int]  # free cards left in the switches, root ports, NUMA nodes touched


@dataclass(frozen=True, slots=True)
class Analysis:
    """What enumerating every set of one request found."""

    best_fit: tuple[str, ...]  # the reference's choice
    most_local_without_split: tuple[int, int, int, int] | None  # None: every set splits


class Board:
    """A board's card groups, and every set a request could get, scored (cached)."""

    def __init__(self, topo: topology.Topology) -> None:
        self.names = list(topo.names)
        places = {name: topo.placement(name) for name in self.names}
        self.keys = {n: (p.switch, p.port, p.numa) for n, p in places.items()}
        self.sizes: list[dict[str, int]] = [{}, {}, {}]
        for key in self.keys.values():
            for level in range(3):
                self.sizes[level][key[level]] = self.sizes[level].get(key[level], 0) + 1
        self._cache: dict[tuple[frozenset[str], int], Analysis | None] = {}

    def counts(self, cards: Sequence[str], level: int) -> dict[str, int]:
        """Cards per group of one level."""
        result: dict[str, int] = {}
        for card in cards:
            result[self.keys[card][level]] = result.get(self.keys[card][level], 0) + 1
        return result

    def score(self, free: Sequence[str], cards: Sequence[str]) -> Candidate:
        """Locality, intact switches split and free cards left behind, for ``cards``."""
        have = [self.counts(free, level) for level in range(3)]
        taken = [self.counts(cards, level) for level in range(3)]
        pairs = sum(n * (n - 1) // 2 for level in taken for n in level.values())
        splits = sum(
            1
            for key, n in taken[0].items()
            if have[0][key] == self.sizes[0][key] and n < have[0][key]
        )
        left = tuple(sum(have[lv][k] - n for k, n in taken[lv].items()) for lv in range(3))
        locality = (len(taken[2]), len(taken[1]), len(taken[0]), -pairs)
        return Candidate(tuple(cards), locality, splits, (left[0], left[1], left[2]))

    def analyse(self, free: Sequence[str], size: int) -> Analysis | None:
        """Every set of ``size`` free cards, enumerated; None when there are too many."""
        key = (frozenset(free), size)
        if key not in self._cache:
            self._cache[key] = None
            if math.comb(len(free), size) <= ENUMERATION_LIMIT:
                order = {name: i for i, name in enumerate(self.names)}
                found = [self.score(free, s) for s in itertools.combinations(free, size)]
                best = min(found, key=lambda c: (c.locality, c.left, [order[n] for n in c.cards]))
                whole = [c.locality for c in found if c.splits == 0]
                self._cache[key] = Analysis(best.cards, min(whole) if whole else None)
        return self._cache[key]

    def best_fit(self, available: Sequence[str], size: int) -> list[str]:
        """The reference: most local, then classic best fit, then lowest minors."""
        found = self.analyse(available, size)
        if found is None:
            raise ValueError(f"{math.comb(len(available), size)} sets: too many to enumerate")
        return list(found.best_fit)


class Replay:
    """Counters of one policy over one trace."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.rejected = 0
        self.requests: dict[int, int] = {}
        self.local = {level: {"eligible": 0, "found": 0, "got": 0} for level in LEVELS}
        self.violations = {"port": 0, "numa": 0}
        self.splits = {"single": 0, "partial": 0}
        self.avoidable = {"single": 0, "partial": 0, "not_checked": 0}

    def record(self, free: list[str], chosen: list[str], size: int) -> None:
        """Count one admitted request (``free`` as it was before ``chosen`` was taken)."""
        self.requests[size] = self.requests.get(size, 0) + 1
        for level, name in enumerate(LEVELS):
            room = max(self.board.counts(free, level).values()) >= size
            spans = len(self.board.counts(chosen, level)) > 1
            if name != "switch" and room and spans:
                self.violations[name] += 1
            if 2 <= size <= max(self.board.sizes[level].values()):
                row = self.local[name]
                row["eligible"] += 1
                row["found"] += room
                row["got"] += not spans
        mine = self.board.score(free, chosen)
        if not mine.splits:
            return
        kind = "single" if size == 1 else "partial"
        self.splits[kind] += 1
        found = self.board.analyse(free, size)
        if found is None:
            self.avoidable["not_checked"] += 1
        elif found.most_local_without_split is not None:
            self.avoidable[kind] += found.most_local_without_split <= mine.locality

    def summary(self) -> dict[str, Any]:
        """The counters as JSON-ready values, with shares."""
        local = {
            name: {
                **row,
                "share": round(row["got"] / row["eligible"], 3) if row["eligible"] else None,
            }
            for name, row in self.local.items()
        }
        return {
            "requests_by_size": dict(sorted(self.requests.items())),
            "rejected": self.rejected,
            "local": local,
            "violations": self.violations,
            "intact_switch_splits": self.splits,
            "avoidable_intact_switch_splits": self.avoidable,
        }


def replay(
    board: Board,
    trace: Sequence[Event],
    choose: Choose,
    requests: list[tuple[list[str], int, list[str]]] | None = None,
) -> Replay:
    """Run one policy over a trace; ``requests`` collects (free, size, chosen) if given."""
    order = {name: i for i, name in enumerate(board.names)}
    free = set(board.names)
    held: dict[int, list[str]] = {}
    result = Replay(board)
    for event in trace:
        if event.size == 0:
            free.update(held.pop(event.pod, []))
            continue
        if event.size > len(free):
            result.rejected += 1
            continue
        available = sorted(free, key=order.__getitem__)
        chosen = choose(available, event.size)
        if len(set(chosen)) != event.size or not free.issuperset(chosen):
            raise AssertionError(f"policy returned {chosen} for {event.size} of {available}")
        result.record(available, chosen, event.size)
        if requests is not None:
            requests.append((available, event.size, chosen))
        free.difference_update(chosen)
        held[event.pod] = chosen
    return result
