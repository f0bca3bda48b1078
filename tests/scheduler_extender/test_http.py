"""The extender over real HTTP on loopback: protocol round trips, pending pods, bad input."""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu import devices, node_fit, node_state
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, protocol, server
from enflame_gcu.scheduler_extender import main as extender_main
from tests.scheduler_extender.leases import lease

WHOLE = [f"gcu{i}" for i in range(8)]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> node_state.NodeState:
    from enflame_gcu.simulation import simulate, topofile

    root = str(tmp_path_factory.mktemp("vendor"))
    simulate.create(root, topofile.load("vendor-8card"))
    return node_state.build(devices.discover(root), [], whole=WHOLE, shared={})


def busy(state: node_state.NodeState, *minors: int) -> str:
    """The state with ``minors`` held, observed now."""
    cards = tuple(dataclasses.replace(c, free=c.minor not in minors) for c in state.cards)
    return dataclasses.replace(state, cards=cards, observed=time.time()).to_json()


def waiting(p: dict[str, Any]) -> dict[str, Any]:
    """``p`` as the extender's watch of pods not yet bound shows it."""
    return {**p, "spec": {**p["spec"], "nodeName": ""}}


Extender = tuple[extender_cache.ClusterCache, server.ExtenderServer]


@pytest.fixture
def extender() -> Iterator[Extender]:
    cache = extender_cache.ClusterCache()
    http_server = server.ExtenderServer(("127.0.0.1", 0), decisions.Decisions(cache))
    http_server.start()
    yield cache, http_server
    http_server.stop()


def post(port: int, verb: str, body: bytes | dict[str, Any]) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", f"/{verb}", data, {"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if response.status == 200 else raw
    finally:
        connection.close()


def pod(name: str, cards: int = 0, slices: tuple[int, ...] = ()) -> dict[str, Any]:
    containers = []
    if cards:
        containers.append({"name": "c", "resources": {"limits": {"enflame.com/gcu": str(cards)}}})
    for index, count in enumerate(slices):
        containers.append(
            {"name": f"s{index}", "resources": {"limits": {"enflame.com/shared-gcu": count}}}
        )
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"containers": containers},
    }


def args(p: dict[str, Any], *names: str) -> dict[str, Any]:
    return {"Pod": p, "NodeNames": list(names)}


def scores(answer: list[dict[str, Any]]) -> dict[str, int]:
    return {entry["Host"]: entry["Score"] for entry in answer}


def test_prioritize_prefers_the_node_with_a_free_pair(
    extender: Extender, fresh: node_state.NodeState
) -> None:
    cache, http_server = extender
    cache.set_lease("pair", lease("pair", busy(fresh, 2, 3, 4, 5, 6)))
    cache.set_lease("split", lease("split", busy(fresh, 0, 3, 4, 6, 7)))
    status, answer = post(http_server.port, "prioritize", args(pod("p", 2), "split", "pair"))
    assert status == 200
    assert [entry["Host"] for entry in answer] == ["split", "pair"]  # the order asked
    assert scores(answer)["pair"] > scores(answer)["split"] > 0


def test_filter_keeps_every_node_for_whole_cards_and_answers_names(
    extender: Extender, fresh: node_state.NodeState
) -> None:
    cache, http_server = extender
    cache.set_lease("full", lease("full", busy(fresh, *range(8))))
    status, answer = post(http_server.port, "filter", args(pod("p", 2), "full", "unknown"))
    assert status == 200
    assert answer == {"NodeNames": ["full", "unknown"], "FailedNodes": {}, "Error": ""}


def test_filter_drops_nodes_without_the_slices_and_keeps_spread_ones(extender: Extender) -> None:
    cache, http_server = extender
    spread = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 2), node_state.SharedCard("gcu1", 1, 6, 2)),
        observed=time.time(),
    )
    little = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 2),), observed=time.time()
    )
    cache.set_lease("spread", lease("spread", spread.to_json()))
    cache.set_lease("little", lease("little", little.to_json()))
    status, answer = post(
        http_server.port, "filter", args(pod("s", slices=(3,)), "spread", "little")
    )
    assert status == 200
    assert answer["NodeNames"] == ["spread"]  # packed gives 2 of gcu0 and 1 of gcu1
    assert "2 free slice(s) for 3" in answer["FailedNodes"]["little"]


