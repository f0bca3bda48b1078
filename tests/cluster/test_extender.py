"""The scheduler extender with Kubernetes' own kube-scheduler 1.20 (the cluster tier's binaries).

A control plane of its own (no controller manager, no kubelets: Nodes are API objects with
GCU capacity, each with the node-state Lease the device plugin would write, written here),
kube-scheduler configured with the shipped deploy/extender/kube-scheduler-config-v1beta1.yaml
(pointed at this extender), and enflame-scheduler-extender as a real process: a 2-card pod goes
to the node with a free pair when another has only split cards, a shared-GCU pod avoids the node
without enough free slices, and with the extender stopped pods are still scheduled
(``ignorable: true``).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from enflame_gcu import node_state
from tests.cluster.controlplane import ControlPlane, build, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTENDER = os.path.join(os.path.dirname(sys.executable), "enflame-scheduler-extender")
NAMESPACE = "extender"
STATE_NAMESPACE = "default"  # where the node-state Leases are (the extender is told so)
GCU, SHARED = "enflame.com/gcu", "enflame.com/shared-gcu"


def vendor_state(busy: set[int]) -> str:
    """The vendor 8-card node's state with ``busy`` minors held (switches {0,1} {2} {3} ...)."""
    switches = {0: "s01", 1: "s01", 2: "s2", 3: "s3", 4: "s45", 5: "s45", 6: "s6", 7: "s7"}
    cards = tuple(
        node_state.CardState(
            f"gcu{m}", m, switches[m], f"port{m // 4}", f"numa{m // 4}", m not in busy
        )
        for m in range(8)
    )
    return node_state.NodeState(cards, observed=time.time()).to_json()


def shared_state(*free: int) -> str:
    cards = tuple(node_state.SharedCard(f"gcu{i}", i, 6, f) for i, f in enumerate(free))
    return node_state.NodeState(shared=cards, observed=time.time()).to_json()


class Bench:
    def __init__(self, plane: ControlPlane, port: int, extender: subprocess.Popen[bytes]) -> None:
        self.plane, self.port, self.extender = plane, port, extender

    def add_node(self, name: str, capacity: dict[str, str], state: str) -> None:
        self.plane.api("POST", "/api/v1/nodes", {"metadata": {"name": name}})
        lease = node_state.lease(name, STATE_NAMESPACE, state, time.time())
        self.plane.api(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{STATE_NAMESPACE}/leases", lease
        )
        # The API server's TaintNodesByCondition admission taints a new Node not-ready; with
        # no kubelet and no controller manager nothing would lift it.
        self.plane.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": []}})
        full = {"cpu": "16", "memory": "64Gi", "pods": "110", **capacity}
        self.plane.api(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {
                "status": {
                    "capacity": full,
                    "allocatable": full,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Test"}],
                }
            },
        )

    def stats(self) -> dict[str, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", "/stats")
            return dict(json.loads(connection.getresponse().read()))
        finally:
            connection.close()

    def nodes_known(self) -> int:
        """Nodes with a state in the extender's cache (0 while it is starting)."""
        try:
            return int(self.stats()["cache"]["nodes_with_state"])
        except OSError:
            return 0

    def run_pod(self, name: str, resource: str, count: int) -> str:
        """Create a pod asking ``count`` of ``resource``; the node it was bound to."""
        self.plane.api(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            {
                "metadata": {"name": name},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": "test.invalid/none",
                            "resources": {"limits": {resource: str(count)}},
                        }
                    ],
                },
            },
        )
        node = self.plane.wait(
            f"pod {name} to be bound",
            lambda: (
                (self.plane.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") or {})
                .get("spec", {})
                .get("nodeName")
            ),
            60,
        )
        return str(node)

    def delete_pod(self, name: str) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0"
        self.plane.request("DELETE", path)
        self.plane.wait(
            f"pod {name} gone",
            lambda: self.plane.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") is None,
        )
        time.sleep(0.5)  # the extender's pod watch sees the deletion


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    work = str(tmp_path_factory.mktemp("extender-plane"))
    port = free_port()
    path = os.path.join(REPO, "deploy", "extender", "kube-scheduler-config-v1beta1.yaml")
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    config.pop("clientConnection")
    config["profiles"] = [{"schedulerName": "default-scheduler"}]
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    with ControlPlane(build(), work, controller_manager=False, scheduler_config=config) as plane:
        plane.api("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        plane.api(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            {"metadata": {"name": "default"}},
        )
        with open(os.path.join(work, "extender.log"), "ab") as log:
            extender = subprocess.Popen(
                [
                    EXTENDER,
                    f"--kubeconfig={plane.kubeconfig}",
                    f"--node-state-namespace={STATE_NAMESPACE}",
                    f"--port={port}",
                    "--bind-address=127.0.0.1",
                    "--state-max-age=3600",  # the states below are written once, not refreshed
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        result = Bench(plane, port, extender)
        try:
            result.add_node("pair", {GCU: "8"}, vendor_state({2, 3, 4, 5, 6, 7}))
            result.add_node("split", {GCU: "8"}, vendor_state({1, 3, 5, 7}))
            result.add_node("slices-short", {SHARED: "12"}, shared_state(1, 1))
            result.add_node("slices-whole", {SHARED: "12"}, shared_state(4, 0))
            plane.wait(
                "the extender to know the nodes",
                lambda: result.nodes_known() == 4,
                60,
            )
            yield result
        finally:
            extender.terminate()
            extender.wait(10)


def test_a_two_card_pod_goes_to_the_node_with_a_free_pair(bench: Bench) -> None:
    for index in range(3):
        assert bench.run_pod(f"pair-{index}", GCU, 2) == "pair", bench.plane.log("kube-scheduler")
        bench.delete_pod(f"pair-{index}")
    verbs = bench.stats()["verbs"]
    assert verbs["prioritize"]["calls"] >= 3 and verbs["filter"]["calls"] >= 3


def test_a_shared_gcu_pod_avoids_the_node_without_enough_free_slices(bench: Bench) -> None:
    for index in range(3):
        assert bench.run_pod(f"slices-{index}", SHARED, 3) == "slices-whole"
        bench.delete_pod(f"slices-{index}")


def test_scheduling_goes_on_with_the_extender_stopped(bench: Bench) -> None:
    bench.extender.terminate()
    bench.extender.wait(10)
    assert bench.run_pod("without-extender", GCU, 2) in ("pair", "split")
    assert bench.run_pod("without-extender-shared", SHARED, 3) in ("slices-short", "slices-whole")
    assert "Skipping extender" in bench.plane.log("kube-scheduler", 200_000)  # ignorable: true
