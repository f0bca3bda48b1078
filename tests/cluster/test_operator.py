"""The operator on the real cluster (issues 27 and 33), as users run it: the chart installed with
Helm's own Go code (``operator.enabled``), the operator as the chart's Deployment (2 replicas,
its ServiceAccount, ClusterRole and Lease Role through the API server's RBAC authorizer). The
chart's GcuResource deploys the toolkit, the device plugin and the validator as real containers
on both kubelet nodes; ``helm upgrade`` with an unrelated value restarts no component pod; a new
plugin version rolls node by node while GCU pods keep their cards, with the leader SIGKILLed and
kube-apiserver frozen for 30 s mid-rollout; ``helm uninstall`` removes everything of ours (its
pre-delete hook waits while the operator removes the components) and keeps the CRDs. The
vendor's example resource, applied with kubectl under the chart's operator, gives the same
components and goes the same way.

The tier has no kube-proxy, so the chart runs the operator with ``operator.hostNetwork`` and
the API server's address in ``operator.env`` (values.yaml). The static DaemonSets earlier
scenarios left (plugin, toolkit) are removed first, since the operator deploys its own; the ones
found are applied again at the end for the scenarios after.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from enflame_gcu.gcu_operator import nodestate
from tests.cluster.cluster import (
    PLUGIN_SELECTOR,
    Cluster,
    cards_in,
    dir_files,
    pinned,
    pod_ready,
    wait_for,
)
from tests.cluster.controlplane import REPO
from tests.cluster.nodes import ClusterNode
from tests.cluster.test_helm import ACTIONS, CHART, HELM_PYTHON, helm

pytestmark = pytest.mark.cluster
NODES = {"gcu-node-1": 8, "gcu-node-2": 4}
GROUP, LEGACY = "topscloud.enflame.com", "topsops.enflame.com"
CRDS = "deploy/operator/crd.yaml"
OURS = "deploy/operator/examples/gcu-resource.yaml"
VENDOR = "deploy/operator/examples/vendor-gcu-resource.json"
STATIC = {
    "enflame-device-plugin-daemonset": "deploy/yaml/enflame-device-plugin.yaml",
    "enflame-container-toolkit-daemonset": "deploy/yaml/enflame-container-toolkit.yaml",
}
TOOLKIT_SELECTOR = "app.kubernetes.io/name=enflame-container-toolkit"
REPOSITORY = "ghcr.io/enflame-gcu"
PLUGIN_IMAGE = f"{REPOSITORY}/enflame-gcu-device-plugin"
TOOLKIT_IMAGE = f"{REPOSITORY}/enflame-gcu-container-toolkit"
SECOND_TAG = "0.1.1-operator"
STATE_ANNOTATION = "enflame.com/gcu.operator-state"
VALIDATED = "enflame.com/gcu.validated"
# Seconds each step took on this run (printed as JSON at the end of the module).
TIMES: dict[str, float] = {}


def freeze_apiserver(cluster: Cluster, seconds: float) -> float:
    """SIGSTOP kube-apiserver for ``seconds`` (connections hang, as in a restart behind a load
    balancer), then SIGCONT; the seconds it was stopped."""
    process = cluster.plane.processes["kube-apiserver"]
    started = time.monotonic()
    os.kill(process.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    return time.monotonic() - started


def timed(step: str, started: float) -> None:
    TIMES[step] = round(time.monotonic() - started, 1)


def logged_cards(cluster: Cluster, pod: str) -> list[str]:
    """The cards a pinned pod listed in its log."""
    return cards_in(cluster.kubectl("-n", "enflame", "logs", pod))


RELEASE = "enflame-gcu"
OPERATOR_SELECTOR = (
    "app.kubernetes.io/name=enflame-gcu-operator,app.kubernetes.io/instance=" + RELEASE
)
LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/enflame-gcu-operator"
# The operator's --retry-period as the chart runs it (its default: the chart passes none).
RETRY_PERIOD = 15.0


def chart_values(cluster: Cluster, spec: dict[str, Any] | None, **operator: Any) -> dict[str, Any]:
    """The chart's values: the operator on, reaching the API server on the host network (the
    tier has no kube-proxy), with ``spec`` as its GcuResource (None: the chart creates none)."""
    values: dict[str, Any] = {
        "enabled": True,
        "interval": 1,
        "hostNetwork": True,
        "env": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.plane.port)},
        ],
        "removeTimeoutSeconds": 240,
        "gcuResource": {"create": spec is not None, "spec": spec or {}},
    }
    values.update(operator)
    return {"operator": values}


def ours_spec(**plugin: Any) -> dict[str, Any]:
    """deploy/operator/examples/gcu-resource.yaml's spec, ``plugin`` laid over devicePlugin."""
    with open(os.path.join(REPO, OURS), encoding="utf-8") as handle:
        spec: dict[str, Any] = yaml.safe_load(handle)["spec"]
    spec["devicePlugin"].update(plugin)
    return spec


