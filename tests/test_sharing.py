"""Shared-gcu slices: IDs, both policies as one table, the per-container cap and the env."""

from __future__ import annotations

import pytest

from enflame_gcu import sharing
from enflame_gcu.errors import AllocationError, ConfigError, InvalidRequestError

CARDS = [(f"gcu{i}", "T20 32GB") for i in range(8)]
ALL = sharing.slice_ids(CARDS, sharing.SharingSettings())


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
    ("packed", _without(*_card(3, 0, 1, 2)), [], 4, _card(0, 0) + _card(3, 3, 4, 5)),
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
    chosen = sharing.policy_by_name(policy).choose(available, required, size)
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
