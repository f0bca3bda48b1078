"""The chart's metrics values: probes, PodResources and NFD mounts, Service and Prometheus
Operator monitors (structure here; real ``helm lint`` renders every switch where it exists)."""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import pytest

from tests.deploy import test_chart
from tests.deploy.helpers import CHART_DIR


def test_monitors_select_the_plugin_pods_and_label_the_node() -> None:
    text = test_chart.template("monitors.yaml")
    assert "kind: ServiceMonitor" in text and "kind: PodMonitor" in text
    assert text.count("targetLabel: node") == 2
    assert text.count("sourceLabels: [__meta_kubernetes_pod_node_name]") == 2
    service = test_chart.template("service-metrics.yaml")
    # A ServiceMonitor needs the Service: either switch renders it.
    assert ".Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled" in service
    assert "targetPort: metrics" in service


def test_monitors_and_service_are_off_by_default_and_probes_on() -> None:
    metrics = test_chart.values()["metrics"]
    assert metrics["port"] == 9402 and metrics["bindAddress"] == ""
    assert not metrics["service"]["enabled"]
    assert not metrics["serviceMonitor"]["enabled"] and not metrics["podMonitor"]["enabled"]
    assert test_chart.values()["nodeLabels"]["enabled"] is True


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metrics.port", 70000),
        ("metrics.bindAddress", "localhost"),
        ("metrics.serviceMonitor.interval", "often"),
        ("metrics.podMonitor.extra", True),
        ("nodeLabels.featuresDir", "features.d"),
    ],
)
def test_schema_rejects_bad_metrics_values(path: str, value: Any) -> None:
    assert not test_chart.validator().is_valid(test_chart._with(path, value))


def _switched_on(tmp_path: Any) -> str:
    target = os.path.join(str(tmp_path), "enflame-gcu")
    shutil.copytree(CHART_DIR, target)
    path = os.path.join(target, "values.yaml")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    text, count = re.subn(
        r"(?m)^(  (?:service|serviceMonitor|podMonitor):\n    enabled: )false$", r"\1true", text
    )
    assert count == 3
    text = text.replace('  bindAddress: ""', '  bindAddress: "0.0.0.0"', 1)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return target


@pytest.mark.skipif(not os.path.exists(test_chart.HELM_SDK), reason=test_chart.NO_HELM_SDK)
def test_real_helm_lint_renders_service_and_monitors(tmp_path: Any) -> None:
    lint = test_chart._real_helm_lint(_switched_on(tmp_path))
    assert lint["errors"] is None
    assert [m for m in lint["messages"] if m["severity"] and m["severity"] > 1] == []
