"""The node state: built from cards and holders, written compactly, read strictly, carried on
the node's own Lease."""

from __future__ import annotations

import json

import pytest

from enflame_gcu import devices, holders, node_state, sharing
from enflame_gcu.errors import NodeStateError

GCU, _VGCU, SHARED = holders.DEFAULT_RESOURCES
WHOLE = [f"gcu{i}" for i in range(8)]


def held(pod: str, resource: str, *ids: str) -> holders.Holding:
    return holders.Holding("ml", pod, "main", resource, ids)


def test_free_cards_groups_and_holder_pods_of_the_vendor_machine(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    state = node_state.build(
        inventory, [held("train", GCU, "gcu0", "gcu1")], whole=WHOLE, shared={}
    )
    assert state.free == {f"gcu{i}" for i in range(2, 8)}
    assert state.pods == {"ml/train"}
    by_name = {card.name: card for card in state.cards}
    assert by_name["gcu0"].switch == by_name["gcu1"].switch != by_name["gcu2"].switch
    assert by_name["gcu0"].port == by_name["gcu3"].port != by_name["gcu4"].port
    assert (by_name["gcu0"].numa, by_name["gcu7"].numa) == ("numa0", "numa1")
    assert state.shared_capacity() is None


def test_unhealthy_cards_are_not_free(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    state = node_state.build(
        inventory, [], whole=WHOLE, shared={}, health={"gcu5": (False, "gone")}
    )
    assert "gcu5" not in state.free
    assert len(state.free) == 7


def test_shared_cards_count_free_slices_and_write_the_gcushare_annotation(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    holding = [held("a", SHARED, "gcu6-slice0", "gcu6-slice1"), held("b", SHARED, "gcu7-slice3")]
    state = node_state.build(inventory, holding, whole=WHOLE[:6], shared={"gcu6": 6, "gcu7": 4})
    assert [(s.name, s.slices, s.free) for s in state.shared] == [("gcu6", 6, 4), ("gcu7", 4, 3)]
    assert json.loads(state.shared_capacity() or "") == {"6": 4, "7": 3}
    assert len(state.cards) == 6


def test_the_text_round_trips_and_equal_states_give_equal_text(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    state = node_state.build(inventory, [held("t", GCU, "gcu4")], whole=WHOLE, shared={"gcu7": 6})
    text = state.to_json()
    assert node_state.parse(text) == state
    again = node_state.build(inventory, [held("t", GCU, "gcu4")], whole=WHOLE, shared={"gcu7": 6})
    assert again.to_json() == text
    assert json.loads(text)["version"] == node_state.VERSION


def test_the_slice_policy_cap_and_observed_time_are_published(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    settings = sharing.SharingSettings(policy="distributed", max_slices_per_container=3)
    state = node_state.build(
        inventory, [], whole=WHOLE[:7], shared={"gcu7": 6}, settings=settings, observed=1234.5
    )
    document = json.loads(state.to_json())
    assert document["sharing"] == {"policy": "distributed", "maxSlicesPerContainer": 3}
    assert document["observed"] == 1234.5
    again = node_state.parse(state.to_json())
    assert (again.policy, again.max_per_container, again.observed) == ("distributed", 3, 1234.5)


def _good() -> dict[str, object]:
    return {
        "version": 2,
        "observed": 1796000000.5,
        "sharing": {"policy": "packed", "maxSlicesPerContainer": 0},
        "cards": [
            {"name": "gcu0", "minor": 0, "switch": "s", "port": "p", "numa": "n", "free": True}
        ],
        "shared": [{"name": "gcu1", "minor": 1, "slices": 6, "free": 2}],
        "pods": ["ns/p"],
    }


def document_root(path: tuple[object, ...], value: object) -> object:
    root = _good()
    target: object = root
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    return root


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ("[]", "not an object"),
        (json.dumps(document_root(("version",), 1)), "version 1 is not known"),
        (json.dumps(document_root(("observed",), "now")), "observed is 'now'"),
        (json.dumps(document_root(("observed",), True)), "observed is True"),
        (json.dumps(document_root(("sharing",), None)), "sharing is a NoneType"),
        (json.dumps(document_root(("sharing", "policy"), "fair")), "not one this reader"),
        (json.dumps(document_root(("sharing", "maxSlicesPerContainer"), -1)), "maxSlices"),
        (json.dumps(document_root(("version",), None)), "version None"),
        (json.dumps(document_root(("cards",), {})), "'cards' is a dict"),
        (json.dumps(document_root(("cards", 0, "free"), "yes")), "cards[0].free"),
        (json.dumps(document_root(("cards", 0, "minor"), -1)), "cards[0].minor"),
        (json.dumps(document_root(("cards", 0, "name"), "card0")), "not gcuN"),
        (json.dumps(document_root(("cards", 0), {"name": "gcu0"})), "lacks free, minor"),
        (json.dumps(document_root(("shared", 0, "free"), 7)), "shared[0].free"),
        (json.dumps(document_root(("pods",), ["ok", ""])), "pods[1]"),
        (json.dumps(document_root(("cards", 0, "pod"), "ns/p")), "free yet held by 'ns/p'"),
        (json.dumps(document_root(("cards", 0, "pod"), 7)), "cards[0].pod is 7"),
        (json.dumps(document_root(("shared", 0, "pods"), ["ns/p"])), "pods is a list"),
        (json.dumps(document_root(("shared", 0, "pods"), {"ns/p": 5})), "hold 5 slices"),
        (json.dumps(document_root(("shared", 0, "pods"), {"ns/p": 0})), "each at least 1"),
        (json.dumps(document_root(("shared", 0, "pods"), {"ns/p": "2"})), "pods['ns/p']"),
        (json.dumps(document_root(("shared", 0, "pods"), {"ns/q": 1})), "which pods does not"),
        (json.dumps(document_root(("pods",), ["p"] * (node_state.MAX_PODS + 1))), "more than"),
        ("[" * 200_000 + "]" * 200_000, "bytes, more than"),
        ("[" * 50_000 + "]" * 50_000, "not JSON"),
    ],
)
def test_bad_annotations_are_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(NodeStateError, match=None) as caught:
        node_state.parse(text)
    assert says in str(caught.value)


def test_holders_are_written_for_healthy_cards_and_released_exactly(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    holding = [
        held("train", GCU, "gcu0", "gcu1"),
        held("sick", GCU, "gcu2"),
        held("a", SHARED, "gcu7-slice0", "gcu7-slice1"),
        held("b", SHARED, "gcu7-slice4"),
    ]
    state = node_state.build(
        inventory, holding, whole=WHOLE[:7], shared={"gcu7": 6}, health={"gcu2": (False, "x")}
    )
    document = json.loads(state.to_json())
    assert [c.get("pod") for c in document["cards"][:4]] == ["ml/train", "ml/train", None, None]
    assert document["shared"][0]["pods"] == {"ml/a": 2, "ml/b": 1}
    assert node_state.parse(state.to_json()) == state
    after = state.released(["ml/train", "ml/a", "ml/sick", "ml/unknown"])
    assert after.free == state.free | {"gcu0", "gcu1"}  # gcu2 is unhealthy: still not free
    assert [(s.free, s.holders) for s in after.shared] == [(5, (("ml/b", 1),))]
    assert after.pods == {"ml/b"}
    assert state.released(["ml/unknown"]) is state
    assert node_state.parse(after.to_json()) == after


def test_a_card_listed_twice_is_refused() -> None:
    document = _good()
    document["cards"] = document["cards"] * 2  # type: ignore[operator]
    with pytest.raises(NodeStateError, match="twice"):
        node_state.parse(json.dumps(document))


def test_the_lease_carries_the_state_and_its_heartbeat_is_the_observed_time(
    vendor_node: str,
) -> None:
    state = node_state.build(devices.discover(vendor_node), [], whole=WHOLE, shared={})
    text = node_state.NodeState(state.cards, observed=100.0).to_json()
    found = node_state.lease("node-a", "gcu-system", text, 1_800_000_000.25)
    assert found["metadata"] | {"annotations": None} == {
        "name": "node-a",
        "namespace": "gcu-system",
        "labels": node_state.LEASE_LABELS,
        "annotations": None,
    }
    assert found["spec"]["holderIdentity"] == "node-a"
    assert found["spec"]["renewTime"] == "2027-01-15T08:00:00.250000Z"
    read = node_state.from_lease("node-a", found)
    assert read.observed == 1_800_000_000.25  # the renewal, not the text's own time
    assert read.free == state.free
    # A heartbeat moves the time and nothing else; a content patch moves both.
    found["spec"].update(node_state.heartbeat(1_800_000_060.0)["spec"])
    assert node_state.from_lease("node-a", found).observed == 1_800_000_060.0
    patch = node_state.content_patch("{}", 5.0)
    assert patch == {
        "metadata": {"annotations": {node_state.ANNOTATION: "{}"}},
        "spec": {"renewTime": node_state.micro_time(5.0)},
    }


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda lease: lease["spec"].update(holderIdentity="node-b"), "held by 'node-b'"),
        (lambda lease: lease["spec"].pop("holderIdentity"), "held by None"),
        (lambda lease: lease["metadata"].update(name="node-b"), "Lease 'node-b' read as"),
        (lambda lease: lease["spec"].update(renewTime="2027-01-15T08:00:00"), "no time zone"),
        (lambda lease: lease["spec"].update(renewTime=17), "not a time"),
        (lambda lease: lease["spec"].pop("renewTime"), "not a time"),
        (lambda lease: lease["metadata"]["annotations"].clear(), "no enflame.com/gcu-node-state"),
        (
            lambda lease: lease["metadata"]["annotations"].update({node_state.ANNOTATION: "[]"}),
            "JSON list",
        ),
    ],
)
def test_a_lease_that_is_not_the_nodes_own_or_unreadable_is_refused(
    change: object, says: str
) -> None:
    text = node_state.NodeState(observed=1.0).to_json()
    found = node_state.lease("node-a", "ns", text, 2.0)
    change(found)  # type: ignore[operator]
    with pytest.raises(NodeStateError, match=says.replace("(", r"\(")):
        node_state.from_lease("node-a", found)
