"""The node changes under a running kubelet: a card is unplugged and replugged, the driver
reloads."""

from __future__ import annotations

import pytest

from enflame_gcu.simulation import simulate
from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def test_unplug_drops_allocatable_and_replug_restores_it(node: harness.Node) -> None:
    node.up()
    simulate.unplug(node.host_root, 7)
    node.wait_registered(7)
    assert "gcu7" not in harness.checkpoint()["registered"][harness.RESOURCE]
    assert node.probe_capacity("probe-a")[1] == 7
    node.pods.create(harness.pod_manifest("eight-a", [harness.container(gcus=8)]))
    refused = node.pods.wait_failed("eight-a")
    assert refused["reason"] == "UnexpectedAdmissionError", refused
    assert "Requested: 8, Available: 7" in refused["message"]

    simulate.replug(node.host_root, 7)
    node.wait_registered(8)
    assert node.probe_capacity("probe-b") == (8, 8)
    report = node.pods.run("eight-b", 8)
    assert set(report.cards) == {f"gcu{n}" for n in range(8)}, report.text


def test_driver_reload(node: harness.Node) -> None:
    node.up()
    held = node.pods.run("two-a", 2)
    assert set(held.cards) == {"gcu0", "gcu1"}
    simulate.unload_driver(node.host_root)
    node.wait_registered(0)
    node.pods.create(harness.pod_manifest("during", [harness.container(gcus=1)]))
    refused = node.pods.wait_failed("during")
    assert "Requested: 1, Available: 0" in refused["message"], refused
    simulate.load_driver(node.host_root, version="1.0.20240101")
    node.wait_registered(8)
    node.pods.wait_running("two-a")  # the pod that held cards kept running throughout
    report = node.pods.run("two-b", 2)
    assert set(report.cards) == {"gcu4", "gcu5"}, report.text
    assert "1.0.20240101" in node.plugin.log()