def test_whole_node_objects_come_back_as_node_objects(fresh: node_state.NodeState) -> None:
    # nodeCacheCapable false: the scheduler sends Node objects; the states are still the
    # Leases', and a state annotation on a Node (anyone who may write Nodes could put one
    # there) is not read.
    cache = extender_cache.ClusterCache()
    decide = decisions.Decisions(cache)
    for name, taken in (("pair", (2, 3, 4, 5, 6)), ("split", (0, 3, 4, 6, 7))):
        cache.set_lease(name, lease(name, busy(fresh, *taken)))
    planted = {node_state.ANNOTATION: busy(fresh)}
    nodes = [
        {"metadata": {"name": n, "annotations": planted}} for n in ("pair", "split", "planted")
    ]
    body = json.dumps({"Pod": pod("p", 2), "Nodes": {"items": nodes}}).encode()
    filtered = json.loads(decide.filter(body))
    assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == [
        "pair", "split", "planted"
    ]  # fmt: skip
    ranked = scores(json.loads(decide.prioritize(body)))
    assert ranked["pair"] > ranked["split"]
    assert ranked["planted"] == node_fit.NEUTRAL


def test_a_bound_pod_not_yet_in_the_state_counts_against_its_node(
    extender: Extender, fresh: node_state.NodeState
) -> None:
    cache, http_server = extender
    for name in ("a", "b"):
        cache.set_lease(name, lease(name, busy(fresh, 2, 3, 4, 5, 6, 7)))
    first = pod("first", 2)
    cache.set_pod({**first, "spec": {**first["spec"], "nodeName": "a"}})
    _, answer = post(http_server.port, "prioritize", args(pod("second", 2), "a", "b"))
    assert scores(answer) == {"a": 0, "b": 10}


def test_a_burst_does_not_send_two_pods_to_one_free_pair_before_a_binding_is_seen(
    extender: Extender, fresh: node_state.NodeState
) -> None:
    cache, http_server = extender
    cache.set_lease("pair", lease("pair", busy(fresh, 2, 3, 4, 5, 6, 7)))  # exact fit
    cache.set_lease("fresh", lease("fresh", busy(fresh)))
    for name in ("p0", "p1"):
        cache.set_pod(waiting(pod(name, 2)))
    _, first = post(http_server.port, "prioritize", args(pod("p0", 2), "pair", "fresh"))
    assert scores(first) == {"pair": 10, "fresh": 8}  # ranked first alone: held there
    _, second = post(http_server.port, "prioritize", args(pod("p1", 2), "pair", "fresh"))
    # The guess fills the pair: lowest of the nodes that fit, never "does not fit".
    assert scores(second) == {"pair": 1, "fresh": 8}


def test_tied_nodes_hold_no_guess(extender: Extender, fresh: node_state.NodeState) -> None:
    cache, http_server = extender
    for name in ("a", "b"):
        cache.set_lease(name, lease(name, busy(fresh, 2, 3, 4, 5, 6, 7)))
    for index in range(2):  # the scheduler's other plugins choose between a and b
        _, answer = post(http_server.port, "prioritize", args(pod(f"p{index}", 2), "a", "b"))
        assert scores(answer) == {"a": 10, "b": 10}
    assert cache.counts()["guesses"] == 0


def test_the_state_listing_a_pod_ends_its_pending_count(
    extender: Extender, fresh: node_state.NodeState
) -> None:
    cache, http_server = extender
    first = pod("first", 2)
    cache.set_pod({**first, "spec": {**first["spec"], "nodeName": "a"}})
    state = node_state.parse(busy(fresh, 2, 3, 4, 5, 6, 7))
    listed = dataclasses.replace(state, pods=frozenset({"ml/first"})).to_json()
    cache.set_lease("a", lease("a", listed))
    _, answer = post(http_server.port, "prioritize", args(pod("second", 2), "a"))
    assert scores(answer) == {"a": 10}  # the state already shows its cards as they are


