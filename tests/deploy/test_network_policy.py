"""The NetworkPolicy on the device plugin pods (issue 22 item 2): only the metrics port, only
from Prometheus; on by default in the chart, with an off-switch; the static manifest says the
same. Rendered with Helm's own engine, validated against Kubernetes' published schemas."""

from __future__ import annotations

import os
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from tests.deploy import helm_render, test_chart
from tests.deploy.helpers import YAML_DIR, load_one

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
TEMPLATE = "networkpolicy-device-plugin.yaml"
PROMETHEUS = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def _policy(rendered: dict[str, list[Any]]) -> dict[str, Any] | None:
    documents = [d for d in rendered.get(TEMPLATE, []) if d]
    assert len(documents) <= 1
    return documents[0] if documents else None


@needs_helm
def test_chart_ships_the_policy_by_default_admitting_prometheus_on_the_metrics_port(
    tmp_path: Any,
) -> None:
    policy = _policy(helm_render.render(str(tmp_path)))
    assert policy is not None and policy["kind"] == "NetworkPolicy"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "enflame-device-plugin"
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{"ports": [{"port": 9402, "protocol": "TCP"}], "from": [PROMETHEUS]}]
    kv.validate(policy, kv.latest_version(), strict=True)


@needs_helm
@pytest.mark.parametrize(
    "overrides",
    [
        {"metrics": {"networkPolicy": {"enabled": False}}},
        {"metrics": {"port": 0}},
    ],
    ids=["switched-off", "no-metrics-port"],
)
def test_chart_policy_off_switch(tmp_path: Any, overrides: dict[str, Any]) -> None:
    assert _policy(helm_render.render(str(tmp_path), overrides)) is None


@needs_helm
def test_no_listed_peer_admits_nobody_rather_than_everybody(tmp_path: Any) -> None:
    """An empty ``from`` in a NetworkPolicy rule means every source: never rendered."""
    overrides = {"metrics": {"networkPolicy": {"enabled": True, "from": []}}}
    policy = _policy(helm_render.render(str(tmp_path), overrides))
    assert policy is not None and policy["spec"]["ingress"] == []


def test_schema_rejects_a_misspelt_policy_value() -> None:
    bad = test_chart._with("metrics.networkPolicy", {"enabled": True, "form": []})
    assert not test_chart.validator().is_valid(bad)
    empty_peer = test_chart._with("metrics.networkPolicy", {"enabled": True, "from": [{}]})
    assert not test_chart.validator().is_valid(empty_peer)
    assert test_chart.values()["metrics"]["networkPolicy"]["enabled"] is True


def test_static_manifest_is_the_charts_default_policy() -> None:
    policy = load_one(os.path.join(YAML_DIR, "enflame-device-plugin-networkpolicy.yaml"))
    plugin = load_one(os.path.join(YAML_DIR, "enflame-device-plugin.yaml"))
    assert policy["metadata"]["namespace"] == plugin["metadata"]["namespace"]
    labels = plugin["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    port = plugin["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": port, "protocol": "TCP"}], "from": [PROMETHEUS]}
    ]
    assert test_chart.values()["metrics"]["networkPolicy"]["from"] == [PROMETHEUS]
