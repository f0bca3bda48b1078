"""The operator's DaemonSets carry the static manifests' containers; the chart installs it."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml

from enflame_gcu.gcu_operator import components, names
from enflame_gcu.gcu_operator import resource as rs
from tests.deploy import helm_render
from tests.deploy.helpers import YAML_DIR, load_all
from tests.gcu_operator.helpers import REPO, ours

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)


def _static(manifest: str) -> dict[str, Any]:
    [ds] = [d for d in load_all(os.path.join(YAML_DIR, manifest)) if d["kind"] == "DaemonSet"]
    return dict(ds["spec"]["template"]["spec"])


@pytest.mark.parametrize(
    ("key", "manifest"),
    [
        (rs.TOOLKIT, "enflame-container-toolkit.yaml"),
        (rs.DEVICE_PLUGIN, "enflame-device-plugin.yaml"),
    ],
)
def test_operator_daemonsets_run_the_static_manifests_containers(key: str, manifest: str) -> None:
    # The static manifests run without the scheduler extender: no node state.
    resource = ours(gfd={}, devicePlugin={"nodeState": False})
    resource["metadata"]["uid"] = "u1"
    desired = components.desired(resource, rs.parse(resource["spec"]))[key]
    pod = desired["spec"]["template"]["spec"]
    static = _static(manifest)
    for field in ("containers", "volumes", "tolerations", "priorityClassName", "hostPID"):
        assert pod.get(field) == static.get(field), field
    # Placement is the operator's: its deploy label, never the static affinity; OnDelete updates.
    assert pod["nodeSelector"] == {
        names.deploy_label(key): "true",
        names.owner_label(key): resource["metadata"]["uid"],
    }
    assert desired["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert desired["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_a_changed_version_changes_only_that_components_template_hash() -> None:
    resource = ours()
    resource["metadata"]["uid"] = "u1"
    before = components.desired(resource, rs.parse(resource["spec"]))
    changed = copy.deepcopy(resource)
    changed["spec"]["devicePlugin"]["version"] = "0.2.0"
    after = components.desired(changed, rs.parse(changed["spec"]))

    def hash_of(objs: dict[str, Any], key: str) -> str:
        return str(objs[key]["spec"]["template"]["metadata"]["annotations"][names.TEMPLATE_HASH])

    assert hash_of(before, rs.TOOLKIT) == hash_of(after, rs.TOOLKIT)
    assert hash_of(before, rs.DEVICE_PLUGIN) != hash_of(after, rs.DEVICE_PLUGIN)


@needs_helm
def test_operator_enabled_installs_crds_rbac_and_two_replicas_and_no_daemonsets(
    tmp_path: Any,
) -> None:
    rendered = helm_render.render(
        str(tmp_path),
        {
            "operator": {"enabled": True, "gcuResource": {"create": True}},
            "toolkit": {"enabled": True},
        },
    )
    docs = [d for d in rendered.get("operator.yaml", []) if d]
    kinds = [d["kind"] for d in docs]
    # The CRDs come from crds/ (installed first, never upgraded or deleted by Helm).
    assert "CustomResourceDefinition" not in kinds
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "Deployment"} <= set(
        kinds
    )
    chart_crds = REPO / "deploy" / "helm" / "enflame-gcu" / "crds" / "gcuresource-crd.yaml"
    on_disk = list(yaml.safe_load_all((REPO / "deploy" / "operator" / "crd.yaml").read_text()))
    assert list(yaml.safe_load_all(chart_crds.read_text())) == on_disk
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "enflame-gcu-operator"
    ]
    resource = next(d for d in docs if d["kind"] == "GcuResource")
    assert resource["apiVersion"] == f"{rs.GROUP}/v1"
    # A release object, not a hook: `helm upgrade` patches it in place instead of deleting and
    # recreating it (which tore every component down and redeployed it on every node).
    assert "helm.sh/hook" not in (resource["metadata"].get("annotations") or {})
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][0] == "--remove-resources"
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert _allowed(role, rs.GROUP, "gcuresources", "delete")
    for template in ("daemonset-device-plugin.yaml", "daemonset-container-toolkit.yaml"):
        assert not [d for d in rendered.get(template, []) if d], template


@needs_helm
def test_operator_off_renders_no_operator(tmp_path: Any) -> None:
    rendered = helm_render.render(str(tmp_path))
    assert not [d for d in rendered.get("operator.yaml", []) if d]
    assert [d for d in rendered["daemonset-device-plugin.yaml"] if d]


def _allowed(role: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for rule in role["rules"]
    )


@needs_helm
def test_operator_rbac_probe_pdb_and_spread_as_users_run_it(tmp_path: Any) -> None:
    rendered = helm_render.render(
        str(tmp_path),
        {
            "operator": {
                "enabled": True,
                "tolerations": [{"key": "infra", "operator": "Exists"}],
                "nodeSelector": {"role": "infra"},
            }
        },
    )
    docs = [d for d in rendered.get("operator.yaml", []) if d]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    for group, resource, verb in [
        (rs.GROUP, "gcuresources/finalizers", "update"),  # blockOwnerDeletion
        ("", "events", "create"),
        ("node.k8s.io", "runtimeclasses", "create"),
        ("", "pods/eviction", "create"),
    ]:
        assert _allowed(role, group, resource, verb), (group, resource, verb)
    # Writing components is allowed only in the component namespaces, through Roles.
    for group, resource in [
        ("apps", "daemonsets"),
        ("", "pods"),
        ("", "services"),
        ("resource.k8s.io", "resourceclaimtemplates"),
        ("networking.k8s.io", "networkpolicies"),
        ("apps", "deployments"),
        ("cert-manager.io", "certificates"),
        # Only with operator.draWebhook (tests/gcu_operator/test_dra_webhook.py).
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    ]:
        assert not _allowed(role, group, resource, "create"), resource
    writers = {
        d["metadata"]["namespace"]: d
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["name"].endswith("-components")
    }
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    release_ns = deployment["metadata"]["namespace"]  # empty in lint, the release's in a cluster
    # The release namespace alone by default (issue 47: kube-system's accounts are not ours).
    assert set(writers) == {release_ns}
    for writer in writers.values():
        assert _allowed(writer, "apps", "daemonsets", "create")
        assert _allowed(writer, "resource.k8s.io", "resourceclaimtemplates", "create")
        assert _allowed(writer, "networking.k8s.io", "networkpolicies", "create")
    # Write access to gcuresources is root on every GCU node: never aggregated to admin/edit.
    assert not any("aggregate-to" in k for k in role["metadata"].get("labels", {}))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--http-address=$(POD_IP):8081" in container["args"]  # never every address
    assert f"--allowed-namespaces={release_ns or ''}" in container["args"]
    assert pod["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    assert pod["nodeSelector"] == {"role": "infra"}
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert "hostNetwork" not in pod


@needs_helm
def test_operator_on_the_host_network_reaches_the_api_and_keeps_replicas_apart(
    tmp_path: Any,
) -> None:
    """Where pods cannot reach the API's Service IP (the cluster tier has no kube-proxy), the
    operator and its pre-delete hook run on the node's network with the API's address in env;
    two replicas in one network namespace would fight over the health port, so they are kept on
    distinct nodes and /healthz listens on the pod IP."""
    api = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
    ]
    rendered = helm_render.render(
        str(tmp_path), {"operator": {"enabled": True, "hostNetwork": True, "env": api}}
    )
    docs = [d for d in rendered.get("operator.yaml", []) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "--http-address=$(POD_IP):8081" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert [e for e in container["env"] if e["name"].startswith("KUBERNETES_")] == api
    anti = pod["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in anti
    required = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required[0]["topologyKey"] == "kubernetes.io/hostname"
    assert required[0]["labelSelector"] == deployment["spec"]["selector"]
    # A surge replica would find no free node: replaced one at a time instead.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    hook = next(d for d in docs if d["kind"] == "Job")
    hook_pod = hook["spec"]["template"]["spec"]
    assert hook_pod["hostNetwork"] is True
    assert hook_pod["containers"][0]["env"] == api


@needs_helm
def test_the_dra_daemonset_is_the_charts(tmp_path: Any) -> None:
    """The operator's DRA driver container and volumes are what the chart renders with its
    defaults (probes, --http-address, resources, unprivileged), the image aside."""
    rendered = helm_render.render(str(tmp_path), {"dra": {"enabled": True}})
    chart = helm_render.daemonset(rendered, "daemonset-dra-plugin.yaml")
    resource = {**ours_with_uid(), "spec": {"dra": {}}}
    spec = rs.parse(resource["spec"])
    account = "test-release-enflame-gcu-dra-plugin"  # lint's release name
    ours_ds = components.desired(resource, spec, True, account)[rs.DRA]
    chart_pod, our_pod = chart["spec"]["template"]["spec"], ours_ds["spec"]["template"]["spec"]
    skip = {"image", "imagePullPolicy"}
    chart_container = {k: v for k, v in chart_pod["containers"][0].items() if k not in skip}
    our_container = {k: v for k, v in our_pod["containers"][0].items() if k not in skip}
    assert our_container == chart_container
    assert our_pod["volumes"] == chart_pod["volumes"]
    assert our_pod["securityContext"] == chart_pod["securityContext"]
    assert our_pod["serviceAccountName"] == chart_pod["serviceAccountName"]


def ours_with_uid() -> dict[str, Any]:
    return {
        "apiVersion": f"{rs.GROUP}/v1",
        "kind": "GcuResource",
        "metadata": {"name": "gcu", "uid": "u-1"},
    }


@needs_helm
def test_the_plugin_network_policy_is_the_charts(tmp_path: Any) -> None:
    # Both admit the scraper only once its namespace is named (issue 48 point 6).
    values = {"metrics": {"networkPolicy": {"scraperNamespace": "monitoring"}}}
    rendered = helm_render.render(str(tmp_path), values)
    [chart] = helm_render.objects(rendered, "NetworkPolicy")
    resource = {**ours_with_uid(), "spec": {"devicePlugin": {}}}
    mine = components.desired(resource, rs.parse(resource["spec"]), scraper_namespace="monitoring")[
        components.PLUGIN_POLICY_KEY
    ]
    assert mine["spec"]["policyTypes"] == chart["spec"]["policyTypes"]
    # The same port and the same pods; the operator admits them from one namespace only
    # (issue 48 point 6: tests/gcu_operator/test_operator_chart.py).
    [rule], [chart_rule] = mine["spec"]["ingress"], chart["spec"]["ingress"]
    assert rule["ports"] == chart_rule["ports"]
    assert rule["from"] == chart_rule["from"]


def _chart_plugin(
    tmp_path: Any, telemetry: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The chart's device plugin DaemonSet with the extender on (node state) and, when given,
    metrics.telemetry; NFD labels on, as the operator's plugin with spec.gfd."""
    values: dict[str, Any] = {"extender": {"enabled": True}, "nodeLabels": {"enabled": True}}
    if telemetry is not None:
        values["metrics"] = {"telemetry": telemetry}
    rendered = helm_render.render(str(tmp_path), values)
    return helm_render.daemonset(rendered, "daemonset-device-plugin.yaml"), rendered