@pytest.mark.parametrize(
    ("annotation", "logged"),
    [
        ("{broken", "not JSON"),
        (json.dumps({"version": 99, "cards": []}), "version 99 is not known"),
        (
            json.dumps(
                {
                    "version": 2,
                    "observed": 1.0,
                    "sharing": {"policy": "packed", "maxSlicesPerContainer": 0},
                    "cards": "all",
                }
            ),
            "'cards' is a str",
        ),
    ],
)
def test_a_bad_annotation_is_one_log_line_and_a_neutral_score(
    extender: Extender,
    fresh: node_state.NodeState,
    caplog: pytest.LogCaptureFixture,
    annotation: str,
    logged: str,
) -> None:
    cache, http_server = extender
    with caplog.at_level(logging.WARNING):
        cache.set_lease("bad", lease("bad", annotation))
        cache.set_lease("bad", lease("bad", annotation))  # same text: not again
        cache.set_lease("good", lease("good", busy(fresh)))
    lines = [r.getMessage() for r in caplog.records if "bad" in r.getMessage()]
    assert len(lines) == 1 and logged in lines[0] and "neutral" in lines[0]
    status, answer = post(http_server.port, "prioritize", args(pod("p", 2), "bad", "good"))
    assert status == 200
    assert scores(answer) == {"bad": node_fit.NEUTRAL, "good": 8}
    status, answer = post(http_server.port, "filter", args(pod("s", slices=(2,)), "bad"))
    assert (status, answer["NodeNames"]) == (200, ["bad"])


@pytest.mark.parametrize(
    ("body", "filter_answer"),
    [
        (b"{not json", {"Error"}),
        (b"[1, 2]", {"Error"}),
        (json.dumps({"NodeNames": ["a"]}).encode(), {"NodeNames", "FailedNodes", "Error"}),
        (
            json.dumps(
                {
                    "Pod": {
                        "spec": {
                            "containers": [{"resources": {"limits": {"enflame.com/gcu": "1.5"}}}]
                        }
                    },
                    "NodeNames": ["a"],
                }
            ).encode(),
            {"NodeNames", "FailedNodes", "Error"},
        ),
        (json.dumps({"Pod": pod("p", 1), "NodeNames": "a"}).encode(), {"Error"}),
        (
            json.dumps(
                args(pod("p", 1), *[f"n{i}" for i in range(protocol.MAX_NODES + 1)])
            ).encode(),
            {"NodeNames", "FailedNodes", "Error"},
        ),
    ],
)
def test_bad_calls_get_a_log_line_and_a_neutral_200(
    extender: Extender,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    filter_answer: set[str],
) -> None:
    _, http_server = extender
    with caplog.at_level(logging.WARNING):
        status, answer = post(http_server.port, "prioritize", body)
        assert (status, answer) == (200, [])
        status, answer = post(http_server.port, "filter", body)
    assert status == 200
    assert set(answer) == filter_answer
    if "NodeNames" in answer:  # whatever names it could read pass unfiltered
        assert answer["FailedNodes"] == {} and answer["Error"] == ""
    else:
        assert answer["Error"].startswith("enflame-scheduler-extender: ")
    assert any(
        "neutral" in r.getMessage()
        or "unfiltered" in r.getMessage()
        or "answering an Error" in r.getMessage()
        for r in caplog.records
    )


def test_an_oversized_body_is_refused_before_it_is_read(extender: Extender) -> None:
    _, http_server = extender
    connection = http.client.HTTPConnection("127.0.0.1", http_server.port, timeout=10)
    connection.putrequest("POST", "/prioritize")
    connection.putheader("Content-Length", str(server.MAX_BODY + 1))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    connection.close()


def test_keep_alive_probes_and_stats(extender: Extender, fresh: node_state.NodeState) -> None:
    cache, http_server = extender
    cache.set_lease("a", lease("a", busy(fresh)))
    connection = http.client.HTTPConnection("127.0.0.1", http_server.port, timeout=10)
    body = json.dumps(args(pod("p", 1), "a")).encode()
    for _ in range(3):  # one connection, three calls
        connection.request("POST", "/prioritize", body)
        assert json.loads(connection.getresponse().read()) == [{"Host": "a", "Score": 8}]
    connection.request("GET", "/healthz")
    assert connection.getresponse().read() == b"ok\n"
    connection.request("GET", "/stats")
    stats = json.loads(connection.getresponse().read())
    assert stats["verbs"]["prioritize"]["calls"] == 3
    assert stats["cache"]["nodes_with_state"] == 1
    connection.request("POST", "/bind", b"{}")
    assert connection.getresponse().status == 404
    connection.close()


