"""The chart's telemetry values: the libefml mount and flags, the dashboard ConfigMap (a copy of
deploy/grafana's JSON), the monitors' honorLabels and relabelings, and what the schema refuses."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.deploy import dashboard, helm_render, test_chart
from tests.deploy.helpers import CHART_DIR

CHART_DASHBOARD = os.path.join(CHART_DIR, "dashboards", "enflame-gcu-dashboard.json")


def test_the_chart_ships_the_same_dashboard_as_deploy_grafana() -> None:
    with open(CHART_DASHBOARD, encoding="utf-8") as handle:
        assert json.load(handle) == dashboard.load()


def test_telemetry_dashboard_and_alerts_are_off_by_default() -> None:
    metrics = test_chart.values()["metrics"]
    assert metrics["telemetry"]["enabled"] is False
    assert metrics["dashboard"]["enabled"] is False
    assert metrics["prometheusRule"]["enabled"] is False
    assert metrics["serviceMonitor"]["honorLabels"] is False
    assert metrics["podMonitor"]["relabelings"] == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metrics.serviceMonitor.honorLabels", "yes"),
        ("metrics.serviceMonitor.relabelings", [{"source_labels": ["a"]}]),
        ("metrics.podMonitor.metricRelabelings", [{"action": "explode"}]),
        ("metrics.podMonitor.relabelings", {"targetLabel": "node"}),
        ("metrics.telemetry.interval", 0),
        ("metrics.telemetry.libraryDir", "usr/lib"),
        ("metrics.prometheusRule.idleFor", "forever"),
        ("metrics.dashboard.labels", {"grafana_dashboard": 1}),
    ],
)
def test_schema_rejects_bad_telemetry_values(path: str, value: Any) -> None:
    assert not test_chart.validator().is_valid(test_chart._with(path, value))


def test_schema_accepts_operator_relabel_configs() -> None:
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}]
    dropping = [{"sourceLabels": ["__name__"], "regex": "process_.*", "action": "drop"}]
    values = test_chart._with("metrics.serviceMonitor.relabelings", relabel)
    values["metrics"]["serviceMonitor"]["metricRelabelings"] = dropping
    values["metrics"]["serviceMonitor"]["honorLabels"] = True
    assert test_chart.validator().is_valid(values)


@pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
def test_rendered_telemetry_mounts_the_library_and_hands_the_plugin_the_cards(
    tmp_path: Any,
) -> None:
    rendered = helm_render.render(
        str(tmp_path),
        {"metrics": {"telemetry": {"enabled": True, "interval": 15, "libraryDir": "/usr/lib64",
                                   "isolation": "process"},
                     "dashboard": {"enabled": True}}},
    )  # fmt: skip
    plugin = helm_render.daemonset(rendered, "daemonset-device-plugin.yaml")
    [container] = plugin["spec"]["template"]["spec"]["containers"]
    assert "--telemetry-interval=15" in container["args"]
    assert "--telemetry-timeout=5" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ENFLAME_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["host-libefml"] == {
        "name": "host-libefml", "mountPath": "/host/usr/lib64", "readOnly": True
    }  # fmt: skip
    assert mounts["host-efsmi"] == {
        "name": "host-efsmi", "mountPath": "/host/usr/local/efsmi", "readOnly": True
    }  # fmt: skip
    volumes = {v["name"]: v for v in plugin["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-libefml"]["hostPath"] == {"path": "/usr/lib64", "type": "Directory"}
    assert volumes["host-efsmi"]["hostPath"]["path"] == "/usr/local/efsmi"
    assert "--telemetry-isolation=process" in container["args"]
    [config_map] = [
        doc
        for doc in helm_render.objects(rendered, "ConfigMap")
        if "dashboard" in doc["metadata"]["name"]
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["enflame-gcu-dashboard.json"]) == dashboard.load()


@pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
def test_rendered_defaults_keep_the_plugin_away_from_the_cards(tmp_path: Any) -> None:
    rendered = helm_render.render(str(tmp_path), {})
    plugin = helm_render.daemonset(rendered, "daemonset-device-plugin.yaml")
    [container] = plugin["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ENFLAME_VISIBLE_DEVICES"] == "void" and "NODE_NAME" not in env
    assert "host-libefml" not in {m["name"] for m in container["volumeMounts"]}
    # Telemetry off as the chart says: the plugin's own default (10 s) would look for libefml.
    assert "--telemetry-interval=0" in container["args"]
    assert not helm_render.objects(rendered, "PrometheusRule")
    names = [doc["metadata"]["name"] for doc in helm_render.objects(rendered, "ConfigMap")]
    assert not [name for name in names if "dashboard" in name]
