"""Admission and allocation through the real kubelet: the vendor manual's pods, a 4-card pod,
a pod asking for more than exists, and init containers whose cards the app container reuses."""

from __future__ import annotations

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def _entries(uid: str) -> dict[str, list[str]]:
    """``{container: device IDs}`` the kubelet checkpointed for one pod."""
    return {
        entry["container"]: entry["ids"]
        for entry in harness.checkpoint()["entries"]
        if entry["pod_uid"] == uid and entry["resource"] == harness.RESOURCE
    }


def _cards(report: harness.ContainerReport) -> set[str]:
    return set(report.cards)


def _visible(report: harness.ContainerReport) -> set[str]:
    return {f"gcu{item}" for item in report.visible.split(",")}


def test_the_manuals_two_pods_get_gcu0_gcu1_then_gcu4_gcu5(node: harness.Node) -> None:
    node.up()
    first = node.pods.run("two-a", 2)
    assert _cards(first) == {"gcu0", "gcu1"}, first.text
    assert "gcuctl" in first.nodes
    assert _visible(first) == {"gcu0", "gcu1"}
    second = node.pods.run("two-b", 2)
    assert _cards(second) == {"gcu4", "gcu5"}, second.text
    assert _visible(second) == {"gcu4", "gcu5"}
    # The kubelet's own record agrees with what the containers see.
    assert _entries(node.pods.uid("two-a")) == {"main": ["gcu0", "gcu1"]}
    assert _entries(node.pods.uid("two-b")) == {"main": ["gcu4", "gcu5"]}
    log = node.running_kubelet.log()
    assert "Issuing a GetPreferredAllocation call" in log


def test_a_four_card_pod_gets_one_root_port(node: harness.Node) -> None:
    node.up()
    report = node.pods.run("four", 4)
    assert _cards(report) == {"gcu0", "gcu1", "gcu2", "gcu3"}, report.text
    assert _visible(report) == {"gcu0", "gcu1", "gcu2", "gcu3"}
    assert _entries(node.pods.uid("four")) == {"main": ["gcu0", "gcu1", "gcu2", "gcu3"]}
    # The rest of the node is still there for an 4-card pod: the other root port.
    other = node.pods.run("four-b", 4)
    assert _cards(other) == {"gcu4", "gcu5", "gcu6", "gcu7"}, other.text


def test_a_pod_asking_for_more_than_exists_is_refused_by_admission(node: harness.Node) -> None:
    node.up()
    node.pods.create(harness.pod_manifest("nine", [harness.container(gcus=9)]))
    status = node.pods.wait_failed("nine")
    assert status["reason"] == "UnexpectedAdmissionError", status
    assert "requested number of devices unavailable for enflame.com/gcu" in status["message"]
    assert "Requested: 9, Available: 8" in status["message"]
    assert not _entries(node.pods.uid("nine"))
    # Nothing was taken: an 8-card pod still fits.
    report = node.pods.run("eight", 8)
    assert _cards(report) == {f"gcu{n}" for n in range(8)}


def test_init_container_cards_are_reused_by_the_app_container(node: harness.Node) -> None:
    node.up()
    init = harness.container("init", gcus=2, sleep=False)
    app = harness.container("app", gcus=2)
    node.pods.create(harness.pod_manifest("with-init", [app], init_containers=[init]))
    node.pods.wait_running("with-init")
    init_report = node.pods.report("with-init", "init")
    app_report = node.pods.report("with-init", "app")
    assert _cards(init_report) == {"gcu0", "gcu1"}, init_report.text
    assert _cards(app_report) == _cards(init_report), app_report.text
    entries = _entries(node.pods.uid("with-init"))
    assert entries == {"init": ["gcu0", "gcu1"], "app": ["gcu0", "gcu1"]}
    # Another 2-card pod gets the manual's second pair: the init container's pair stays held.
    assert _cards(node.pods.run("after", 2)) == {"gcu4", "gcu5"}
