"""spec.dra.webhook.enabled on the real 1.20 kube-apiserver (issue 51, point 2): the server
accepts the field (the CRD's schema) and the webhook's objects the operator makes; it serves no
resource.k8s.io/v1, so the operator, running as the chart's ServiceAccount, refuses the field,
names why in the status and makes none of them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import objects, runner, webhook
from enflame_gcu.gcu_operator import resource as rs
from tests.controlplane import conftest, operator_env
from tests.controlplane.harness import Harness, until

pytestmark = [*conftest.MARKS, pytest.mark.timeout(600)]
NS = operator_env.NAMESPACE
PATHS = {
    "ServiceAccount": f"/api/v1/namespaces/{NS}/serviceaccounts",
    "Service": f"/api/v1/namespaces/{NS}/services",
    "Deployment": f"/apis/apps/v1/namespaces/{NS}/deployments",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    ),
}


@pytest.fixture(scope="module")
def operator(harness: Harness) -> Iterator[str]:
    kubeconfig = operator_env.install(harness)
    with operator_env.operator_process(harness, kubeconfig) as process:
        yield kubeconfig
        assert process.poll() is None, "the operator exited:\n" + operator_env.log_tail(harness)


def _made() -> dict[str, Any]:
    resource: dict[str, Any] = {
        "apiVersion": f"{rs.GROUP}/v1",
        "kind": "GcuResource",
        "metadata": {"name": "gcu", "uid": "0b7e3f0c-0000-4000-8000-000000000001"},
        "spec": {"dra": {"webhook": {"enabled": True}}},
    }
    runner.default_namespace(resource, NS)
    return webhook.objects(resource, rs.parse(resource["spec"]))


def test_the_server_accepts_the_webhooks_objects(harness: Harness, operator: str) -> None:
    """Every object of a served kind, as the operator makes it, passes the 1.20 server's
    validation (a dry run: nothing is stored), and what the server would store (its defaults
    added) is no difference to the operator: no rewrite every pass. cert-manager's kinds are
    not served here."""
    checked = set()
    for obj in _made().values():
        path = PATHS.get(obj["kind"])
        if path is None:
            assert obj["apiVersion"] == "cert-manager.io/v1", obj["kind"]
            continue
        # The owner reference names a GcuResource that does not exist: fine for a dry run.
        stored = harness.plane.api("POST", f"{path}?dryRun=All", obj)
        assert stored["metadata"]["name"] == obj["metadata"]["name"]
        assert not objects.needs_update(obj, stored), (obj["kind"], stored)
        checked.add(obj["kind"])
    assert checked == set(PATHS)


def test_the_operator_refuses_it_without_resource_k8s_io(harness: Harness, operator: str) -> None:
    name = f"gr-wh-{int(time.monotonic() * 1000) % 10_000_000}"
    body = operator_env.resource_body(name, dra={"webhook": {"enabled": True}})
    harness.plane.api("POST", operator_env.GR_PATH, body)
    try:

        def refused() -> str | None:
            found = operator_env.get_resource(harness, name) or {}
            for condition in (found.get("status") or {}).get("conditions") or []:
                if "spec.dra.webhook.enabled" in str(condition.get("message")):
                    return str(condition["message"])
            return None

        try:
            message = until(refused, "the refusal in the status", 120, every=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{operator_env.log_tail(harness)}") from None
        assert "resource.k8s.io/v1" in message, message
        for kind, path in PATHS.items():
            assert harness.plane.get(f"{path}/{webhook.NAME}") is None, kind
    finally:
        operator_env.delete_resource(harness, name)