class Operator:
    """The chart's operator Deployment: its pods, the leader, their logs."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kills = 0
        self.logs_seen: list[str] = []  # logs of pods the scenarios replaced or killed

    def pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.cluster.pods("kube-system", OPERATOR_SELECTOR)
            if not p["metadata"].get("deletionTimestamp")
        ]

    def wait_ready(self, timeout: float = 180) -> list[dict[str, Any]]:
        """Both replicas Ready (on distinct nodes), one of them holding the Lease."""

        def ready() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods() if pod_ready(p)]
            names = {p["metadata"]["name"] for p in pods}
            ok = len(pods) == 2 and len({p["spec"].get("nodeName") for p in pods}) == 2
            return pods if ok and self.leader() in names else None

        return wait_for(
            "both operator replicas Ready, one leading",
            ready,
            timeout,
            1,
            detail=lambda: self.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False),
        )

    def leader(self) -> str:
        lease = self.cluster.get(LEASE) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def next_renewal_in(self) -> float | None:
        """Seconds until the leader next tries to renew the Lease (its renewTime, whole seconds,
        plus the chart's --retry-period), or None without a holder."""
        spec = (self.cluster.get(LEASE) or {}).get("spec") or {}
        stamp = spec.get("renewTime")
        if not spec.get("holderIdentity") or not stamp:
            return None
        renewed = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        return renewed + RETRY_PERIOD - time.time()

    def restarts(self) -> dict[str, tuple[int, str]]:
        """``{pod: (restartCount, waiting reason)}`` of the live replicas."""
        found = {}
        for pod in self.pods():
            state = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
            waiting = (state.get("state") or {}).get("waiting") or {}
            found[pod["metadata"]["name"]] = (
                int(state.get("restartCount", 0)),
                str(waiting.get("reason", "")),
            )
        return found

    def kill_leader(self, nodes: dict[str, ClusterNode]) -> str:
        """SIGKILL the leading replica's process (no Lease released, nothing finished) through
        its node's containerd; the kubelet restarts the container."""
        name = self.leader()
        pod = next(p for p in self.pods() if p["metadata"]["name"] == name)
        self.logs_seen.append(self.log_of(name))
        container = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        nodes[pod["spec"]["nodeName"]].ctr("tasks", "kill", "--signal", "SIGKILL", container)
        self.kills += 1
        return name

    def keep_logs(self) -> None:
        """Keep the live replicas' logs (before Helm replaces or deletes them)."""
        self.logs_seen.append(self.log(10**7))

    def log_of(self, pod: str, previous: bool = False) -> str:
        args = ["-n", "kube-system", "logs", pod] + (["--previous"] if previous else [])
        return self.cluster.kubectl(*args, check=False)

    def log(self, size: int = 4000) -> str:
        """The live replicas' logs (and their previous containers'), newest last."""
        text = "".join(self.logs_seen)
        for pod in self.pods():
            name = pod["metadata"]["name"]
            text += f"\n--- {name} (previous)\n{self.log_of(name, True)}"
            text += f"\n--- {name}\n{self.log_of(name)}"
        return text[-size:]


class Bench:
    """The cluster with the operator running and the CRDs installed."""

    def __init__(self, cluster: Cluster, operator: Operator) -> None:
        self.cluster = cluster
        self.operator = operator
        self.nodes = {n.name: n for n in cluster.nodes if n.name in NODES}

    def gr(self, name: str, group: str = GROUP) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.cluster.get(f"/apis/{group}/v1/gcuresources/{name}")
        return found

    def status(self, name: str, group: str = GROUP) -> dict[str, Any]:
        return dict((self.gr(name, group) or {}).get("status") or {})

    def node_reports(self, name: str, group: str = GROUP) -> dict[str, dict[str, Any]]:
        """Each node's report, which the operator keeps on the Node (its state annotation)."""
        out = {}
        for node in NODES:
            found = self.cluster.get(f"/api/v1/nodes/{node}") or {}
            report = nodestate.report_of(found, f"{group}/{name}")
            if report is not None:
                out[node] = report
        return out

    def detail(self, name: str, group: str = GROUP) -> Callable[[], str]:
        def text() -> str:
            pods = self.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False)
            return (
                f"status: {json.dumps(self.status(name, group))[:3000]}\n{pods}\n"
                f"operator log:\n{self.operator.log()}"
            )

        return text

    def get_gr(self, resource: str) -> list[list[str]]:
        """``kubectl get <resource>`` as rows of words (a fresh discovery cache: kubectl's
        cache of the API's resources may predate the CRDs)."""
        with tempfile.TemporaryDirectory() as cache:
            table = self.cluster.kubectl("--cache-dir", cache, "get", resource)
        return [line.split() for line in table.splitlines() if line.strip()]

    def component_pods(self, selector: str, owner: str) -> list[dict[str, Any]]:
        """Live pods of the DaemonSet ``owner``."""
        return [
            p
            for p in self.cluster.pods("kube-system", selector)
            if not p["metadata"].get("deletionTimestamp")
            and any(o.get("name") == owner for o in p["metadata"].get("ownerReferences") or [])
        ]

    def on_each_node(self, selector: str, owner: str) -> dict[str, dict[str, Any]]:
        """The DaemonSet's one Ready pod per GCU node (E2EError-free: {} when not so)."""
        pods = self.component_pods(selector, owner)
        by_node = {p["spec"].get("nodeName"): p for p in pods if pod_ready(p)}
        return by_node if set(by_node) == set(NODES) and len(pods) == len(NODES) else {}

    def labels(self) -> dict[str, dict[str, str]]:
        return {n: dict(self.cluster.node(n)["metadata"].get("labels") or {}) for n in NODES}

    def configs(self) -> dict[str, dict[str, bytes]]:
        """Each node's /etc/containerd, file by file (the toolkit's undo leaves it as before)."""
        return dir_files({n: node.private("/etc/containerd") for n, node in self.nodes.items()})

    def node_mode_record(self, node: str) -> str:
        return os.path.join(self.nodes[node].private("/etc/enflame-gcu"), "node-mode.json")

    def wait_running(self, name: str, group: str = GROUP, timeout: float = 360) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            status = self.status(name, group)
            ok = status.get("phase") == "Running" and status.get("observedGeneration") == (
                (self.gr(name, group) or {}).get("metadata", {}).get("generation")
            )
            return status if ok else None

        return wait_for(
            f"{group} {name} to be Running", running, timeout, 2, detail=self.detail(name, group)
        )

    def assert_deployed(self, toolkit_ds: str, plugin_ds: str) -> dict[str, dict[str, Any]]:
        """Toolkit and plugin pods Ready on both nodes (ours, at this release), each node's mode
        recorded by the toolkit, validated, and showing its cards; the plugin pods by node."""
        toolkits = wait_for(
            "a Ready toolkit pod on each node",
            lambda: self.on_each_node(TOOLKIT_SELECTOR, toolkit_ds),
            120,
        )
        plugins = wait_for(
            "a Ready plugin pod on each node",
            lambda: self.on_each_node(PLUGIN_SELECTOR, plugin_ds),
            120,
        )
        for node, count in NODES.items():
            assert toolkits[node]["spec"]["containers"][0]["image"] == f"{TOOLKIT_IMAGE}:0.1.0"
            # The toolkit ran in its container on this node: it chose and recorded the mode.
            with open(self.node_mode_record(node), encoding="utf-8") as handle:
                assert json.load(handle)["mode"] == "device-specs", node

            def shows(node: str = node, count: int = count) -> bool:
                return self.cluster.gcus(node) == (count, count)

            wait_for(
                f"{node} to show {count} GCUs through the API",
                shows,
                90,
                detail=functools.partial(self.cluster.describe, "node", node),
            )
        labels = self.labels()
        assert all(labels[n].get(VALIDATED) == "true" for n in NODES), labels
        return plugins

    def delete_and_check(
        self,
        name: str,
        *,
        group: str,
        toolkit_ds: str,
        plugin_ds: str,
        labels_before: dict[str, dict[str, str]],
        configs_before: dict[str, dict[str, bytes]],
        delete: Callable[[], subprocess.Popen[str]],
    ) -> None:
        """``delete()`` deletes the resource (here: ``helm uninstall``, whose pre-delete hook
        does it; a process the removal is watched alongside): components removed in reverse
        order (the plugin's DaemonSet gone before the toolkit's), the toolkit's undo run, the
        nodes as they were."""
        process = delete()
        started = time.monotonic()
        path = "/apis/apps/v1/namespaces/kube-system/daemonsets/"
        gone: dict[str, float] = {}
        phases: set[str] = set()

        def removed() -> bool:
            phases.add(str(self.status(name, group).get("phase")))
            for ds in (plugin_ds, toolkit_ds):
                if ds not in gone and self.cluster.get(path + ds) is None:
                    gone[ds] = time.monotonic()
            return self.gr(name, group) is None

        wait_for(
            f"{group} {name} to be removed", removed, 300, 0.5, detail=self.detail(name, group)
        )
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"{process.args!r}: {out}{err[-3000:]}"
        for ds, when in gone.items():
            TIMES[f"{group} delete: DaemonSet {ds} gone after"] = round(when - started, 1)
        assert "Deleting" in phases, phases
        assert gone[plugin_ds] <= gone[toolkit_ds], gone
        assert not self.component_pods(TOOLKIT_SELECTOR, toolkit_ds)
        assert not self.component_pods(PLUGIN_SELECTOR, plugin_ds)
        for node in NODES:
            # The toolkit's undo (on SIGTERM in its container) removed its record.
            assert not os.path.exists(self.node_mode_record(node)), node
            annotations = self.cluster.node(node)["metadata"].get("annotations") or {}
            assert STATE_ANNOTATION not in annotations, annotations
        assert self.configs() == configs_before
        assert self.labels() == labels_before