def test_closing_ends_kept_alive_connections_at_once(fresh: node_state.NodeState) -> None:
    cache = extender_cache.ClusterCache()
    http_server = server.ExtenderServer(("127.0.0.1", 0), decisions.Decisions(cache))
    http_server.start()
    connection = http.client.HTTPConnection("127.0.0.1", http_server.port, timeout=10)
    connection.request("GET", "/healthz")
    assert connection.getresponse().read() == b"ok\n"  # the connection stays open, idle
    started = time.monotonic()
    http_server.stop()
    assert time.monotonic() - started < 5  # not the 30 s idle timeout
    assert connection.sock is not None and connection.sock.recv(1) == b""
    connection.close()


def test_the_exec_probe_asks_readyz_from_inside_the_pod() -> None:
    ready = [False]
    cache = extender_cache.ClusterCache()
    http_server = server.ExtenderServer(
        ("127.0.0.1", 0),
        decisions.Decisions(cache),
        ready=lambda: (ready[0], "ok" if ready[0] else "not listed yet: nodes"),
    )
    http_server.start()
    try:
        probe = ["--check-ready", "--bind-address=127.0.0.1", f"--port={http_server.port}"]
        assert extender_main.main(probe) == 1
        ready[0] = True
        assert extender_main.main(probe) == 0
    finally:
        http_server.stop()
    assert extender_main.main(probe) == 1  # nothing listens any more


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics, parsed by Prometheus' own text parser: (sample, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    finally:
        connection.close()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_calls_latency_refusals_and_the_caches_age(
    extender: Extender, fresh: node_state.NodeState
) -> None:
    cache, http_server = extender
    cache.set_lease("pair", lease("pair", busy(fresh, 2, 3, 4, 5, 6, 7)))
    stale = dataclasses.replace(fresh, observed=time.time() - 3600).to_json()
    cache.set_lease("old", lease("old", stale))
    cache.set_lease("bad", lease("bad", "{not json"))
    small = node_state.NodeState(
        shared=(node_state.SharedCard("gcu0", 0, 6, 1),), max_per_container=2, observed=time.time()
    )
    cache.set_lease("small", lease("small", small.to_json()))
    for _ in range(3):
        post(http_server.port, "prioritize", args(pod("p", 2), "pair", "old"))
    # Neither has 2 free slices ("pair" shares no card): two refusals for slices.
    post(http_server.port, "filter", args(pod("s", slices=(2,)), "small", "pair"))
    post(http_server.port, "filter", args(pod("t", slices=(3,)), "small"))  # over the cap
    found = scrape(http_server.port)
    prefix = "enflame_scheduler_extender"
    assert found[(f"{prefix}_calls_total", (("verb", "prioritize"),))] == 3
    assert found[(f"{prefix}_calls_total", (("verb", "filter"),))] == 2
    assert found[(f"{prefix}_call_duration_seconds_count", (("verb", "prioritize"),))] == 3
    assert (
        found[(f"{prefix}_call_duration_seconds_bucket", (("le", "+Inf"), ("verb", "filter")))] == 2
    )
    assert found[(f"{prefix}_refusals_total", (("reason", "slices"),))] == 2
    assert found[(f"{prefix}_refusals_total", (("reason", "per_container_cap"),))] == 1
    states = {
        dict(labels)["status"]: value
        for (name, labels), value in found.items()
        if name == f"{prefix}_node_states"
    }
    assert states == {"fresh": 2, "stale": 1, "future": 0, "unreadable": 1}
    assert 0 <= found[(f"{prefix}_node_state_oldest_age_seconds", ())] < 60
    assert 0 <= found[(f"{prefix}_cache_update_age_seconds", ())] < 60
    assert found[(f"{prefix}_cached_pods", (("kind", "bound"),))] == 0
