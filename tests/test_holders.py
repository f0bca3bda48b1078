"""The card -> holder view: every device on its parent card, locality of multi-card pods."""

from __future__ import annotations

import pytest

from enflame_gcu import devices, holders, topology
from tests.conftest import MakeNode

GCU, VGCU, SHARED = holders.DEFAULT_RESOURCES


def held(pod: str, resource: str, *ids: str, namespace: str = "ml") -> holders.Holding:
    return holders.Holding(namespace, pod, "main", resource, ids)


@pytest.mark.parametrize(
    ("cards", "expected"),
    [
        (["gcu3"], "single"),
        (["gcu0", "gcu1"], "switch"),
        (["gcu4", "gcu5"], "switch"),
        (["gcu0", "gcu2"], "root_port"),
        (["gcu0", "gcu1", "gcu2", "gcu3"], "root_port"),
        (["gcu1", "gcu6"], "spread"),
        (["gcu0", "gcu9"], "spread"),  # a card this node does not have
    ],
)
def test_locality_of_card_sets_on_the_vendor_machine(
    vendor_node: str, cards: list[str], expected: str
) -> None:
    topo = topology.Topology.from_inventory(devices.discover(vendor_node))
    assert holders.locality(topo, cards) == expected


def test_one_numa_node_through_two_root_ports_is_numa_local(make_node: MakeNode) -> None:
    inventory = devices.discover(make_node("2socket-16card"))
    topo = topology.Topology.from_inventory(inventory)
    numa0 = [c for c in inventory.cards if c.numa_node == 0]
    ports = {str(c.root_port) for c in numa0}
    assert len(ports) > 1, "the fixture needs two root ports on one NUMA node"
    pair = [next(c.name for c in numa0 if c.root_port == port) for port in sorted(ports)[:2]]
    assert holders.locality(topo, pair) == "numa"


def test_holders_land_on_their_cards_and_pods_are_summarised(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    view = holders.build(
        inventory,
        [
            held("pod1", GCU, "gcu0", "gcu1", namespace="default"),
            held("pod2", GCU, "gcu4", "gcu5"),
            held("spread", GCU, "gcu2", "gcu7"),
            held("other", "example.com/fpga", "gcu3"),  # not ours: ignored
            held("ghost", GCU, "gcu12"),
        ],
    )
    owner = {c.card.name: [f"{h.namespace}/{h.pod}" for h in c.holders] for c in view.cards}
    assert owner == {
        "gcu0": ["default/pod1"],
        "gcu1": ["default/pod1"],
        "gcu2": ["ml/spread"],
        "gcu3": [],
        "gcu4": ["ml/pod2"],
        "gcu5": ["ml/pod2"],
        "gcu6": [],
        "gcu7": ["ml/spread"],
    }
    assert [(p.pod, p.locality) for p in view.multi_card_pods] == [
        ("pod1", "switch"),
        ("spread", "spread"),
        ("pod2", "switch"),
    ]
    assert [h.device for h in view.unplaced] == ["gcu12"]
    assert view.by_locality() == {"switch": 2, "root_port": 0, "numa": 0, "spread": 1}
    assert view.summary() == (
        "6 of 8 cards held; 2 of 3 multi-card pods switch-local (2 same switch, 1 spread)"
    )


def test_vgcus_and_slices_show_on_their_parent_card(make_node: MakeNode) -> None:
    inventory = devices.discover(make_node("vgcu-2card"))
    view = holders.build(
        inventory,
        [held("v", VGCU, "vgcu1", "vgcu5"), held("s", SHARED, "gcu1-slice3")],
    )
    by_card = {c.card.name: [(h.pod, h.device) for h in c.holders] for c in view.cards}
    assert by_card == {"gcu0": [("v", "vgcu1")], "gcu1": [("v", "vgcu5"), ("s", "gcu1-slice3")]}
    assert [(p.pod, p.cards, p.locality) for p in view.multi_card_pods] == [
        ("v", ("gcu0", "gcu1"), "spread")
    ]


def test_health_verdicts_override_discovery_and_keep_the_reason(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    view = holders.build(inventory, [], health={"gcu2": (False, "/dev/gcu2 is missing")})
    gcu2 = next(c for c in view.cards if c.card.name == "gcu2")
    assert (gcu2.healthy, gcu2.reason, gcu2.free) == (False, "/dev/gcu2 is missing", True)
    assert all(c.healthy for c in view.cards if c.card.name != "gcu2")
    assert view.summary() == "0 of 8 cards held; no multi-card pods"


def test_the_summary_counts_in_the_right_number(make_node: MakeNode) -> None:
    one = holders.build(devices.discover(make_node("zixiao-1card")), [held("p", GCU, "gcu0")])
    assert one.summary() == "1 of 1 card held; no multi-card pods"
    four = holders.build(
        devices.discover(make_node("flat-4card")), [held("p", GCU, "gcu0", "gcu1")]
    )
    assert four.summary().startswith("2 of 4 cards held; 1 of 1 multi-card pod switch-local")
    assert [holders.counted(n, "card") for n in (0, 1, 2)] == ["0 cards", "1 card", "2 cards"]