def helm_started(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    """A Helm action (test_helm.helm's) started, not waited for."""
    return subprocess.Popen(
        [HELM_PYTHON, ACTIONS, cluster.plane.kubeconfig, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def released(cluster: Cluster) -> bool:
    secrets = cluster.kubectl("-n", "kube-system", "get", "secrets", "-o", "name")
    return f"sh.helm.release.v1.{RELEASE}." in secrets


@pytest.fixture(scope="module")
def bench(cluster: Cluster) -> Iterator[Bench]:
    """Static DaemonSets and GCU pods out of the way; the scenarios install the chart. After:
    a release left uninstalled, any resource left let go, CRDs removed, static ones back."""
    if not os.access(HELM_PYTHON, os.X_OK):
        pytest.fail(f"no {HELM_PYTHON}: scripts/bootstrap.sh makes it (helm-python-sdk)")
    for name in NODES:  # as scenario 1 does (idempotent; this file may run alone)
        cluster.shell(f"kubectl label node {name} enflame.com/gcu.present=true --overwrite")
    cluster.kubectl(
        "delete", "namespace", "enflame", "--ignore-not-found", "--wait=true", "--timeout=120s"
    )
    found = [
        manifest
        for ds, manifest in STATIC.items()
        if cluster.get(f"/apis/apps/v1/namespaces/kube-system/daemonsets/{ds}") is not None
    ]
    for manifest in STATIC.values():
        cluster.kubectl(
            "delete",
            "-f",
            cluster.repo_file(manifest),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        )
    for selector in (PLUGIN_SELECTOR, TOOLKIT_SELECTOR):

        def none_left(selector: str = selector) -> bool:
            return not cluster.pods("kube-system", selector)

        wait_for(f"no pods of {selector}", none_left, 180)
    operator = Operator(cluster)
    try:
        yield Bench(cluster, operator)
    finally:
        print(f"\noperator log (tail):\n{operator.log(3000)}")
        if released(cluster):
            process = helm_started(cluster, "uninstall", RELEASE, "kube-system")
            print("cleanup: helm uninstall", process.communicate(timeout=300))
        for group in (GROUP, LEGACY):  # a resource the operator could not finish: let it go
            listed = cluster.plane.get(f"/apis/{group}/v1/gcuresources") or {"items": []}
            for item in listed["items"]:
                cluster.kubectl(
                    "patch",
                    f"gcuresources.{group}",
                    item["metadata"]["name"],
                    "--type=merge",
                    "-p",
                    '{"metadata":{"finalizers":[]}}',
                    check=False,
                )
        cluster.kubectl(
            "delete",
            "-f",
            cluster.repo_file(CRDS),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
            check=False,
        )
        for manifest in found:
            cluster.kubectl("apply", "-f", cluster.repo_file(manifest))
        if STATIC["enflame-device-plugin-daemonset"] in found:
            wait_for(
                "the static plugin pods to be Ready again",
                lambda: len(cluster.ready_pods("kube-system", PLUGIN_SELECTOR)) == 2,
                180,
            )


def install(bench: Bench, values: dict[str, Any]) -> None:
    """``helm install`` the chart; its CRDs established and both operator replicas Ready (a
    release a failed scenario left is uninstalled first)."""
    if released(bench.cluster):
        helm(bench.cluster, "uninstall", RELEASE, "kube-system")
    helm(bench.cluster, "install", RELEASE, CHART, "kube-system", json.dumps(values))
    for group in (GROUP, LEGACY):
        bench.cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/gcuresources.{group}", "--timeout=60s"
        )
    bench.operator.wait_ready()


def uninstalled_and_checked(bench: Bench, labels_before: dict[str, dict[str, str]]) -> None:
    """After ``helm uninstall``: nothing of ours anywhere (DaemonSets, pods, Services, the
    operator's RBAC, Deployment, PDB, hook Job, RuntimeClass, the release record, node labels
    and annotations), nothing Terminating, the CRDs kept (docs/operator.md, "Uninstall")."""
    cluster = bench.cluster
    ours = "app.kubernetes.io/managed-by=enflame-gcu-operator"
    left = cluster.kubectl("get", "daemonsets,pods,services", "-A", "-l", ours, "-o", "name")
    assert left.strip() == "", left
    kinds = (
        "deployments,daemonsets,pods,services,configmaps,serviceaccounts,roles,rolebindings,"
        "jobs,poddisruptionbudgets,clusterroles,clusterrolebindings"
    )
    selector = f"app.kubernetes.io/instance={RELEASE}"

    def nothing_left() -> bool:
        return not cluster.kubectl("get", kinds, "-A", "-l", selector, "-o", "name").strip()

    wait_for(
        "nothing of the release left",
        nothing_left,
        120,
        1,
        detail=lambda: cluster.kubectl("get", kinds, "-A", "-l", selector, check=False),
    )
    assert not released(cluster)
    runtime_classes = cluster.kubectl("get", "runtimeclasses", "-o", "name")
    assert "enflame" not in runtime_classes, runtime_classes
    for group in (GROUP, LEGACY):
        assert cluster.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gcuresources.{group}"
        ), group
        assert cluster.plane.api("GET", f"/apis/{group}/v1/gcuresources")["items"] == []
    terminating = [
        p["metadata"]["name"]
        for p in cluster.pods("kube-system")
        if p["metadata"].get("deletionTimestamp")
    ]
    assert terminating == [], terminating
    assert bench.labels() == labels_before
    for node in NODES:
        annotations = cluster.node(node)["metadata"].get("annotations") or {}
        assert not [a for a in annotations if "operator" in a], annotations


def test_operator_chart_installs_upgrades_in_place_rolls_the_plugin_and_uninstalls(
    bench: Bench, clean_namespace: str
) -> None:
    cluster = bench.cluster
    labels_before, configs_before = bench.labels(), bench.configs()
    for node in NODES:
        assert not os.path.exists(bench.node_mode_record(node)), node
    name = "enflame-gcu-resource"
    toolkit_ds, plugin_ds = "enflame-container-toolkit", "enflame-k8s-device-plugin"

    # helm install with operator.enabled (the operator as the chart's Deployment), then
    # helm upgrade with the chart's GcuResource (ours: toolkit, plugin, exporter, gfd labels,
    # validator). In one step Helm failed here: right after it installed the CRDs, kube-apiserver
    # 1.20 did not yet serve their group, so "no matches for kind GcuResource"
    # (docs/operator.md, "Helm upgrade and uninstall").
    started = time.monotonic()
    install(bench, chart_values(cluster, None))
    timed("chart: install to both operator replicas Ready", started)
    helm(cluster, "upgrade", RELEASE, CHART, "kube-system",
         json.dumps(chart_values(cluster, ours_spec())))  # fmt: skip
    status = bench.wait_running(name)
    timed("chart: install to Running", started)
    assert bench.gr(name)["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"  # type: ignore[index]
    # The API server (the CRD's schema, installed by the chart) refuses a wrong enum value,
    # naming the field; nothing is created.
    with open(cluster.repo_file(OURS), encoding="utf-8") as handle:
        bad = yaml.safe_load(handle)
    bad["metadata"]["name"] = "typo"
    bad["spec"]["nodeMode"] = "cdii"
    result = cluster.plane.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert result.returncode != 0, result
    assert "spec.nodeMode" in result.stderr, result.stderr
    assert bench.gr("typo") is None
    assert status["readyResource"] == "5/5", status
    rows = bench.get_gr("gr")
    assert rows[0] == ["NAME", "READY", "STATUS", "AGE"], rows
    assert rows[1][:3] == [name, "5/5", "Running"], rows
    plugins = bench.assert_deployed(toolkit_ds, plugin_ds)
    reports = bench.node_reports(name)
    assert status["nodeCounts"]["problems"] == 0, status
    for node in NODES:
        assert reports[node]["validated"] is True and reports[node]["ready"] == "2/2", reports
        assert reports[node]["lastError"] == "", reports
    toolkit_uids = {
        p["metadata"]["uid"] for p in bench.component_pods(TOOLKIT_SELECTOR, toolkit_ds)
    }
    service = cluster.get("/api/v1/namespaces/kube-system/services/enflame-gcu-exporter")
    assert service is not None and service["spec"]["ports"][0]["port"] == 9402

    # A GCU pod on each node.
    held: dict[str, list[str]] = {}
    for pod, node in (("op-a", "gcu-node-1"), ("op-b", "gcu-node-2")):
        cluster.kubectl("apply", "-f", "-", stdin=pinned(pod, node, 2))
        cluster.wait_pod("enflame", pod)
        held[pod] = wait_for(
            f"{pod}'s cards in its log",
            functools.partial(logged_cards, cluster, pod),
            60,
        )
        assert len(held[pod]) == 2, held

    # helm upgrade with an unrelated value (the operator's memory limit): the operator's own
    # pods are replaced one at a time; the GcuResource is patched with the same spec, so no
    # component pod restarts (same UIDs, restartCount 0) and the GCU pods run on.
    def component_state() -> dict[str, tuple[str, int]]:
        pods = [
            p
            for selector, owner in ((TOOLKIT_SELECTOR, toolkit_ds), (PLUGIN_SELECTOR, plugin_ds))
            for p in bench.component_pods(selector, owner)
        ] + cluster.pods("enflame")
        return {
            p["metadata"]["name"]: (
                p["metadata"]["uid"],
                sum(s.get("restartCount", 0) for s in p["status"].get("containerStatuses") or []),
            )
            for p in pods
        }

    components_before = component_state()
    assert all(count == 0 for _, count in components_before.values()), components_before
    generation = bench.gr(name)["metadata"]["generation"]  # type: ignore[index]
    operator_pods = {p["metadata"]["uid"] for p in bench.operator.pods()}
    bench.operator.keep_logs()
    started = time.monotonic()
    # Kept in the upgrades after this one (Helm's values are given whole each time).
    limits = {"resources": {"limits": {"memory": "320Mi"}}}
    unrelated = chart_values(cluster, ours_spec(), **limits)
    helm(cluster, "upgrade", RELEASE, CHART, "kube-system", json.dumps(unrelated))

    def operator_replaced() -> bool:
        pods = [p for p in bench.operator.pods() if pod_ready(p)]
        uids = {p["metadata"]["uid"] for p in pods}
        return len(pods) == 2 and not uids & operator_pods

    wait_for("both operator replicas replaced", operator_replaced, 240, 2)
    bench.operator.wait_ready()
    timed("chart: unrelated upgrade, operator replicas replaced", started)
    time.sleep(10)  # the new leader's passes: still nothing to do
    assert bench.gr(name)["metadata"]["generation"] == generation  # type: ignore[index]
    assert bench.status(name)["phase"] == "Running"
    assert component_state() == components_before

    # The "new release": the plugin image under a second tag in each node's containerd.
    for member in bench.nodes.values():
        member.ctr(
            "images", "tag", "--force", f"{PLUGIN_IMAGE}:0.1.0", f"{PLUGIN_IMAGE}:{SECOND_TAG}"
        )
    old = {node: p["metadata"]["uid"] for node, p in plugins.items()}
    restarts_before = bench.operator.restarts()
    started = time.monotonic()
    helm(cluster, "upgrade", RELEASE, CHART, "kube-system",
         json.dumps(chart_values(cluster, ours_spec(version=SECOND_TAG), **limits)))  # fmt: skip
    upgrading: list[list[str]] = []
    replaced: list[str] = []  # nodes in the order their plugin pod was replaced
    phases: set[str] = set()
    killed: list[str] = []
    frozen: list[float] = []

    def renewal_soon() -> bool:
        due = bench.operator.next_renewal_in()
        return due is not None and 1.0 <= due <= 5.0

    def rolled() -> bool:
        status = bench.status(name)
        phases.add(str(status.get("phase")))
        upgrading.append(list((status.get("rollout") or {}).get("upgrading") or []))
        for pod in bench.component_pods(PLUGIN_SELECTOR, plugin_ds):
            node = pod["spec"].get("nodeName")
            if pod["metadata"]["uid"] != old.get(node) and node not in replaced:
                replaced.append(node)
        if replaced and not killed:
            # Mid-rollout (a node's new plugin pod exists, not yet validated): the leading
            # replica is SIGKILLed; the kubelet restarts it, and whichever replica holds the
            # Lease next (the standby once it expires) carries on.
            killed.append(json.dumps(status.get("rollout")))
            bench.operator.kill_leader(bench.nodes)
        elif killed and not frozen and "Upgrading" in phases and renewal_soon():
            # API trouble mid-rollout (issue 33 point 5): kube-apiserver answers nothing for
            # 30 s (frozen: every request hangs until the operator's own timeout). The
            # operator process stays up and the rollout finishes with the budget held. The
            # freeze starts a few seconds before the leader's next Lease renewal, so that
            # renewal times out inside it (20 s): frozen at any moment, a replica that had just
            # renewed and finished its pass met no failure at all (its next renewal, 15 s on,
            # outlived the freeze), and there was no outage to recover from.
            frozen.append(freeze_apiserver(cluster, 30.0))
        pods = bench.on_each_node(PLUGIN_SELECTOR, plugin_ds)
        images = {p["spec"]["containers"][0]["image"] for p in pods.values()}
        generation = (bench.gr(name) or {}).get("metadata", {}).get("generation")
        return (
            status.get("phase") == "Running"
            and status.get("observedGeneration") == generation
            and images == {f"{PLUGIN_IMAGE}:{SECOND_TAG}"}
        )

    wait_for(
        "the plugin rolled to the second tag on both nodes",
        rolled,
        480,
        1,
        detail=bench.detail(name),
    )
    timed("chart: plugin version rollout, 2 nodes, leader killed, API frozen 30 s", started)
    assert "Upgrading" in phases, phases
    assert killed, "the operator was never killed mid-rollout"
    assert frozen, "the API server was never stopped mid-rollout"
    # Both replicas up: the killed one restarted once, neither in CrashLoopBackOff, and the
    # freeze restarted none (the liveness probe waits longer than the outage).
    bench.operator.wait_ready()
    restarts = bench.operator.restarts()
    assert set(restarts) == set(restarts_before), (restarts, restarts_before)
    assert sum(count for count, _ in restarts.values()) == 1, restarts
    assert not [reason for _, reason in restarts.values() if reason], restarts
    operator_log = bench.operator.log(400_000)
    assert "works again" in operator_log, operator_log[-3000:]
    assert "Traceback" not in operator_log, operator_log[-3000:]
    assert sorted(replaced) == sorted(NODES), replaced
    # maxUnavailable 1: one node at a time, and it was seen doing so.
    assert max(len(u) for u in upgrading) == 1, upgrading
    assert [u[0] for u in upgrading if u] == sorted(
        [u[0] for u in upgrading if u], key=replaced.index
    ), (upgrading, replaced)
    status = bench.status(name)
    assert status["readyResource"] == "5/5" and status["nodeCounts"]["validated"] == len(NODES)
    rows = bench.get_gr("gr")
    assert rows[1][:3] == [name, "5/5", "Running"], rows
    # The toolkit did not change: its pods were not restarted.
    assert {
        p["metadata"]["uid"] for p in bench.component_pods(TOOLKIT_SELECTOR, toolkit_ds)
    } == toolkit_uids
    assert all(v == "true" for v in (bench.labels()[n].get(VALIDATED) for n in NODES))

    # The GCU pods ran on throughout, with the same cards.
    for pod, cards in held.items():
        obj = cluster.pod("enflame", pod)
        assert obj is not None and obj["status"]["phase"] == "Running", obj
        assert obj["status"]["containerStatuses"][0]["restartCount"] == 0
        listed = cluster.kubectl("-n", "enflame", "exec", pod, "--", "sh", "-c", "ls /dev")
        assert sorted(re.findall(r"\bgcu\d+\b", listed), key=lambda n: int(n[3:])) == cards
    # New pods get the free cards, none twice.
    for pod, node, count, other in (
        ("op-c", "gcu-node-1", 6, "op-a"),
        ("op-d", "gcu-node-2", 2, "op-b"),
    ):
        cluster.kubectl("apply", "-f", "-", stdin=pinned(pod, node, count))
        cluster.wait_pod("enflame", pod)
        fresh = wait_for(
            f"{pod}'s cards in its log",
            functools.partial(logged_cards, cluster, pod),
            60,
        )
        assert len(fresh) == count and not set(fresh) & set(held[other]), (held, fresh)
        assert sorted(set(fresh) | set(held[other]), key=lambda n: int(n[3:])) == [
            f"gcu{i}" for i in range(NODES[node])
        ]
        held[pod] = fresh

    # Every card is held now. Another version: gcu-node-1 goes first; no card is free for its
    # validator, so the operator waits for one (saying so on the node) for podReadyTimeoutSeconds
    # (90 s here), then the rollout stops there, naming the node and why; gcu-node-2 is left
    # alone. Setting the previous version again (a card freed) rolls back.
    rolled_uids = {
        p["spec"]["nodeName"]: p["metadata"]["uid"]
        for p in bench.component_pods(PLUGIN_SELECTOR, plugin_ds)
    }
    started = time.monotonic()
    held_spec = ours_spec(version="0.1.0")
    held_spec["upgradePolicy"]["podReadyTimeoutSeconds"] = 90
    helm(cluster, "upgrade", RELEASE, CHART, "kube-system",
         json.dumps(chart_values(cluster, held_spec, **limits)))  # fmt: skip
    waited: list[str] = []

    def stopped() -> dict[str, Any] | None:
        status = bench.status(name)
        waited.extend(
            str(n.get("lastError"))
            for n in bench.node_reports(name).values()
            if "waiting for a free enflame.com/gcu card" in str(n.get("lastError"))
        )
        failed = (status.get("rollout") or {}).get("failed") or []
        return status if status.get("phase") == "Failed" and failed else None

    status = wait_for(
        "the rollout to stop on gcu-node-1", stopped, 300, 1, detail=bench.detail(name)
    )
    timed("chart: rollout stopped by a node with no free card", started)
    assert waited, "the node's wait for a free card was never said"
    failed = status["rollout"]["failed"]
    assert [f["node"] for f in failed] == ["gcu-node-1"], failed
    assert failed[0]["reason"].startswith(
        "validator: no free enflame.com/gcu card on the node in 90 s"
    ), failed
    assert "gcu-node-1" in status["conditions"][0]["message"], status["conditions"]
    rows = bench.get_gr("gr")
    assert rows[1][2] == "Failed" and rows[1][1] != "5/5", rows
    labels = bench.labels()
    assert VALIDATED not in labels["gcu-node-1"], labels
    assert labels["gcu-node-2"].get(VALIDATED) == "true", labels
    time.sleep(5)  # the rollout stays stopped: gcu-node-2 keeps its plugin pod
    node_2 = [
        p
        for p in bench.component_pods(PLUGIN_SELECTOR, plugin_ds)
        if p["spec"]["nodeName"] == "gcu-node-2"
    ]
    assert [p["metadata"]["uid"] for p in node_2] == [rolled_uids["gcu-node-2"]], node_2
    assert bench.status(name)["phase"] == "Failed"

    cluster.delete_pods("enflame", "op-c")
    del held["op-c"]
    started = time.monotonic()
    helm(cluster, "upgrade", RELEASE, CHART, "kube-system",
         json.dumps(chart_values(cluster, ours_spec(version=SECOND_TAG), **limits)))  # fmt: skip

    def rolled_back() -> bool:
        status = bench.status(name)
        pods = bench.on_each_node(PLUGIN_SELECTOR, plugin_ds)
        images = {p["spec"]["containers"][0]["image"] for p in pods.values()}
        generation = (bench.gr(name) or {}).get("metadata", {}).get("generation")
        return (
            status.get("phase") == "Running"
            and status.get("observedGeneration") == generation
            and images == {f"{PLUGIN_IMAGE}:{SECOND_TAG}"}
        )

    wait_for("the rollback to the previous version", rolled_back, 300, 1, detail=bench.detail(name))
    timed("chart: rollback of the failed node", started)
    after = {
        p["spec"]["nodeName"]: p["metadata"]["uid"]
        for p in bench.component_pods(PLUGIN_SELECTOR, plugin_ds)
    }
    assert after["gcu-node-2"] == rolled_uids["gcu-node-2"], (after, rolled_uids)
    assert all(v == "true" for v in (bench.labels()[n].get(VALIDATED) for n in NODES))
    rows = bench.get_gr("gr")
    assert rows[1][:3] == [name, "5/5", "Running"], rows
    for pod, cards in held.items():  # through a stopped rollout and its rollback
        listed = cluster.kubectl("-n", "enflame", "exec", pod, "--", "sh", "-c", "ls /dev")
        assert sorted(re.findall(r"\bgcu\d+\b", listed), key=lambda n: int(n[3:])) == cards
    cluster.delete_pods("enflame", *held)

    # helm uninstall: its pre-delete hook deletes the resource and waits while the operator
    # removes the components (reverse order, the toolkit's undo); then Helm deletes the rest.
    bench.operator.keep_logs()
    started = time.monotonic()
    bench.delete_and_check(
        name,
        group=GROUP,
        toolkit_ds=toolkit_ds,
        plugin_ds=plugin_ds,
        labels_before=labels_before,
        configs_before=configs_before,
        delete=functools.partial(helm_started, cluster, "uninstall", RELEASE, "kube-system"),
    )
    timed("chart: uninstall to nodes as before", started)
    uninstalled_and_checked(bench, labels_before)
    for member in bench.nodes.values():
        member.ctr("images", "rm", f"{PLUGIN_IMAGE}:{SECOND_TAG}")


def test_operator_vendor_example_applies_unchanged_and_gives_the_same_components(
    bench: Bench, clean_namespace: str
) -> None:
    cluster = bench.cluster
    labels_before, configs_before = bench.labels(), bench.configs()
    name = "enflame-gcu-resource"
    # The vendor's names for the workloads (its 2.0 example), our images in them.
    toolkit_ds, plugin_ds = "enflame-gcu-docker-plugin", "enflame-gcu-k8s-plugin"
    install(bench, chart_values(cluster, None))  # the operator only, no GcuResource of the chart's
    started = time.monotonic()
    cluster.kubectl("apply", "-f", cluster.repo_file(VENDOR))
    status = bench.wait_running(name, LEGACY)
    timed("vendor example: apply to Running", started)
    rows = bench.get_gr(f"gcuresources.{LEGACY}")
    assert rows[0] == ["NAME", "READY", "STATUS", "AGE"], rows
    assert rows[1][:3] == [name, "5/5", "Running"], rows
    unsupported = {u["field"] for u in status["unsupported"]}
    assert {"spec.nfd", "spec.devicePlugin.image", "spec.toolkit.image"} <= unsupported
    plugins = bench.assert_deployed(toolkit_ds, plugin_ds)
    for pod in plugins.values():
        assert pod["spec"]["containers"][0]["image"] == f"{PLUGIN_IMAGE}:0.1.0"
    # A GCU pod runs on the cards the vendor resource's plugin serves.
    cluster.kubectl("apply", "-f", "-", stdin=pinned("vendor-gcu", "gcu-node-2", 4))
    cluster.wait_pod("enflame", "vendor-gcu")
    cards = wait_for(
        "vendor-gcu's cards in its log",
        lambda: cards_in(cluster.kubectl("-n", "enflame", "logs", "vendor-gcu")),
        60,
    )
    assert cards == ["gcu0", "gcu1", "gcu2", "gcu3"], cards
    cluster.delete_pods("enflame", "vendor-gcu")
    bench.operator.keep_logs()
    started = time.monotonic()
    bench.delete_and_check(
        name,
        group=LEGACY,
        toolkit_ds=toolkit_ds,
        plugin_ds=plugin_ds,
        labels_before=labels_before,
        configs_before=configs_before,
        # The hook deletes resources of both groups, the vendor's included.
        delete=functools.partial(helm_started, cluster, "uninstall", RELEASE, "kube-system"),
    )
    timed("vendor example: uninstall to nodes as before", started)
    uninstalled_and_checked(bench, labels_before)


def test_operator_logged_no_traceback(bench: Bench) -> None:
    """The operator's logs (the replicas the scenarios killed or replaced included): no
    Traceback, its own lines at the default level, not one per HTTP request."""
    log = "".join(bench.operator.logs_seen) + bench.operator.log(10**7)
    assert "Traceback" not in log, log[-4000:]
    assert "actions" in log and "HTTP Request" not in log, log[-4000:]
    TIMES["operator passes that failed and were retried"] = log.count("pass failed")
    TIMES["operator leader kills"] = bench.operator.kills
    print("\noperator e2e:", json.dumps(TIMES))
