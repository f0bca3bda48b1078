"""Shared-gcu slices: IDs, both policies as one table, the per-container cap and the env."""

from __future__ import annotations

import itertools
import random

import pytest

from enflame_gcu import sharing, virtual
from enflame_gcu.errors import AllocationError, ConfigError, InvalidRequestError

CARDS = [(f"gcu{i}", "T20 32GB") for i in range(8)]
ALL = sharing.slice_ids(CARDS, sharing.SharingSettings())
SLICES_OF = {card: 6 for card, _model in CARDS}


def _without(*taken: str) -> list[str]:
    return [d for d in ALL if d not in taken]


def _card(n: int, *slices: int) -> list[str]:
    return [sharing.slice_id(f"gcu{n}", s) for s in slices]


def test_slice_ids_name_card_and_slice() -> None:
    assert len(ALL) == 48
    assert ALL[:7] == [f"gcu0-slice{i}" for i in range(6)] + ["gcu1-slice0"]
    assert sharing.parse_slice_id("gcu12-slice5") == ("gcu12", 5)
    with pytest.raises(InvalidRequestError, match="want gcuN-sliceK"):
        sharing.parse_slice_id("gcu1")


def test_slice_counts_per_card_beat_per_model_beat_default() -> None:
    settings = sharing.SharingSettings(
        slices=4, slices_by_model={"S60 48GB": 8}, slices_by_card={"gcu1": 2}
    )
    ids = sharing.slice_ids([("gcu0", "S60 48GB"), ("gcu1", "S60 48GB"), ("gcu2", "T20")], settings)
    assert [d for d in ids if d.startswith("gcu0-")] == _card(0, *range(8))
    assert [d for d in ids if d.startswith("gcu1-")] == _card(1, 0, 1)
    assert [d for d in ids if d.startswith("gcu2-")] == _card(2, 0, 1, 2, 3)


# (policy, available, must_include, size, expected)
TABLE = [
    ("packed", ALL, [], 1, _card(0, 0)),
    ("packed", ALL, [], 2, _card(0, 0, 1)),
    ("packed", _without(*_card(0, 0)), [], 2, _card(0, 1, 2)),
    # gcu3's three free slices cannot hold four: a card must be opened either way, so the
    # container gets one card (gcu0) rather than two.
    ("packed", _without(*_card(3, 0, 1, 2)), [], 4, _card(0, 0, 1, 2, 3)),
    ("packed", _without(*_card(3, 0, 1, 2)), [], 3, _card(3, 3, 4, 5)),
    ("packed", ALL, [], 7, _card(0, *range(6)) + _card(1, 0)),
    # The must-include slice leaves gcu5 with the fewest free slices, so packing fills it.
    ("packed", ALL, _card(5, 2), 2, _card(5, 0, 2)),
    ("distributed", ALL, [], 1, _card(0, 0)),
    ("distributed", ALL, [], 3, _card(0, 0) + _card(1, 0) + _card(2, 0)),
    ("distributed", _without(*_card(0, 0)), [], 2, _card(1, 0) + _card(2, 0)),
    ("distributed", ALL, [], 9, _card(0, 0, 1) + [s for n in range(1, 8) for s in _card(n, 0)]),
    ("distributed", _card(2, 0, 1, 2) + _card(4, 0), [], 2, _card(2, 0, 1)),
    ("distributed", ALL, _card(7, 3), 2, _card(0, 0) + _card(7, 3)),
]


@pytest.mark.parametrize(("policy", "available", "required", "size", "expected"), TABLE)
def test_slice_policies_on_the_eight_card_machine(
    policy: str, available: list[str], required: list[str], size: int, expected: list[str]
) -> None:
    chosen = sharing.policy_by_name(policy, SLICES_OF).choose(available, required, size)
    assert chosen == expected
    assert set(chosen) <= set(available)


@pytest.mark.parametrize("policy", ["packed", "distributed"])
def test_slice_policies_refuse_impossible_requests(policy: str) -> None:
    chooser = sharing.policy_by_name(policy)
    with pytest.raises(AllocationError, match="only 2 are available"):
        chooser.choose(_card(0, 0, 1), [], 3)
    with pytest.raises(AllocationError, match="not in the available list"):
        chooser.choose(_card(0, 0, 1), _card(1, 0), 1)


