"""The chart's scheduler extender deployed for real (issue 35 point 6), in both modes.

The chart is installed with Helm's own Go code (tests/cluster/test_helm.py's ``helm()``) with
``extender.enabled``: the device plugin DaemonSet then publishes each node's state (its node-state
Lease) and the extender runs as the chart renders it:

- ``mode: daemonset`` (beside the cluster's own scheduler): a host-network DaemonSet on the
  control-plane nodes (gcu-node-2 is labelled one here), listening on 127.0.0.1:32766, and the
  tier's kube-scheduler restarted with deploy/extender/kube-scheduler-config-v1beta1.yaml's
  ``extenders``, as docs/scheduler-extender.md tells a cluster admin;
- ``mode: scheduler``: a Deployment with a second kube-scheduler (the image the values name: here
  one holding the tier's own kube-scheduler binary, as a cluster uses its own version) and the
  extender beside it; pods with ``schedulerName: enflame-gcu-scheduler`` use it.

In each mode the extender pod becomes Ready, a 2-card pod (no node selector) lands on a
switch-local pair of whichever node the scheduler picks (the extender scores each node's free
switch pairs: gcu0+gcu1 or gcu4+gcu5 on gcu-node-1's vendor board, any pair on gcu-node-2's
single-switch board), the extender's own counters show it was asked (filter and prioritize), and
the pod runs. The tier has no kube-proxy: :class:`tests.cluster.service_route.ServiceRoute`
gives the pods the ``kubernetes`` Service's address.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from enflame_gcu import node_state
from enflame_gcu.simulation import topofile
from enflame_gcu.simulation.testing import oci_image
from tests.cluster import session
from tests.cluster.cluster import (
    PLUGIN_SELECTOR,
    Cluster,
    cards_in,
    listing_pod,
    pod_ready,
    wait_for,
)
from tests.cluster.service_route import ServiceRoute
from tests.cluster.test_helm import CHART, HELM_PYTHON, helm, plugin_pods_ready

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
RELEASE = "enflame-gcu"
STATIC_PLUGIN = "deploy/yaml/enflame-device-plugin.yaml"
EXTENDER_SELECTOR = "app.kubernetes.io/name=enflame-scheduler-extender"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
SCHEDULER_IMAGE = "enflame-e2e.invalid/kube-scheduler:tier"
EXTENDER_CONFIG = "deploy/extender/kube-scheduler-config-v1beta1.yaml"
PORT = 32766


def one_switch(node: str, cards: list[str]) -> bool:
    """Whether ``cards`` all sit under one PCIe switch of ``node``'s simulated board (the
    switch's upstream port is the second bridge above a card): on gcu-node-1 (vendor-8card)
    only gcu0+gcu1 and gcu4+gcu5 do; on gcu-node-2 (flat-4card) any pair does."""
    board = next(topology for name, topology, _, _ in session.NODES if name == node)
    upstream = {f"gcu{c.minor}": c.bridges[-2] for c in topofile.load(board).cards}
    known = all(card in upstream for card in cards)
    return known and len(cards) >= 2 and len({upstream[card] for card in cards}) == 1


def gcu_pod(name: str, scheduler: str = "") -> str:
    """A pod asking for 2 cards, listing them; no node selector."""
    return listing_pod(name, 2, scheduler=scheduler)


def scheduler_image(cluster: Cluster) -> None:
    """An image holding the tier's kube-scheduler (static Go binary), imported on every node."""
    binary = os.path.join(cluster.plane.bin, "kube-scheduler")
    spec = oci_image.ImageSpec(
        name=SCHEDULER_IMAGE,
        files={"/usr/local/bin/kube-scheduler": binary},
        env=("PATH=/usr/local/bin:/bin",),
    )
    archive = os.path.join(cluster.work, "kube-scheduler-image.tar")
    oci_image.write_archive(archive, spec)
    for node in cluster.nodes:
        node.import_archive(archive)
    os.unlink(archive)


