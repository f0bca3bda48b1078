"""The extender's scores against a table of vendor 8-card node states (node_fit's docstring).

The vendor machine: switches {0,1} {2} {3} {4,5} {6} {7}; root ports (= NUMA nodes) 0-3, 4-7.
"""

from __future__ import annotations

import dataclasses

import pytest

from enflame_gcu import devices, node_fit, node_state

WHOLE = [f"gcu{i}" for i in range(8)]


@pytest.fixture(scope="module")
def empty_state(tmp_path_factory: pytest.TempPathFactory) -> node_state.NodeState:
    from enflame_gcu.simulation import simulate, topofile

    root = str(tmp_path_factory.mktemp("vendor"))
    simulate.create(root, topofile.load("vendor-8card"))
    return node_state.build(devices.discover(root), [], whole=WHOLE, shared={})


def busy(state: node_state.NodeState, *minors: int) -> node_state.NodeState:
    cards = tuple(dataclasses.replace(c, free=c.minor not in minors) for c in state.cards)
    return dataclasses.replace(state, cards=cards)


@pytest.mark.parametrize(
    ("size", "taken", "pending", "score", "why"),
    [
        (2, (), (), 8, "a fresh node: the pair breaks an intact root port and the whole node"),
        (2, (2, 3, 4, 5, 6, 7), (), 10, "only a free pair is left: exact fit"),
        (2, (0, 4), (), 6, "no free pair: one root port, nothing intact broken"),
        (2, (1, 2, 3, 5, 6, 7), (), 2, "gcu0 and gcu4 are on different NUMA nodes"),
        (1, (0, 1, 2, 4, 5, 6), (), 10, "a lone card whose switch has no partner"),
        (1, (), (), 8, "a fresh node: one card breaks its root port and the node"),
        (1, (2, 3, 6, 7), (), 9, "only pair cards left: one breaks a free pair"),
        (1, (2, 3), (), 9, "the lone gcu6 rather than a pair card, but root port 1 breaks"),
        (4, (), (), 5, "a root port of a fresh node"),
        (4, (4,), (), 6, "an intact root port on a used node"),
        (8, (), (), 2, "every card: two NUMA nodes, nothing broken"),
        (8, (3,), (), 0, "not enough free cards"),
        (2, (2, 3, 4, 5, 6, 7), (2,), 0, "a bound pod takes the only pair first"),
        (2, (), (1,), 10, "a bound 1-card pod takes gcu2 first; the pair breaks nothing"),
        (2, (2, 3, 6, 7), (2,), 10, "a bound pod takes one pair, this pod the other"),
    ],
)
def test_whole_card_scores(  # noqa: PLR0917 (one argument per column of the table)
    empty_state: node_state.NodeState,
    size: int,
    taken: tuple[int, ...],
    pending: tuple[int, ...],
    score: int,
    why: str,
) -> None:
    fit = node_fit.whole_cards(busy(empty_state, *taken), pending, size)
    assert fit.score == score, f"{why}: {fit.reason}"
    assert fit.fits == (score > 0)


def test_a_node_with_a_free_pair_beats_one_with_only_split_cards(
    empty_state: node_state.NodeState,
) -> None:
    pair = node_fit.whole_cards(busy(empty_state, 2, 3, 4, 5, 6), (), 2)
    split = node_fit.whole_cards(busy(empty_state, 0, 3, 4, 6, 7), (), 2)
    assert pair.score > split.score
    assert "switch" in pair.reason and "switch" not in split.reason


def shared(*cards: tuple[str, int, int]) -> node_state.NodeState:
    return node_state.NodeState(
        shared=tuple(node_state.SharedCard(n, int(n[3:]), s, f) for n, s, f in cards)
    )


@pytest.mark.parametrize(
    ("containers", "pending", "fits", "score"),
    [
        ((2,), (), True, 10),  # gcu6 has exactly 2 free: no idle card started
        ((1,), (), True, 9),  # gcu6, one slice left over
        ((3,), (), True, 7),  # only the idle gcu7 has 3
        ((7,), (), False, 0),  # no card has 7
        ((4, 4), (), False, 0),  # one card each: only gcu7 has 4
        ((2, 2), (), True, 7),  # gcu6 and then the idle gcu7
        ((2,), ((2,),), True, 7),  # a bound pod takes gcu6's two first
        ((6,), ((1,),), True, 7),  # the bound pod goes to gcu6 (best fit), gcu7 stays whole
    ],
)
def test_shared_slice_fits(
    containers: tuple[int, ...],
    pending: tuple[tuple[int, ...], ...],
    fits: bool,
    score: int,
) -> None:
    state = shared(("gcu6", 6, 2), ("gcu7", 6, 6))
    fit = node_fit.shared_slices(state, pending, containers)
    assert (fit.fits, fit.score) == (fits, score), fit.reason


def test_a_spread_node_names_its_free_slices() -> None:
    fit = node_fit.shared_slices(shared(("gcu0", 6, 2), ("gcu1", 6, 2)), (), (3,))
    assert not fit.fits
    assert fit.reason == "no card has 3 free slices (free: gcu0 2, gcu1 2)"
