"""The chart values operators expect, each checked by the schema and rendered by Helm's engine."""

from __future__ import annotations

import copy
import os
from typing import Any

import jsonschema
import pytest

from tests.deploy import helm_render
from tests.deploy.helpers import CHART_DIR, YAML_DIR, load_all, load_one
from tests.deploy.test_chart import schema, values

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
DIGEST = "sha256:" + "0123456789abcdef" * 4
NEW_VALUES = {
    "nodeSelector": {"gcu.example.com/pool": "training"},
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
            ]
        }
    },
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gcu"}],
    "podAnnotations": {"example.com/team": "ml"},
    "podLabels": {"team": "ml"},
    "podSecurityContext": {"runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"}},
    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
    "priorityClassName": "gcu-critical",
    "runtimeClassName": "enflame",
    "namespaceOverride": "gcu-system",
    "image": {"digest": DIGEST},
    "imagePullSecrets": [{"name": "registry-cred"}],
    "devicePlugin": {
        "env": [{"name": "GRPC_VERBOSITY", "value": "ERROR"}],
        "extraArgs": ["--socket-name=enflame-b.sock"],
        "allocationPolicy": "simple",
    },
    "config": {"name": "my-plugin-config"},
    "toolkit": {"enabled": True},
}


def validator() -> jsonschema.protocols.Validator:
    checker = jsonschema.validators.validator_for(schema())
    return checker(schema())


def test_every_new_value_is_accepted_by_the_schema() -> None:
    validator().validate(helm_render.merged(values(), NEW_VALUES))
    inline = helm_render.merged(values(), {"config": {"inline": "version: v1\n"}})
    validator().validate(inline)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"image": {"digest": "latest"}}, "a digest is sha256:<64 hex>"),
        ({"image": {"digest": "sha256:abc"}}, "too short"),
        ({"toolkit": {"image": {"digest": "md5:" + "0" * 32}}}, "toolkit image too"),
        ({"devicePlugin": {"allocationPolicy": "fastest"}}, "unknown policy"),
        ({"devicePlugin": {"extraArgs": "--x"}}, "a list, not a string"),
        ({"devicePlugin": {"extraArgs": ["x"]}}, "arguments are options"),
        ({"devicePlugin": {"env": [{"value": "x"}]}}, "an EnvVar needs a name"),
        ({"devicePlugin": {"env": {"A": "b"}}}, "env is a list"),
        ({"nodeSelector": {"a": 1}}, "label values are strings"),
        ({"podAnnotations": {"a": True}}, "annotation values are strings"),
        ({"podLabels": ["a"]}, "a map"),
        ({"affinity": {"nodeAffinty": {}}}, "misspelt key"),
        ({"updateStrategy": {"type": "Never"}}, "unknown strategy"),
        ({"updateStrategy": {}}, "type is required"),
        ({"runtimeClassName": "Bad_Name"}, "not a DNS name"),
        ({"namespaceOverride": "Kube_System"}, "not a namespace name"),
        ({"config": {"name": "a", "inline": "version: v1"}}, "name and inline exclude"),
        ({"config": {"maps": {}}}, "unknown key"),
        ({"podSecurityContext": "RuntimeDefault"}, "an object"),
    ],
)
def test_the_schema_rejects_bad_operator_values(overrides: dict[str, Any], why: str) -> None:
    assert not validator().is_valid(helm_render.merged(values(), overrides)), why


def _pod(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]  # type: ignore[no-any-return]


@needs_helm
def test_every_new_value_renders_where_it_belongs(tmp_path: Any) -> None:
    rendered = helm_render.render(str(tmp_path), NEW_VALUES)
    plugin = helm_render.daemonset(rendered, "daemonset-device-plugin.yaml")
    toolkit = helm_render.daemonset(rendered, "daemonset-container-toolkit.yaml")
    for ds in (plugin, toolkit):
        pod = _pod(ds)
        spec = pod["spec"]
        assert spec["nodeSelector"] == NEW_VALUES["nodeSelector"]
        assert spec["affinity"]["podAntiAffinity"] == NEW_VALUES["affinity"]["podAntiAffinity"]  # type: ignore[index]
        # nodeSelection still builds the nodeAffinity when values give none.
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert spec["tolerations"] == NEW_VALUES["tolerations"]
        assert pod["metadata"]["annotations"]["example.com/team"] == "ml"
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert ds["spec"]["selector"]["matchLabels"].get("team") is None  # selector unchanged
        assert ds["spec"]["updateStrategy"] == NEW_VALUES["updateStrategy"]
        assert spec["priorityClassName"] == "gcu-critical"
        assert spec["imagePullSecrets"] == [{"name": "registry-cred"}]
        assert ds["metadata"]["namespace"] == "gcu-system"
    spec = _pod(plugin)["spec"]
    assert spec["securityContext"] == NEW_VALUES["podSecurityContext"]
    assert spec["runtimeClassName"] == "enflame"
    assert "runtimeClassName" not in _pod(toolkit)["spec"]  # the installer runs as runc does
    [container] = spec["containers"]
    assert container["image"] == f"ghcr.io/enflame-gcu/enflame-gcu-device-plugin@{DIGEST}"
    assert {"name": "GRPC_VERBOSITY", "value": "ERROR"} in container["env"]
    assert container["env"][0] == {"name": "ENFLAME_VISIBLE_DEVICES", "value": "void"}
    assert "--allocation-policy=simple" in container["args"]
    assert container["args"][-1] == "--socket-name=enflame-b.sock"  # after the chart's own
    assert "--config-file=/etc/enflame-device-plugin/config.yaml" in container["args"]
    volume = next(v for v in spec["volumes"] if v["name"] == "plugin-config")
    assert volume["configMap"]["name"] == "my-plugin-config"  # the operator's own ConfigMap
    assert helm_render.objects(rendered, "ConfigMap") == []  # the chart makes none then
    for obj in (o for docs in rendered.values() for o in docs):
        if obj["kind"] in ("DaemonSet", "ConfigMap", "ServiceAccount", "Job"):
            assert obj["metadata"]["namespace"] == "gcu-system", obj["metadata"]["name"]


