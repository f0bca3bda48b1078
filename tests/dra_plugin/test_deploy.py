"""Deploying the DRA driver: the static manifest, the chart's DRA parts and the docs."""

from __future__ import annotations

import os
from typing import Any

import pytest

from enflame_gcu.dra_plugin import config as dra_config
from tests.deploy.helpers import CHART_DIR
from tests.deploy.test_chart import HELM_SDK, NO_HELM_SDK, _chart_copy, _real_helm_lint
from tests.dra_plugin import slices_helpers as helpers

MANIFEST = os.path.join(helpers.DRA_DEPLOY, "enflame-dra-plugin.yaml")
TEMPLATES = os.path.join(CHART_DIR, "templates")


def documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in helpers.load_yaml(MANIFEST)}


def read(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("version", helpers.VERSIONS)
def test_static_manifest_is_schema_valid(version: str) -> None:
    found = documents()
    assert sorted(found) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "NetworkPolicy",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for document in found.values():
        helpers.validate(document, version)


def test_rbac_grants_only_what_the_driver_uses() -> None:
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in documents()["ClusterRole"]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("resource.k8s.io", "resourceslices"): sorted(
            ["get", "list", "watch", "create", "update", "delete"]
        ),
        ("resource.k8s.io", "resourceclaims"): ["get"],
        ("", "nodes"): ["get"],
    }
    chart_rbac = read(TEMPLATES, "rbac-dra-plugin.yaml")
    for verbs in ('["get", "list", "watch", "create", "update", "delete"]', '["get"]'):
        assert verbs in chart_rbac


def test_daemonset_mounts_what_the_driver_defaults_to_and_runs_only_on_dra_nodes() -> None:
    pod = documents()["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    settings = dra_config.DraConfig(node_name="n")
    for path in (settings.registry_dir, settings.data_dir, settings.cdi_dir):
        assert mounts[path] is False
    assert mounts["/host/sys"] is True and mounts["/host/dev"] is True
    assert container["command"] == ["enflame-dra-plugin"]
    assert "--host-root=/host" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["ENFLAME_VISIBLE_DEVICES"]["value"] == "void"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "enflame.com/gcu.mode", "operator": "In", "values": ["dra"]}
    ]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["privileged"] is False


STATIC_PLUGIN_MANIFESTS = [
    "enflame-device-plugin.yaml",
    "enflame-device-plugin-compat-with-cpumanager.yaml",
    "enflame-vdevice-plugin.yaml",
    "enflame-device-plugin-pcie-switch-affinity.yaml",
    "extensions-v1beta1-enflame-device-plugin.yaml",
]


@pytest.mark.parametrize("name", STATIC_PLUGIN_MANIFESTS)
def test_static_device_plugin_manifests_skip_the_nodes_the_dra_driver_serves(name: str) -> None:
    (dra_term,) = documents()["DaemonSet"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    (dra_only,) = dra_term["matchExpressions"]
    (plugin,) = helpers.load_yaml(os.path.join(helpers.REPO, "deploy", "yaml", name))
    terms = plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # Terms are ORed: every one of them must exclude the DRA nodes, with the same label.
    excluded = {**dra_only, "operator": "NotIn"}
    assert terms and all(excluded in term["matchExpressions"] for term in terms)


def test_chart_serves_a_node_one_way_only_and_ships_the_same_device_classes() -> None:
    assert '"mode" "device-plugin"' in read(TEMPLATES, "daemonset-device-plugin.yaml")
    assert '"mode" "dra"' in read(TEMPLATES, "daemonset-dra-plugin.yaml")
    helpers_tpl = read(TEMPLATES, "_helpers.tpl")
    assert '"operator" "NotIn"' in helpers_tpl and '"operator" "In"' in helpers_tpl
    assert read(CHART_DIR, "files", "deviceclasses.yaml") == read(
        helpers.DRA_DEPLOY, "deviceclasses.yaml"
    )
    hook = read(TEMPLATES, "job-dra-cleanup.yaml")
    assert "helm.sh/hook: pre-delete" in hook
    assert '["enflame-dra-plugin", "cleanup", "--all-nodes"]' in hook


@pytest.mark.parametrize("name", ["dra.md", "dra.zh-CN.md"])
def test_docs_show_the_switch_local_claim_and_what_the_cluster_needs(name: str) -> None:
    text = read(helpers.REPO, "docs", name)
    for fact in (
        "matchAttribute: gcu.enflame.com/pcieSwitch",
        "containerd 1.6",
        "cdi.k8s.io/gcu.enflame.com_",
        "enflame.com/gcu.mode=dra",
        "1.34",
        "1.36",
    ):
        assert fact in text, fact
    assert ("fake" in text) if name == "dra.md" else ("模拟" in text)


def test_seamless_upgrade_surges_and_names_sockets_by_pod_uid() -> None:
    text = read(TEMPLATES, "daemonset-dra-plugin.yaml")
    surge = text.index("{{- if $dra.seamlessUpgrade }}")
    assert "maxSurge: 1" in text[surge:] and "maxUnavailable: 0" in text[surge:]
    # The env var the driver reads for the socket names, from the downward API.
    assert "- name: POD_UID\n" in text and "fieldPath: metadata.uid" in text
    assert dra_config.parse([], {"NODE_NAME": "n", "POD_UID": "u-1"}).pod_uid == "u-1"
    # Off by default: kubelets before 1.33 cannot tell two instances of a driver apart.
    assert "seamlessUpgrade: false" in read(CHART_DIR, "values.yaml")
    static = documents()["DaemonSet"]
    assert "rollingUpdate" not in static["spec"]["updateStrategy"]
    (container,) = static["spec"]["template"]["spec"]["containers"]
    assert "POD_UID" not in {e["name"] for e in container["env"]}


@pytest.mark.skipif(not os.path.exists(HELM_SDK), reason=NO_HELM_SDK)
def test_real_helm_lint_accepts_the_seamless_upgrade_variant(tmp_path: Any) -> None:
    chart_dir = _chart_copy(tmp_path, ("dra",))
    path = os.path.join(chart_dir, "values.yaml")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace("seamlessUpgrade: false", "seamlessUpgrade: true"))
    lint = _real_helm_lint(chart_dir)
    assert lint["errors"] is None
    assert [m for m in lint["messages"] if m["severity"] >= 2] == []