def _our_plugin(plugin: dict[str, Any]) -> dict[str, Any]:
    resource = {**ours_with_uid(), "spec": {"devicePlugin": plugin, "gfd": {}}}
    return components.desired(resource, rs.parse(resource["spec"]))


def _same_pod(chart: dict[str, Any], mine: dict[str, Any]) -> None:
    chart_pod, our_pod = chart["spec"]["template"]["spec"], mine["spec"]["template"]["spec"]
    skip = {"image", "imagePullPolicy"}
    chart_container = {k: v for k, v in chart_pod["containers"][0].items() if k not in skip}
    our_container = {k: v for k, v in our_pod["containers"][0].items() if k not in skip}
    assert our_container == chart_container
    assert our_pod["volumes"] == chart_pod["volumes"]
    assert our_pod["automountServiceAccountToken"] is chart_pod["automountServiceAccountToken"]


@needs_helm
def test_the_plugin_publishes_node_state_as_the_charts_does_with_the_extender(
    tmp_path: Any,
) -> None:
    """With nodeState: true the operator's plugin keeps its node's node-state Lease current for
    the scheduler extender, as the chart's with extender.enabled: --node-state, NODE_NAME from
    the downward API, its own ServiceAccount allowed the chart's lease verbs in its namespace (a
    Role) and get/patch on Nodes (the gcushare annotation), nothing else."""
    chart, rendered = _chart_plugin(tmp_path)
    mine = _our_plugin({"nodeState": True})
    _same_pod(chart, mine[rs.DEVICE_PLUGIN])
    our_pod = mine[rs.DEVICE_PLUGIN]["spec"]["template"]["spec"]
    assert "--node-state" in our_pod["containers"][0]["args"]
    account = mine[components.PLUGIN_ACCOUNT_KEY]
    assert our_pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == mine[rs.DEVICE_PLUGIN]["metadata"]["namespace"]
    [chart_role] = [
        r
        for r in helm_render.objects(rendered, "ClusterRole")
        if r["metadata"]["name"].endswith("-device-plugin-node-state")
    ]
    role, binding = mine[components.PLUGIN_ROLE_KEY], mine[components.PLUGIN_BINDING_KEY]
    assert role["rules"] == chart_role["rules"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    # Its Lease: the chart's Role, in the plugin's own namespace, bound to its account there.
    [chart_lease_role] = [
        r
        for r in helm_render.objects(rendered, "Role")
        if r["metadata"]["name"].endswith("-device-plugin-node-state")
    ]
    [chart_lease_binding] = [
        b
        for b in helm_render.objects(rendered, "RoleBinding")
        if b["metadata"]["name"].endswith("-device-plugin-node-state")
    ]
    lease_role = mine[components.PLUGIN_LEASE_ROLE_KEY]
    lease_binding = mine[components.PLUGIN_LEASE_BINDING_KEY]
    assert lease_role["kind"] == "Role" and lease_binding["kind"] == "RoleBinding"
    assert lease_role["rules"] == chart_lease_role["rules"]
    assert lease_role["metadata"]["name"] == role["metadata"]["name"]
    for obj in (lease_role, lease_binding):
        assert obj["metadata"]["namespace"] == account["metadata"]["namespace"]
    assert lease_binding["roleRef"] == {
        **chart_lease_binding["roleRef"],
        "name": lease_role["metadata"]["name"],
    }
    assert lease_binding["roleRef"]["kind"] == "Role"
    assert lease_binding["subjects"] == binding["subjects"]
    for obj in (account, role, binding, lease_role, lease_binding):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["labels"][names.COMPONENT_LABEL] == rs.DEVICE_PLUGIN


@pytest.mark.parametrize("plugin", [{}, {"nodeState": False}], ids=["default", "false"])
def test_node_state_off_gives_the_plugin_no_account_and_no_rbac(plugin: dict[str, Any]) -> None:
    """Off unless asked for (issue 47): without an extender nothing reads it, and it would let
    every GCU node's plugin patch every Node."""
    mine = _our_plugin(plugin)
    pod = mine[rs.DEVICE_PLUGIN]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert "--node-state" not in pod["containers"][0]["args"]
    assert not [e for e in pod["containers"][0]["env"] if e["name"] == "NODE_NAME"]
    assert not set(components.PLUGIN_RBAC_KEYS) & set(mine)


@needs_helm
@pytest.mark.parametrize(
    ("ours_telemetry", "chart_telemetry"),
    [
        ({"enabled": True}, {"enabled": True}),
        (
            {
                "enabled": True,
                "interval": 30,
                "timeout": 7,
                "isolation": "process",
                "libraryDir": "/opt/efml/lib",
                "efsmiDir": "",
            },
            {
                "enabled": True,
                "interval": 30,
                "timeout": 7,
                "isolation": "process",
                "libraryDir": "/opt/efml/lib",
                "efsmiDir": "",
            },
        ),
    ],
)
def test_plugin_telemetry_mounts_libefml_as_the_chart_does(
    tmp_path: Any, ours_telemetry: dict[str, Any], chart_telemetry: dict[str, Any]
) -> None:
    chart, _ = _chart_plugin(tmp_path, chart_telemetry)
    mine = _our_plugin({"telemetry": ours_telemetry, "nodeState": True})
    _same_pod(chart, mine[rs.DEVICE_PLUGIN])
    container = mine[rs.DEVICE_PLUGIN]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "ENFLAME_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert "--telemetry-interval=0" not in container["args"]


def test_telemetry_is_off_by_default() -> None:
    container = _our_plugin({})[rs.DEVICE_PLUGIN]["spec"]["template"]["spec"]["containers"][0]
    assert "--telemetry-interval=0" in container["args"]
    assert {"name": "ENFLAME_VISIBLE_DEVICES", "value": "void"} in container["env"]
    assert not [m for m in container["volumeMounts"] if m["name"].startswith("host-efsmi")]
    assert not [m for m in container["volumeMounts"] if m["name"] == "host-libefml"]


@pytest.mark.parametrize(
    ("telemetry", "field"),
    [
        ({"enabled": True, "libraryDir": "/"}, "libraryDir"),
        ({"enabled": True, "libraryDir": "usr/lib"}, "libraryDir"),
        ({"enabled": True, "libraryDir": "/usr/../etc"}, "libraryDir"),
        ({"enabled": True, "efsmiDir": "/usr/local//efsmi"}, "efsmiDir"),
        ({"enabled": True, "interval": 0}, "interval"),
        ({"enabled": True, "timeout": "5"}, "timeout"),
        ({"enabled": True, "isolation": "none"}, "isolation"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_bad_telemetry_fields_are_reported_and_leave_telemetry_off(
    telemetry: dict[str, Any], field: str
) -> None:
    spec = rs.parse({"devicePlugin": {"telemetry": telemetry}})
    assert spec.plugin.telemetry is None
    assert [u.field for u in spec.unsupported] == [f"spec.devicePlugin.telemetry.{field}"]
    container = _our_plugin({"telemetry": telemetry})[rs.DEVICE_PLUGIN]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "--telemetry-interval=0" in container["args"]


@needs_helm
def test_the_operator_may_create_the_plugins_rbac_without_escalating(tmp_path: Any) -> None:
    """RBAC refuses a ClusterRole (or a binding to it) granting what its creator does not hold,
    unless it has escalate/bind: the operator's ClusterRole must hold every permission of the
    plugin's node-state ClusterRole, and may create the ClusterRole, its binding and (in the
    component namespaces) the ServiceAccount. The lease Role: test_operator_chart.py."""
    rendered = helm_render.render(str(tmp_path), {"operator": {"enabled": True}})
    docs = [d for d in rendered.get("operator.yaml", []) if d]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    plugin_role = _our_plugin({"nodeState": True})[components.PLUGIN_ROLE_KEY]
    for rule in plugin_role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert _allowed(role, group, resource, verb), (resource, verb)
    for resource in ("clusterroles", "clusterrolebindings"):
        for verb in ("get", "list", "create", "update", "delete"):
            assert _allowed(role, "rbac.authorization.k8s.io", resource, verb), (resource, verb)
        for verb in ("bind", "escalate", "*"):
            assert not _allowed(role, "rbac.authorization.k8s.io", resource, verb), verb
    assert _allowed(role, "", "serviceaccounts", "list")
    assert not _allowed(role, "", "serviceaccounts", "create")
    writers = [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-components")
    ]
    assert writers
    for writer in writers:
        for verb in ("create", "update", "delete"):
            assert _allowed(writer, "", "serviceaccounts", verb), verb
