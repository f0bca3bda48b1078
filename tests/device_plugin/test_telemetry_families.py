"""The telemetry families rendered in-process from one pass over the simulated libefml: counters
that keep one series when a card changes hands (the holder joined through
``enflame_gcu_allocation_info``), and ``promtool check metrics`` clean for every family of ours."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu import devices, holders
from enflame_gcu.device_plugin import card_metrics, telemetry, telemetry_metrics
from enflame_gcu.simulation import efmlsim
from tests.conftest import PROJECT_ROOT, MakeNode
from tests.deploy import promtool

# gcu-exporter's names, kept for compatibility (EFML.md §4): promtool dislikes "_total_count" on
# a gauge, but dashboards and alerts written for gcu-exporter read them.
GCU_EXPORTER_NAMES = {
    f"enflame_{kind}_ecc_{bits}_bit_error_total_count"
    for kind in ("gcu", "vgcu")
    for bits in ("single", "double")
} | {"enflame_gcu_count", "enflame_vgcu_count"}
# dcgm-exporter's label names (docs/metrics.md, "Labels"): promtool wants snake_case.
DCGM_LABELS = {"UUID", "modelName", "Hostname"}
COUNTERS = {
    "enflame_gcu_ecc_single_bit_errors",
    "enflame_gcu_ecc_double_bit_errors",
    "enflame_gcu_pcie_tx_naks",
    "enflame_gcu_pcie_rx_naks",
}
Render = Callable[..., str]


def holding(pod: str, device: str, resource: str = "enflame.com/vgcu") -> holders.Holding:
    return holders.Holding("ml", pod, "main", resource, (device,))


@pytest.fixture
def render(make_node: MakeNode) -> Iterator[Render]:
    """``render(*holdings)``: /metrics over one telemetry pass, with those containers holding."""
    root = make_node("vgcu-2card")
    efmlsim.install(root)
    efmlsim.set_values(root, "card0", {"ecc_dbe": "4", "ecc_sbe": "9", "pcie_tx_nak": "2"})
    collector = telemetry.TelemetryCollector(root, 10, 5)
    collector.snapshot = collector.collect_once()
    assert collector.snapshot.up, collector.snapshot.reason
    inventory = devices.discover(root)
    cards = card_metrics.CardCollector(host="n1")
    registry = CollectorRegistry()
    registry.register(cards)
    registry.register(telemetry_metrics.TelemetryMetrics(collector, cards.current, host="n1"))

    def rendered(*held: holders.Holding) -> str:
        cards.update(holders.build(inventory, held), known=True)
        return generate_latest(registry).decode()

    yield rendered
    collector.stop()


def series(text: str, names: set[str]) -> dict[str, list[dict[str, str]]]:
    """Labels of each sample of the families ``names`` (counters checked to be counters)."""
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in names:
            if family.name in COUNTERS:
                assert family.type == "counter", family.name
            found[family.name] = [
                dict(s.labels) for s in family.samples if not s.name.endswith("_created")
            ]
    return found


def test_counters_keep_one_series_per_card_when_the_card_changes_hands(render: Render) -> None:
    before = render(holding("a", "vgcu1"), holding("b", "vgcu2"))
    after = render(holding("c", "vgcu1"))
    free = render()
    counters = series(before, COUNTERS)
    assert set(counters) == COUNTERS
    for name, labels in counters.items():
        assert [d["card"] for d in labels] == ["gcu0", "gcu1"], name
        assert not set(telemetry_metrics.POD_LABELS) & set(labels[0]), name
    assert series(after, COUNTERS) == counters == series(free, COUNTERS)
    compat = series(before, GCU_EXPORTER_NAMES)
    assert len(compat["enflame_gcu_ecc_double_bit_error_total_count"]) == 2  # one per card
    assert len(compat["enflame_vgcu_ecc_double_bit_error_total_count"]) == 8  # one per vGCU
    # The holder is joined through the allocation info metric, one series per held device.
    info = series(before, {"enflame_gcu_allocation_info"})["enflame_gcu_allocation_info"]
    assert sorted((d["card"], d["device"], d["pod_name"], d["Hostname"]) for d in info) == [
        ("gcu0", "vgcu1", "a", "n1"),
        ("gcu0", "vgcu2", "b", "n1"),
    ]
    assert not series(free, {"enflame_gcu_allocation_info"}).get("enflame_gcu_allocation_info")


def test_counter_values_are_the_librarys_counts(render: Render) -> None:
    values = {
        (s.name, s.labels["card"]): s.value
        for family in text_string_to_metric_families(render())
        if family.name in COUNTERS
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert values[("enflame_gcu_ecc_double_bit_errors_total", "gcu0")] == 4
    assert values[("enflame_gcu_ecc_single_bit_errors_total", "gcu0")] == 9
    assert values[("enflame_gcu_pcie_tx_naks_total", "gcu0")] == 2
    assert values[("enflame_gcu_ecc_double_bit_errors_total", "gcu1")] == 0


def test_promtool_check_metrics_is_clean_for_every_family_of_ours(render: Render) -> None:
    text = render(holding("a", "vgcu1"))
    labels = {
        family.name: {key for s in family.samples for key in s.labels}
        for family in text_string_to_metric_families(text)
    }
    result = promtool.run("check", "metrics", stdin=text)
    problems = []
    for line in (result.stdout + result.stderr).splitlines():
        name = line.split()[0] if line.strip() else ""
        family = name.removesuffix("_total")
        if name in GCU_EXPORTER_NAMES:
            continue
        camel = {key for key in labels.get(family, set()) if key != key.lower()}
        if "camelCase" in line and camel and camel <= DCGM_LABELS:
            continue
        if line.strip():
            problems.append(line)
    assert problems == []


def documented_types(path: str) -> dict[str, str]:
    """``{family: type}`` from the tables of a metrics doc (first cell names, second the type)."""
    found: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.startswith("| `"):
                continue
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if len(cells) < 3 or cells[1] not in ("gauge", "counter"):
                continue
            for name in re.findall(r"`(enflame_v?gcu_[a-z0-9_{},]+)`", cells[0]):
                found[name] = cells[1]
    return found


@pytest.mark.parametrize("doc", ["metrics.md", "metrics.zh-CN.md"])
def test_the_metrics_doc_lists_every_family_with_its_type(make_node: MakeNode, doc: str) -> None:
    root = make_node("vgcu-2card")
    efmlsim.install(root)
    efmlsim.set_values(root, "card1", {"refuse": "EfmlGetDevPwr=254"})
    collector = telemetry.TelemetryCollector(root, 10, 5)
    try:
        collector.collect_once()  # libefml initialised: events from now on are handed out
        efmlsim.set_values(root, "node", {"event_seq": "1", "event_type": "3", "event_msg": "x"})
        deadline = time.monotonic() + 10
        while not collector.snapshot.events and time.monotonic() < deadline:
            collector.snapshot = collector.collect_once()
            time.sleep(0.05)
        cards = card_metrics.CardCollector(host="n1")
        cards.update(holders.build(devices.discover(root), [holding("a", "vgcu1")]), known=True)
        registry = CollectorRegistry()
        registry.register(cards)
        registry.register(telemetry_metrics.TelemetryMetrics(collector, cards.current, host="n1"))
        text = generate_latest(registry).decode()
    finally:
        collector.stop()
    own = {"enflame_gcu_cards", "enflame_gcu_card_healthy", "enflame_gcu_card_unhealthy",
           "enflame_gcu_card_allocated", "enflame_gcu_cards_allocated"}  # fmt: skip
    rendered = {
        (f"{f.name}_total" if f.type == "counter" else f.name): f.type
        for f in text_string_to_metric_families(text)
        if f.name not in own
    }
    assert {"enflame_gcu_events_total", "enflame_gcu_telemetry_reading_errors_total"} <= set(
        rendered
    )
    documented = documented_types(os.path.join(PROJECT_ROOT, "docs", doc))
    assert {name: documented.get(name) for name in rendered} == rendered


def test_a_card_shared_by_six_holders_is_one_series_per_family_not_six(
    make_node: MakeNode,
) -> None:
    """8 cards, each shared by 6 slice holders: every telemetry family keeps one series per
    card (before: one per holder, 1,331 telemetry series instead of 291); the holders are on
    enflame_gcu_allocation_info only, one series per held slice."""
    root = make_node("vendor-8card")
    efmlsim.install(root)
    collector = telemetry.TelemetryCollector(root, 10, 5)
    collector.snapshot = collector.collect_once()
    inventory = devices.discover(root)
    slices = "enflame.com/shared-gcu"
    held = [
        holders.Holding("ml", f"p{c}-{h}", "main", slices, (f"{card.name}-slice{h}",))
        for c, card in enumerate(inventory.cards)
        for h in range(6)
    ]
    cards = card_metrics.CardCollector(host="n1")
    free_registry, shared_registry = CollectorRegistry(), CollectorRegistry()
    for registry in (free_registry, shared_registry):
        registry.register(telemetry_metrics.TelemetryMetrics(collector, cards.current, host="n1"))
    try:
        cards.update(holders.build(inventory, []), known=True)
        free = generate_latest(free_registry).decode()
        cards.update(holders.build(inventory, held), known=True)
        shared = generate_latest(shared_registry).decode()
        info = generate_latest(_only(cards)).decode()
    finally:
        collector.stop()
    samples = [s for f in text_string_to_metric_families(shared) for s in f.samples]
    assert samples and not any(set(telemetry_metrics.POD_LABELS) & set(s.labels) for s in samples)
    assert len(samples) == len([s for f in text_string_to_metric_families(free) for s in f.samples])
    per_card = [s for s in samples if s.name == "enflame_gcu_usage"]
    assert sorted(s.labels["card"] for s in per_card) == sorted(c.name for c in inventory.cards)
    holders_seen = [
        (s.labels["card"], s.labels["pod_name"])
        for f in text_string_to_metric_families(info)
        for s in f.samples
        if s.name == "enflame_gcu_allocation_info"
    ]
    assert len(holders_seen) == 48 and len(set(holders_seen)) == 48


def _only(collector: card_metrics.CardCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
