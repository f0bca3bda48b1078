"""The per-node score memo behind prioritize (issue 38): the same scores as computing every
node's view afresh, on seeded random cluster histories, and dropped whenever a node's view can
change (its state, a pod bound to it or leaving it, the node removed, a guess placed or gone)."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest

from enflame_gcu import devices, node_fit, node_state
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, protocol
from tests.scheduler_extender.leases import lease

WHOLE = [f"gcu{i}" for i in range(8)]
GCU, SHARED = "enflame.com/gcu", "enflame.com/shared-gcu"


class Clock:
    """The cache's two clocks (monotonic and wall), moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def vendor(tmp_path_factory: pytest.TempPathFactory) -> node_state.NodeState:
    from enflame_gcu.simulation import simulate, topofile

    root = str(tmp_path_factory.mktemp("vendor"))
    simulate.create(root, topofile.load("vendor-8card"))
    return node_state.build(devices.discover(root), [], whole=WHOLE, shared={})


def pod_object(
    name: str, cards: int = 0, slices: tuple[int, ...] = (), node: str | None = None
) -> dict[str, Any]:
    containers: list[dict[str, Any]] = []
    if cards:
        containers.append({"name": "c", "resources": {"limits": {GCU: str(cards)}}})
    for index, count in enumerate(slices):
        containers.append({"name": f"s{index}", "resources": {"limits": {SHARED: str(count)}}})
    spec: dict[str, Any] = {"containers": containers}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": spec}


def args(p: dict[str, Any], names: list[str]) -> protocol.ExtenderArgs:
    body = json.dumps({"Pod": p, "NodeNames": names}).encode()
    return protocol.parse_args(body, GCU, SHARED)


def random_state(
    rng: random.Random, vendor: node_state.NodeState, now: float, keys: list[str]
) -> str:
    """An annotation: random free cards, sometimes a card as slices, some pods listed, an
    observed time that is fresh, stale or ahead; now and then not a state at all."""
    roll = rng.random()
    if roll < 0.04:
        return "{not json"
    if roll < 0.07:
        return json.dumps({"version": 99})
    busy = set(rng.sample(range(8), rng.randint(0, 8)))
    cards = tuple(dataclasses.replace(c, free=c.minor not in busy) for c in vendor.cards)
    shared: tuple[node_state.SharedCard, ...] = ()
    if rng.random() < 0.5:
        cards = cards[:7]
        slices = rng.choice((4, 6))
        shared = (node_state.SharedCard("gcu7", 7, slices, rng.randint(0, slices)),)
    observed = now - rng.choice((0, 1, 30, 200)) + rng.choice((0, 0, 0, 400))
    listed = frozenset(rng.sample(keys, min(len(keys), rng.randint(0, 3))))
    return dataclasses.replace(
        vendor,
        cards=cards,
        shared=shared,
        pods=listed,
        policy=rng.choice(("packed", "distributed")),
        max_per_container=rng.choice((0, 0, 4)),
        observed=observed,
    ).to_json()


def random_request(rng: random.Random) -> tuple[int, tuple[int, ...]]:
    if rng.random() < 0.6:
        return rng.choice((1, 2, 4, 8)), ()
    return 0, tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 2)))


