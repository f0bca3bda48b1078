"""The operator's validator pods through Kubernetes' own scheduler (issue 47 point 3).

A DRA node's validator pod is not bound by name: it asks for its GCU through a claim, which only
the scheduler allocates, and reaches its node by node affinity. A drain rollout cordons that
node first, so the pod must tolerate the cordon's taint or it never schedules, the node never
validates and stays cordoned. Kubernetes 1.20 serves no DRA API (its API server drops the
pod's claim fields), so what is tested here is the scheduling half, on the real scheduler:
the pod as the operator makes it lands on its cordoned node, and without the toleration (the
operator before the fix) the scheduler keeps it Pending for the cordon. The claim half is
tested against DRA.md's facts in tests/dra_plugin and on the FakeCluster (tests/gcu_operator).
"""

from __future__ import annotations

import copy
from typing import Any

from enflame_gcu.gcu_operator import components
from enflame_gcu.gcu_operator import resource as rs
from tests.controlplane import conftest
from tests.controlplane.harness import Harness, until

pytestmark = list(conftest.MARKS)


def _dra_validator(node: str, namespace: str) -> dict[str, Any]:
    resource = {
        "apiVersion": "topscloud.enflame.com/v1",
        "kind": "GcuResource",
        "metadata": {"name": "validated", "uid": "00000000-0000-0000-0000-000000000047"},
    }
    spec = rs.parse({"dra": {}, "validator": {}})
    pod = components.validator_pod(
        resource, spec.components[rs.VALIDATOR], node, "0123456789abcdef", mode="dra"
    )
    pod["metadata"]["namespace"] = namespace
    del pod["metadata"]["ownerReferences"]  # no such GcuResource here: kept by the test
    return pod


def _pod(harness: Harness, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = harness.plane.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return found


def test_a_dra_validator_pod_schedules_onto_its_cordoned_node(
    harness: Harness, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    (node,) = sim_nodes(1, unschedulable=True)
    pod = _dra_validator(node, namespace)
    assert "nodeName" not in pod["spec"]  # through the scheduler, as a claim needs
    harness.plane.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    name = pod["metadata"]["name"]
    until(
        lambda: _pod(harness, namespace, name)["spec"].get("nodeName") == node,
        "the validator bound to its cordoned node",
        60,
    )
    # The control: the same pod without the cordon's toleration is what the scheduler keeps
    # off a cordoned node (so the test above passes for the toleration, not by accident).
    bare = copy.deepcopy(pod)
    bare["metadata"]["name"] = f"{name[:240]}-bare"
    bare["spec"]["tolerations"] = [
        t for t in bare["spec"]["tolerations"] if t != components.CORDON_TOLERATION
    ]
    harness.plane.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare)

    def unschedulable() -> str | None:
        conditions = _pod(harness, namespace, bare["metadata"]["name"])["status"].get("conditions")
        for c in conditions or []:
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                return str(c.get("message"))
        return None

    message = until(unschedulable, "the scheduler's refusal", 60)
    assert "unschedulable" in message, message
    assert not _pod(harness, namespace, bare["metadata"]["name"])["spec"].get("nodeName")
