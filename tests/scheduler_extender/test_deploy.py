"""deploy/extender: schema-valid manifests, one extender stanza everywhere, the node-state
variant of the plugin, and the >= 1.30 admission policy's CEL run on real requests."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from enflame_gcu import node_state
from tests.deploy.helpers import DEPLOY, YAML_DIR
from tests.dra_plugin import admission

HERE = os.path.join(DEPLOY, "extender")
MANIFESTS = [
    "enflame-scheduler-extender.yaml",
    "enflame-gcu-scheduler.yaml",
    "enflame-device-plugin-node-state.yaml",
]
PLUGIN_USER = "system:serviceaccount:kube-system:enflame-device-plugin"


def documents(name: str) -> list[dict[str, Any]]:
    with open(os.path.join(HERE, name), encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def one(name: str, kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in documents(name) if doc["kind"] == kind]
    return found


@pytest.mark.parametrize("version", ["1.25.0", kv.latest_version()])
@pytest.mark.parametrize("name", MANIFESTS)
def test_manifests_validate_strictly(name: str, version: str) -> None:
    for doc in documents(name):
        kv.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", ["1.30.0", kv.latest_version()])
def test_the_policy_validates_where_it_exists(version: str) -> None:
    for doc in documents("node-state-policy.yaml"):
        kv.validate(doc, version, strict=True)


def extenders(config: dict[str, Any]) -> list[dict[str, Any]]:
    return list(config["extenders"])


def test_every_configuration_ships_the_same_ignorable_extender() -> None:
    (v1beta1,) = documents("kube-scheduler-config-v1beta1.yaml")
    (v1,) = documents("kube-scheduler-config-v1.yaml")
    separate = yaml.safe_load(one("enflame-gcu-scheduler.yaml", "ConfigMap")["data"]["config.yaml"])
    assert v1beta1["apiVersion"] == "kubescheduler.config.k8s.io/v1beta1"
    assert v1["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert separate["apiVersion"] == v1beta1["apiVersion"]
    assert extenders(v1beta1) == extenders(v1) == extenders(separate)
    (stanza,) = extenders(v1)
    assert stanza["ignorable"] is True and stanza["nodeCacheCapable"] is True
    assert stanza["urlPrefix"] == "http://127.0.0.1:32766"
    assert {r["name"] for r in stanza["managedResources"]} == {
        "enflame.com/gcu",
        "enflame.com/shared-gcu",
    }
    assert [p["schedulerName"] for p in v1["profiles"]] == [
        "default-scheduler",
        "enflame-gcu-scheduler",
    ]
    assert [p["schedulerName"] for p in separate["profiles"]] == ["enflame-gcu-scheduler"]
    assert separate["leaderElection"]["resourceName"] == "enflame-gcu-scheduler"


def test_the_extender_listens_where_the_configuration_calls_it() -> None:
    for name, kind in (
        ("enflame-scheduler-extender.yaml", "DaemonSet"),
        ("enflame-gcu-scheduler.yaml", "Deployment"),
    ):
        spec = one(name, kind)["spec"]["template"]["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == "enflame-scheduler-extender"]
        assert container["command"] == ["enflame-scheduler-extender"]
        assert container["args"] == ["--http-address=127.0.0.1:32766"]
        assert spec["securityContext"]["runAsNonRoot"] is True


def test_the_extender_may_only_read_pods_and_the_node_state_leases() -> None:
    (rule,) = one("enflame-scheduler-extender.yaml", "ClusterRole")["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    role = one("enflame-scheduler-extender.yaml", "Role")
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    # The separate scheduler's account reads them too.
    (binding,) = [
        doc
        for doc in documents("enflame-gcu-scheduler.yaml")
        if doc["kind"] == "RoleBinding" and doc["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["subjects"][0]["name"] == "enflame-gcu-scheduler"


def test_the_node_state_plugin_is_the_base_plus_what_it_needs() -> None:
    with open(os.path.join(YAML_DIR, "enflame-device-plugin.yaml"), encoding="utf-8") as handle:
        base = yaml.safe_load(handle)
    variant = copy.deepcopy(one("enflame-device-plugin-node-state.yaml", "DaemonSet"))
    spec = variant["spec"]["template"]["spec"]
    assert spec.pop("serviceAccountName") == "enflame-device-plugin"
    assert spec["automountServiceAccountToken"] is True
    spec["automountServiceAccountToken"] = False
    (container,) = spec["containers"]
    container["args"].remove("--node-state")
    node_name = container["env"].pop(0)
    assert node_name == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert variant == base
    (rule,) = one("enflame-device-plugin-node-state.yaml", "ClusterRole")["rules"]
    assert rule["resources"] == ["nodes"] and rule["verbs"] == ["get", "patch"]
    (lease_rule,) = one("enflame-device-plugin-node-state.yaml", "Role")["rules"]
    assert lease_rule == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "patch", "delete"],
    }


def policy(name: str = "enflame-device-plugin-own-node-state") -> dict[str, Any]:
    (found,) = [
        doc
        for doc in documents("node-state-policy.yaml")
        if doc["kind"] == "ValidatingAdmissionPolicy" and doc["metadata"]["name"] == name
    ]
    return found


def test_every_policy_is_bound() -> None:
    docs = documents("node-state-policy.yaml")
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bound = {
        d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    assert (
        policies
        == bound
        == {
            "enflame-device-plugin-own-node-state",
            "enflame-device-plugin-own-node-state-lease",
        }
    )


def node(name: str = "node-a", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {"keep": "me", **annotations},
        },
        "spec": {"podCIDR": "10.1.0.0/24"},
    }


def review(
    new: Any,
    old: Any,
    *,
    user: str = PLUGIN_USER,
    on: str | None = "node-a",
    operation: str = "UPDATE",
) -> admission.Verdict:
    info: dict[str, Any] = {"username": user}
    if on is not None:
        info["extra"] = {"authentication.kubernetes.io/node-name": [on]}
    request = {
        "operation": operation,
        "userInfo": info,
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
    }
    return admission.review(policy(), request, new, old)


STATE = {node_state.ANNOTATION: '{"version":1}'}
CAPACITY = {node_state.SHARED_CAPACITY_ANNOTATION: '{"7": 6}'}


def test_the_plugin_writes_and_removes_the_gcushare_annotation_and_drops_the_old_state() -> None:
    assert review(node(**CAPACITY), node()) == (True, "")
    assert review(node(**{node_state.SHARED_CAPACITY_ANNOTATION: "{}"}), node(**CAPACITY)) == (
        True,
        "",
    )
    assert review(node(), node(**CAPACITY)) == (True, "")
    assert review(node(**CAPACITY), node(**STATE)) == (True, "")  # an older version's, removed


def test_the_state_is_never_written_on_the_node_again() -> None:
    allowed, message = review(node(**STATE), node())
    assert not allowed and "may only remove enflame.com/gcu-node-state" in message
    changed = {node_state.ANNOTATION: '{"version":2}'}
    assert not review(node(**changed), node(**STATE))[0]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda n: n["metadata"]["annotations"].update(keep="changed"), "may change only the"),
        (lambda n: n["metadata"]["annotations"].pop("keep"), "may change only the"),
        (lambda n: n["metadata"]["labels"].update(evil="1"), "spec or labels"),
        (lambda n: n["spec"].update(unschedulable=True), "spec or labels"),
    ],
)
def test_anything_else_on_its_node_is_refused(change: Any, says: str) -> None:
    new = node(**CAPACITY)
    change(new)
    allowed, message = review(new, node())
    assert not allowed and says in message


def test_another_node_or_a_token_without_a_node_is_refused() -> None:
    allowed, message = review(node("node-b", **CAPACITY), node("node-b"))
    assert (
        not allowed
        and message == "enflame-device-plugin on node node-a may change only its own Node"
    )
    assert not review(node(**CAPACITY), node(), on=None)[0]
    assert not review(None, node(), operation="DELETE")[0]


def test_other_users_are_not_the_policys_business() -> None:
    new = node(**CAPACITY)
    new["spec"]["unschedulable"] = True
    assert review(new, node(), user="system:node:node-a") == (True, "")


def lease_review(
    new: Any,
    old: Any,
    *,
    operation: str = "UPDATE",
    on: str | None = "node-a",
    user: str = PLUGIN_USER,
) -> admission.Verdict:
    info: dict[str, Any] = {"username": user}
    if on is not None:
        info["extra"] = {"authentication.kubernetes.io/node-name": [on]}
    request = {
        "operation": operation,
        "userInfo": info,
        "resource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"},
    }
    return admission.review(
        policy("enflame-device-plugin-own-node-state-lease"), request, new, old
    )  # fmt: skip


def node_lease(name: str = "node-a", holder: str | None = None) -> dict[str, Any]:
    found = node_state.lease(name, "kube-system", '{"version":2}', 1.8e9)
    if holder is not None:
        found["spec"]["holderIdentity"] = holder
    return found


def test_the_plugin_writes_its_own_nodes_lease() -> None:
    assert lease_review(node_lease(), None, operation="CREATE") == (True, "")
    assert lease_review(node_lease(), node_lease()) == (True, "")
    assert lease_review(None, node_lease(), operation="DELETE") == (True, "")


@pytest.mark.parametrize(
    ("new", "old", "operation", "says"),
    [
        (node_lease("node-b"), None, "CREATE", "may write only the Lease named after its node"),
        (node_lease("node-b"), node_lease("node-b"), "UPDATE", "named after its node"),
        (None, node_lease("node-b"), "DELETE", "named after its node"),
        (node_lease(holder="node-b"), node_lease(), "UPDATE", "only a Lease its node holds"),
        (node_lease(holder="node-b"), None, "CREATE", "only a Lease its node holds"),
    ],
)
def test_another_nodes_lease_or_holder_is_refused(
    new: Any, old: Any, operation: str, says: str
) -> None:
    allowed, message = lease_review(new, old, operation=operation)
    assert not allowed and says in message, message


def test_a_lease_write_without_a_node_in_the_token_is_refused_and_others_are_not_judged() -> None:
    assert not lease_review(node_lease(), None, operation="CREATE", on=None)[0]
    other = "system:serviceaccount:kube-system:someone"
    assert lease_review(node_lease("x", "y"), None, operation="CREATE", user=other) == (True, "")