def test_memoized_scores_equal_fresh_scores_on_random_histories(
    vendor: node_state.NodeState,
) -> None:
    """Each step of a seeded random history changes the cluster one way; after each, every
    request's scores from the memo must equal the scores computed from fresh views, byte for
    byte in the answer. A memo that misses any invalidation, or scores differently, fails."""
    compared = differing_requests = filtered = 0
    for seed in range(6):
        rng = random.Random(seed)  # noqa: S311 (a seeded test history)
        clock = Clock()
        cache = extender_cache.ClusterCache(clock=clock, wall=clock)
        decide = decisions.Decisions(cache)
        nodes = [f"n{i}" for i in range(24)]
        pods: dict[str, tuple[int, tuple[int, ...]]] = {}
        keys: list[str] = []
        for name in nodes:
            cache.set_lease(name, lease(name, random_state(rng, vendor, clock.now, [])))
        for step in range(220):
            action = rng.random()
            if action < 0.25:
                name = rng.choice(nodes)
                cache.set_lease(name, lease(name, random_state(rng, vendor, clock.now, keys)))
            elif action < 0.33:  # the node's Lease deleted (the plugin stopped, the node went)
                cache.delete_lease(rng.choice(nodes))
            elif action < 0.50:
                name = f"p{seed}-{step}"
                pods[name] = random_request(rng)
                cards, slices = pods[name]
                cache.set_pod(pod_object(name, cards, slices, node=""))  # waiting
            elif action < 0.65 and pods:
                name = rng.choice(sorted(pods))
                cards, slices = pods[name]
                cache.set_pod(pod_object(name, cards, slices, node=rng.choice(nodes)))
                keys.append(f"ml/{name}")
            elif action < 0.72 and pods:
                name = rng.choice(sorted(pods))
                cache.delete_pod(f"uid-{name}")
            elif action < 0.75 and pods:
                name = rng.choice(sorted(pods))
                cards, slices = pods[name]
                done = pod_object(name, cards, slices, node=rng.choice(nodes))
                done["status"] = {"phase": "Succeeded"}
                cache.set_pod(done)
            elif action < 0.85:
                clock.now += rng.choice((0.5, 2.0, 6.0, 20.0))
            elif action < 0.88:  # a fresh listing of nodes (the watch restarted)
                kept = rng.sample(nodes, len(nodes) - 2)
                cache.replace_leases(
                    {n: lease(n, random_state(rng, vendor, clock.now, keys)) for n in kept}
                )
            elif action < 0.91 and pods:  # a fresh listing of bound pods: some are gone
                kept_pods = rng.sample(sorted(pods), len(pods) // 2)
                cache.replace_pods(
                    pod_object(n, *pods[n], node=rng.choice(nodes)) for n in kept_pods
                )
            # A scheduling call of a waiting pod: it may plant a guess, as in production.
            if pods and rng.random() < 0.5:
                name = rng.choice(sorted(pods))
                cards, slices = pods[name]
                decide.prioritize(
                    json.dumps(
                        {"Pod": pod_object(name, cards, slices), "NodeNames": nodes}
                    ).encode()
                )
            names = [*rng.sample(nodes, rng.randint(1, len(nodes))), "unseen", nodes[0]]
            for _ in range(3):
                if pods and rng.random() < 0.5:  # the pod itself may hold a guess or a node
                    name = rng.choice(sorted(pods))
                    cards, slices = pods[name]
                else:
                    name = f"new{step}"
                    cards, slices = random_request(rng)
                call = args(pod_object(name, cards, slices), names)
                memo = decide.scores(call)
                fresh = decide.scores_from_views(call)
                assert memo == fresh, (seed, step, call.pod)
                assert list(memo) == list(fresh)
                assert (
                    protocol.priority_list(memo)
                    == json.dumps(
                        [{"Host": h, "Score": s} for h, s in fresh.items()], separators=(",", ":")
                    ).encode()
                )
                compared += len(memo)
                differing_requests += len(set(memo.values())) > 1
                if slices:  # the filter's memo against the fresh views too
                    body = json.dumps({"Pod": pod_object(name, cards, slices), "NodeNames": names})
                    answer = json.loads(decide.filter(body.encode()))
                    views = cache.views(names, exclude=call.pod.uid)
                    refused = {
                        node: f"enflame.com/shared-gcu: {fit.reason}"
                        for node, view in views.items()
                        if view.state is not None
                        for fit in [node_fit.shared_slices(view.state, view.pending_slices, slices)]
                        if not fit.fits
                    }
                    assert answer["FailedNodes"] == refused, (seed, step, call.pod)
                    assert answer["NodeNames"] == [n for n in names if n not in refused]
                    filtered += len(refused)
    assert compared > 10_000
    assert differing_requests > 500  # the histories rank nodes, not only "unknown"
    assert filtered > 500  # and the filter refuses nodes in them


def setup(
    vendor: node_state.NodeState,
) -> tuple[Clock, extender_cache.ClusterCache, decisions.Decisions]:
    clock = Clock()
    cache = extender_cache.ClusterCache(clock=clock, wall=clock)
    return clock, cache, decisions.Decisions(cache)


def state(vendor: node_state.NodeState, observed: float, *held: int) -> str:
    cards = tuple(dataclasses.replace(c, free=c.minor not in held) for c in vendor.cards)
    return dataclasses.replace(vendor, cards=cards, observed=observed).to_json()


def prioritize(decide: decisions.Decisions, p: dict[str, Any], *names: str) -> dict[str, int]:
    body = json.dumps({"Pod": p, "NodeNames": list(names)}).encode()
    return {e["Host"]: e["Score"] for e in json.loads(decide.prioritize(body))}


def test_a_node_state_change_changes_the_memoized_answer(vendor: node_state.NodeState) -> None:
    clock, cache, decide = setup(vendor)
    cache.set_lease("a", lease("a", state(vendor, clock.now)))
    cache.set_lease("b", lease("b", state(vendor, clock.now, 2, 3, 4, 5, 6, 7)))
    asker = pod_object("asker", 2)
    assert prioritize(decide, asker, "a", "b") == {"a": 8, "b": 10}  # memo filled
    cache.set_lease("b", lease("b", state(vendor, clock.now, *range(8))))
    assert prioritize(decide, asker, "a", "b") == {"a": 8, "b": node_fit.NO_FIT}
    clock.now += cache.max_age + 1  # no refresh: both states go stale, memo or not
    assert prioritize(decide, asker, "a", "b") == {"a": 5, "b": 5}


def test_a_pending_pod_bound_changes_the_memoized_answer(vendor: node_state.NodeState) -> None:
    clock, cache, decide = setup(vendor)
    cache.set_lease("a", lease("a", state(vendor, clock.now, 2, 3, 4, 5, 6, 7)))
    asker = pod_object("asker", 2)
    assert prioritize(decide, asker, "a") == {"a": 10}
    cache.set_pod(pod_object("first", 2, node="a"))  # bound, not yet in the state
    assert prioritize(decide, asker, "a") == {"a": node_fit.NO_FIT}
    cache.delete_pod("uid-first")
    assert prioritize(decide, asker, "a") == {"a": 10}


def test_a_removed_node_changes_the_memoized_answer(vendor: node_state.NodeState) -> None:
    clock, cache, decide = setup(vendor)
    cache.set_lease("a", lease("a", state(vendor, clock.now, 2, 3, 4, 5, 6, 7)))
    asker = pod_object("asker", 2)
    assert prioritize(decide, asker, "a") == {"a": 10}
    cache.delete_lease("a")
    assert prioritize(decide, asker, "a") == {"a": node_fit.NEUTRAL}
    cache.set_lease("a", lease("a", state(vendor, clock.now, *range(8))))
    assert prioritize(decide, asker, "a") == {"a": node_fit.NO_FIT}
    cache.replace_leases({"b": lease("b", state(vendor, clock.now))})  # a fresh listing without "a"
    assert prioritize(decide, asker, "a") == {"a": node_fit.NEUTRAL}


def test_a_guess_placed_and_expired_changes_the_memoized_answer(
    vendor: node_state.NodeState,
) -> None:
    clock, cache, decide = setup(vendor)
    cache.set_lease("pair", lease("pair", state(vendor, clock.now, 2, 3, 4, 5, 6, 7)))
    cache.set_lease("fresh", lease("fresh", state(vendor, clock.now)))
    other = pod_object("other", 2)
    assert prioritize(decide, other, "pair", "fresh") == {"pair": 10, "fresh": 8}
    waiting = pod_object("waiting", 2, node="")
    cache.set_pod(waiting)
    # Ranked first alone: held on "pair" for guess_ttl, which another pod then sees.
    assert prioritize(decide, waiting, "pair", "fresh") == {"pair": 10, "fresh": 8}
    assert prioritize(decide, other, "pair", "fresh") == {"pair": 1, "fresh": 8}
    # The pod's own guess does not count against itself.
    assert prioritize(decide, waiting, "pair", "fresh") == {"pair": 10, "fresh": 8}
    # Ranked first alone elsewhere: the guess moves, and the old node is free again.
    cache.set_lease("pair2", lease("pair2", state(vendor, clock.now, 2, 3, 4, 5, 6, 7)))
    assert prioritize(decide, other, "pair", "fresh") == {"pair": 1, "fresh": 8}
    assert prioritize(decide, waiting, "pair2", "fresh") == {"pair2": 10, "fresh": 8}
    assert prioritize(decide, other, "pair", "pair2") == {"pair": 10, "pair2": 1}
    clock.now += cache.guess_ttl
    assert prioritize(decide, other, "pair2", "fresh") == {"pair2": 10, "fresh": 8}


def test_the_pods_own_binding_is_not_counted_against_it(vendor: node_state.NodeState) -> None:
    clock, cache, decide = setup(vendor)
    cache.set_lease("a", lease("a", state(vendor, clock.now, 2, 3, 4, 5, 6, 7)))
    cache.set_pod(pod_object("self", 2, node="a"))
    assert prioritize(decide, pod_object("other", 2), "a") == {"a": node_fit.NO_FIT}
    assert prioritize(decide, pod_object("self", 2), "a") == {"a": 10}
    assert prioritize(decide, pod_object("other", 2), "a") == {"a": node_fit.NO_FIT}


def test_the_priority_list_is_json_dumps_byte_for_byte() -> None:
    scores = {"n1": 10, 'we"ird\\': 0, "ünï\u2028": 5, "": 7}
    expected = json.dumps(
        [{"Host": h, "Score": s} for h, s in scores.items()], separators=(",", ":")
    ).encode()
    assert protocol.priority_list(scores) == expected


def test_a_release_past_its_grace_leaves_the_memoized_answer(vendor: node_state.NodeState) -> None:
    clock, cache, decide = setup(vendor)
    owner = {minor: "ml/old" if minor < 2 else "ml/rest" for minor in range(8)}
    cards = tuple(
        dataclasses.replace(c, free=False, holder=owner[c.minor]) for c in vendor.cards
    )  # fmt: skip
    held = dataclasses.replace(
        vendor, cards=cards, pods=frozenset(owner.values()), observed=clock.now
    )
    cache.set_lease("a", lease("a", held.to_json()))
    cache.set_pod(pod_object("old", 2, node="a"))
    cache.set_pod(pod_object("rest", 6, node="a"))
    asker = pod_object("asker", 2)
    clock.now += 1
    cache.delete_pod("uid-old")  # its cards count as free until the plugin reads again
    assert prioritize(decide, asker, "a") == {"a": 10}
    clock.now += cache.admission_grace + 1  # by now the plugin has read: its state's word
    assert prioritize(decide, asker, "a") == {"a": node_fit.NO_FIT}
    assert decide.scores_from_views(args(asker, ["a"])) == {"a": node_fit.NO_FIT}


def test_an_answer_computed_while_its_node_changed_is_not_kept(
    vendor: node_state.NodeState,
) -> None:
    """Answers are computed outside the lock: a node whose state changes meanwhile (the watch
    thread) must not keep the answer computed from its old state (issue 49's column memo)."""
    clock = Clock()
    cache = extender_cache.ClusterCache(clock=clock, wall=clock)
    all_free = dataclasses.replace(vendor, observed=clock.now).to_json()
    busy = tuple(dataclasses.replace(c, free=c.minor >= 6) for c in vendor.cards)
    two_free = dataclasses.replace(vendor, cards=busy, observed=clock.now).to_json()
    cache.set_lease("n0", lease("n0", all_free))
    cache.set_lease("n1", lease("n1", all_free))

    def free(view: extender_cache.NodeView) -> int:
        assert view.state is not None
        return sum(card.free for card in view.state.cards)

    def free_while_n0_changes(view: extender_cache.NodeView) -> int:
        found = free(view)
        if found == 8 and "n0" in calls:
            calls.remove("n0")
            clock.now += 1  # a renewal with new content, while n0's answer is in hand
            cache.set_lease("n0", lease("n0", two_free, renewed=clock.now))
        return found

    calls = ["n0"]
    first = cache.answers(["n0", "n1"], "", "free", free_while_n0_changes, -1)
    assert first == {"n0": 8, "n1": 8}  # answered from the state it read
    assert cache.answers(["n0", "n1"], "", "free", free, -1) == {"n0": 2, "n1": 8}


def test_the_priority_list_keeps_host_prefixes_bounded_and_writes_what_json_writes() -> None:
    """The kept '{"Host":...,"Score":' prefixes: any host name and score written as json.dumps
    writes them, a name past the length bound answered but not kept, the table starting
    again past its bound (issue 49)."""
    odd = {'a"b\\c': 3, "gcu-节点-é": 10, "x" * 300: 0, "": 7, "n-1": -1, "n11": 11, "t": True}
    for _ in range(2):  # from an empty table, then from the kept one
        assert (
            protocol.priority_list(odd)
            == json.dumps(
                [{"Host": h, "Score": int(s)} for h, s in odd.items()], separators=(",", ":")
            ).encode()
        )
    hosts = protocol._HostPrefixes(limit=4, longest=10)
    table = hosts.prefixes(dict.fromkeys(["a", "b", "y" * 11], 0))
    assert set(table) == {"a", "b", "y" * 11}  # all answered
    assert set(hosts.prefixes({"a": 0})) == {"a", "b"}  # the long name was not kept
    table = hosts.prefixes(dict.fromkeys("cdefg", 0))  # 2 + 5 > 4: starts again
    assert set(table) == set("cdefg")
    assert len(hosts.prefixes({"c": 0})) == 4  # four kept, the fifth answered only
