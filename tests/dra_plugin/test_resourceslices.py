"""A node's GCUs as DRA devices: attributes, schema-valid slices, limits and the property."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

from enflame_gcu import devices, resourceslices
from enflame_gcu.simulation import simulate, topofile
from tests.dra_plugin import slices_helpers as helpers

Options = resourceslices.PublishOptions


@pytest.fixture(params=helpers.FIXTURES, ids=helpers.fixture_id)
def fixture_node(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, devices.Inventory]:
    name = str(request.param)
    return name, helpers.make_fixture_node(str(tmp_path), name)


def by_name(device_list: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {device["name"]: device for device in device_list}


def attr(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name)
    return None if value is None else next(iter(value.values()))


def test_vendor_card_carries_every_attribute(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    gcu0 = by_name(helpers.published(inventory))["gcu-0"]
    assert {key: next(iter(value.values())) for key, value in gcu0["attributes"].items()} == {
        "type": "gcu",
        "index": 0,
        "shareable": False,
        "model": "T20-32GB",
        "family": "T",
        "productID": "0x0021",
        "driverVersion": "1.0.20230110",
        "resource.kubernetes.io/pciBusID": "0000:11:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:0c",
        "resource.kubernetes.io/numaNode": 0,
        "pcieSwitch": "0000:0f:00.0",
        "pcieRootPort": "0000:0c:02.0",
    }
    assert gcu0["attributes"]["driverVersion"] == {"version": "1.0.20230110"}
    assert gcu0["capacity"] == {"memory": {"value": "32768Mi"}}
    assert "allowMultipleAllocations" not in gcu0 and "taints" not in gcu0


def test_numa_node_is_omitted_when_sysfs_says_minus_one(make_node: Any) -> None:
    inventory = devices.discover(make_node("flat-4card"))
    for device in helpers.published(inventory):
        assert "resource.kubernetes.io/numaNode" not in device["attributes"]


def test_cards_on_root_ports_have_no_switch_attribute(tmp_path: Any) -> None:
    inventory = helpers.make_fixture_node(str(tmp_path), helpers.NO_SWITCH_FIXTURE)
    found = by_name(helpers.published(inventory))
    assert [name for name, d in found.items() if attr(d, "pcieSwitch") is None] == [
        "gcu-0",
        "gcu-1",
        "gcu-2",
        "gcu-3",
    ]
    assert attr(found["gcu-2"], "pcieRootPort") == "0000:80:01.0"
    assert attr(found["gcu-2"], "resource.kubernetes.io/pcieRoot") == "pci0000:80"


def _lowest_switch_in_description(card: topofile.SimCard) -> str | None:
    # Ground truth from the fixture text: a card's parent is a switch downstream port when the
    # chain has a bridge above that parent, and that bridge is the switch's upstream port.
    return card.bridges[-2] if len(card.bridges) >= 2 else None


def test_cards_share_pcie_switch_exactly_when_under_the_same_lowest_switch(
    fixture_node: tuple[str, devices.Inventory],
) -> None:
    name, inventory = fixture_node
    description = {f"gcu-{card.minor}": card for card in topofile.load(name).cards}
    published = by_name(helpers.published(inventory))
    whole = [n for n in published if n.startswith("gcu-")]
    assert sorted(whole) == sorted(n for n in description if not description[n].vgcus)
    for a, b in itertools.combinations(whole, 2):
        truth_a = _lowest_switch_in_description(description[a])
        truth_b = _lowest_switch_in_description(description[b])
        same_switch = truth_a is not None and truth_a == truth_b
        value_a, value_b = attr(published[a], "pcieSwitch"), attr(published[b], "pcieSwitch")
        assert (value_a is not None and value_a == value_b) == same_switch, (a, b)
        same_port = description[a].bridges[:1] == description[b].bridges[:1]
        assert (attr(published[a], "pcieRootPort") == attr(published[b], "pcieRootPort")) == (
            same_port
        ), (a, b)


@pytest.mark.parametrize("version", helpers.VERSIONS)
def test_every_fixture_publishes_schema_valid_slices_within_the_limits(
    fixture_node: tuple[str, devices.Inventory], version: str
) -> None:
    _, inventory = fixture_node
    for options in (Options(), Options(shared_slices=6)):
        device_list = helpers.published(inventory, options)
        slices = resourceslices.build_slices("node-a", "uid-1", device_list, 3, options)
        assert resourceslices.check_pool(slices) == []
        for item in slices:
            helpers.validate(item, version)


@pytest.mark.parametrize("version", helpers.VERSIONS)
def test_64_cards_split_into_slices_of_one_pool(make_node: Any, version: str) -> None:
    inventory = devices.discover(make_node("2socket-64card"))
    simulate.unplug(inventory.root, 5)
    inventory = devices.discover(inventory.root)
    device_list = helpers.published(inventory)
    assert len(device_list) == 63
    slices = resourceslices.build_slices(
        "node-a", None, device_list, 1, Options(devices_per_slice=20)
    )
    assert [len(s["spec"]["devices"]) for s in slices] == [20, 20, 20, 3]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {4}
    assert len({s["metadata"]["name"] for s in slices}) == 4
    assert resourceslices.check_pool(slices) == []
    for item in slices:
        helpers.validate(item, version)


def test_unhealthy_cards_get_a_noschedule_taint_or_are_left_out(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    healthy = {card.name: card.minor != 3 for card in inventory.cards}
    tainted = by_name(resourceslices.node_devices(inventory, healthy))
    assert tainted["gcu-3"]["taints"] == [
        {"key": "gcu.enflame.com/unhealthy", "effect": "NoSchedule"}
    ]
    assert all("taints" not in d for n, d in tainted.items() if n != "gcu-3")
    omitted = resourceslices.node_devices(inventory, healthy, Options(unhealthy="omit"))
    assert "gcu-3" not in by_name(omitted) and len(omitted) == 7
    for version in helpers.VERSIONS:
        for item in resourceslices.build_slices("n", None, list(tainted.values()), 1):
            helpers.validate(item, version)


def test_vgcu_mode_cards_publish_their_vgcus_only(make_node: Any) -> None:
    inventory = devices.discover(make_node("vgcu-2card"))
    published = by_name(helpers.published(inventory))
    assert sorted(published) == [f"vgcu-{i}" for i in range(8)]
    vgcu5 = published["vgcu-5"]
    parent = next(card for card in inventory.cards if card.minor == attr(vgcu5, "parentIndex"))
    assert attr(vgcu5, "type") == "vgcu"
    assert attr(vgcu5, "resource.kubernetes.io/pciBusID") == parent.bdf
    assert "capacity" not in vgcu5


def test_shareable_cards_use_consumable_capacity_whose_default_is_the_whole_card(
    vendor_node: str,
) -> None:
    inventory = devices.discover(vendor_node)
    gcu0 = by_name(helpers.published(inventory, Options(shared_slices=6)))["gcu-0"]
    assert gcu0["allowMultipleAllocations"] is True
    assert attr(gcu0, "shareable") is True
    slices = gcu0["capacity"]["slices"]
    assert slices["value"] == slices["requestPolicy"]["default"] == "6"
    assert slices["requestPolicy"]["validRange"] == {"min": "1", "max": "6", "step": "1"}
    assert gcu0["capacity"]["memory"]["requestPolicy"]["default"] == "0"


def test_an_empty_node_still_publishes_one_empty_slice() -> None:
    (only,) = resourceslices.build_slices("node-a", None, [], 7)
    assert only["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 1}
    assert "devices" not in only["spec"]
    for version in helpers.VERSIONS:
        helpers.validate(only, version)


def test_slice_names_are_dns_subdomains_even_for_odd_node_names() -> None:
    name = resourceslices.slice_name("Node_A" + "x" * 300, 2)
    assert len(name) <= 253 and name.endswith("-gcu.enflame.com-2")
    assert (
        resourceslices.check_slice(
            {"metadata": {"name": name}, "spec": {"driver": "gcu.enflame.com", "nodeName": "n"}}
        )
        == []
    )


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.update(name="GCU_0"), "is not a DNS label"),
        (
            lambda d: d["attributes"].update({f"a{i}": {"int": i} for i in range(30)}),
            "attributes and capacities",
        ),
        (lambda d: d["attributes"].update(model={"string": "x" * 65}), "longer than 64"),
        (lambda d: d["attributes"].update({"x" * 33: {"int": 1}}), "C identifier"),
        (lambda d: d["attributes"].update({"Bad_Domain/x": {"int": 1}}), "DNS subdomain"),
        (lambda d: d["attributes"].update(v={"version": "1.0"}), "not semver"),
        (lambda d: d["attributes"].update(two={"int": 1, "bool": True}), "exactly one value type"),
        (lambda d: d.update(taints=[{"key": "k", "effect": "NoSchedule"}] * 17), "taints"),
    ],
)
def test_limit_checks_catch_each_violation(vendor_node: str, mutate: Any, problem: str) -> None:
    device = helpers.published(devices.discover(vendor_node))[0]
    assert resourceslices.check_device(device) == []
    mutate(device)
    assert any(problem in text for text in resourceslices.check_device(device))


def test_slice_checks_catch_too_many_devices_and_broken_pools(vendor_node: str) -> None:
    device = helpers.published(devices.discover(vendor_node))[0]
    many = [dict(device, name=f"gcu-{i}") for i in range(129)]
    assert len(resourceslices.build_slices("n", None, many, 1, Options(devices_per_slice=200))) == 2
    (item,) = resourceslices.build_slices("n", None, many[:1], 1)
    item["spec"]["devices"] = many
    assert any("129 devices" in p for p in resourceslices.check_slice(item))
    item["spec"]["devices"] = [
        dict(d, taints=[{"key": "k", "effect": "NoSchedule"}]) for d in many[:65]
    ]
    assert any("the limit here is 64" in p for p in resourceslices.check_slice(item))
    pool = resourceslices.build_slices("n", None, many[:4], 1, Options(devices_per_slice=2))
    pool[1]["spec"]["pool"]["generation"] = 2
    assert any("disagree" in p for p in resourceslices.check_pool(pool))
    pool = resourceslices.build_slices("n", None, many[:4], 1, Options(devices_per_slice=2))
    pool[1]["spec"]["devices"][0]["name"] = "gcu-0"
    assert any("twice" in p for p in resourceslices.check_pool(pool))
    both = resourceslices.build_slices("n", None, many[:1], 1)[0]
    both["spec"]["sharedCounters"] = [{"name": "c", "counters": {}}]
    assert any("sharedCounters" in p for p in resourceslices.check_slice(both))


def test_node_device_maps_published_names_back() -> None:
    assert resourceslices.node_device("gcu-3") == "gcu3"
    assert resourceslices.node_device("vgcu-12") == "vgcu12"
    with pytest.raises(ValueError, match="want gcu-N"):
        resourceslices.node_device("gpu-1")


def test_fixture_list_covers_the_issue_s_machines() -> None:
    names = {helpers.fixture_id(name) for name in helpers.FIXTURES}
    assert {"vendor-8card", "2socket-16card", "flat-4card", "rootports-6card"} <= names
    assert os.path.exists(helpers.NO_SWITCH_FIXTURE)
