"""A short bounded chaos run on the real-cluster tier (tests/cluster/chaos.py; ``make chaos`` is
the long one). Marker ``chaos`` only, so ``make e2e-cluster`` (``-m cluster``) leaves it out:

    bash scripts/e2e-cluster.sh tests/cluster/test_chaos.py -m chaos
"""

from __future__ import annotations

import json
import os

import pytest

from tests.cluster import chaos
from tests.cluster.cluster import Cluster
from tests.cluster.service_route import ServiceRoute

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200)]
# One of them alone: bash scripts/e2e-cluster.sh tests/cluster/test_chaos.py -m chaos -k NAME
MINUTES = float(os.environ.get("ENFLAME_CHAOS_MINUTES", "2"))


def test_bounded_chaos_keeps_every_invariant(cluster: Cluster) -> None:
    """Two minutes, a fault every ten seconds of every kind, overlapping: no violation, every
    fault injected that was planned (or said why not), the cluster back within 60 s."""
    with ServiceRoute(cluster.plane.port):
        bench, extender_prefix = chaos.deploy(cluster, print)
        run = chaos.ChaosRun(cluster, bench, 5, MINUTES, round(6 * MINUTES), chaos.KINDS, print)
        run.extender_prefix = extender_prefix
        report = run.run()
    print(chaos.table(report))
    assert report["faults"]["total"] >= round(5 * MINUTES), json.dumps(report["faults"])
    assert report["violations"] == [], json.dumps(report["violations"], indent=1)[:6000]
    assert report["final"]["recovered_at"] is not None, json.dumps(report["final"])[:4000]


def test_a_kubelet_started_while_containerd_is_down_comes_back(cluster: Cluster) -> None:
    """Seed 7's gcu-node-1 (issue 52): a kubelet restarted while containerd was down exits at
    once ("get remote runtime typed version failed ... connection refused"). On a node systemd
    starts it again (kubeadm's unit: Restart=always); so does the tier, and once containerd is
    back the node is Ready and runs pods again. Before, it stayed down for good: the node went
    NotReady and its pods could be neither started nor deleted."""
    from tests.cluster.cluster import wait_for
    from tests.kubelet import harness

    node = next(n for n in cluster.nodes if n.name == "gcu-node-1")
    kubelet = node.daemons["kubelet"]
    before = len(kubelet.exits)
    node.daemons["containerd"].stop(kill=True, timeout=10)
    try:
        node.restart_kubelet(0)
        wait_for(
            "the kubelet to exit by itself (containerd down)",
            lambda: len(kubelet.exits) > before,
            90,
            detail=lambda: node.log("kubelet"),
        )
    finally:
        node.restart_containerd(0)
    wait_for(f"{node.name} Ready again", node.ready, 120, 1, detail=lambda: node.log("kubelet"))
    name = "after-kubelet-exit"
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": harness.IMAGE, "command": ["sleep", "600"]}],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    try:
        cluster.wait_pod("default", name, timeout=120)
    finally:
        cluster.delete_pods("default", name)
    assert cluster.pod("default", name) is None
