"""DeviceClasses and example claims: schema-valid, and satisfiable exactly where they should be.

The satisfiability tables run the examples through a small stand-in for the scheduler's
allocator (``allocator.py``) over the devices we publish for each fixture, restricted to a
given set of free cards.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from enflame_gcu import devices, resourceslices
from tests.dra_plugin import allocator
from tests.dra_plugin import slices_helpers as helpers

EXAMPLE_NAMES = sorted(
    name.removesuffix(".yaml") for name in os.listdir(helpers.EXAMPLES) if name.endswith(".yaml")
)
SWITCH = "two-gcus-one-switch"
PREFER = "two-gcus-prefer-switch"
ROOT_PORT = "four-gcus-one-root-port"

# fixture, free cards, then per claim: None (unsatisfiable) or what the stand-in allocates
# (for PREFER: the alternative that wins).
CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    (
        "vendor-8card",
        tuple(range(8)),
        {SWITCH: [0, 1], PREFER: "same-switch", ROOT_PORT: [0, 1, 2, 3]},
    ),
    # The manual's second pod: with gcu0+gcu1 taken, the next switch-local pair is gcu4+gcu5.
    (
        "vendor-8card",
        (2, 3, 4, 5, 6, 7),
        {SWITCH: [4, 5], PREFER: "same-switch", ROOT_PORT: [4, 5, 6, 7]},
    ),
    ("vendor-8card", (0, 2, 4, 6), {SWITCH: None, PREFER: "same-numa", ROOT_PORT: None}),
    ("vendor-8card", (2, 3, 6, 7), {SWITCH: None, PREFER: "same-numa", ROOT_PORT: None}),
    ("vendor-8card", (1, 5), {SWITCH: None, PREFER: "any", ROOT_PORT: None}),
    ("2socket-16card", (0, 4, 8, 12), {SWITCH: None, PREFER: "same-numa", ROOT_PORT: None}),
    ("2socket-16card", (3, 4, 5, 6), {SWITCH: [4, 5], PREFER: "same-switch", ROOT_PORT: None}),
    (
        "2socket-16card",
        (3, 12, 13, 14, 15),
        {SWITCH: [12, 13], PREFER: "same-switch", ROOT_PORT: [12, 13, 14, 15]},
    ),
    ("flat-4card", (0, 1, 2, 3), {SWITCH: [0, 1], PREFER: "same-switch", ROOT_PORT: [0, 1, 2, 3]}),
    ("flat-4card", (3,), {SWITCH: None, PREFER: None, ROOT_PORT: None}),
    ("rootports-6card", tuple(range(6)), {SWITCH: [4, 5], PREFER: "same-switch", ROOT_PORT: None}),
    # No switch anywhere and numaNode present: the preference falls back to one NUMA node.
    ("rootports-6card", (0, 1, 2, 3), {SWITCH: None, PREFER: "same-numa", ROOT_PORT: None}),
    ("rootports-6card", (0, 2), {SWITCH: None, PREFER: "any", ROOT_PORT: None}),
]


def _fixture_path(name: str) -> str:
    return helpers.NO_SWITCH_FIXTURE if name == "rootports-6card" else name


@pytest.mark.parametrize("version", helpers.VERSIONS)
def test_device_classes_are_schema_valid(version: str) -> None:
    classes = helpers.device_classes()
    assert sorted(classes) == [
        "drs.gcu.enflame.com",
        "gcu.enflame.com",
        "shared.gcu.enflame.com",
        "vgcu.gcu.enflame.com",
    ]
    for document in classes.values():
        helpers.validate(document, version)


@pytest.mark.parametrize("version", helpers.VERSIONS)
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_examples_are_schema_valid_and_use_our_classes(name: str, version: str) -> None:
    documents = helpers.load_yaml(os.path.join(helpers.EXAMPLES, f"{name}.yaml"))
    assert sorted(doc["kind"] for doc in documents) == ["Pod", "ResourceClaimTemplate"]
    for document in documents:
        helpers.validate(document, version)
    spec = helpers.example(name)
    for request in spec["devices"]["requests"]:
        for alternative in request.get("firstAvailable") or [request.get("exactly")]:
            assert alternative["deviceClassName"] in helpers.device_classes()
    for constraint in spec["devices"].get("constraints") or []:
        domain = constraint["matchAttribute"].partition("/")[0]
        assert domain in (resourceslices.DRIVER, resourceslices.STANDARD_DOMAIN)
    pod = next(doc for doc in documents if doc["kind"] == "Pod")
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == name


def test_the_examples_are_the_ones_the_issue_asks_for() -> None:
    assert (
        sorted(
            [
                SWITCH,
                PREFER,
                ROOT_PORT,
                "one-vgcu",
                "one-shared-slice",
                "one-drs-1g8gb",
                "one-drs-16gb",
            ]
        )
        == EXAMPLE_NAMES
    )


@pytest.mark.parametrize(
    ("fixture", "free", "expected"),
    CASES,
    ids=[f"{c[0]}-{len(c[1])}free-{c[1][0] if c[1] else ''}" for c in CASES],
)
def test_which_claims_a_free_set_can_satisfy(
    tmp_path: Any, fixture: str, free: tuple[int, ...], expected: dict[str, Any]
) -> None:
    inventory = helpers.make_fixture_node(str(tmp_path), _fixture_path(fixture))
    published = helpers.published(inventory)
    available = [d for d in published if d["name"] in {f"gcu-{m}" for m in free}]
    classes = helpers.device_classes()
    switch = allocator.allocate(helpers.example(SWITCH), classes, available)
    assert (switch and sorted(int(n[4:]) for n in switch["gcus"])) == (expected[SWITCH] or None)
    port = allocator.allocate(helpers.example(ROOT_PORT), classes, available)
    assert (port and sorted(int(n[4:]) for n in port["gcus"])) == (expected[ROOT_PORT] or None)
    prefer = allocator.allocate(helpers.example(PREFER), classes, available)
    assert (prefer and next(iter(prefer)).split("/")[1]) == (expected[PREFER] or None)


def test_a_switch_local_claim_is_never_satisfied_across_switches(tmp_path: Any) -> None:
    """Every pair the stand-in may pick for the hard claim sits under one lowest switch."""
    claim, classes = helpers.example(SWITCH), helpers.device_classes()
    for name in helpers.FIXTURES:
        root = tmp_path / helpers.fixture_id(name)
        root.mkdir()
        inventory = helpers.make_fixture_node(str(root), name)
        cards = {f"gcu-{c.minor}": c for c in inventory.cards}
        published = [d for d in helpers.published(inventory) if d["name"] in cards]
        for first in published:
            for second in published:
                if first["name"] >= second["name"]:
                    continue
                pair = allocator.allocate(claim, classes, [first, second])
                a, b = cards[first["name"]], cards[second["name"]]
                assert (pair is not None) == (a.switch is not None and a.switch == b.switch)


def test_one_vgcu_is_satisfiable_only_where_cards_are_in_vgcu_mode(make_node: Any) -> None:
    classes = helpers.device_classes()
    vgcu_node = helpers.published(devices.discover(make_node("vgcu-2card")))
    assert allocator.allocate(helpers.example("one-vgcu"), classes, vgcu_node) == {
        "vgcu": ["vgcu-0"]
    }
    # Its cards are partitioned: no whole card is on offer there.
    assert allocator.allocate(helpers.example(SWITCH), classes, vgcu_node) is None
    whole_node = helpers.published(devices.discover(make_node("flat-4card")))
    assert allocator.allocate(helpers.example("one-vgcu"), classes, whole_node) is None


def test_one_shared_slice_needs_a_driver_that_publishes_sharing(vendor_node: str) -> None:
    classes = helpers.device_classes()
    inventory = devices.discover(vendor_node)
    exclusive = helpers.published(inventory)
    assert allocator.allocate(helpers.example("one-shared-slice"), classes, exclusive) is None
    shared = helpers.published(inventory, resourceslices.PublishOptions(shared_slices=6))
    assert allocator.allocate(helpers.example("one-shared-slice"), classes, shared) == {
        "slice": ["gcu-0"]
    }
    # Shareable cards still serve whole-card claims (which consume every slice).
    assert allocator.allocate(helpers.example(SWITCH), classes, shared) == {
        "gcus": ["gcu-0", "gcu-1"]
    }


def test_the_stand_in_refuses_what_it_does_not_understand() -> None:
    device = {"name": "gcu-0", "attributes": {"type": {"string": "gcu"}}}
    with pytest.raises(allocator.Unsupported):
        allocator.selects('device.attributes["gcu.enflame.com"].type in ["gcu"]', device)
    with pytest.raises(allocator.Unsupported):
        allocator.selects('device.attributes["gcu.enflame.com"].model == "x"', device)
