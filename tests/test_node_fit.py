"""The extender's scores against a table of vendor 8-card node states (node_fit's docstring).

The vendor machine: switches {0,1} {2} {3} {4,5} {6} {7}; root ports (= NUMA nodes) 0-3, 4-7.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from enflame_gcu import devices, node_fit, node_state, sharing
from enflame_gcu.errors import AllocationError

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


def shared(
    *cards: tuple[str, int, int], policy: str = "packed", cap: int = 0
) -> node_state.NodeState:
    return node_state.NodeState(
        shared=tuple(node_state.SharedCard(n, int(n[3:]), s, f) for n, s, f in cards),
        policy=policy,
        max_per_container=cap,
    )


@pytest.mark.parametrize(
    ("containers", "pending", "fits", "score"),
    [
        ((2,), (), True, 10),  # gcu6 has exactly 2 free: no idle card started
        ((1,), (), True, 9),  # gcu6, one slice left over
        ((3,), (), True, 7),  # packed: the idle gcu7, not gcu6's two and one of gcu7
        ((7,), (), True, 7),  # packed spans cards: gcu6's two and five of gcu7
        ((9,), (), False, 0),  # 8 free slices in all
        ((4, 4), (), True, 7),
        ((2, 2), (), True, 7),  # gcu6 and then the idle gcu7
        ((2,), ((2,),), True, 7),  # a bound pod takes gcu6's two first
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


def test_a_pod_spanning_cards_fits_as_the_packed_policy_gives_it() -> None:
    """Two cards with one free slice each and a 2-slice pod: the plugin gives
    gcu0-slice5 + gcu1-slice5, so the extender must not filter the node out."""
    fit = node_fit.shared_slices(shared(("gcu0", 6, 1), ("gcu1", 6, 1)), (), (2,))
    assert fit.fits, fit.reason
    assert fit.reason.startswith("slices on gcu0+gcu1")


def test_the_per_container_cap_is_replayed() -> None:
    fit = node_fit.shared_slices(shared(("gcu0", 6, 6), cap=2), (), (3,))
    assert not fit.fits
    assert "at most 2 per container" in fit.reason


def test_a_full_node_names_its_free_slices() -> None:
    fit = node_fit.shared_slices(shared(("gcu0", 6, 1), ("gcu1", 6, 1)), (), (3,))
    assert not fit.fits
    assert fit.reason == "2 free slice(s) for 3 after bound pods (free: gcu0 1, gcu1 1)"


def _plugin_serves(
    cards: list[tuple[str, int, list[int]]],
    policy_name: str,
    cap: int,
    pods: list[tuple[int, ...]],
) -> tuple[bool, set[str]]:
    """The plugin's side, as the kubelet drives it: per container, the free slice IDs the
    kubelet still has (the real, scattered indexes), the node's policy choosing, and the
    cap enforced by ``sharing.grant`` at Allocate. Whether the last pod is served, and the
    cards it was given."""
    slices_of = {name: count for name, count, _ in cards}
    policy = sharing.policy_by_name(policy_name, slices_of)
    available = [sharing.slice_id(name, index) for name, _, free in cards for index in free]
    used: set[str] = set()
    for number, pod in enumerate(pods):
        last = number == len(pods) - 1
        for count in pod:
            if count > len(available):
                if last:
                    return False, used
                taken = []
            else:
                taken = policy.choose(available, [], count)
                try:
                    sharing.grant(taken, slices_of, cap)
                except AllocationError:
                    if last:
                        return False, used
                    continue
            available = [d for d in available if d not in taken]
            if last:
                used |= {sharing.parse_slice_id(d)[0] for d in taken}
    return True, used


def test_the_extender_agrees_with_the_plugins_own_policies() -> None:
    """A table of node states, policies, caps and pods: the extender's filter answer is the
    plugin's, and the cards it reports are the ones the plugin would use."""
    chance = random.Random(35)  # noqa: S311 (a seeded table, not a secret)
    cases = 0
    for policy_name, cap in itertools.product(sharing.SLICE_POLICIES, (0, 2, 4)):
        for _ in range(60):
            cards = []
            for minor in range(chance.randint(1, 4)):
                total = chance.choice((2, 4, 6, 8))
                free = sorted(chance.sample(range(total), chance.randint(0, total)))
                cards.append((f"gcu{minor}", total, free))
            bound = tuple(
                tuple(chance.randint(1, cap or 4) for _ in range(chance.randint(1, 2)))
                for _ in range(chance.randint(0, 2))
            )
            pod = tuple(chance.randint(1, 6) for _ in range(chance.randint(1, 2)))
            state = shared(
                *((name, total, len(free)) for name, total, free in cards),
                policy=policy_name,
                cap=cap,
            )
            fit = node_fit.shared_slices(state, bound, pod)
            served, used = _plugin_serves(cards, policy_name, cap, [*bound, pod])
            where = f"{policy_name} cap {cap} cards {cards} bound {bound} pod {pod}: {fit.reason}"
            if any(cap and count > cap for count in pod):
                assert not fit.fits, where
                continue
            assert fit.fits == served, where
            if served:
                assert fit.reason.startswith(f"slices on {'+'.join(sorted(used))} "), where
            cases += 1
    assert cases > 200
