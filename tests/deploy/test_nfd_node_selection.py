"""Nodes Node Feature Discovery labels with its stock settings run the DaemonSets (issue 50).

NFD's default PCI label is pci-<class>_<vendor>.present (class and subclass: GCUs report class
0x12, subclass 0x00, "1200"); pci-<vendor>.present exists only with deviceLabelFields: [vendor].
Each node below is labelled as NFD would label it, from a simulated node's sysfs; the manifests,
the chart's rendered DaemonSets and the operator's notion of a GCU node must take it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu import devices
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import main as plugin_main
from enflame_gcu.gcu_operator import nodes as operator_nodes
from enflame_gcu.simulation import simulate, topofile
from tests.deploy import helm_render
from tests.deploy.helpers import CHART_DIR, YAML_DIR, load_all, load_one
from tests.deploy.node_labels import NFD, nfd_rule_labels, schedules_on, stock_nfd_labels
from tests.deploy.test_chart_component_knobs import _lint_output

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
STOCK = f"{NFD}pci-{devices.ACCELERATOR_CLASS:02x}00_{devices.VENDOR_ID:04x}.present"
SHORT = f"{NFD}pci-{devices.VENDOR_ID:04x}.present"
DAEMONSET_MANIFESTS = [
    "enflame-device-plugin.yaml",
    "enflame-device-plugin-compat-with-cpumanager.yaml",
    "enflame-vdevice-plugin.yaml",
    "enflame-device-plugin-pcie-switch-affinity.yaml",
    "extensions-v1beta1-enflame-device-plugin.yaml",
    "enflame-container-toolkit.yaml",
]
OTHER_NODE = {f"{NFD}pci-0300_1a03.present": "true", f"{NFD}pci-0300_10de.present": "true"}


@pytest.fixture(scope="module")
def gcu_host() -> Iterator[str]:
    """A simulated 8-card node's host root (its sysfs is what nfd-worker would read)."""
    work = tempfile.mkdtemp(prefix="nfd-")
    try:
        simulate.create(os.path.join(work, "n"), topofile.load("vendor-8card"), char_devices=False)
        yield os.path.join(work, "n")
    finally:
        shutil.rmtree(work)


def _daemonset_pods(path: str) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in load_all(path) if d["kind"] == "DaemonSet"]


def test_stock_nfd_labels_a_simulated_gcu_node_with_the_class_and_vendor_form(
    gcu_host: str,
) -> None:
    # The simulated bridges (class 0604) are outside NFD's whitelist; the cards make one label.
    assert stock_nfd_labels(gcu_host) == {STOCK: "true"}
    assert f"{NFD}pci-1200_1e36.present" == STOCK


@pytest.mark.parametrize("name", DAEMONSET_MANIFESTS)
def test_a_node_stock_nfd_labelled_runs_every_manifests_daemonset(name: str, gcu_host: str) -> None:
    [pod] = _daemonset_pods(os.path.join(YAML_DIR, name))
    for labels in ({**OTHER_NODE, **stock_nfd_labels(gcu_host)}, {SHORT: "true"}):
        assert schedules_on(pod, labels), (name, labels)
    assert schedules_on(pod, {"enflame.com/gcu.present": "true"})
    assert not schedules_on(pod, OTHER_NODE)
    dra_node = {**stock_nfd_labels(gcu_host), "enflame.com/gcu.mode": "dra"}
    assert schedules_on(pod, dra_node) == (name == "enflame-container-toolkit.yaml")