def test_grant_gives_each_card_once_with_its_share() -> None:
    granted = sharing.grant(_card(2, 0, 3) + _card(5, 1), {f"gcu{i}": 6 for i in range(8)})
    assert granted.cards == ("gcu2", "gcu5")
    assert granted.env() == {
        "ENFLAME_CONTAINER_SUB_CARD": "true",
        "ENFLAME_CONTAINER_USABLE_PROCESSOR": "2/6,1/6",
    }


def test_grant_enforces_the_cap_with_a_clear_message() -> None:
    with pytest.raises(AllocationError, match="at most 1 per container"):
        sharing.grant(_card(0, 0, 1), {"gcu0": 6}, max_per_container=1)
    assert sharing.grant(_card(0, 0), {"gcu0": 6}, max_per_container=1).cards == ("gcu0",)


def test_grant_refuses_unknown_and_duplicate_slices() -> None:
    with pytest.raises(InvalidRequestError, match="unknown slice gcu0-slice6; shared cards"):
        sharing.grant(_card(0, 6), {"gcu0": 6})
    with pytest.raises(
        InvalidRequestError, match=r"unknown slice gcu3-slice0; shared cards on this node: gcu0"
    ):
        sharing.grant(_card(3, 0), {"gcu0": 6})
    with pytest.raises(InvalidRequestError, match="requested twice: gcu0-slice1"):
        sharing.grant(_card(0, 1, 1), {"gcu0": 6})
    with pytest.raises(InvalidRequestError, match="no slices requested"):
        sharing.grant([], {"gcu0": 6})


def test_bad_settings_are_refused() -> None:
    with pytest.raises(
        ConfigError, match="unknown sharing policy 'fair'; valid: packed, distributed"
    ):
        sharing.SharingSettings(policy="fair")
    with pytest.raises(ConfigError, match=r"slice counts must be 1\.\.64"):
        sharing.SharingSettings(slices_by_card={"gcu0": 0})


def _used(free: dict[int, int], total: int = 6) -> list[str]:
    """Available slices when card N has ``free[N]`` free slices (the highest ones), others idle."""
    return [d for n in range(8) for d in _card(n, *range(total - free.get(n, total), total))]


# Packing: (available, slices per card, must include, size, expected, why).
PACKED = [
    (_used({2: 1}), SLICES_OF, [], 1, _card(2, 5), "single-goes-to-a-card-in-use"),
    (_used({2: 2, 5: 3}), SLICES_OF, [], 3, _card(5, 3, 4, 5), "one-used-card-holds-it"),
    (_used({2: 2, 5: 3}), SLICES_OF, [], 2, _card(2, 4, 5), "tightest-used-card"),
    (_used({2: 1, 5: 1}), SLICES_OF, [], 2, _card(2, 5) + _card(5, 5), "two-used-before-idle"),
    (_used({2: 1}), SLICES_OF, [], 2, _card(0, 0, 1), "idle-card-opened-anyway-holds-all"),
    (_used({2: 1, 5: 4}), SLICES_OF, [], 6, _card(0, *range(6)), "opened-card-holds-it-all"),
    (
        _used({2: 1, 5: 4}),
        SLICES_OF,
        [],
        7,
        _card(0, *range(6)) + _card(2, 5),
        "opened-card-plus-tightest-used-card",
    ),
    # gcu0 has 8 slices, 2 in use (6 free); gcu1 has 4, all free: fewest-free-first would
    # open gcu1, packing keeps it idle.
    (
        _card(0, *range(2, 8)) + _card(1, 0, 1, 2, 3),
        {"gcu0": 8, "gcu1": 4},
        [],
        1,
        _card(0, 2),
        "used-card-with-more-free-beats-small-idle-one",
    ),
    (_used({2: 1}), SLICES_OF, _card(6, 0), 3, _card(6, 0, 1, 2), "must-include-card-first"),
    # Without slice counts no card counts as idle: fewest cards, then best fit.
    (_used({2: 2, 5: 3}), {}, [], 1, _card(2, 4), "no-counts-best-fit"),
]


