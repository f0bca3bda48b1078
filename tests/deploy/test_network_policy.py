"""The NetworkPolicies on the device plugin and DRA driver pods (issue 22 item 2, issue 48
point 6): only their HTTP port, only from the scraper's namespace named by
kubernetes.io/metadata.name (no user can set it), nobody until it is set; on by default in the
chart, with an off-switch; the static manifests say the same. Rendered with Helm's own
engine, validated against Kubernetes' published schemas."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from tests.deploy import helm_render, test_chart
from tests.deploy.helpers import YAML_DIR, load_all

DRA_DIR = os.path.join(os.path.dirname(YAML_DIR), "dra")

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
TEMPLATE = "networkpolicy-device-plugin.yaml"
DRA_TEMPLATE = "networkpolicy-dra-plugin.yaml"
SCRAPER_LABELS = {"app.kubernetes.io/name": "prometheus"}
# What a tenant can do without any right over other namespaces: label its own pods (and, where
# it may edit its namespace, the namespace) as Prometheus's. The admitted peer must not care.
NAME_LABEL = "kubernetes.io/metadata.name"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def scraper(namespace: str) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": SCRAPER_LABELS},
    }


def _policy(rendered: dict[str, list[Any]], template: str = TEMPLATE) -> dict[str, Any] | None:
    documents = [d for d in rendered.get(template, []) if d]
    assert len(documents) <= 1
    return documents[0] if documents else None


@needs_helm
def test_chart_ships_the_policy_by_default_admitting_nobody_until_the_scraper_is_named(
    tmp_path: Any,
) -> None:
    """Before: every pod in any namespace labelled app.kubernetes.io/name=prometheus, which any
    tenant can label its own pod, was admitted."""
    rendered = helm_render.render(str(tmp_path), {"dra": {"enabled": True}})
    for template in (TEMPLATE, DRA_TEMPLATE):
        policy = _policy(rendered, template)
        assert policy is not None and policy["kind"] == "NetworkPolicy", template
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"] == [], template
        kv.validate(policy, kv.latest_version(), strict=True)
    spec = _policy(rendered)["spec"]  # type: ignore[index]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "enflame-device-plugin"


@needs_helm
def test_the_scraper_is_admitted_by_its_namespaces_name_on_each_port(tmp_path: Any) -> None:
    overrides = {
        "dra": {"enabled": True},
        "metrics": {"networkPolicy": {"enabled": True, "scraperNamespace": "monitoring"}},
    }
    rendered = helm_render.render(str(tmp_path), overrides)
    for template, port in ((TEMPLATE, 9402), (DRA_TEMPLATE, 8082)):
        policy = _policy(rendered, template)
        assert policy is not None
        assert policy["spec"]["ingress"] == [
            {"ports": [{"port": port, "protocol": "TCP"}], "from": [scraper("monitoring")]}
        ], template
        kv.validate(policy, kv.latest_version(), strict=True)


@needs_helm
def test_extra_peers_follow_the_scraper_as_written(tmp_path: Any) -> None:
    extra = {"ipBlock": {"cidr": "10.0.0.0/8"}}
    overrides = {
        "metrics": {
            "networkPolicy": {
                "enabled": True,
                "scraperNamespace": "obs",
                "from": [extra],
            }
        }
    }
    policy = _policy(helm_render.render(str(tmp_path), overrides))
    assert policy is not None
    assert policy["spec"]["ingress"][0]["from"] == [
        scraper("obs"),
        extra,
    ]


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


@pytest.mark.parametrize(
    "policy",
    [
        # The hole being closed: any namespace, a label any tenant can put on its own pod.
        {
            "enabled": True,
            "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": SCRAPER_LABELS}}],
        },
        {"enabled": True, "scraperNamespace": "Monitoring"},  # no namespace has capitals
        {"enabled": True, "scraperNamespace": "monitoring,default"},
        {"enabled": True, "scraperNamespace": "a" * 64},
        {"enabled": True, "scraperNamespace": "obs", "scraperPodLabels": {"app": 1}},
    ],
    ids=["any-namespace", "capitals", "two-names", "too-long", "label-not-a-string"],
)
def test_schema_refuses_a_peer_any_tenant_can_be(policy: dict[str, Any]) -> None:
    assert not test_chart.validator().is_valid(test_chart._with("metrics.networkPolicy", policy))


def test_the_default_values_name_no_scraper_and_admit_no_extra_peer() -> None:
    policy = test_chart.values()["metrics"]["networkPolicy"]
    assert policy["scraperNamespace"] == "" and policy["from"] == []
    assert policy["scraperPodLabels"] == SCRAPER_LABELS


@pytest.mark.parametrize(
    ("manifest", "workload", "component"),
    [
        (os.path.join(YAML_DIR, "enflame-device-plugin-networkpolicy.yaml"),
         os.path.join(YAML_DIR, "enflame-device-plugin.yaml"), "enflame-device-plugin"),
        (os.path.join(DRA_DIR, "enflame-dra-plugin.yaml"),
         os.path.join(DRA_DIR, "enflame-dra-plugin.yaml"), "enflame-dra-plugin"),
    ],
    ids=["device-plugin", "dra-plugin"],
)  # fmt: skip
def test_static_manifests_admit_the_scraper_by_a_namespace_name_that_is_yet_to_be_set(
    manifest: str, workload: str, component: str
) -> None:
    """As shipped, the placeholder cannot be any namespace's name (capitals): nobody is admitted
    until it is replaced; no peer selects namespaces by a label a tenant can set."""
    [policy] = [d for d in load_all(manifest) if d and d["kind"] == "NetworkPolicy"]
    [plugin] = [d for d in load_all(workload) if d and d["kind"] == "DaemonSet"]
    assert policy["metadata"]["namespace"] == plugin["metadata"]["namespace"]
    labels = plugin["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == component
    ports = plugin["spec"]["template"]["spec"]["containers"][0]["ports"]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": ports[0]["containerPort"], "protocol": "TCP"}]
    [peer] = rule["from"]
    assert peer["podSelector"] == {"matchLabels": SCRAPER_LABELS}
    assert list(peer["namespaceSelector"]) == ["matchLabels"]
    [(label, placeholder)] = peer["namespaceSelector"]["matchLabels"].items()
    assert label == NAME_LABEL
    assert not DNS_LABEL.match(placeholder), placeholder  # matches no namespace
    kv.validate(policy, kv.latest_version(), strict=True)
