"""The topology policy on the named boards, as one table, plus the requests it must refuse."""

from __future__ import annotations

import itertools

import pytest

from enflame_gcu import allocation, devices, simulate, topofile, topology
from enflame_gcu.errors import AllocationError, InvalidRequestError


def gcus(*minors: int) -> list[str]:
    """``gcus(0, 1)`` -> ``["gcu0", "gcu1"]``."""
    return [f"gcu{m}" for m in minors]


ALL8 = gcus(*range(8))
ALL16 = gcus(*range(16))

# (board, available, must include, size, expected) — why each row holds is in its id.
TABLE = [
    ("vendor-8card", ALL8, [], 2, gcus(0, 1), "manual-pod1-shared-switch"),
    ("vendor-8card", gcus(2, 3, 4, 5, 6, 7), [], 2, gcus(4, 5), "manual-pod2-other-switch-pair"),
    ("vendor-8card", ALL8, [], 4, gcus(0, 1, 2, 3), "four-under-one-root-port"),
    ("vendor-8card", ALL8, [], 1, gcus(0), "single-lowest-minor"),
    ("vendor-8card", ALL8, [], 5, gcus(0, 1, 2, 4, 5), "five-fewest-switches-over-minors"),
    ("vendor-8card", ALL8, [], 8, ALL8, "everything"),
    ("vendor-8card", ALL8, ["gcu5"], 2, gcus(4, 5), "must-include-gets-switch-mate"),
    ("vendor-8card", ALL8, ["gcu2"], 2, gcus(0, 2), "must-include-stays-on-port"),
    ("vendor-8card", ALL8, ["gcu0", "gcu7"], 2, gcus(0, 7), "must-include-fills-request"),
    ("vendor-8card", ALL8, ["gcu6"], 4, gcus(4, 5, 6, 7), "must-include-picks-its-port"),
    ("vendor-8card", gcus(0, 2, 4, 5), [], 2, gcus(4, 5), "switch-beats-port"),
    ("vendor-8card", gcus(1, 2, 3, 5, 6, 7), [], 3, gcus(1, 2, 3), "tie-lowest-minors"),
    ("vendor-8card", gcus(3, 4), [], 2, gcus(3, 4), "no-choice-crosses-ports"),
    ("flat-4card", gcus(0, 1, 2, 3), [], 2, gcus(0, 1), "flat-lowest"),
    ("flat-4card", gcus(1, 3), [], 1, gcus(1), "flat-available-only"),
    ("flat-4card", gcus(0, 1, 2, 3), ["gcu3"], 3, gcus(0, 1, 3), "flat-must-include"),
    ("2socket-16card", ALL16, [], 2, gcus(0, 1), "16-pair"),
    ("2socket-16card", ALL16, [], 4, gcus(0, 1, 2, 3), "16-one-switch"),
    ("2socket-16card", ALL16, [], 8, gcus(*range(8)), "16-one-socket"),
    ("2socket-16card", ALL16, [], 9, gcus(*range(9)), "16-spill-to-second-socket"),
    ("2socket-16card", gcus(3, 4, 5, 6, 7, 8), [], 4, gcus(4, 5, 6, 7), "16-whole-switch"),
    ("2socket-16card", ALL16, ["gcu9"], 4, gcus(8, 9, 10, 11), "16-must-include-switch"),
    ("2socket-16card", gcus(0, 1, 8, 9, 10), [], 3, gcus(8, 9, 10), "16-numa-over-minor"),
]


@pytest.fixture(scope="module")
def boards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, topology.Topology]:
    """Topologies of the named boards, discovered from simulated nodes."""
    result = {}
    for name in ("vendor-8card", "flat-4card", "2socket-16card"):
        root = str(tmp_path_factory.mktemp(name))
        simulate.create(root, topofile.load(name))
        result[name] = topology.Topology.from_inventory(devices.discover(root))
    return result


Row = tuple[str, list[str], list[str], int, list[str], str]
ROWS = [pytest.param(row, id=row[5]) for row in TABLE]


@pytest.mark.parametrize("row", ROWS)
def test_topology_policy_table(boards: dict[str, topology.Topology], row: Row) -> None:
    board, available, must, size, expected, _why = row
    policy = allocation.policy_by_name("topology", boards[board])
    assert policy.choose(available, must, size) == expected


@pytest.mark.parametrize("row", ROWS)
def test_answers_do_not_depend_on_the_order_of_available(
    boards: dict[str, topology.Topology], row: Row
) -> None:
    board, available, must, size, expected, _why = row
    policy = allocation.policy_by_name("topology", boards[board])
    assert policy.choose(list(reversed(available)), must, size) == expected


def test_no_better_set_exists_for_any_pair_on_the_vendor_board(
    boards: dict[str, topology.Topology],
) -> None:
    topo = boards["vendor-8card"]
    policy = allocation.policy_by_name("topology", topo)
    for size in range(1, 9):
        chosen = policy.choose(ALL8, [], size)
        best = min(
            (topo.set_score(list(c)) for c in itertools.combinations(ALL8, size)),
            key=lambda s: s.key(),
        )
        assert topo.set_score(chosen).key()[:4] == best.key()[:4]


BAD = [
    (ALL8, [], 0, "allocation size must be at least 1, got 0"),
    (gcus(0, 1), [], 3, "asked for 3 device(s) but only 2 are available (gcu0, gcu1)"),
    (gcus(0, 1), ["gcu5"], 2, "must-include device(s) gcu5 are not in the available list"),
    (gcus(0, 0, 1), [], 1, "available list repeats gcu0"),
    (gcus(0, 1, 2), gcus(0, 1, 2), 2, "3 must-include devices exceed the size 2"),
    ([], [], 1, "only 0 are available (none)"),
]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("policy_name", ["topology", "simple"])
def test_bad_requests_raise_allocation_error_with_a_clear_message(
    boards: dict[str, topology.Topology],
    policy_name: str,
    bad: tuple[list[str], list[str], int, str],
) -> None:
    available, must, size, phrase = bad
    policy = allocation.policy_by_name(policy_name, boards["vendor-8card"])
    with pytest.raises(AllocationError) as caught:
        policy.choose(available, must, size)
    assert phrase in str(caught.value)
    assert isinstance(caught.value, InvalidRequestError)
