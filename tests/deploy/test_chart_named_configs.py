"""One plugin config per node pool (issue 23): config.map, config.default, config.nodeLabel,
checked by the schema and rendered by Helm's engine; the rendered configs are ones the plugin
accepts."""

from __future__ import annotations

import os
from typing import Any

import jsonschema
import pytest

from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import config_file
from tests.deploy import helm_render
from tests.deploy.test_chart import schema, values
from tests.deploy.test_chart_component_knobs import _lint_output

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
PLUGIN = "daemonset-device-plugin.yaml"
POOLS = {
    "whole": "version: v1\n",
    "shared-6": "version: v1\nflags: {resources: [gcu, shared-gcu]}\nsharing: {slicesPerCard: 6}\n",
}


def _container(rendered: dict[str, list[Any]]) -> dict[str, Any]:
    spec = helm_render.daemonset(rendered, PLUGIN)["spec"]["template"]["spec"]
    container: dict[str, Any] = spec["containers"][0]
    return container


def _rules(rendered: dict[str, list[Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        role["metadata"]["name"]: role["rules"]
        for role in helm_render.objects(rendered, "ClusterRole")
    }


def _valid(overrides: dict[str, Any]) -> bool:
    checker = jsonschema.validators.validator_for(schema())(schema())
    return bool(checker.is_valid(helm_render.merged(values(), overrides)))


@needs_helm
def test_a_map_of_named_configs_becomes_one_configmap_and_the_label_chooses(
    tmp_path: Any,
) -> None:
    rendered = helm_render.render(str(tmp_path), {"config": {"map": POOLS, "default": "whole"}})
    [configmap] = helm_render.objects(rendered, "ConfigMap")
    assert configmap["data"] == POOLS  # one key per name, the text as given
    for text in configmap["data"].values():  # each one a config the plugin accepts
        plugin_config.resolve([config_file.parse(text)])
    container = _container(rendered)
    args = container["args"]
    assert "--config-dir=/etc/enflame-device-plugin" in args
    assert "--config-default=whole" in args
    assert f"--config-label={plugin_config.CONFIG_LABEL}" in args
    assert "--config-label-interval=30" in args
    assert not any(arg.startswith("--config-file") for arg in args)
    assert {
        "name": "plugin-config",
        "mountPath": "/etc/enflame-device-plugin",
        "readOnly": True,
    } in (container["volumeMounts"])
    node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    pod = helm_render.daemonset(rendered, PLUGIN)["spec"]["template"]
    assert pod["spec"]["automountServiceAccountToken"] is True
    account = pod["spec"]["serviceAccountName"]
    assert [a["metadata"]["name"] for a in helm_render.objects(rendered, "ServiceAccount")] == [
        account
    ]
    # Reading its own Node's label needs get on Nodes, and nothing more (no extender here).
    assert _rules(rendered) == {
        f"{account}-node-config": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    }
    [binding] = helm_render.objects(rendered, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == account
    assert "checksum/plugin-config" in pod["metadata"]["annotations"]  # a changed map rolls


@needs_helm
def test_with_the_extender_the_account_gets_both_roles_and_a_single_entry_is_the_default(
    tmp_path: Any,
) -> None:
    rendered = helm_render.render(
        str(tmp_path),
        {
            "config": {"map": {"only": "version: v1\n"}, "nodeLabel": "example.com/pool"},
            "extender": {"enabled": True},
        },
    )
    args = _container(rendered)["args"]
    assert "--config-default=only" in args and "--config-label=example.com/pool" in args
    account = helm_render.daemonset(rendered, PLUGIN)["spec"]["template"]["spec"][
        "serviceAccountName"
    ]
    rules = _rules(rendered)
    assert rules[f"{account}-node-config"][0]["verbs"] == ["get"]
    assert rules[f"{account}-node-state"][0]["verbs"] == ["get", "patch"]
    assert len(helm_render.objects(rendered, "ServiceAccount")) == 2  # the plugin's, extender's


@needs_helm
def test_an_existing_configmap_of_named_configs(tmp_path: Any) -> None:
    rendered = helm_render.render(
        str(tmp_path), {"config": {"name": "gpu-pools", "default": "a100"}}
    )
    assert helm_render.objects(rendered, "ConfigMap") == []
    pod = helm_render.daemonset(rendered, PLUGIN)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "plugin-config")
    assert volume["configMap"]["name"] == "gpu-pools"
    args = pod["containers"][0]["args"]
    assert "--config-dir=/etc/enflame-device-plugin" in args and "--config-default=a100" in args


@needs_helm
def test_one_config_as_before_reads_no_label(tmp_path: Any) -> None:
    rendered = helm_render.render(str(tmp_path), {"config": {"inline": "version: v1\n"}})
    container = _container(rendered)
    assert "--config-file=/etc/enflame-device-plugin/config.yaml" in container["args"]
    assert not any(arg.startswith(("--config-dir", "--config-label")) for arg in container["args"])
    pod = helm_render.daemonset(rendered, PLUGIN)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert helm_render.objects(rendered, "ClusterRole") == []


@needs_helm
def test_a_default_that_is_not_in_the_map_fails_the_render_naming_it(tmp_path: Any) -> None:
    # In lint mode Helm logs a template's fail where an install stops with it.
    overrides = {"config": {"map": POOLS, "default": "big"}}
    output = _lint_output(os.path.join(str(tmp_path), "a"), overrides)
    assert "is not a key of config.map (shared-6, whole)" in output
    assert "big" in output.split("is not a key of config.map")[0][-40:]
    fine = {"config": {"map": POOLS, "default": "whole"}}
    assert "is not a key" not in _lint_output(os.path.join(str(tmp_path), "b"), fine)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"config": {"map": POOLS, "inline": "version: v1\n"}}, "map and inline exclude"),
        ({"config": {"map": POOLS, "name": "other"}}, "map and name exclude"),
        ({"config": {"map": {"-bad": "version: v1\n"}}}, "a name is a label value"),
        ({"config": {"map": {"a": ""}}}, "an empty config"),
        ({"config": {"map": {"a": {"version": "v1"}}}}, "the file's text, not a mapping"),
        ({"config": {"nodeLabel": "Example.com/pool"}}, "not a label key"),
        ({"config": {"default": "a b"}}, "not a config name"),
        ({"config": {"labelInterval": -1}}, "negative interval"),
    ],
)
def test_the_schema_rejects_bad_named_config_values(overrides: dict[str, Any], why: str) -> None:
    assert not _valid(overrides), why


def test_the_schema_accepts_named_configs() -> None:
    assert _valid({"config": {"map": POOLS, "default": "whole", "labelInterval": 0}})
    assert _valid({"config": {"name": "pools", "default": "whole"}})
