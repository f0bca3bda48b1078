"""Scenarios 1, 3 and 4 of the guide, on the real cluster: label the nodes, deploy the device
plugin DaemonSet, see the cards in the Node objects, run the example pods through the scheduler.

The tests of this module build on each other in file order (one cluster per session)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest

from tests.cluster.cluster import PLUGIN_SELECTOR, RESOURCE, Cluster, cards_in, pinned, wait_for
from tests.kubelet.harness import E2EError

pytestmark = pytest.mark.cluster
PLUGIN = "deploy/yaml/enflame-device-plugin.yaml"
NODES = {"gcu-node-1": 8, "gcu-node-2": 4}


def unpinned_pod(name: str, gcus: int) -> str:
    """A pod asking for ``gcus`` cards anywhere."""
    return pinned(name, "x", gcus).replace("  nodeSelector:\n    kubernetes.io/hostname: x\n", "")


def test_scenario_1_nodes_labelled_as_the_guide_says(cluster: Cluster) -> None:
    """`kubectl label node gcu-node-1 enflame.com/gcu.present=true`, for both nodes."""
    for node in NODES:
        cluster.shell(f"kubectl label node {node} enflame.com/gcu.present=true --overwrite")
        labels = cluster.node(node)["metadata"]["labels"]
        assert labels.get("enflame.com/gcu.present") == "true"


def test_scenario_3_can_fail_a_wrong_host_path_leaves_the_nodes_without_cards(
    cluster: Cluster,
) -> None:
    """The same manifest with the kubelet's plugin dir misspelt: the plugin finds no kubelet,
    its pods never become Ready and no Node shows a card (what scenario 3 would then report)."""

    def misspell(documents: list[dict[str, Any]]) -> None:
        for document in documents:
            for volume in document["spec"]["template"]["spec"]["volumes"]:
                if volume["name"] == "device-plugin":
                    volume["hostPath"]["path"] = "/var/lib/kubelet/device-plugin"
                    volume["hostPath"]["type"] = "DirectoryOrCreate"

    cluster.apply_manifest(PLUGIN, edit=misspell)
    wait_for(
        "both misconfigured plugin pods to run",
        lambda: (
            sum(
                1
                for p in cluster.pods("kube-system", PLUGIN_SELECTOR)
                if p["status"].get("phase") == "Running"
            )
            == 2
        ),
        180,
    )
    time.sleep(20)  # four readiness periods
    assert cluster.ready_pods("kube-system", PLUGIN_SELECTOR) == []
    assert {node: cluster.gcus(node) for node in NODES} == {node: (0, 0) for node in NODES}
    cluster.kubectl("delete", "-f", os.path.join(cluster.work, os.path.basename(PLUGIN)),
                    "--wait=true")  # fmt: skip
    wait_for("the plugin pods to go", lambda: not cluster.pods("kube-system", PLUGIN_SELECTOR), 120)


def test_scenario_3_plugin_pods_ready_and_nodes_show_their_cards(cluster: Cluster) -> None:
    """The DaemonSet's pods become Ready through their real probes; each Node's capacity and
    allocatable show its cards; `kubectl describe node ... | grep enflame.com/gcu` shows them."""
    cluster.apply_manifest(PLUGIN)
    wait_for(
        "both device plugin pods to be Ready",
        lambda: len(cluster.ready_pods("kube-system", PLUGIN_SELECTOR)) == 2,
        180,
        detail=lambda: cluster.kubectl(
            "-n", "kube-system", "describe", "pods", "-l", PLUGIN_SELECTOR, check=False
        ),
    )
    listing = cluster.shell(
        "kubectl -n kube-system get pods -l app.kubernetes.io/name=enflame-device-plugin -o wide"
    )
    for node, count in NODES.items():
        assert node in listing

        def shows(node: str = node, count: int = count) -> bool:
            return cluster.gcus(node) == (count, count)

        def seen(node: str = node) -> str:
            return str(cluster.gcus(node))

        wait_for(f"{node} to show {count} GCUs", shows, 60, detail=seen)
        described = cluster.shell(f"kubectl describe node {node} | grep enflame.com/gcu")
        # capacity and allocatable, each "enflame.com/gcu:  N"; then the allocated line.
        assert len(re.findall(rf"^\s*{re.escape(RESOURCE)}:\s+{count}$", described, re.M)) == 2, (
            described
        )


def test_scenario_4_example_pod_runs_and_logs_show_its_card(
    cluster: Cluster, clean_namespace: str
) -> None:
    """The guide's example pod, scheduled by the real scheduler; `kubectl logs` shows one card."""
    cluster.shell("kubectl apply -f deploy/yaml/examples/pod-gcu-example.yaml")
    pod = cluster.wait_pod("enflame", "pod-gcu-example")
    logs = wait_for(
        "the example's logs",
        lambda: (
            t
            if "ENFLAME_VISIBLE_DEVICES="
            in (t := cluster.shell("kubectl -n enflame logs pod-gcu-example"))
            else None
        ),
        60,
    )
    cards = cards_in(logs)
    assert len(cards) == 1, logs
    assert "/dev/gcuctl" in logs
    assert f"ENFLAME_VISIBLE_DEVICES={cards[0][3:]}" in logs
    listed = cluster.shell(
        f"kubectl -n enflame exec pod-gcu-example -- ls /dev/{cards[0]} /dev/gcuctl"
    )
    assert cards[0] in listed
    assert pod["spec"]["nodeName"] in NODES


