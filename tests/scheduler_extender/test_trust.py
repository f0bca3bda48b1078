"""What the extender trusts: node states only while fresh, bound pods until the state counts
them, and guesses only for pods its own watch shows waiting (never a caller's word)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

from enflame_gcu import devices, node_fit, node_state
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions
from tests.scheduler_extender.leases import lease

WHOLE = [f"gcu{i}" for i in range(8)]


class Clocks:
    """The cache's two clocks (monotonic and wall), moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> node_state.NodeState:
    from enflame_gcu.simulation import simulate, topofile

    root = str(tmp_path_factory.mktemp("vendor"))
    simulate.create(root, topofile.load("vendor-8card"))
    return node_state.build(devices.discover(root), [], whole=WHOLE, shared={})


def text(state: node_state.NodeState, observed: float, *held: int, **changes: Any) -> str:
    cards = tuple(dataclasses.replace(c, free=c.minor not in held) for c in state.cards)
    return dataclasses.replace(state, cards=cards, observed=observed, **changes).to_json()


def pod(name: str, cards: int = 0, slices: int = 0, node: str | None = None) -> dict[str, Any]:
    limits = {"enflame.com/gcu": str(cards)} if cards else {"enflame.com/shared-gcu": str(slices)}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": spec}


def call(decide: decisions.Decisions, verb: str, p: dict[str, Any], *names: str) -> Any:
    body = json.dumps({"Pod": p, "NodeNames": list(names)}).encode()
    return json.loads(getattr(decide, verb)(body))


def scores(answer: list[dict[str, Any]]) -> dict[str, int]:
    return {entry["Host"]: entry["Score"] for entry in answer}


def setup() -> tuple[Clocks, extender_cache.ClusterCache, decisions.Decisions]:
    clock = Clocks()
    cache = extender_cache.ClusterCache(clock=clock, wall=clock)
    return clock, cache, decisions.Decisions(cache)


def test_a_node_without_state_scores_neutral_not_as_a_node_that_does_not_fit(
    fresh: node_state.NodeState,
) -> None:
    clock, cache, decide = setup()
    cache.set_lease("full", lease("full", text(fresh, clock.now, *range(8))))
    cache.delete_lease("plain")
    ranked = scores(call(decide, "prioritize", pod("p", 2), "full", "plain", "unseen"))
    assert ranked == {"full": node_fit.NO_FIT, "plain": node_fit.NEUTRAL, "unseen": 5}
    assert 0 < node_fit.NEUTRAL < node_fit.MAX_SCORE


def test_a_state_the_plugin_stopped_refreshing_becomes_unknown(
    fresh: node_state.NodeState,
) -> None:
    clock, cache, decide = setup()
    cache.set_lease("a", lease("a", text(fresh, clock.now, *range(8))))
    assert scores(call(decide, "prioritize", pod("p", 2), "a")) == {"a": 0}
    clock.now += cache.max_age + 1  # no refresh since: the plugin crashed or lost its RBAC
    assert scores(call(decide, "prioritize", pod("p", 2), "a")) == {"a": node_fit.NEUTRAL}
    ahead = text(fresh, clock.now + cache.max_age + 60, *range(8))  # a clock far ahead
    cache.set_lease("c", lease("c", ahead))
    assert scores(call(decide, "prioritize", pod("p", 2), "c")) == {"c": node_fit.NEUTRAL}
    shared_state = text(fresh, clock.now - cache.max_age - 1, shared=())
    cache.set_lease("b", lease("b", shared_state))
    answer = call(decide, "filter", pod("s", slices=2), "b")
    assert answer["NodeNames"] == ["b"]  # unknown is never filtered out


def test_a_bound_pod_counts_until_the_state_lists_it_or_is_newer(
    fresh: node_state.NodeState,
) -> None:
    clock, cache, decide = setup()
    cache.set_lease("a", lease("a", text(fresh, clock.now, 2, 3, 4, 5, 6, 7)))
    cache.set_pod(pod("first", 2, node="a"))
    clock.now += 60  # longer than any fixed time-to-live: the plugin has not read again
    cache.set_lease("a", lease("a", text(fresh, clock.now - 59, 2, 3, 4, 5, 6, 7)))
    assert scores(call(decide, "prioritize", pod("second", 2), "a")) == {"a": 0}
    # A state read well after the binding that still shows the pair free: the pod is not there.
    cache.set_lease("a", lease("a", text(fresh, clock.now, 2, 3, 4, 5, 6, 7)))
    assert scores(call(decide, "prioritize", pod("second", 2), "a")) == {"a": 10}


def holding(state: node_state.NodeState, observed: float, **pods: list[int]) -> str:
    """``state`` with each named pod (of namespace ``ml``) holding the listed card minors."""
    owner = {minor: f"ml/{name}" for name, minors in pods.items() for minor in minors}
    cards = tuple(
        dataclasses.replace(c, free=c.minor not in owner, holder=owner.get(c.minor, ""))
        for c in state.cards
    )
    listed = frozenset(owner.values())
    return dataclasses.replace(state, cards=cards, pods=listed, observed=observed).to_json()


