"""The driver's service account may change only its own node's ResourceSlices (its policy's CEL).

RBAC grants create/update/delete on every ResourceSlice; the ValidatingAdmissionPolicy in the
manifest narrows that to the slices of driver gcu.enflame.com on the node the requesting pod
runs on. Its CEL is run here by a real CEL interpreter (tests/dra_plugin/admission.py) on the
requests a driver, a compromised driver and other users would send.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from enflame_gcu import resourceslices
from tests.deploy.helpers import CHART_DIR
from tests.dra_plugin import admission
from tests.dra_plugin import slices_helpers as helpers

DRIVER_USER = "system:serviceaccount:kube-system:enflame-dra-plugin"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def manifest_objects() -> dict[str, dict[str, Any]]:
    path = os.path.join(helpers.DRA_DEPLOY, "enflame-dra-plugin.yaml")
    return {doc["kind"]: doc for doc in helpers.load_yaml(path)}


def policy() -> dict[str, Any]:
    return manifest_objects()["ValidatingAdmissionPolicy"]


def slice_of(node: str, driver: str = resourceslices.DRIVER) -> dict[str, Any]:
    (document,) = resourceslices.build_slices(node, None, [], 1)
    document["spec"]["driver"] = driver
    return document


def request(operation: str, user: str = DRIVER_USER, node: str | None = "node-a") -> Any:
    info: dict[str, Any] = {"username": user}
    if node is not None:
        info["extra"] = {NODE_CLAIM: [node], "authentication.kubernetes.io/pod-name": ["p"]}
    return {
        "operation": operation,
        "userInfo": info,
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
    }


def review(operation: str, new: Any, old: Any, **who: Any) -> admission.Verdict:
    return admission.review(policy(), request(operation, **who), new, old)


def test_the_driver_manages_its_own_nodes_slices() -> None:
    mine = slice_of("node-a")
    assert review("CREATE", mine, None) == (True, "")
    assert review("UPDATE", mine, mine) == (True, "")
    assert review("DELETE", None, mine) == (True, "")


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        ("CREATE", slice_of("node-b"), None),
        ("UPDATE", slice_of("node-b"), slice_of("node-b")),
        ("UPDATE", slice_of("node-a"), slice_of("node-b")),  # taking over another node's slice
        ("DELETE", None, slice_of("node-b")),
    ],
)
def test_a_driver_cannot_touch_another_nodes_slices(operation: str, new: Any, old: Any) -> None:
    allowed, message = review(operation, new, old)
    assert not allowed
    assert (
        message
        == "enflame-dra-plugin on node node-a may change only the ResourceSlices of its own node"
    )


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_a_driver_publishes_only_the_pool_named_after_its_node(operation: str) -> None:
    """Issue 22 item 13: the pool name was not restricted, so a driver on node-a could publish
    its slice into another node's pool (the scheduler then counts it in that pool)."""
    other_pool = slice_of("node-a")
    other_pool["spec"]["pool"]["name"] = "node-b"
    new = None if operation == "DELETE" else other_pool
    old = None if operation == "CREATE" else other_pool
    allowed, message = review(operation, new, old)
    assert not allowed
    assert (
        message
        == "enflame-dra-plugin on node node-a may publish only the pool named after its node"
    )


def test_another_drivers_slices_are_off_limits_even_on_the_own_node() -> None:
    allowed, message = review("CREATE", slice_of("node-a", driver="gpu.example.com"), None)
    assert not allowed and "driver gcu.enflame.com" in message


def test_a_token_not_bound_to_a_node_is_refused() -> None:
    allowed, message = review("CREATE", slice_of("node-a"), None, node=None)
    assert not allowed and "only from a pod on a node" in message


def test_other_users_are_not_the_policys_business() -> None:
    other = "system:serviceaccount:kube-system:enflame-gcu-dra-cleanup"
    assert review("DELETE", None, slice_of("node-b"), user=other, node="node-a") == (True, "")


def test_a_slice_without_a_spec_is_denied() -> None:
    # Real CEL fails on the missing field (failurePolicy: Fail denies); either way: no.
    allowed, _ = review("CREATE", {"metadata": {"name": "x"}}, None)
    assert not allowed


def test_an_expression_that_fails_to_evaluate_denies() -> None:
    broken = policy()
    broken["spec"]["validations"][0]["expression"] = "variables.nodeName.size() > int('x')"
    allowed, message = admission.review(broken, request("CREATE"), slice_of("node-a"), None)
    assert not allowed and message.startswith("policy evaluation failed")


@pytest.mark.parametrize("version", helpers.VERSIONS)
def test_policy_and_binding_are_schema_valid(version: str) -> None:
    objects = manifest_objects()
    binding = objects["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {
        "policyName": policy()["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        helpers.validate(objects[kind], version)
    service_account = objects["ServiceAccount"]["metadata"]
    assert (
        f"system:serviceaccount:{service_account['namespace']}:{service_account['name']}"
    ) == DRIVER_USER


def test_the_chart_ships_the_same_policy_for_its_own_service_accounts() -> None:
    path = os.path.join(CHART_DIR, "templates", "vap-dra-plugin.yaml")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    # The template's only Helm parts: names, the release namespace, labels and the if/end.
    rendered = (
        text.replace('{{ include "enflame-gcu.fullname" . }}', "enflame-gcu")
        .replace("{{ .Release.Namespace }}", "kube-system")
        .replace('{{ include "enflame-gcu.namespace" . }}', "kube-system")
    )
    rendered = "\n".join(
        line for line in rendered.splitlines() if "{{" not in line and "labels:" not in line
    )
    chart_policy, chart_binding = [d for d in yaml.safe_load_all(rendered) if d]
    expected = policy()["spec"]
    user = "system:serviceaccount:kube-system:enflame-gcu-dra-plugin"
    expected["matchConditions"][0]["expression"] = f'request.userInfo.username == "{user}"'
    assert chart_policy["spec"] == expected
    assert chart_binding["spec"]["policyName"] == chart_policy["metadata"]["name"]
    # The uninstall hook deletes every node's slices under an account the policy leaves alone.
    with open(os.path.join(CHART_DIR, "templates", "job-dra-cleanup.yaml"), encoding="utf-8") as f:
        assert 'serviceAccountName: {{ include "enflame-gcu.fullname" . }}-dra-cleanup' in f.read()