def test_scenario_4_two_pods_get_switch_pairs_and_too_big_stays_pending(
    cluster: Cluster, clean_namespace: str
) -> None:
    """Two 2-card pods on gcu-node-1 get gcu0+gcu1 and gcu4+gcu5; a pod asking for more than any
    node has stays Pending with `Insufficient enflame.com/gcu`; deleting holders lets a waiting
    pod schedule."""
    got = []
    for name in ("pair-a", "pair-b"):
        cluster.kubectl("apply", "-f", "-", stdin=pinned(name, "gcu-node-1"))
        cluster.wait_pod("enflame", name)
        got.append(cards_in(cluster.kubectl("-n", "enflame", "logs", name)))
    assert sorted(got) == [["gcu0", "gcu1"], ["gcu4", "gcu5"]], got

    cluster.kubectl("apply", "-f", "-", stdin=unpinned_pod("too-big", 9))
    message = wait_for(
        "the scheduler to say why too-big waits",
        lambda: next(
            (
                e
                for e in cluster.events("enflame", "too-big")
                if "Insufficient enflame.com/gcu" in e
            ),
            None,
        ),
        60,
    )
    assert "FailedScheduling" in message
    pod = cluster.pod("enflame", "too-big")
    assert pod is not None and pod["status"]["phase"] == "Pending"

    # 8 cards: only gcu-node-1 has that many, and two pairs hold 4 of them.
    cluster.kubectl("apply", "-f", "-", stdin=unpinned_pod("all-eight", 8))
    wait_for(
        "all-eight to be refused while the pairs hold cards",
        lambda: any(
            "Insufficient enflame.com/gcu" in e for e in cluster.events("enflame", "all-eight")
        ),
        60,
    )
    cluster.delete_pods("enflame", "pair-a", "pair-b")
    pod = cluster.wait_pod("enflame", "all-eight", timeout=180)
    assert pod["spec"]["nodeName"] == "gcu-node-1"
    cards = cards_in(cluster.kubectl("-n", "enflame", "logs", "all-eight"))
    assert cards == [f"gcu{i}" for i in range(8)], cards
    if cluster.pod("enflame", "too-big")["status"]["phase"] != "Pending":  # type: ignore[index]
        raise E2EError("the 9-card pod left Pending")