@pytest.mark.parametrize(
    ("available", "slices_of", "required", "size", "expected"),
    [pytest.param(*row[:5], id=row[5]) for row in PACKED],
)
def test_packed_fills_cards_in_use_before_opening_an_idle_one(
    available: list[str],
    slices_of: dict[str, int],
    required: list[str],
    size: int,
    expected: list[str],
) -> None:
    chosen = sharing.policy_by_name("packed", slices_of).choose(available, required, size)
    assert chosen == expected
    assert sharing.PackedPolicy(slices_of).choose(available[::-1], required, size) == expected


def _packed_oracle(
    available: list[str], slices_of: dict[str, int], size: int
) -> tuple[int, int, int, list[int]]:
    """Best (idle cards opened, cards, free slices left on them, cards) by enumeration."""
    free: dict[str, int] = {}
    for d in available:
        free[sharing.parse_slice_id(d)[0]] = free.get(sharing.parse_slice_id(d)[0], 0) + 1
    best = None
    for subset in itertools.combinations(available, size):
        cards = sorted({sharing.parse_slice_id(d)[0] for d in subset}, key=lambda c: int(c[3:]))
        key = (
            sum(1 for c in cards if free[c] == slices_of[c]),
            len(cards),
            sum(free[c] for c in cards) - size,
            [int(c[3:]) for c in cards],
        )
        best = key if best is None or key < best else best
    assert best is not None
    return best


def test_packed_matches_an_enumeration_of_every_choice() -> None:
    rng = random.Random(14)  # noqa: S311 - reproducible cases, not a secret
    slices_of = {f"gcu{n}": rng.choice([2, 3, 4]) for n in range(4)}
    every = [sharing.slice_id(c, i) for c, k in slices_of.items() for i in range(k)]
    policy = sharing.PackedPolicy(slices_of)
    for _ in range(300):
        available = sorted(rng.sample(every, rng.randint(1, len(every))), key=every.index)
        size = rng.randint(1, min(len(available), 6))
        chosen = policy.choose(available, [], size)
        cards = sorted({sharing.parse_slice_id(d)[0] for d in chosen}, key=lambda c: int(c[3:]))
        free = {c: sum(1 for d in available if d.startswith(f"{c}-")) for c in cards}
        idle = sum(1 for c in cards if free[c] == slices_of[c])
        got = (idle, len(cards), sum(free.values()) - size, [int(c[3:]) for c in cards])
        assert got == _packed_oracle(available, slices_of, size), (available, size, chosen)
        for card in cards:  # each card gives its lowest free slices
            mine = [d for d in chosen if d.startswith(f"{card}-")]
            assert mine == [d for d in available if d.startswith(f"{card}-")][: len(mine)]


# vGCUs: gcu0 has two vGCUs, both free (idle); gcu1 has four, two of them in use.
VGCU_PARENTS = {"vgcu0": "gcu0", "vgcu1": "gcu0", **{f"vgcu{i}": "gcu1" for i in range(2, 6)}}


@pytest.mark.parametrize(
    ("available", "size", "expected"),
    [
        (["vgcu0", "vgcu1", "vgcu4", "vgcu5"], 1, ["vgcu4"]),
        (["vgcu0", "vgcu1", "vgcu4", "vgcu5"], 2, ["vgcu4", "vgcu5"]),
        # Nothing in use on gcu1 either: the tightest fit, then the lowest card.
        (["vgcu0", "vgcu1", *(f"vgcu{i}" for i in range(2, 6))], 1, ["vgcu0"]),
        (["vgcu0", "vgcu1", *(f"vgcu{i}" for i in range(2, 6))], 3, ["vgcu2", "vgcu3", "vgcu4"]),
    ],
)
def test_vgcus_pack_onto_a_card_in_use_before_an_idle_one(
    available: list[str], size: int, expected: list[str]
) -> None:
    policy = virtual.VgcuPolicy(VGCU_PARENTS)
    assert policy.choose(available, [], size) == expected
    assert policy.choose(available[::-1], [], size) == expected
