"""Registration and capacity, as the real kubelet records them."""

from __future__ import annotations

import re

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def test_plugin_registers_and_the_kubelet_counts_eight_cards(node: harness.Node) -> None:
    node.up()
    kubelet = node.running_kubelet
    log = kubelet.log()
    assert 'Got registration request from device plugin with resource name "enflame.com/gcu"' in log
    assert re.search(r"Registered endpoint .*enflame\.sock", log), log[-3000:]
    registered = harness.checkpoint()["registered"][harness.RESOURCE]
    assert sorted(registered) == [f"gcu{n}" for n in range(8)]
    # The kubelet computes node capacity when it admits a pod: a pod with no GCU shows it.
    assert node.probe_capacity("probe") == (8, 8)
    report = node.pods.report("probe")
    assert report.nodes == (), "a pod that asked for no GCU must see none"
