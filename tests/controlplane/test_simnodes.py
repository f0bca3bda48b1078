"""The harness itself: simulated nodes behave as kubelets do, and Kubernetes does the rest.

Each test here would pass against the hand-written stand-ins only where they agree with
Kubernetes; they pin the behaviour the operator and extender tests rely on: the real scheduler
honours capacity, cordons and taints, the real DaemonSet controller adds its tolerations, the
agent admits and refuses with the kubelet's words, runs pods to completion and honours grace.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.controlplane import conftest
from tests.controlplane.harness import Harness, until

pytestmark = list(conftest.MARKS)
GCU = "enflame.com/gcu"


def pod(
    name: str,
    gcus: int = 0,
    *,
    node: str = "",
    restart: str = "Always",
    tolerations: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    grace: int | None = None,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A one-container pod asking for ``gcus`` cards (pinned to ``node`` when given)."""
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gcus:
        container["resources"] = {"limits": {GCU: str(gcus)}}
    spec: dict[str, Any] = {"containers": [container], "restartPolicy": restart}
    if node:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = tolerations
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def create(harness: Harness, namespace: str, body: dict[str, Any]) -> None:
    harness.plane.api("POST", f"/api/v1/namespaces/{namespace}/pods", body)


def get(harness: Harness, namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = harness.plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return found


def phase(harness: Harness, namespace: str, name: str) -> str:
    found = get(harness, namespace, name)
    return "" if found is None else str(found.get("status", {}).get("phase", ""))


def ready(found: dict[str, Any] | None) -> bool:
    conditions = (found or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def scheduling_message(harness: Harness, namespace: str, name: str) -> str:
    found = get(harness, namespace, name) or {}
    for condition in found.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return ""


def test_nodes_register_with_leases_and_the_lifecycle_controller_lifts_the_not_ready_taint(
    harness: Harness, sim_nodes: conftest.MakeNodes
) -> None:
    (name,) = sim_nodes(1)
    node = harness.plane.api("GET", f"/api/v1/nodes/{name}")
    assert node["status"]["allocatable"][GCU] == "8"
    assert not [t for t in node["spec"].get("taints") or [] if "not-ready" in t["key"]]
    lease = harness.plane.api(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    )
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = lease["spec"]["renewTime"]
    until(
        lambda: (
            harness.plane.api(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            )["spec"]["renewTime"]
            != first
        ),
        "a Lease renewal",
        30,
    )


def test_the_scheduler_places_by_free_cards_and_leaves_the_rest_pending(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    (name,) = sim_nodes(1, cards=4)
    for i in range(3):
        create(harness, namespace, pod(f"p{i}", 2, selector={"kubernetes.io/hostname": name}))
    until(
        lambda: sum(phase(harness, namespace, f"p{i}") == "Running" for i in range(3)) == 2,
        "two running",
        60,
    )
    pending = [f"p{i}" for i in range(3) if phase(harness, namespace, f"p{i}") == "Pending"]
    assert len(pending) == 1
    message = until(
        lambda: scheduling_message(harness, namespace, pending[0]), "FailedScheduling", 30
    )
    assert f"Insufficient {GCU}" in message


def test_cordoned_and_tainted_nodes_get_no_pods_unless_tolerated(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    cordoned = sim_nodes(1, unschedulable=True)[0]
    tainted = sim_nodes(1, taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}])[
        0
    ]
    create(harness, namespace, pod("to-cordoned", 1, selector={"kubernetes.io/hostname": cordoned}))
    create(harness, namespace, pod("to-tainted", 1, selector={"kubernetes.io/hostname": tainted}))
    tolerates = [
        {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
    ]
    create(
        harness,
        namespace,
        pod("tolerating", 1, selector={"kubernetes.io/hostname": tainted}, tolerations=tolerates),
    )
    until(
        lambda: phase(harness, namespace, "tolerating") == "Running",
        "the tolerating pod running",
        60,
    )
    assert "unschedulable" in until(
        lambda: scheduling_message(harness, namespace, "to-cordoned"), "cordon message", 30
    )
    assert "taint" in until(
        lambda: scheduling_message(harness, namespace, "to-tainted"), "taint message", 30
    )
    assert (
        phase(harness, namespace, "to-cordoned")
        == phase(harness, namespace, "to-tainted")
        == "Pending"
    )


def test_a_pod_bound_past_the_free_cards_is_refused_in_the_kubelets_words(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    (name,) = sim_nodes(1, cards=2)
    create(harness, namespace, pod("holder", 2, node=name))
    until(lambda: phase(harness, namespace, "holder") == "Running", "the holder running", 30)
    create(harness, namespace, pod("late", 1, node=name))
    until(lambda: phase(harness, namespace, "late") == "Failed", "the refusal", 30)
    status = (get(harness, namespace, "late") or {})["status"]
    assert status["reason"] == "UnexpectedAdmissionError"
    assert status["message"] == (
        f"Pod Allocate failed due to requested number of devices unavailable for {GCU}. "
        "Requested: 1, Available: 0, which is unexpected"
    )
    big_cpu = pod("cpu-hog", node=name)
    big_cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "65"}}
    create(harness, namespace, big_cpu)
    until(lambda: phase(harness, namespace, "cpu-hog") == "Failed", "the cpu refusal", 30)
    status = (get(harness, namespace, "cpu-hog") or {})["status"]
    assert status["reason"] == "OutOfcpu"
    assert "Node didn't have enough resource: cpu, requested: 65000" in status["message"]


class _SlowPlugin:
    """A device plugin that takes its time to answer (as one under load does): the agent awaits
    it between reading the free cards and recording the ones it gave."""

    resource = GCU

    async def allocate(self, free: list[str], size: int) -> tuple[str, ...]:
        await asyncio.sleep(0.5)
        return tuple(free[:size])


def test_two_pods_bound_at_once_are_admitted_one_at_a_time_as_the_kubelet_does(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    """Both want the node's two cards: one runs, the other is refused, never both on one card."""
    (name,) = sim_nodes(1, cards=2, plugin=lambda _: {GCU: _SlowPlugin()})
    create(harness, namespace, pod("first", 2, node=name))
    create(harness, namespace, pod("second", 2, node=name))
    until(
        lambda: (
            {phase(harness, namespace, n) for n in ("first", "second")} == {"Running", "Failed"}
        ),
        "one pod running and one refused",
        30,
    )
    refused = next(n for n in ("first", "second") if phase(harness, namespace, n) == "Failed")
    assert (get(harness, namespace, refused) or {})["status"][
        "reason"
    ] == "UnexpectedAdmissionError"


def test_run_to_completion_pods_succeed_or_fail_on_request(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    (name,) = sim_nodes(1)
    create(harness, namespace, pod("ok", 1, node=name, restart="Never"))
    create(
        harness,
        namespace,
        pod("bad", 1, node=name, restart="Never", annotations={"sim.enflame.com/exit-code": "3"}),
    )
    until(lambda: phase(harness, namespace, "ok") == "Succeeded", "success", 30)
    until(lambda: phase(harness, namespace, "bad") == "Failed", "failure", 30)
    bad = (get(harness, namespace, "bad") or {})["status"]["containerStatuses"][0]
    assert bad["state"]["terminated"]["exitCode"] == 3
    # The cards of ended pods are free again: a pod asking for all 8 runs.
    create(harness, namespace, pod("all", 8, node=name))
    until(lambda: phase(harness, namespace, "all") == "Running", "all cards free again", 30)


@pytest.mark.parametrize(("grace", "stays"), [(0, False), (30, True)])
def test_deletion_waits_for_the_containers_within_the_grace_period(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str, grace: int, stays: bool
) -> None:
    (name,) = sim_nodes(1)
    create(harness, namespace, pod("p", 1, node=name, grace=grace))
    until(lambda: ready(get(harness, namespace, "p")), "ready", 30)
    slow = 3.0
    harness.call_soon(lambda: setattr(harness.nodes, "termination_seconds", slow))
    try:
        harness.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/p")
        found = get(harness, namespace, "p")
        # Grace 0 is an immediate delete by the API server; otherwise the pod is Terminating
        # until its containers stopped.
        assert (found is not None) == stays
        if stays:
            assert found is not None and found["metadata"].get("deletionTimestamp")
        until(lambda: get(harness, namespace, "p") is None, "the pod gone", 30)
    finally:
        harness.call_soon(lambda: setattr(harness.nodes, "termination_seconds", 0.5))


def test_the_daemonset_controller_adds_its_tolerations_and_skips_untolerated_taints(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    plain = sim_nodes(1, labels={"ds-test": namespace})[0]
    cordoned = sim_nodes(1, labels={"ds-test": namespace}, unschedulable=True)[0]
    tainted = sim_nodes(
        1, labels={"ds-test": namespace}, taints=[{"key": "gpu-only", "effect": "NoSchedule"}]
    )[0]
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "ds"},
        "spec": {
            "selector": {"matchLabels": {"app": "ds"}},
            "template": {
                "metadata": {"labels": {"app": "ds"}},
                "spec": {
                    "nodeSelector": {"ds-test": namespace},
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            },
        },
    }
    harness.plane.api("POST", f"/apis/apps/v1/namespaces/{namespace}/daemonsets", daemonset)

    def placed() -> dict[str, bool]:
        pods = harness.plane.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        return {p["spec"].get("nodeName", ""): ready(p) for p in pods if p["spec"].get("nodeName")}

    until(
        lambda: placed().get(plain) and placed().get(cordoned),
        "DaemonSet pods on the plain and cordoned nodes",
        60,
    )
    ds = until(
        lambda: (
            found
            if (
                found := harness.plane.api(
                    "GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/ds"
                )
            )["status"].get("numberReady")
            == 2
            else None
        ),
        "two ready",
        60,
    )
    assert ds["status"]["desiredNumberScheduled"] == 2
    assert tainted not in placed()
    pods = harness.plane.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    keys = {t["key"] for t in pods[0]["spec"]["tolerations"]}
    assert "node.kubernetes.io/unschedulable" in keys and "node.kubernetes.io/not-ready" in keys


def test_a_node_whose_heartbeats_stop_goes_unknown_through_the_lifecycle_controller(
    harness: Harness, sim_nodes: conftest.MakeNodes
) -> None:
    (name,) = sim_nodes(1)
    harness.call_soon(lambda: harness.nodes.stop_heartbeats(name))

    def condition() -> str:
        node = harness.plane.api("GET", f"/api/v1/nodes/{name}")
        return str(next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"))

    until(lambda: condition() == "Unknown", "Ready=Unknown", 90, every=1)
    node = harness.plane.api("GET", f"/api/v1/nodes/{name}")
    assert any(
        t["key"] == "node.kubernetes.io/unreachable" for t in node["spec"].get("taints") or []
    )
    harness.run(harness.nodes.resume_heartbeats(name))
    until(lambda: condition() == "True", "Ready again", 60, every=1)
