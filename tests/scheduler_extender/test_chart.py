"""The chart's extender.* values: the same objects as deploy/extender, and the plugin's
node-state wiring."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy import helm_render
from tests.deploy.helpers import CHART_DIR
from tests.scheduler_extender import test_deploy
from tests.scheduler_extender.test_deploy import one


def rendered(tmp_path: Any, **extender: Any) -> dict[str, list[dict[str, Any]]]:
    out = helm_render.render(str(tmp_path), {"extender": {"enabled": True, **extender}})
    return {name: [doc for doc in docs if doc] for name, docs in out.items()}


def kind(docs: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == wanted]
    return found


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return dict(found)


def test_off_by_default_and_the_plugin_keeps_no_credentials(tmp_path: Any) -> None:
    out = helm_render.render(str(tmp_path), {})
    assert not [d for d in out["extender.yaml"] if d]
    assert not [d for d in out["rbac-node-state.yaml"] if d]
    spec = out["daemonset-device-plugin.yaml"][0]["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert "--node-state" not in spec["containers"][0]["args"]


def test_separate_scheduler_matches_the_static_manifest(tmp_path: Any) -> None:
    docs = rendered(tmp_path)["extender.yaml"]
    config = yaml.safe_load(kind(docs, "ConfigMap")["data"]["config.yaml"])
    static = yaml.safe_load(one("enflame-gcu-scheduler.yaml", "ConfigMap")["data"]["config.yaml"])
    assert config["extenders"] == static["extenders"]
    assert config["profiles"] == static["profiles"]
    spec = kind(docs, "Deployment")["spec"]["template"]["spec"]
    static_spec = one("enflame-gcu-scheduler.yaml", "Deployment")["spec"]["template"]["spec"]
    for name in ("kube-scheduler", "enflame-scheduler-extender"):
        ours, theirs = container(spec, name), container(static_spec, name)
        assert ours.get("command") == theirs.get("command")
        assert set(theirs.get("args", [])) <= set(ours.get("args", []))
    for doc in docs:
        kv.validate(doc, kv.latest_version(), strict=True)
    # No host network here: the kubelet's httpGet would reach the pod IP, where nothing listens.
    probe = container(spec, "enflame-scheduler-extender")["readinessProbe"]
    assert "httpGet" not in probe
    assert probe["exec"]["command"][:2] == ["enflame-scheduler-extender", "--check-ready"]
    assert "hostNetwork" not in spec


def test_the_scheduler_keeps_its_own_sample_of_nodes_unless_told(tmp_path: Any) -> None:
    # Scoring every node made every pod wait (docs/benchmarks.md, "percentageOfNodesToScore"):
    # the shipped configurations leave the scheduler's adaptive sample, the chart lets it be set.
    def percentage(**extender: Any) -> Any:
        docs = rendered(tmp_path / str(len(extender)), **extender)["extender.yaml"]
        return yaml.safe_load(kind(docs, "ConfigMap")["data"]["config.yaml"]).get(
            "percentageOfNodesToScore"
        )

    assert percentage() is None
    assert percentage(percentageOfNodesToScore=100) == 100
    for config in (
        *test_deploy.documents("kube-scheduler-config-v1beta1.yaml"),
        *test_deploy.documents("kube-scheduler-config-v1.yaml"),
        yaml.safe_load(one("enflame-gcu-scheduler.yaml", "ConfigMap")["data"]["config.yaml"]),
    ):
        assert "percentageOfNodesToScore" not in config
    with pytest.raises(AssertionError, match="percentageOfNodesToScore"):
        rendered(tmp_path / "bad", percentageOfNodesToScore=101)


@pytest.mark.parametrize("version", ["kubescheduler.config.k8s.io/v1"])
def test_the_configuration_follows_the_api_version_asked_for(tmp_path: Any, version: str) -> None:
    docs = rendered(tmp_path, configApiVersion=version)["extender.yaml"]
    assert yaml.safe_load(kind(docs, "ConfigMap")["data"]["config.yaml"])["apiVersion"] == version


def test_daemonset_mode_beside_the_clusters_scheduler(tmp_path: Any) -> None:
    docs = rendered(tmp_path, mode="daemonset")["extender.yaml"]
    assert [d["kind"] for d in docs] == [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DaemonSet",
    ]
    spec = kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    static = one("enflame-scheduler-extender.yaml", "DaemonSet")["spec"]["template"]["spec"]
    for key in ("hostNetwork", "affinity", "tolerations", "securityContext"):
        assert spec[key] == static[key], key
    probe = container(spec, "enflame-scheduler-extender")["readinessProbe"]
    assert probe["httpGet"]["host"] == "127.0.0.1"  # host network: the node's loopback is ours
    for wanted in ("ClusterRole", "Role"):  # pods cluster-wide, the Leases of its namespace
        assert (
            kind(docs, wanted)["rules"] == one("enflame-scheduler-extender.yaml", wanted)["rules"]
        )
    assert (
        kind(docs, "Role")["metadata"]["namespace"]
        == kind(docs, "DaemonSet")["metadata"]["namespace"]
    )


def test_the_admission_policy_follows_what_the_cluster_serves_by_default(tmp_path: Any) -> None:
    template = os.path.join(CHART_DIR, "templates", "rbac-node-state.yaml")
    with open(template, encoding="utf-8") as handle:
        text = handle.read()
    # auto (the default): rendered when the API server serves ValidatingAdmissionPolicy v1.
    assert 'APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"' in text
    # Helm's offline capabilities (no cluster) do not list it: nothing the cluster cannot take.
    docs = rendered(tmp_path)["rbac-node-state.yaml"]
    assert "ValidatingAdmissionPolicy" not in [doc["kind"] for doc in docs]
    forced = rendered(tmp_path / "on", admissionPolicy=True)["rbac-node-state.yaml"]
    bindings = [d for d in forced if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert [b["spec"]["validationActions"] for b in bindings] == [["Deny"], ["Deny"]]


def test_the_plugin_writes_its_node_state(tmp_path: Any) -> None:
    out = rendered(tmp_path, admissionPolicy=True)
    spec = out["daemonset-device-plugin.yaml"][0]["spec"]["template"]["spec"]
    plugin = spec["containers"][0]
    assert "--node-state" in plugin["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        plugin["env"]
    )
    assert spec["automountServiceAccountToken"] is True
    assert any(m["mountPath"] == "/var/lib/kubelet/pod-resources" for m in plugin["volumeMounts"])
    docs = out["rbac-node-state.yaml"]
    account = kind(docs, "ServiceAccount")["metadata"]
    assert spec["serviceAccountName"] == account["name"]
    # The Leases' Role is the static manifests', in the namespace the plugin and extender share.
    role = kind(docs, "Role")
    assert role["rules"] == one("enflame-device-plugin-node-state.yaml", "Role")["rules"]
    (extender_role,) = [
        d
        for d in out["extender.yaml"]
        if d["kind"] == "Role" and d["metadata"]["name"].endswith("-node-state")
    ]
    assert extender_role["rules"][0]["resources"] == ["leases"]
    assert role["metadata"]["namespace"] == extender_role["metadata"]["namespace"]
    assert role["metadata"]["namespace"] == account["namespace"]
    policies = {
        doc["metadata"]["name"].rsplit("-own-", 1)[1]: doc["spec"]
        for doc in docs
        if doc["kind"] == "ValidatingAdmissionPolicy"
    }
    assert set(policies) == {"node-state", "node-state-lease"}
    for suffix, policy in policies.items():
        static = test_deploy.policy(f"enflame-device-plugin-own-{suffix}")["spec"]
        assert policy["variables"] == static["variables"]
        assert policy["validations"] == static["validations"]
        assert policy["matchConstraints"] == static["matchConstraints"]
    bound = [
        d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert len(bound) == 2
    for doc in docs:
        kv.validate(doc, kv.latest_version(), strict=True)


CHOICE_PROBE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: probe
data:
{{- range $i, $version := list %s }}
{{- $asked := dict "version" $version "image" "" "api" "" }}
  v{{ $i }}: {{ include "enflame-gcu.schedulerChoice" $asked | quote }}
{{- end }}
"""