def test_a_pod_that_ends_gives_its_cards_back_before_the_plugin_reads_again(
    fresh: node_state.NodeState,
) -> None:
    clock, cache, decide = setup()
    cache.set_lease("a", lease("a", holding(fresh, clock.now, old=[0, 1],
                                                        rest=[2, 3, 4, 5, 6, 7])))  # fmt: skip
    cache.set_pod(pod("old", 2, node="a"))
    cache.set_pod(pod("rest", 6, node="a"))
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 0}
    clock.now += 1
    cache.delete_pod("uid-old")  # deleted: the state (read before) still names it on gcu0+gcu1
    assert cache.counts()["released_pods"] == 1
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 10}
    assert cache.views(["a"])["a"].state.free == {"gcu0", "gcu1"}  # type: ignore[union-attr]
    # A pod that ends by its phase releases the same way; one whose state is read after the
    # end is the state's word again (here the plugin still reports it: it is held).
    cache.set_pod({**pod("rest", 6, node="a"), "status": {"phase": "Succeeded"}})
    assert len(cache.views(["a"])["a"].state.free) == 8  # type: ignore[union-attr]
    cache.set_lease("a", lease("a", holding(fresh, clock.now + 0.5, old=[0, 1],
                                                        rest=[2, 3, 4, 5, 6, 7])))  # fmt: skip
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 0}
    assert cache.counts()["released_pods"] == 0  # the newer state is the word: both forgotten


def test_a_release_is_forgotten_after_the_grace_and_when_the_name_comes_back(
    fresh: node_state.NodeState,
) -> None:
    clock, cache, decide = setup()
    full = holding(fresh, clock.now, old=[0, 1], rest=[2, 3, 4, 5, 6, 7])
    cache.set_lease("a", lease("a", full))
    cache.set_pod(pod("old", 2, node="a"))
    clock.now += 1
    cache.delete_pod("uid-old")
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 10}
    cache.set_pod(pod("old", 2, node="a"))  # a new pod of the same name bound there
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 0}
    cache.delete_pod("uid-old")
    clock.now += cache.admission_grace + 1  # the plugin must have read by now: its word again
    cache.set_lease("a", lease("a", holding(fresh, clock.now - 60, old=[0, 1],
                                                        rest=[2, 3, 4, 5, 6, 7])))  # fmt: skip
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 0}


def test_a_shared_pod_that_ends_gives_its_slices_back_to_filter() -> None:
    clock, cache, decide = setup()
    card = node_state.SharedCard("gcu0", 0, 6, 0, (("ml/big", 4), ("ml/small", 2)))
    state = node_state.NodeState(shared=(card,), pods=frozenset({"ml/big", "ml/small"}),
                                 observed=clock.now)  # fmt: skip
    cache.set_lease("a", lease("a", state.to_json()))
    cache.set_pod(pod("big", slices=4, node="a"))
    assert call(decide, "filter", pod("s", slices=3), "a")["NodeNames"] == []
    clock.now += 1
    cache.delete_pod("uid-big")
    assert call(decide, "filter", pod("s", slices=3), "a")["NodeNames"] == ["a"]
    assert call(decide, "filter", pod("s", slices=5), "a")["NodeNames"] == []


def test_made_up_prioritize_calls_plant_no_guess_and_never_fail_filter() -> None:
    clock, cache, decide = setup()
    one_card = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 6),), observed=clock.now
    )
    other = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 1),), observed=clock.now
    )
    cache.set_lease("a", lease("a", one_card.to_json()))
    cache.set_lease("b", lease("b", other.to_json()))
    for index in range(8):  # a caller inventing pods: nothing the watch has seen waiting
        call(decide, "prioritize", pod(f"fake{index}", slices=6), "a", "b")
    assert cache.counts()["guesses"] == 0
    assert call(decide, "filter", pod("real", slices=6), "a", "b")["NodeNames"] == ["a"]


def test_a_guess_takes_the_watched_request_and_only_lowers_scores() -> None:
    clock, cache, decide = setup()
    card = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 6),), observed=clock.now
    )
    cache.set_lease("a", lease("a", card.to_json()))
    cache.set_lease("b", lease("b", card.to_json()))
    cache.set_lease("c", lease("c", dataclasses.replace(card, shared=()).to_json()))
    cache.set_pod(pod("big", slices=6, node=""))  # the watch: it asks for 6 slices
    # The call claims 1 slice for the same pod; "a" is ranked first alone.
    call(decide, "prioritize", pod("big", slices=1), "a", "c")
    assert cache.counts()["guesses"] == 1
    # The guess counts 6 slices on "a" (the watched request), so another pod sees it fuller,
    ranked = scores(call(decide, "prioritize", pod("next", slices=2), "a", "b"))
    assert ranked["a"] < ranked["b"]
    # but the filter never drops a node for a guess.
    assert call(decide, "filter", pod("next", slices=6), "a", "b")["NodeNames"] == ["a", "b"]