def test_the_node_feature_rule_labels_a_gcu_node_and_only_that(gcu_host: str) -> None:
    rule = load_one(os.path.join(YAML_DIR, "enflame-gcu-nodefeaturerule.yaml"))
    assert (rule["apiVersion"], rule["kind"]) == ("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule")
    assert nfd_rule_labels(rule, gcu_host) == {"enflame.com/gcu.present": "true"}
    [pod] = _daemonset_pods(os.path.join(YAML_DIR, "enflame-device-plugin.yaml"))
    assert schedules_on(pod, {**OTHER_NODE, **nfd_rule_labels(rule, gcu_host)})
    bridges_only = tempfile.mkdtemp(prefix="nfd-")
    try:
        other = os.path.join(bridges_only, "n")
        simulate.create(other, topofile.load("vendor-8card"), char_devices=False)
        top = os.path.join(other, "sys", "bus", "pci", "devices")
        for name in os.listdir(top):  # the cards become another vendor's accelerators
            with open(os.path.join(top, name, "vendor"), encoding="ascii") as handle:
                vendor = handle.read().strip()
            if vendor == f"0x{devices.VENDOR_ID:04x}":
                with open(os.path.join(top, name, "vendor"), "w", encoding="ascii") as handle:
                    handle.write("0x8086")
        assert nfd_rule_labels(rule, other) == {}
    finally:
        shutil.rmtree(bridges_only)


def test_the_operator_counts_a_stock_nfd_labelled_node_as_a_gcu_node(gcu_host: str) -> None:
    for labels in (
        stock_nfd_labels(gcu_host),
        {SHORT: "true"},
        {"enflame.com/gcu.present": "true"},
    ):
        assert operator_nodes.is_gcu_node({"metadata": {"name": "n", "labels": labels}}), labels
    assert not operator_nodes.is_gcu_node({"metadata": {"name": "n", "labels": OTHER_NODE}})


def test_the_operator_example_asks_for_no_label_stock_nfd_does_not_set() -> None:
    example = load_one(os.path.join(YAML_DIR, "..", "operator", "examples", "gcu-resource.yaml"))
    for component in example["spec"].values():
        if isinstance(component, dict):
            assert "nodeSelector" not in component, component


@needs_helm
def test_a_node_stock_nfd_labelled_runs_the_charts_daemonsets(tmp_path: Any, gcu_host: str) -> None:
    rendered = helm_render.render(str(tmp_path), {"toolkit": {"enabled": True}})
    stock = {**OTHER_NODE, **stock_nfd_labels(gcu_host)}
    for template in ("daemonset-device-plugin.yaml", "daemonset-container-toolkit.yaml"):
        pod = helm_render.daemonset(rendered, template)["spec"]["template"]["spec"]
        assert schedules_on(pod, stock), template
        assert schedules_on(pod, {SHORT: "true"}), template
        assert not schedules_on(pod, OTHER_NODE), template
    # No NFD API here: no NodeFeatureRule (auto) ...
    assert helm_render.objects(rendered, "NodeFeatureRule") == []


