"""Issue 47 point 9 under Kubernetes' own authorizer: the chart's operator RBAC, applied to a real
kube-apiserver (--authorization-mode=Node,RBAC, from tests/cluster/controlplane.py, no
scheduler, no controllers), and requests made as the operator's ServiceAccount (impersonated by
the admin): it can write its own objects and cannot delete or rewrite any other, nor grant what
it does not hold.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import components
from enflame_gcu.gcu_operator import resource as rs
from tests.deploy import helm_render

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(600),
    pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK),
]
NS = "enflame-gcu"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    "RuntimeClass": "/apis/node.k8s.io/v1/runtimeclasses",
    "Lease": "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
}


def _path(kind: str, namespace: str = "", name: str = "") -> str:
    path = PATHS[kind].format(ns=namespace)
    return f"{path}/{name}" if name else path


@dataclasses.dataclass(frozen=True)
class Plane:
    """The control plane, and the user name of the operator's ServiceAccount."""

    cp: Any
    operator_user: str

    @property
    def server(self) -> str:
        return str(self.cp.server)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return self.cp.api(method, path, body)

    def get(self, path: str) -> Any:
        return self.cp.get(path)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    from tests.cluster import controlplane

    rendered = helm_render.render(
        str(tmp_path_factory.mktemp("chart")),
        {"namespaceOverride": NS, "operator": {"enabled": True}},
    )
    docs = [d for d in rendered.get("operator.yaml", []) if d and d["kind"] in RBAC_KINDS]
    with (
        tempfile.TemporaryDirectory(prefix="enflame-operator-rbac-") as work,
        controlplane.ControlPlane(
            controlplane.build(), work, scheduler=False, controller_manager=False
        ) as cp,
    ):
        cp.api("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        for doc in docs:
            cp.api("POST", _path(doc["kind"], doc["metadata"].get("namespace", "")), doc)
        account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
        yield Plane(cp, f"system:serviceaccount:{NS}:{account}")


def _as_operator(cp: Plane, method: str, path: str, body: Any = None) -> int:
    """One request as the operator's ServiceAccount: the HTTP status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 (https to our own API server)
        cp.server + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "Impersonate-User": cp.operator_user},
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=cp.cp._ssl) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def _daemonset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }


def _cluster_role(name: str, rules: list[Any]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }


NODE_STATE = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]


def test_the_operator_cannot_rewrite_or_delete_what_is_not_its_own(plane: Plane) -> None:
    cp = plane
    cp.api("POST", _path("ClusterRole"), _cluster_role("someone-elses", NODE_STATE))
    cp.api("POST", _path("DaemonSet", "kube-system"), _daemonset("kube-proxy"))
    cp.api("POST", _path("DaemonSet", NS), _daemonset("someone-elses"))
    cp.api(
        "POST",
        _path("RuntimeClass"),
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc"},
         "handler": "runc"},
    )  # fmt: skip
    refused = [
        ("DELETE", _path("ClusterRole", name="cluster-admin")),
        ("DELETE", _path("ClusterRole", name="someone-elses")),
        ("PUT", _path("ClusterRole", name="someone-elses")),
        ("DELETE", _path("ClusterRoleBinding", name="system:node-proxier")),
        ("DELETE", _path("DaemonSet", "kube-system", "kube-proxy")),
        ("PUT", _path("DaemonSet", "kube-system", "kube-proxy")),
        ("DELETE", _path("DaemonSet", NS, "someone-elses")),
        ("PUT", _path("DaemonSet", NS, "someone-elses")),
        ("DELETE", _path("RuntimeClass", name="runc")),
        ("DELETE", _path("Lease", "kube-system", "kube-controller-manager")),
    ]
    # What a PUT sends: each object as it is (read before any request of the operator's).
    bodies = {path: cp.api("GET", path) for method, path in refused if method == "PUT"}
    answers = {
        (method, path): _as_operator(cp, method, path, bodies.get(path)) for method, path in refused
    }
    assert all(code == 403 for code in answers.values()), answers
    # Nothing was changed.
    assert cp.get(_path("ClusterRole", name="cluster-admin")) is not None
    assert cp.get(_path("DaemonSet", "kube-system", "kube-proxy")) is not None


def test_the_operator_writes_its_own_objects_and_grants_only_what_it_holds(plane: Plane) -> None:
    cp = plane
    own = "enflame-k8s-device-plugin-node-state"
    assert _as_operator(cp, "POST", _path("ClusterRole"), _cluster_role(own, NODE_STATE)) == 201
    have = cp.api("GET", _path("ClusterRole", name=own))
    assert _as_operator(cp, "PUT", _path("ClusterRole", name=own), have) == 200
    # A role granting what the operator does not hold: RBAC's escalation check refuses it.
    secrets = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    assert _as_operator(cp, "POST", _path("ClusterRole"), _cluster_role("x", secrets)) == 403
    # Binding cluster-admin to itself is refused too (no bind, not held).
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "steal"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": cp.operator_user}],
    }  # fmt: skip
    assert _as_operator(cp, "POST", _path("ClusterRoleBinding"), binding) == 403
    assert _as_operator(cp, "DELETE", _path("ClusterRole", name=own)) == 200
    # Its own DaemonSet in its namespace: created, rewritten, deleted; none in kube-system.
    plugin = _daemonset("enflame-k8s-device-plugin")
    assert _as_operator(cp, "POST", _path("DaemonSet", NS), plugin) == 201
    have = cp.api("GET", _path("DaemonSet", NS, "enflame-k8s-device-plugin"))
    assert _as_operator(cp, "PUT", _path("DaemonSet", NS, "enflame-k8s-device-plugin"), have) == 200
    assert _as_operator(cp, "DELETE", _path("DaemonSet", NS, "enflame-k8s-device-plugin")) == 200
    assert _as_operator(cp, "POST", _path("DaemonSet", "kube-system"), plugin) == 403


def _plugin_lease_rbac() -> tuple[dict[str, Any], dict[str, Any]]:
    """The plugin's node-state Role and RoleBinding as the operator makes them, in NS."""
    spec: dict[str, Any] = {"devicePlugin": {"nodeState": True, "namespace": NS}}
    resource = {
        "apiVersion": f"{rs.GROUP}/v1",
        "kind": "GcuResource",
        "metadata": {"name": "gcu", "uid": "u-1"},
        "spec": spec,
    }
    made = components.desired(resource, rs.parse(spec))
    return made[components.PLUGIN_LEASE_ROLE_KEY], made[components.PLUGIN_LEASE_BINDING_KEY]


def test_the_operator_grants_the_plugins_lease_role_and_nothing_more(plane: Plane) -> None:
    """RBAC's escalation check, as kube-apiserver runs it: the operator may create, rewrite and
    delete the plugin's lease Role and its binding in its namespace (it holds those lease verbs
    there), and may not widen that Role, bind another role, or write Roles elsewhere."""
    cp = plane
    role, binding = _plugin_lease_rbac()
    name = role["metadata"]["name"]
    assert _as_operator(cp, "POST", _path("Role", NS), role) == 201
    assert _as_operator(cp, "POST", _path("RoleBinding", NS), binding) == 201
    for kind in ("Role", "RoleBinding"):
        have = cp.api("GET", _path(kind, NS, name))
        assert _as_operator(cp, "PUT", _path(kind, NS, name), have) == 200, kind
    widened = cp.api("GET", _path("Role", NS, name))
    widened["rules"][0]["verbs"].append("update")
    assert _as_operator(cp, "PUT", _path("Role", NS, name), widened) == 403
    listing = {**role, "metadata": {"name": "lists"}}
    listing["rules"] = [{**role["rules"][0], "verbs": ["list", "watch"]}]
    assert _as_operator(cp, "POST", _path("Role", NS), listing) == 403
    # cluster-admin, not admin: admin is aggregated, empty without the controller-manager.
    admin = {
        **binding,
        "metadata": {"name": "steal-cluster-admin"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
    }
    assert _as_operator(cp, "POST", _path("RoleBinding", NS), admin) == 403
    # Not a component namespace: no Role there, not even the plugin's.
    elsewhere = {**role, "metadata": {**role["metadata"], "namespace": "default"}}
    assert _as_operator(cp, "POST", _path("Role", "default"), elsewhere) == 403
    # Someone else's Role in its namespace: neither rewritten nor deleted.
    cp.api("POST", _path("Role", NS), {**role, "metadata": {"name": "someone-elses"}})
    theirs = cp.api("GET", _path("Role", NS, "someone-elses"))
    assert _as_operator(cp, "PUT", _path("Role", NS, "someone-elses"), theirs) == 403
    assert _as_operator(cp, "DELETE", _path("Role", NS, "someone-elses")) == 403
    assert _as_operator(cp, "DELETE", _path("RoleBinding", NS, name)) == 200
    assert _as_operator(cp, "DELETE", _path("Role", NS, name)) == 200