def full_slices(observed: float) -> str:
    """A node whose one shared card has no free slice: a 2-slice pod does not fit there."""
    card = node_state.SharedCard("gcu0", 0, 6, 0)
    return node_state.NodeState(shared=(card,), observed=observed).to_json()


def fails_closed_to_neutral(decide: decisions.Decisions, name: str) -> None:
    """Prioritize scores the node neutrally and filter keeps it, for a pod it cannot fit."""
    assert scores(call(decide, "prioritize", pod("s", slices=2), name)) == {name: node_fit.NEUTRAL}
    assert call(decide, "filter", pod("s", slices=2), name)["NodeNames"] == [name]


def test_a_lease_not_renewed_is_neutral_whatever_its_state_says() -> None:
    clock, cache, decide = setup()
    # The state's own "observed" is fresh; the Lease's heartbeat is what counts, and it is old.
    stale = lease("a", full_slices(clock.now), renewed=clock.now - cache.max_age - 1)
    cache.set_lease("a", stale)
    fails_closed_to_neutral(decide, "a")
    cache.set_lease("a", lease("a", full_slices(clock.now)))  # renewed: the state counts again
    assert call(decide, "filter", pod("s", slices=2), "a")["NodeNames"] == []


def test_a_future_dated_lease_is_neutral() -> None:
    clock, cache, decide = setup()
    ahead = clock.now + cache.max_age + 1  # a node clock this far ahead would never go stale
    cache.set_lease("a", lease("a", full_slices(ahead), renewed=ahead))
    fails_closed_to_neutral(decide, "a")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda found: found["spec"].update(holderIdentity="node-b"), "held by 'node-b'"),
        (lambda found: found["spec"].pop("holderIdentity"), "held by None"),
        (lambda found: found["metadata"].update(name="node-b"), "Lease 'node-b' read as"),
        (lambda found: found["spec"].update(renewTime="yesterday"), "not an RFC 3339 time"),
        (lambda found: found["metadata"].pop("annotations"), "has no enflame.com/gcu-node-state"),
    ],
)
def test_a_foreign_or_malformed_lease_is_neutral(
    change: Any, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock, cache, decide = setup()
    found = lease("a", full_slices(clock.now))
    change(found)
    with caplog.at_level(logging.WARNING):
        cache.set_lease("a", found)
    assert says in caplog.text
    fails_closed_to_neutral(decide, "a")


def test_a_node_clock_ahead_keeps_a_just_bound_pod_counted(fresh: node_state.NodeState) -> None:
    clock, cache, decide = setup()
    skew = 60.0  # the node's clock runs a minute ahead of the extender's

    def renew(*held: int) -> None:
        cache.set_lease("a", lease("a", text(fresh, clock.now + skew, *held)))

    renew(2, 3, 4, 5, 6, 7)  # a free pair
    clock.now += 1
    cache.set_pod(pod("first", 2, node="a"))  # bound; the plugin has not seen it yet
    assert scores(call(decide, "prioritize", pod("second", 2), "a")) == {"a": node_fit.NO_FIT}
    clock.now += 4
    renew(2, 3, 4, 5, 6, 7)  # a heartbeat 4 s later: still within the admission grace
    assert scores(call(decide, "prioritize", pod("second", 2), "a")) == {"a": node_fit.NO_FIT}
    clock.now += cache.admission_grace
    renew(2, 3, 4, 5, 6, 7)  # read well after the binding, the pair still free: not there
    assert scores(call(decide, "prioritize", pod("second", 2), "a")) == {"a": 10}


def test_a_node_clock_ahead_does_not_cancel_a_release(fresh: node_state.NodeState) -> None:
    clock, cache, decide = setup()
    full = holding(fresh, clock.now + 60, old=[0, 1], rest=[2, 3, 4, 5, 6, 7])
    cache.set_lease("a", lease("a", full))
    cache.set_pod(pod("old", 2, node="a"))
    clock.now += 1
    cache.delete_pod("uid-old")  # ended after the state was read (on the extender's clock)
    assert scores(call(decide, "prioritize", pod("next", 2), "a")) == {"a": 10}


def test_a_per_container_cap_refusal_is_unresolvable() -> None:
    clock, cache, decide = setup()
    capped = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 6),), max_per_container=2, observed=clock.now
    )
    cache.set_lease("capped", lease("capped", capped.to_json()))
    cache.set_lease("full", lease("full", full_slices(clock.now)))
    answer = call(decide, "filter", pod("s", slices=3), "capped", "full")
    assert answer["NodeNames"] == []
    # Preempting pods frees slices on "full", never raises the cap of "capped".
    assert set(answer["FailedNodes"]) == {"full"}
    assert set(answer["FailedAndUnresolvableNodes"]) == {"capped"}
    assert "at most 2 per container" in answer["FailedAndUnresolvableNodes"]["capped"]