def test_the_daemonset_probes_the_driver_on_its_http_address() -> None:
    (container,) = documents()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    args = dra_config.parse([*container["args"], "--node-name", "n"], environ={}).http_address
    assert args == "$(POD_IP):8082"  # the pod's own address, not every address
    env = {item["name"]: item.get("valueFrom") for item in container["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container["ports"] == [{"name": "http", "containerPort": 8082}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    chart = read(TEMPLATES, "daemonset-dra-plugin.yaml")
    for line in (
        "- --http-address=$(POD_IP):{{ $dra.httpPort }}",
        "path: /healthz",
        "path: /readyz",
        "- --drs={{ . }}",
    ):
        assert line in chart


def test_only_prometheus_may_reach_the_drivers_port() -> None:
    policy = documents()["NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "enflame-dra-plugin"
    }
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8082, "protocol": "TCP"}]
    assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [
        {"app.kubernetes.io/name": "prometheus"}
    ]
    chart = read(TEMPLATES, "networkpolicy-dra-plugin.yaml")
    assert "port: {{ $.Values.dra.httpPort }}" in chart


def test_extended_resource_class_ships_off_by_default_and_the_same_as_the_static_file(
    tmp_path: Any,
) -> None:
    from tests.deploy import helm_render
    from tests.dra_plugin.fake_apiserver import CLASSES, FakeApiServer
    from tests.dra_plugin.test_strict_apiserver import call

    assert read(CHART_DIR, "files", "extended-resource.yaml") == read(
        helpers.DRA_DEPLOY, "extended-resource.yaml"
    )
    off = helm_render.render(str(tmp_path / "off"), {"dra": {"enabled": True}})
    names = [d["metadata"]["name"] for d in off.get("deviceclasses-dra.yaml", [])]
    assert "extended.gcu.enflame.com" not in names and "gcu.enflame.com" in names
    on = helm_render.render(
        str(tmp_path / "on"), {"dra": {"enabled": True, "extendedResource": True}}
    )
    (extended,) = [
        d
        for d in on["deviceclasses-dra.yaml"]
        if d["metadata"]["name"] == "extended.gcu.enflame.com"
    ]
    assert extended["spec"]["extendedResourceName"] == "enflame.com/gcu"
    for version in helpers.VERSIONS:
        helpers.validate(extended, version)
    with FakeApiServer() as fake:  # 1.36 keeps it
        code, stored = call(fake, "POST", CLASSES, extended)
        assert code == 201 and stored["spec"]["extendedResourceName"] == "enflame.com/gcu"
    with FakeApiServer(gates={"DRAExtendedResource": False}) as fake:  # 1.34-1.35: dropped
        code, stored = call(fake, "POST", CLASSES, extended)
        assert code == 201 and "extendedResourceName" not in stored["spec"]


def test_the_driver_pods_read_the_kubelets_pod_resources_read_only() -> None:
    for text in (read(TEMPLATES, "daemonset-dra-plugin.yaml"), read(MANIFEST)):
        assert "mountPath: /var/lib/kubelet/pod-resources\n              readOnly: true" in text
        assert "path: /var/lib/kubelet/pod-resources" in text
