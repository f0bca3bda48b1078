"""Topology: pair distances, set scores and groupings on the named boards."""

from __future__ import annotations

import pytest

from enflame_gcu import devices, topology
from enflame_gcu.topology import Level

from .conftest import MakeNode


def _topo(make_node: MakeNode, name: str) -> topology.Topology:
    return topology.Topology.from_inventory(devices.discover(make_node(name)))


def test_vendor_machine_switch_pairs_and_root_port_groups(make_node: MakeNode) -> None:
    topo = _topo(make_node, "vendor-8card")
    assert topo.switch_groups() == [
        ("gcu0", "gcu1"),
        ("gcu2",),
        ("gcu3",),
        ("gcu4", "gcu5"),
        ("gcu6",),
        ("gcu7",),
    ]
    assert topo.port_groups() == [
        ("gcu0", "gcu1", "gcu2", "gcu3"),
        ("gcu4", "gcu5", "gcu6", "gcu7"),
    ]


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        ("gcu0", "gcu0", Level.CARD),
        ("gcu0", "gcu1", Level.SWITCH),
        ("gcu4", "gcu5", Level.SWITCH),
        ("gcu0", "gcu2", Level.PORT),
        ("gcu2", "gcu3", Level.PORT),
        ("gcu6", "gcu7", Level.PORT),
        ("gcu3", "gcu4", Level.SYSTEM),
        ("gcu1", "gcu7", Level.SYSTEM),
    ],
)
def test_vendor_machine_pair_distances(make_node: MakeNode, a: str, b: str, level: Level) -> None:
    topo = _topo(make_node, "vendor-8card")
    assert topo.pair_distance(a, b) is level
    assert topo.pair_distance(b, a) is level


def test_distances_are_ordered_switch_port_numa_system() -> None:
    assert Level.CARD < Level.SWITCH < Level.PORT < Level.NUMA < Level.SYSTEM


def test_sixteen_card_box_groups(make_node: MakeNode) -> None:
    topo = _topo(make_node, "2socket-16card")
    switches = topo.switch_groups()
    assert switches == [tuple(f"gcu{i}" for i in range(s, s + 4)) for s in (0, 4, 8, 12)]
    assert topo.port_groups() == switches  # one switch per root port
    numa = topo.groups(Level.NUMA)
    assert numa == {
        "numa0": tuple(f"gcu{i}" for i in range(8)),
        "numa1": tuple(f"gcu{i}" for i in range(8, 16)),
    }
    assert topo.pair_distance("gcu0", "gcu3") is Level.SWITCH
    assert topo.pair_distance("gcu0", "gcu4") is Level.NUMA
    assert topo.pair_distance("gcu0", "gcu8") is Level.SYSTEM


def test_flat_box_is_one_switch_and_unknown_numa_is_shared(make_node: MakeNode) -> None:
    topo = _topo(make_node, "flat-4card")
    assert topo.switch_groups() == [("gcu0", "gcu1", "gcu2", "gcu3")]
    assert topo.pair_distance("gcu0", "gcu3") is Level.SWITCH
    assert topo.groups(Level.NUMA) == {"numa?": ("gcu0", "gcu1", "gcu2", "gcu3")}


def test_card_on_a_root_port_is_its_own_switch_group(make_node: MakeNode) -> None:
    topo = _topo(make_node, "zixiao-1card")
    assert topo.switch_groups() == [("gcu0",)]


def test_set_score_prefers_one_root_port_over_fewer_switches(make_node: MakeNode) -> None:
    topo = _topo(make_node, "vendor-8card")
    one_port = topo.set_score(["gcu0", "gcu1", "gcu2", "gcu3"])
    two_ports = topo.set_score(["gcu0", "gcu1", "gcu4", "gcu5"])
    assert (one_port.numa_nodes, one_port.root_ports, one_port.switches) == (1, 1, 3)
    assert (two_ports.numa_nodes, two_ports.root_ports, two_ports.switches) == (2, 2, 2)
    assert one_port < two_ports


def test_set_score_counts_pair_distances(make_node: MakeNode) -> None:
    topo = _topo(make_node, "vendor-8card")
    assert topo.set_score(["gcu0", "gcu1"]).distance_sum == 10
    assert topo.set_score(["gcu0", "gcu1", "gcu2"]).distance_sum == 10 + 20 + 20
    assert topo.set_score(["gcu0", "gcu1"]) < topo.set_score(["gcu2", "gcu3"])


def test_unknown_card_names_the_known_ones(make_node: MakeNode) -> None:
    topo = _topo(make_node, "flat-4card")
    with pytest.raises(KeyError, match="unknown card 'gcu9'; known: gcu0, gcu1, gcu2, gcu3"):
        topo.pair_distance("gcu0", "gcu9")