def extender_stats(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The extender's ``/stats``, asked from inside its container (its 127.0.0.1)."""
    script = (
        "import urllib.request,sys;"
        f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{PORT}/stats',timeout=5)"
        ".read().decode())"
    )
    text = cluster.kubectl(
        "-n", "kube-system", "exec", pod["metadata"]["name"], "-c", "enflame-scheduler-extender",
        "--", "python3", "-c", script,
    )  # fmt: skip
    stats: dict[str, Any] = json.loads(text)
    return stats


def asked(stats: dict[str, Any]) -> tuple[int, int]:
    verbs = stats.get("verbs", {})
    return (
        int(verbs.get("filter", {}).get("calls", 0)),
        int(verbs.get("prioritize", {}).get("calls", 0)),
    )


def extender_pod(cluster: Cluster) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pods = [
            p
            for p in cluster.pods("kube-system", EXTENDER_SELECTOR)
            if not p["metadata"].get("deletionTimestamp")
        ]
        return pods[0] if len(pods) == 1 and pod_ready(pods[0]) else None

    def detail() -> str:
        pods = cluster.pods("kube-system", EXTENDER_SELECTOR)
        if not pods:
            return "no extender pod; " + cluster.kubectl("get", "all", "-n", "kube-system")
        name = pods[0]["metadata"]["name"]
        logs = cluster.kubectl("-n", "kube-system", "logs", name, "--all-containers",
                               "--tail=40", check=False)  # fmt: skip
        return cluster.describe("pod", name, "kube-system") + "\n" + logs

    found: dict[str, Any] = wait_for("the extender pod to be Ready", ready, 240, detail=detail)
    return found


def extender_beside_scheduler(cluster: Cluster) -> dict[str, Any]:
    """docs/scheduler-extender.md, way 1: once the chart's extender pod is Ready, the tier's
    kube-scheduler restarted with deploy/extender's ``extenders`` stanza; returns the extender
    pod once it knows both nodes' state."""
    pod = extender_pod(cluster)
    with open(cluster.repo_file(EXTENDER_CONFIG), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    config.pop("clientConnection")
    cluster.plane.restart_scheduler(config)
    wait_for("the plugins to publish both nodes' state", lambda: states_published(cluster), 120)
    wait_for(
        "the extender to know both nodes",
        lambda: extender_stats(cluster, pod)["cache"].get("nodes_with_state") == 2,
        60,
    )
    return pod


def states_published(cluster: Cluster) -> bool:
    """Both nodes' plugins wrote their node-state Lease (in the release's namespace), and no
    Node carries the state itself."""
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    for name in ("gcu-node-1", "gcu-node-2"):
        found = cluster.get(f"{leases}/{name}")
        if not found or node_state.ANNOTATION not in (found["metadata"].get("annotations") or {}):
            return False
        assert node_state.ANNOTATION not in (
            cluster.node(name)["metadata"].get("annotations") or {}
        )
    return True


def schedule_through_extender(
    cluster: Cluster, name: str, scheduler: str = ""
) -> tuple[str, list[str]]:
    """Create the 2-card pod; check it ran on one PCIe switch of whichever node the scheduler
    chose (both nodes have switch pairs free, and spreading may pick either); the node and the
    pod's cards."""
    cluster.kubectl("apply", "-f", "-", stdin=gcu_pod(name, scheduler))
    pod = cluster.wait_pod("enflame", name, timeout=180)
    node = pod["spec"]["nodeName"]

    def listed() -> list[str] | None:
        cards = cards_in(cluster.kubectl("-n", "enflame", "logs", name, check=False))
        return cards or None

    cards = wait_for(f"{name}'s card list", listed, 60)
    assert one_switch(node, cards), (node, cards)
    return node, cards


@pytest.fixture(scope="module")
def chart_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """The static plugin out of the way, the Service's address routed, the scheduler image in;
    after: the release gone, the tier's scheduler as before, the static plugin back."""
    if not os.access(HELM_PYTHON, os.X_OK):
        pytest.fail(f"no {HELM_PYTHON} (scripts/bootstrap.sh makes it with helm-python-sdk)")
    for name in ("gcu-node-1", "gcu-node-2"):
        cluster.shell(f"kubectl label node {name} enflame.com/gcu.present=true --overwrite")
    cluster.kubectl("apply", "-f", cluster.repo_file("deploy/yaml/examples/namespace.yaml"))
    static = cluster.get("/apis/apps/v1/namespaces/kube-system/daemonsets/"
                         "enflame-device-plugin-daemonset")  # fmt: skip
    cluster.kubectl("delete", "-f", cluster.repo_file(STATIC_PLUGIN), "--ignore-not-found",
                    "--wait=true", "--timeout=180s")  # fmt: skip
    wait_for("the static plugin pods to go",
             lambda: not cluster.pods("kube-system", PLUGIN_SELECTOR), 180)  # fmt: skip
    scheduler_image(cluster)
    with ServiceRoute(cluster.plane.port):
        try:
            yield cluster
        finally:
            cluster.kubectl("-n", "enflame", "delete", "pods", "--all", "--wait=true",
                            "--timeout=120s", check=False)  # fmt: skip
            cluster.plane.restart_scheduler(None)
            cluster.kubectl("label", "node", "gcu-node-2", f"{CONTROL_PLANE_LABEL}-", check=False)
            if static is not None:
                cluster.kubectl("apply", "-f", cluster.repo_file(STATIC_PLUGIN))
                wait_for("the static plugin pods to be Ready again",
                         lambda: plugin_pods_ready(cluster), 180)  # fmt: skip


def install(cluster: Cluster, mode: str, extra: dict[str, Any] | None = None) -> None:
    values = {"extender": {"enabled": True, "mode": mode, **(extra or {})}}
    helm(cluster, "install", RELEASE, CHART, "kube-system", json.dumps(values))
    wait_for("the chart's plugin pods to be Ready", lambda: plugin_pods_ready(cluster), 180)
    wait_for("the plugins to publish both nodes' state", lambda: states_published(cluster), 120,
             detail=lambda: cluster.describe("node", "gcu-node-1"))  # fmt: skip
    # A published Lease is not yet allocatable cards in the Node's status (the kubelet posts
    # that on its own beat); a node still at 0 fails the scheduler's own filter, and with one
    # feasible node left kube-scheduler skips scoring, so /prioritize is never asked.
    nodes = ("gcu-node-1", "gcu-node-2")
    wait_for("both nodes to offer the 2 cards a test pod asks for",
             lambda: all(cluster.gcus(n)[1] >= 2 for n in nodes), 120,
             detail=lambda: str({n: cluster.gcus(n) for n in nodes}))  # fmt: skip


def delete_pod(cluster: Cluster, name: str) -> None:
    cluster.kubectl("-n", "enflame", "delete", "pod", name, "--ignore-not-found", "--wait=true",
                    "--timeout=120s", check=False)  # fmt: skip


def uninstall(cluster: Cluster) -> None:
    helm(cluster, "uninstall", RELEASE, "kube-system")
    wait_for("the release's pods to go",
             lambda: not cluster.pods("kube-system", f"app.kubernetes.io/instance={RELEASE}"),
             180)  # fmt: skip


def test_chart_extender_beside_the_clusters_scheduler(chart_cluster: Cluster) -> None:
    cluster = chart_cluster
    cluster.kubectl("label", "node", "gcu-node-2", f"{CONTROL_PLANE_LABEL}=", "--overwrite")
    install(cluster, "daemonset")
    try:
        pod = extender_beside_scheduler(cluster)
        assert pod["spec"]["nodeName"] == "gcu-node-2" and pod["spec"]["hostNetwork"]
        before = asked(extender_stats(cluster, pod))
        node, cards = schedule_through_extender(cluster, "chart-beside")
        after = asked(extender_stats(cluster, pod))
        assert after[0] > before[0] and after[1] > before[1], (before, after)
        print(f"beside mode: {node} cards {cards}, extender calls {before}->{after}")
    finally:
        delete_pod(cluster, "chart-beside")
        cluster.plane.restart_scheduler(None)
        uninstall(cluster)
        cluster.kubectl("label", "node", "gcu-node-2", f"{CONTROL_PLANE_LABEL}-", check=False)


def test_chart_extender_as_a_second_scheduler(chart_cluster: Cluster) -> None:
    cluster = chart_cluster
    install(cluster, "scheduler", {"schedulerImage": SCHEDULER_IMAGE})
    try:
        pod = extender_pod(cluster)
        names = [c["name"] for c in pod["status"]["containerStatuses"] if c["ready"]]
        assert sorted(names) == ["enflame-scheduler-extender", "kube-scheduler"], names
        wait_for("the extender to know both nodes",
                 lambda: extender_stats(cluster, pod)["cache"].get("nodes_with_state") == 2,
                 60)  # fmt: skip
        before = asked(extender_stats(cluster, pod))
        node, cards = schedule_through_extender(cluster, "chart-second", "enflame-gcu-scheduler")
        after = asked(extender_stats(cluster, pod))
        assert after[0] > before[0] and after[1] > before[1], (before, after)
        print(f"scheduler mode: {node} cards {cards}, extender calls {before}->{after}")
    finally:
        delete_pod(cluster, "chart-second")
        uninstall(cluster)