def test_the_scheduler_image_and_config_api_follow_the_clusters_version(tmp_path: Any) -> None:
    """1.20.15 with v1beta1 was the default everywhere: kube-schedulers from 1.23 read no
    v1beta1. Now the cluster's own version chooses both (issue 50 point 3; KEP-785's table)."""
    expected = {
        "v1.20.15": ("v1.20.15", "v1beta1"),
        "v1.21.2": ("v1.21.2", "v1beta1"),
        "v1.22.17": ("v1.22.17", "v1beta2"),
        "v1.23.0": ("v1.23.0", "v1beta3"),
        "v1.24.3": ("v1.24.3", "v1beta3"),
        "v1.25.16": ("v1.25.16", "v1"),
        "v1.30.4+k3s1": ("v1.30.4", "v1"),
        "v1.29.8-eks-a737599": ("v1.29.8", "v1"),
        "v1.36.0": ("v1.36.0", "v1"),
    }
    probe = CHOICE_PROBE % " ".join(f'"{v}"' for v in expected)
    out = helm_render.render(str(tmp_path), {}, {"zz-choice.yaml": probe})
    data = out["zz-choice.yaml"][0]["data"]
    for i, (tag, api) in enumerate(expected.values()):
        assert yaml.safe_load(data[f"v{i}"]) == {
            "image": f"registry.k8s.io/kube-scheduler:{tag}",
            "api": f"kubescheduler.config.k8s.io/{api}",
        }, list(expected)[i]
    # The chart's defaults use that choice for the cluster it renders for (lint's own version).
    docs = rendered(tmp_path / "defaults")["extender.yaml"]
    config = yaml.safe_load(kind(docs, "ConfigMap")["data"]["config.yaml"])
    image = container(kind(docs, "Deployment")["spec"]["template"]["spec"], "kube-scheduler")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert image["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    assert image["image"] != "registry.k8s.io/kube-scheduler:v1.20.15"
    # Set values win.
    set_ = rendered(
        tmp_path / "set", schedulerImage="r.example/ks:v1.22.1",
        configApiVersion="kubescheduler.config.k8s.io/v1beta2",
    )["extender.yaml"]  # fmt: skip
    assert yaml.safe_load(kind(set_, "ConfigMap")["data"]["config.yaml"])["apiVersion"].endswith(
        "/v1beta2"
    )
    spec = kind(set_, "Deployment")["spec"]["template"]["spec"]
    assert container(spec, "kube-scheduler")["image"] == "r.example/ks:v1.22.1"
