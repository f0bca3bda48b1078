"""Time-shared slices of whole cards (``enflame.com/shared-gcu``): IDs, policies and env.

A shared card ``gcuN`` is advertised as ``slices`` devices ``gcuN-slice0`` … ``gcuN-slice<k-1>``.
Slices share the card's time, not its memory: nothing isolates one container's memory use from
another's on the same card. A slice is healthy exactly when its card is.

Both policies decide from the request's ``available`` list alone — the kubelet has already
removed slices in use — so, like whole-card allocation, they keep no state between calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from enflame_gcu.allocation import check_request
from enflame_gcu.errors import AllocationError, ConfigError, InvalidRequestError

DEFAULT_SLICES = 6
SUB_CARD_ENV = "ENFLAME_CONTAINER_SUB_CARD"
USABLE_PROCESSOR_ENV = "ENFLAME_CONTAINER_USABLE_PROCESSOR"
_SLICE_ID = re.compile(r"^(gcu\d+)-slice(\d+)$")


def slice_id(card: str, index: int) -> str:
    """Device ID of slice ``index`` of ``card``: ``slice_id("gcu3", 1) == "gcu3-slice1"``."""
    return f"{card}-slice{index}"


def parse_slice_id(device_id: str) -> tuple[str, int]:
    """``"gcu3-slice1"`` -> ``("gcu3", 1)``; InvalidRequestError for anything else."""
    match = _SLICE_ID.match(device_id)
    if not match:
        raise InvalidRequestError(
            f"{device_id!r} is not a shared-gcu slice ID (want gcuN-sliceK, e.g. gcu0-slice3)"
        )
    return match.group(1), int(match.group(2))


@dataclass(frozen=True, slots=True)
class SharingSettings:
    """How many slices each shared card gets, and how slices are allocated."""

    slices: int = DEFAULT_SLICES
    slices_by_model: Mapping[str, int] = field(default_factory=dict)
    slices_by_card: Mapping[str, int] = field(default_factory=dict)
    policy: str = "packed"
    max_slices_per_container: int = 0  # 0: no cap

    def __post_init__(self) -> None:
        counts = {"slices": self.slices, **self.slices_by_model, **self.slices_by_card}
        bad = {key: value for key, value in counts.items() if not 1 <= value <= 64}
        if bad:
            raise ConfigError(f"slice counts must be 1..64; got {bad}")
        if self.policy not in SLICE_POLICIES:
            raise ConfigError(
                f"unknown sharing policy {self.policy!r}; valid: {', '.join(SLICE_POLICIES)}"
            )
        if self.max_slices_per_container < 0:
            raise ConfigError("max slices per container must be 0 (no cap) or more")

    def slices_for(self, card: str, model: str) -> int:
        """Slice count for one card: per-card setting, else per-model, else the default."""
        return self.slices_by_card.get(card, self.slices_by_model.get(model, self.slices))


def slice_ids(cards: Iterable[tuple[str, str]], settings: SharingSettings) -> list[str]:
    """All slice IDs of ``(card name, model)`` pairs, card by card."""
    return [
        slice_id(card, index)
        for card, model in cards
        for index in range(settings.slices_for(card, model))
    ]


def _card_order(card: str) -> int:
    return int(card[3:])


def _free_by_card(available: Sequence[str]) -> dict[str, list[int]]:
    free: dict[str, list[int]] = {}
    for device_id in available:
        card, index = parse_slice_id(device_id)
        free.setdefault(card, []).append(index)
    for indexes in free.values():
        indexes.sort()
    return free


@dataclass(frozen=True, slots=True)
class PackedPolicy:
    """Keep shared cards idle for as long as possible: pack onto cards already in use.

    A choice is ranked, best first, by: the fewest idle cards it puts in use (a card is idle when
    every slice it has is in ``available``; ``slices_of`` gives each card's slice count, and a
    card missing from it never counts as idle), then the fewest cards for the container, then
    the fewest free slices left on the cards it uses (best fit), then the lowest cards. Cards
    that hold a must-include slice are used first: the container has them already.
    """

    slices_of: Mapping[str, int] = field(default_factory=dict)
    name: str = "packed"

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """Required slices, their cards' other free slices, then the best cards' lowest slices."""
        check_request(available, required, size)
        idle = {
            card
            for card, free in _free_by_card(available).items()
            if len(free) == self.slices_of.get(card, -1)
        }
        chosen = list(dict.fromkeys(required))
        free = _free_by_card([d for d in available if d not in chosen])
        for card in sorted({parse_slice_id(d)[0] for d in chosen}, key=_card_order):
            take = free.pop(card, [])[: size - len(chosen)]
            chosen += [slice_id(card, index) for index in take]
        rest = size - len(chosen)
        if rest:
            cards = _pack(free, idle, rest)
            for card in sorted(cards, key=lambda c: (len(free[c]), _card_order(c))):
                take = free[card][: size - len(chosen)]
                chosen += [slice_id(card, index) for index in take]
        return _ordered(chosen)


def _pack(free: Mapping[str, Sequence[int]], idle: set[str], needed: int) -> list[str]:
    """The cards to take ``needed`` slices from, by PackedPolicy's ranking.

    A knapsack over the cards, exact because every part of the ranking adds up card by card:
    (idle cards, cards, free slices on them, -bitmask of the cards with the lowest highest).
    States are slices available so far, capped at ``needed``.
    """
    cards = sorted(free, key=_card_order)
    bit = {card: 1 << (len(cards) - 1 - rank) for rank, card in enumerate(cards)}
    table: dict[int, tuple[int, int, int, int]] = {0: (0, 0, 0, 0)}
    for card in cards:
        step = (int(card in idle), 1, len(free[card]), -bit[card])
        for have, cost in list(table.items()):
            reach = min(needed, have + len(free[card]))
            candidate = (cost[0] + step[0], cost[1] + step[1], cost[2] + step[2], cost[3] + step[3])
            if reach not in table or candidate < table[reach]:
                table[reach] = candidate
    mask = -table[needed][3]
    return [card for card in cards if mask & bit[card]]


@dataclass(frozen=True, slots=True)
class DistributedPolicy:
    """Spread over the cards with the most free slices (one slice per card where possible)."""

    name: str = "distributed"

    def choose(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """Each further slice from the card with the most free slices left; lowest card wins."""
        check_request(available, required, size)
        chosen = list(dict.fromkeys(required))
        free = _free_by_card([d for d in available if d not in chosen])
        while len(chosen) < size:
            card = max(free, key=lambda c: (len(free[c]), -_card_order(c)))
            chosen.append(slice_id(card, free[card].pop(0)))
            if not free[card]:
                del free[card]
        return _ordered(chosen)


def _ordered(ids: Iterable[str]) -> list[str]:
    return sorted(ids, key=lambda d: (_card_order(parse_slice_id(d)[0]), parse_slice_id(d)[1]))


SLICE_POLICIES: dict[str, type[PackedPolicy | DistributedPolicy]] = {
    "packed": PackedPolicy,
    "distributed": DistributedPolicy,
}


def policy_by_name(
    name: str, slices_of: Mapping[str, int] | None = None
) -> PackedPolicy | DistributedPolicy:
    """The named slice policy for cards with ``slices_of`` slices; ConfigError lists the names."""
    if name not in SLICE_POLICIES:
        raise ConfigError(f"unknown sharing policy {name!r}; valid: {', '.join(SLICE_POLICIES)}")
    if name == "packed":
        return PackedPolicy(dict(slices_of or {}))
    return DistributedPolicy()


@dataclass(frozen=True, slots=True)
class SliceGrant:
    """What a container holding some slices gets: each card once, with its share."""

    cards: tuple[str, ...]
    shares: tuple[tuple[int, int], ...]  # (slices held, slices the card has), per card

    def env(self) -> dict[str, str]:
        """Env telling the workload how much of each card it was given (same order as cards)."""
        return {
            SUB_CARD_ENV: "true",
            USABLE_PROCESSOR_ENV: ",".join(f"{held}/{total}" for held, total in self.shares),
        }


def grant(
    device_ids: Sequence[str], slices_of: Mapping[str, int], max_per_container: int = 0
) -> SliceGrant:
    """Group a container's slices by card; enforce the per-container cap with a clear error."""
    if not device_ids:
        raise InvalidRequestError("no slices requested")
    if len(set(device_ids)) != len(device_ids):
        dupes = sorted({d for d in device_ids if device_ids.count(d) > 1})
        raise InvalidRequestError(f"slice(s) requested twice: {', '.join(dupes)}")
    if max_per_container and len(device_ids) > max_per_container:
        raise AllocationError(
            f"{len(device_ids)} shared-gcu slices requested but this node allows at most "
            f"{max_per_container} per container (sharing.maxSlicesPerContainer); ask for "
            "whole cards with enflame.com/gcu instead"
        )
    held: dict[str, int] = {}
    for device_id in device_ids:
        card, index = parse_slice_id(device_id)
        total = slices_of.get(card)
        if total is None or index >= total:
            valid = ", ".join(sorted(slices_of, key=_card_order)) or "none"
            raise InvalidRequestError(
                f"unknown slice {device_id}; shared cards on this node: {valid}"
            )
        held[card] = held.get(card, 0) + 1
    cards = tuple(sorted(held, key=_card_order))
    return SliceGrant(cards, tuple((held[c], slices_of[c]) for c in cards))
