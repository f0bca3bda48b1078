"""Scenario 8 on the real cluster: the guide's vGCU section on a node whose driver runs in vGCU
mode (a third node, gcu-node-3, with the simulated two-card vGCU board, joins for it)."""

from __future__ import annotations

import re

import pytest

from tests.cluster import guide
from tests.cluster.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster
VGCU = "enflame.com/vgcu"


def test_scenario_8_vgcu_example_runs_on_the_vgcu_node(
    cluster: Cluster, clean_namespace: str
) -> None:
    """The vdevice plugin serves enflame.com/vgcu on gcu-node-3 only; the guide's vGCU example
    is scheduled there and `kubectl logs` shows one /dev/vgcuN and /dev/gcuctl."""
    cluster.add_node("gcu-node-3", "vgcu-2card", "10.88.3.0/24", "10.99.0.3")
    cluster.shell(
        guide.line("kubectl label node gcu-node-1 enflame.com/gcu.present=true").replace(
            "gcu-node-1", "gcu-node-3"
        )
    )
    guide.line("kubectl apply -f deploy/yaml/enflame-vdevice-plugin.yaml")
    cluster.apply_manifest("deploy/yaml/enflame-vdevice-plugin.yaml")
    wait_for(
        "gcu-node-3 to show 8 vGCUs",
        lambda: cluster.gcus("gcu-node-3", VGCU) == (8, 8),
        180,
        detail=lambda: cluster.describe("node", "gcu-node-3"),
    )
    for node in ("gcu-node-1", "gcu-node-2"):
        assert cluster.gcus(node, VGCU) == (0, 0)
    cluster.shell(guide.line("kubectl apply -f deploy/yaml/examples/pod-vgcu-example.yaml"))
    pod = cluster.wait_pod("enflame", "pod-vgcu-example")
    assert pod["spec"]["nodeName"] == "gcu-node-3"
    line = guide.line("kubectl -n enflame logs pod-vgcu-example")
    logs = wait_for(
        "the vGCU example's logs",
        lambda: text if "gcuctl" in (text := cluster.shell(line)) else None,
        60,
    )
    vgcus = re.findall(r"/dev/(vgcu\d+)\b", logs)
    assert len(vgcus) == 1, logs
    assert not re.search(r"/dev/gcu\d", logs), logs