@needs_helm
def test_inline_config_becomes_the_charts_configmap_and_rolls_the_pods(tmp_path: Any) -> None:
    text = "version: v1\nflags:\n  healthInterval: 7\n"
    rendered = helm_render.render(str(tmp_path), {"config": {"inline": text}})
    [configmap] = helm_render.objects(rendered, "ConfigMap")
    assert configmap["data"]["config.yaml"] == text
    plugin = helm_render.daemonset(rendered, "daemonset-device-plugin.yaml")
    pod = _pod(plugin)
    assert "checksum/plugin-config" in pod["metadata"]["annotations"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "plugin-config")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]


@needs_helm
def test_a_node_affinity_in_values_replaces_the_built_one(tmp_path: Any) -> None:
    own = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gcu"]}]}
            ]
        }
    }
    rendered = helm_render.render(str(tmp_path), {"affinity": {"nodeAffinity": own}})
    spec = _pod(helm_render.daemonset(rendered, "daemonset-device-plugin.yaml"))["spec"]
    assert spec["affinity"] == {"nodeAffinity": own}


@needs_helm
def test_defaults_render_the_static_manifests_daemonset_names_and_pod_spec(tmp_path: Any) -> None:
    rendered = helm_render.render(str(tmp_path), {"toolkit": {"enabled": True}})
    for template, manifest in (
        ("daemonset-device-plugin.yaml", "enflame-device-plugin.yaml"),
        ("daemonset-container-toolkit.yaml", "enflame-container-toolkit.yaml"),
    ):
        chart_ds = helm_render.daemonset(rendered, template)
        [static] = [
            d for d in load_all(os.path.join(YAML_DIR, manifest)) if d["kind"] == "DaemonSet"
        ]
        assert chart_ds["metadata"]["name"] == static["metadata"]["name"]
        chart_pod = copy.deepcopy(chart_ds["spec"]["template"]["spec"])
        static_pod = static["spec"]["template"]["spec"]
        for key in ("securityContext", "containers", "volumes", "tolerations"):
            assert chart_pod.get(key) == static_pod.get(key), (manifest, key)
    static_dra = load_all(os.path.join(CHART_DIR, "..", "..", "dra", "enflame-dra-plugin.yaml"))
    dra_name = next(d for d in static_dra if d["kind"] == "DaemonSet")["metadata"]["name"]
    rendered = helm_render.render(str(tmp_path / "dra"), {"dra": {"enabled": True}})
    assert helm_render.daemonset(rendered, "daemonset-dra-plugin.yaml")["metadata"]["name"] == (
        dra_name
    )


@needs_helm
def test_the_render_harness_can_fail(tmp_path: Any) -> None:
    """Helm itself refuses a value the schema rejects: the harness reports it."""
    problems = helm_render.lint_errors(str(tmp_path), {"image": {"digest": "latest"}})
    assert "'severity': 3, 'path': 'values.yaml'" in problems  # the schema check, in Go
    # Helm's own words (helm-python-sdk keeps Go's error text), and the harness's from the schema.
    assert "/image/digest" in problems and "does not match" in problems
    assert "image.digest: 'latest' does not match" in problems


def test_static_manifest_names_are_what_the_guide_uses() -> None:
    doc = load_one(os.path.join(YAML_DIR, "enflame-device-plugin.yaml"))
    name = doc["metadata"]["name"]
    with open(os.path.join(CHART_DIR, "..", "..", "..", "docs", "user-guide.md")) as handle:
        assert f"logs ds/{name}" in handle.read()