@needs_helm
def test_the_chart_ships_the_node_feature_rule_where_nfd_serves_its_api(
    tmp_path: Any, gcu_host: str
) -> None:
    rendered = helm_render.render(
        str(tmp_path / "a"), {"apiVersions": ["nfd.k8s-sigs.io/v1alpha1"]}
    )
    [rule] = helm_render.objects(rendered, "NodeFeatureRule")
    assert rule["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert "namespace" not in rule["metadata"]  # cluster-scoped
    assert nfd_rule_labels(rule, gcu_host) == {"enflame.com/gcu.present": "true"}
    static = load_one(os.path.join(YAML_DIR, "enflame-gcu-nodefeaturerule.yaml"))
    assert rule["spec"] == static["spec"]
    off = {"apiVersions": ["nfd.k8s-sigs.io/v1alpha1"], "nfd": {"nodeFeatureRule": False}}
    assert (
        helm_render.objects(helm_render.render(str(tmp_path / "b"), off), "NodeFeatureRule") == []
    )
    # true without the API: the install fails and says why (lint logs the template's fail).
    said = _lint_output(str(tmp_path / "c"), {"nfd": {"nodeFeatureRule": True}})
    assert "nfd.nodeFeatureRule=true needs the API nfd.k8s-sigs.io/v1alpha1" in said


NODES_PROBE = """{{- $nodes := list %s }}
{{- $wanted := .Values.nodeSelection.anyOfLabels }}
{{- $count := include "enflame-gcu.matchingNodeCount" (dict "nodes" $nodes "anyOfLabels" $wanted) }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: probe
data:
  count: {{ $count | quote }}
"""


def _node(labels: dict[str, str]) -> str:
    pairs = " ".join(f'"{k}" "{v}"' for k, v in labels.items())
    return f'(dict "metadata" (dict "labels" (dict {pairs})))'


@needs_helm
def test_the_notes_count_the_nodes_that_match_node_selection(tmp_path: Any, gcu_host: str) -> None:
    """The NOTES warn when no node matches (they count what lookup lists, with this helper)."""
    for labels, expected in (
        ([OTHER_NODE, OTHER_NODE], "0"),
        ([OTHER_NODE, {**OTHER_NODE, **stock_nfd_labels(gcu_host)}, {SHORT: "true"}], "2"),
        ([{"enflame.com/gcu.present": "false"}], "0"),
    ):
        probe = NODES_PROBE % " ".join(_node(n) for n in labels)
        rendered = helm_render.render(
            str(tmp_path / expected / str(len(labels))), {}, {"zz-nodes-probe.yaml": probe}
        )
        [configmap] = rendered["zz-nodes-probe.yaml"]
        assert configmap["data"]["count"] == expected, labels
    with open(os.path.join(CHART_DIR, "templates", "NOTES.txt"), encoding="utf-8") as f:
        notes = f.read()
    assert 'include "enflame-gcu.matchingNodeCount"' in notes
    assert "WARNING: none of the cluster's" in notes


def test_the_charts_description_and_readme_name_everything_it_installs() -> None:
    """Chart.yaml and the chart README once named only the plugin and the toolkit."""
    description = " ".join(load_one(os.path.join(CHART_DIR, "Chart.yaml"))["description"].split())
    with open(os.path.join(CHART_DIR, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    for words in (
        "DRA driver", "scheduler extender", "operator", "Node Feature Discovery",
        "ServiceMonitor", "PrometheusRule", "Grafana dashboard", "NetworkPolicies",
    ):  # fmt: skip
        assert words in description, words
        assert words in readme, words


@needs_helm
def test_the_plugins_drs_value_serves_drs_gcu_with_efsmi_and_the_privilege_it_needs(
    tmp_path: Any,
) -> None:
    """enflame.com/drs-gcu could not be reached from Helm (issue 50 point 3)."""
    rendered = helm_render.render(str(tmp_path / "on"), {"devicePlugin": {"drs": "S60,gcu3"}})
    pod = helm_render.daemonset(rendered, "daemonset-device-plugin.yaml")["spec"]["template"]
    [container] = pod["spec"]["containers"]
    args = container["args"]
    assert "--resources=gcu,drs-gcu" in args
    assert "--drs=S60,gcu3" in args and "--efsmi=/usr/local/efsmi/efsmi" in args
    # The plugin's own parser takes what the chart passes.
    config = plugin_main.load_config(args, {})
    assert plugin_config.DRS_GCU in config.resources
    assert config.efsmi == "/usr/local/efsmi/efsmi"
    security = container["securityContext"]
    assert security["privileged"] is True and "allowPrivilegeEscalation" not in security
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["drs-efsmi"] == {
        "name": "drs-efsmi", "mountPath": "/usr/local/efsmi", "readOnly": True,
    }  # fmt: skip
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["drs-efsmi"]["hostPath"]["path"] == "/usr/local/efsmi"
    # Off (the default): nothing of it, and the plugin stays unprivileged.
    off = helm_render.render(str(tmp_path / "off"), {})
    pod = helm_render.daemonset(off, "daemonset-device-plugin.yaml")["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert not any(a.startswith(("--drs", "--efsmi")) for a in container["args"])
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "drs-efsmi" not in {v["name"] for v in pod["spec"]["volumes"]}
