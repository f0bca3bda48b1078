"""The telemetry collector in-process over the simulated libefml: re-init after a driver reload,
per-call reading errors counted while the card stays, events counted by type on their own
thread, energy integrated from power, the reason telemetry is off, the UUID of a card left out,
and a scrape cache keyed on content."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu import devices, holders
from enflame_gcu.device_plugin import card_metrics, telemetry, telemetry_metrics
from enflame_gcu.simulation import efmlsim
from tests.conftest import MakeNode


class Node:
    def __init__(self, root: str) -> None:
        self.root = root
        self.collector = telemetry.TelemetryCollector(root, 0.1, 5)
        self.cards = card_metrics.CardCollector(host="n1")
        self.cards.update(holders.build(devices.discover(root), []), known=True)
        self.metrics = telemetry_metrics.TelemetryMetrics(
            self.collector, self.cards.current, host="n1"
        )
        self.registry = CollectorRegistry()
        self.registry.register(self.metrics)

    def collect(self) -> telemetry.Snapshot:
        self.collector.snapshot = self.collector.collect_once()
        return self.collector.snapshot

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        text = generate_latest(self.registry).decode()
        return [
            (dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        ]


@pytest.fixture
def node(make_node: MakeNode) -> Iterator[Node]:
    root = make_node("vgcu-2card")
    efmlsim.install(root)
    made = Node(root)
    yield made
    made.collector.stop()


def test_a_driver_reload_reinitialises_libefml(node: Node) -> None:
    assert node.collect().up
    efmlsim.set_values(node.root, "node", {"driver_ver": "9.9.9"})  # the driver reloaded
    snap = node.collect()
    assert snap.up, snap.reason
    assert snap.driver_version == "9.9.9" and snap.inits == 2 and len(snap.cards) == 2
    assert node.samples("enflame_gcu_telemetry_library_inits_total")[0][1] == 2


def test_repeated_node_level_errors_reinitialise_libefml(node: Node) -> None:
    assert node.collect().up
    efmlsim.set_values(node.root, "node", {"count_fail": "254"})
    passes = [node.collect() for _ in range(telemetry.REINIT_AFTER)]
    assert [p.up for p in passes] == [False] * telemetry.REINIT_AFTER
    assert passes[0].cause == "no_answer:EFML_ERROR_FAIL"
    assert [p.inits for p in passes] == [1] * (telemetry.REINIT_AFTER - 1) + [2]
    efmlsim.set_values(node.root, "node", {"count_fail": None})
    assert node.collect().up


def test_a_refused_reading_is_counted_per_call_and_the_card_stays(node: Node) -> None:
    efmlsim.set_values(node.root, "card1", {"refuse": "EfmlGetDevPwr=254", "usage": "7"})
    node.collect()
    snap = node.collect()
    assert [c.index for c in snap.cards] == [0, 1] and snap.failures == ()
    [(labels, value)] = node.samples("enflame_gcu_telemetry_reading_errors_total")
    assert value == 2
    assert (labels["card"], labels["call"], labels["reason"]) == (
        "gcu1",
        "EfmlGetDevPwr",
        "EFML_ERROR_FAIL",
    )
    usage = {d["card"]: v for d, v in node.samples("enflame_gcu_usage")}
    assert usage == {"gcu0": 0, "gcu1": 7}
    assert [d["card"] for d, _ in node.samples("enflame_gcu_power_consumption")] == ["gcu0"]


def test_events_are_counted_by_type_on_their_own_thread(node: Node) -> None:
    node.collector.start()
    deadline = time.monotonic() + 10
    while not node.collector.snapshot.up:  # libefml initialised: later events are handed out
        assert time.monotonic() < deadline, node.collector.snapshot
        time.sleep(0.05)
    for seq in (1, 2):
        efmlsim.set_values(
            node.root, "node", {"event_seq": str(seq), "event_type": "10", "event_msg": "x"}
        )
        deadline = time.monotonic() + 10
        while dict(node.collector.snapshot.events).get("reset_start") != seq:
            assert time.monotonic() < deadline, node.collector.snapshot
            time.sleep(0.05)
    counted = {d["type"]: v for d, v in node.samples("enflame_gcu_events_total")}
    # Every known type from 0 (so increase() sees a type's first event), reset_start twice.
    assert counted == {
        "unknown": 0, "dtu_suspend": 0, "reset_start": 2, "reset_finish": 0, "dtu_eid": 0
    }  # fmt: skip


def test_energy_is_the_integral_of_power(node: Node) -> None:
    efmlsim.set_values(node.root, "card0", {"power": "200"})
    started = time.monotonic()
    node.collect()
    time.sleep(0.3)
    node.collect()
    elapsed = time.monotonic() - started
    energy = {d["card"]: v for d, v in node.samples("enflame_gcu_energy_joules_total")}
    assert 200 * 0.3 <= energy["gcu0"] <= 200 * elapsed
    assert energy["gcu1"] > 0  # the default 75 W


def test_exporter_up_zero_says_why(make_node: MakeNode) -> None:
    bare = Node(make_node("vgcu-2card"))  # no libefml installed
    assert node_reason(bare) == ("not_collected_yet", 0)
    bare.collect()
    assert node_reason(bare) == ("no_library", 0)


def node_reason(node: Node) -> tuple[str, float]:
    [(labels, value)] = node.samples("enflame_gcu_exporter_up")
    return labels["reason"], value


def test_a_card_left_out_keeps_its_uuid(node: Node) -> None:
    node.collect()
    efmlsim.set_values(node.root, "card1", {"fail": "254"})
    node.collect()
    errors = {
        d["card"]: (d["UUID"], v) for d, v in node.samples("enflame_gcu_telemetry_card_error")
    }
    uuid = efmlsim.read_values(node.root, "card1")["uuid"]
    assert errors["gcu1"] == (f"GCU-{uuid}", 1)
    assert errors["gcu0"][1] == 0 and errors["gcu0"][0].startswith("GCU-")


def test_the_scrape_cache_is_keyed_on_content(node: Node) -> None:
    node.collect()
    first = {f.name: f for f in node.metrics.collect()}
    node.collect()  # a new pass, same readings
    node.cards.update(holders.build(devices.discover(node.root), []), known=True)  # a new view
    second = {f.name: f for f in node.metrics.collect()}
    assert second["enflame_gcu_usage"] is first["enflame_gcu_usage"]
    efmlsim.set_values(node.root, "card0", {"usage": "50"})
    node.collect()
    third = {f.name: f for f in node.metrics.collect()}
    assert third["enflame_gcu_usage"] is not first["enflame_gcu_usage"]
    assert {s.labels["card"]: s.value for s in third["enflame_gcu_usage"].samples} == {
        "gcu0": 50,
        "gcu1": 0,
    }


def test_a_driver_reload_reinitialises_libefml_only_when_no_call_is_inside(node: Node) -> None:
    """The events thread is inside EfmlGetEvent almost all the time; before, the re-init after
    a driver reload ran EfmlShutdown and EfmlInit under it (the simulated libefml records it)."""
    node.collector.start()
    deadline = time.monotonic() + 10
    while not node.collector.snapshot.up:
        assert time.monotonic() < deadline, node.collector.snapshot
        time.sleep(0.05)
    for version in ("9.9.1", "9.9.2"):
        efmlsim.set_values(node.root, "node", {"driver_ver": version})
        deadline = time.monotonic() + 15
        while node.collector.snapshot.driver_version != version:
            assert time.monotonic() < deadline, node.collector.snapshot
            time.sleep(0.05)
    assert node.collector.snapshot.inits == 3 and node.collector.snapshot.up
    path = pathlib.Path(node.root, efmlsim.EFML_DIR, "overlaps")
    assert not path.exists(), path.read_text(encoding="utf-8")
