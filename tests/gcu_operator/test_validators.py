"""Validator pods that a real kubelet runs: on DRA nodes through a ResourceClaimTemplate placed
by the scheduler, on runtimeclass nodes through RuntimeClass enflame (which the operator
creates); and the fake refusing, as the real scheduler, kubelet and API server do, the pods
the old validator was."""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, components, names, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, node_reports, ours, status

NODES = ["node-a", "node-b"]


def _start(resource: dict[str, Any], dra: bool = False) -> tuple[FakeApi, FakeCluster]:
    fake = FakeApi(dra_served=dra)
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    return fake, cluster


def _settle(fake: FakeApi, cluster: FakeCluster) -> None:
    operator = runner.Operator(fake, clock=lambda: fake.now)
    for _ in range(5):
        converge(operator, cluster)
        cluster.step()
    converge(operator, cluster)


def test_dra_node_is_validated_through_a_claim_placed_by_the_scheduler() -> None:
    resource = ours(dra={})
    fake, cluster = _start(resource, dra=True)
    fake.patch(api.NODE, "node-a", {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    _settle(fake, cluster)
    st = status(fake, resource)
    by_node = node_reports(fake, resource)
    assert by_node["node-a"]["mode"] == "dra"
    assert by_node["node-a"]["validated"], by_node["node-a"]
    assert cluster.node_labels("node-a").get(names.VALIDATED_LABEL) == "true"
    assert st["phase"] == "Running", st["conditions"]
    template = fake.find(api.RESOURCE_CLAIM_TEMPLATE, "enflame-gcu-validator", "kube-system")
    assert template is not None
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == components.DRA_DEVICE_CLASS


def test_dra_validator_pod_asks_through_its_claim_and_node_affinity() -> None:
    component = rs.parse(ours(dra={})["spec"]).components[rs.VALIDATOR]
    resource = {**ours(dra={}), "metadata": {"name": "gcu", "uid": "u-1"}}
    pod = components.validator_pod(resource, component, "node-a", "t" * 16, mode="dra")
    spec = pod["spec"]
    assert "nodeName" not in spec
    assert spec["resourceClaims"] == [
        {"name": "gcu", "resourceClaimTemplateName": "enflame-gcu-validator"}
    ]
    assert "limits" not in spec["containers"][0]["resources"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]


def test_runtimeclass_nodes_are_validated_through_runtimeclass_enflame() -> None:
    resource = ours(nodeMode="runtimeclass")
    fake, cluster = _start(resource)
    _settle(fake, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    assert all(n["validated"] for n in node_reports(fake, resource).values())
    rc = fake.find(api.RUNTIME_CLASS, components.RUNTIME_CLASS)
    assert rc is not None and rc["handler"] == "enflame"
    uid = fake.find(api.GCU_RESOURCE, "gcu")["metadata"]["uid"]  # type: ignore[index]
    assert rc["metadata"]["ownerReferences"][0]["uid"] == uid


def test_an_existing_runtimeclass_enflame_is_used_not_reported() -> None:
    resource = ours(nodeMode="runtimeclass")
    fake, cluster = _start(resource)
    fake.put(api.RUNTIME_CLASS, {"metadata": {"name": "enflame"}, "handler": "enflame"})
    _settle(fake, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    rc = fake.find(api.RUNTIME_CLASS, "enflame")
    assert rc is not None and "ownerReferences" not in rc["metadata"]


def test_removal_takes_the_runtimeclass_and_the_claim_template_away() -> None:
    resource = ours(nodeMode="runtimeclass", dra={})
    fake, cluster = _start(resource, dra=True)
    fake.patch(api.NODE, "node-a", {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    _settle(fake, cluster)
    assert fake.objects(api.RUNTIME_CLASS) and fake.objects(api.RESOURCE_CLAIM_TEMPLATE)
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(runner.Operator(fake, clock=lambda: fake.now), cluster)
    assert fake.objects(api.GCU_RESOURCE) == []
    assert fake.objects(api.RUNTIME_CLASS) == []
    assert fake.objects(api.RESOURCE_CLAIM_TEMPLATE) == []


# --- the fake refuses what the real components refuse ---------------------------------------


def _pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "validator", "image": "x"}],
            **spec,
        },
    }


def test_fake_kubelet_refuses_an_extended_resource_the_node_does_not_serve() -> None:
    fake, cluster = _start(ours(dra={}), dra=True)
    pod = _pod("p", {"nodeName": "node-a"})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"enflame.com/gcu": "1"}}
    fake.create(api.POD, pod)
    cluster.step()
    got = fake.find(api.POD, "p", "default")
    assert got is not None
    assert got["status"]["phase"] == "Failed"
    assert got["status"]["reason"] == "OutOfenflame.com/gcu"


def test_fake_never_runs_a_nodename_pod_whose_claim_the_scheduler_did_not_allocate() -> None:
    fake, cluster = _start(ours(dra={}), dra=True)
    pod = _pod("p", {"nodeName": "node-a", "resourceClaims": [{"name": "gcu"}]})
    fake.create(api.POD, pod)
    for _ in range(5):
        cluster.step()
    got = fake.find(api.POD, "p", "default")
    assert got is not None and got["status"]["phase"] == "Pending"


def test_fake_api_refuses_a_pod_naming_a_missing_runtimeclass() -> None:
    fake, _ = _start(ours())
    with pytest.raises(api.ApiError) as caught:
        fake.create(api.POD, _pod("p", {"runtimeClassName": "enflame"}))
    assert caught.value.status == 403
    assert 'RuntimeClass "enflame" not found' in caught.value.message
