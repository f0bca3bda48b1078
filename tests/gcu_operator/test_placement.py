"""Where a resource's pods can run (issue 47, points 2 and 4): nodes no serving component
selects are not the resource's (the project's example on a node Node Feature Discovery alone
labelled reaches Running and rolls), and a node whose taints a component does not tolerate is
named ("no pod can run here") and kept out of the rollout's budget; `tolerations` and
`affinity` in both API groups reach the DaemonSets (and the validator)."""

from __future__ import annotations

from typing import Any

import yaml

from enflame_gcu.gcu_operator import api, crd, names, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import EXAMPLE, converge, node_reports, ours, set_spec, status

NODES = ["node-a", "node-b", "node-c"]
NFD_LABEL = "feature.node.kubernetes.io/pci-1e36.present"
TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
TOLERATE = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]


def _start(resource: dict[str, Any], dra: bool = False) -> tuple[FakeApi, FakeCluster, Any]:
    fake = FakeApi(dra_served=dra)
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    return fake, cluster, runner.Operator(fake, clock=lambda: fake.now)


def _component_pods(fake: FakeApi, key: str) -> dict[str, dict[str, Any]]:
    return {
        p["spec"]["nodeName"]: p
        for p in fake.objects(api.POD)
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == key
        and not p["metadata"].get("deletionTimestamp")
    }


def _nfd_only(fake: FakeApi, name: str) -> None:
    """The node as Node Feature Discovery alone labels a GCU node."""
    fake.patch(
        api.NODE,
        name,
        {"metadata": {"labels": {"enflame.com/gcu.present": None, NFD_LABEL: "true"}}},
    )


def test_the_example_reaches_running_and_rolls_beside_a_node_only_nfd_labelled() -> None:
    """The example selects every GCU node (no nodeSelector since issue 50), a node only Node
    Feature Discovery labelled included; the same resource with the hand-set label as its
    plugin's nodeSelector leaves that node out, and is not held back by it (issue 47 point 2)."""
    example = yaml.safe_load(EXAMPLE.read_text())
    fake, cluster, operator = _start(example)
    _nfd_only(fake, "node-c")
    converge(operator, cluster)
    st = status(fake, example)
    assert st["phase"] == "Running", st["conditions"]
    assert st["clusterGCUNodes"] == ["node-a", "node-b", "node-c"]
    assert "node-c" in _component_pods(fake, rs.TOOLKIT)

    scoped = yaml.safe_load(EXAMPLE.read_text())
    scoped["spec"]["devicePlugin"]["nodeSelector"] = {"enflame.com/gcu.present": "true"}
    fake, cluster, operator = _start(scoped)
    _nfd_only(fake, "node-c")
    converge(operator, cluster)
    st = status(fake, scoped)
    assert st["phase"] == "Running", st["conditions"]
    assert st["clusterGCUNodes"] == ["node-a", "node-b"]
    assert "node-c" not in _component_pods(fake, rs.TOOLKIT)
    assert names.deploy_label(rs.TOOLKIT) not in cluster.node_labels("node-c")
    set_spec(fake, scoped, ["devicePlugin", "version"], "0.2.0")
    converge(operator, cluster)
    st = status(fake, scoped)
    assert st["phase"] == "Running", st["conditions"]
    images = {
        n: p["spec"]["containers"][0]["image"]
        for n, p in _component_pods(fake, rs.DEVICE_PLUGIN).items()
    }
    assert sorted(images) == ["node-a", "node-b"]
    assert all(i.endswith(":0.2.0") for i in images.values())


def test_a_node_that_leaves_the_plugins_selector_stops_being_the_resources() -> None:
    resource = ours(devicePlugin={"nodeSelector": {"pool": "gcu"}})
    fake, cluster, operator = _start(resource)
    for name in NODES:
        fake.patch(api.NODE, name, {"metadata": {"labels": {"pool": "gcu"}}})
    converge(operator, cluster)
    fake.patch(api.NODE, "node-c", {"metadata": {"labels": {"pool": None}}})
    converge(operator, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    assert sorted(node_reports(fake, resource)) == ["node-a", "node-b"]
    assert "node-c" not in _component_pods(fake, rs.TOOLKIT)
    labels = cluster.node_labels("node-c")
    assert not any(k.startswith(names.DEPLOY_LABEL_PREFIX) for k in labels), labels


def test_a_tainted_node_is_named_and_out_of_the_budget() -> None:
    resource = ours()
    fake, cluster, operator = _start(resource)
    cluster.taint("node-b", **TAINT)
    converge(operator, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    by_node = node_reports(fake, resource)
    assert [n["name"] for n in st["nodes"]] == ["node-b"]  # the one node with a problem
    error = by_node["node-b"]["lastError"]
    assert "no pod can run here" in error
    assert "dedicated=ml:NoSchedule not tolerated by spec.containerToolkit.tolerations" in error
    assert "node-b" in st["conditions"][0]["message"]
    assert sorted(_component_pods(fake, rs.DEVICE_PLUGIN)) == ["node-a", "node-c"]
    # maxUnavailable 1: the node where nothing can run does not block the rollout.
    set_spec(fake, resource, ["devicePlugin", "version"], "0.2.0")
    converge(operator, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    plugin_pods = _component_pods(fake, rs.DEVICE_PLUGIN)
    assert all(p["spec"]["containers"][0]["image"].endswith(":0.2.0") for p in plugin_pods.values())


def test_tolerations_and_affinity_reach_the_daemonsets() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z9"]}]}
                ]
            }
        }
    }
    resource = ours(
        containerToolkit={"tolerations": TOLERATE},
        devicePlugin={"tolerations": TOLERATE, "affinity": affinity},
    )
    fake, cluster, operator = _start(resource)
    cluster.taint("node-b", **TAINT)
    fake.patch(api.NODE, "node-c", {"metadata": {"labels": {"zone": "z9"}}})
    converge(operator, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    assert st["clusterGCUNodes"] == ["node-a", "node-b"]  # node-c: the affinity keeps it out
    assert sorted(_component_pods(fake, rs.DEVICE_PLUGIN)) == ["node-a", "node-b"]
    assert all(n["validated"] for n in node_reports(fake, resource).values())
    plugin = fake.find(api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
    assert plugin is not None
    pod_spec = plugin["spec"]["template"]["spec"]
    assert TOLERATE[0] in pod_spec["tolerations"]
    assert pod_spec["affinity"] == affinity


def test_a_tainted_dra_node_validates_with_the_dra_drivers_tolerations() -> None:
    resource = ours(dra={"tolerations": TOLERATE}, containerToolkit={"tolerations": TOLERATE})
    fake, cluster, operator = _start(resource, dra=True)
    fake.patch(api.NODE, "node-a", {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    cluster.taint("node-a", **TAINT)
    converge(operator, cluster)
    for _ in range(3):
        cluster.step()
        converge(operator, cluster)
    by_node = node_reports(fake, resource)
    assert by_node["node-a"]["mode"] == "dra"
    assert by_node["node-a"]["validated"], by_node["node-a"]


def test_bad_tolerations_and_affinity_are_reported_not_deployed() -> None:
    spec = rs.parse(
        {
            "devicePlugin": {
                "tolerations": [{"key": "a", "operator": "Sometimes"}, {"key": "b"}],
                "affinity": "near",
            }
        }
    )
    plugin = spec.components[rs.DEVICE_PLUGIN]
    assert plugin.tolerations == ({"key": "b"},)
    assert plugin.affinity is None
    fields = {u.field for u in spec.unsupported}
    assert "spec.devicePlugin.tolerations[0]" in fields
    assert "spec.devicePlugin.affinity" in fields


def test_both_groups_crds_take_tolerations_and_affinity() -> None:
    for group in (rs.GROUP, rs.LEGACY_GROUP):
        schema = crd.crd(group)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for key in ("containerToolkit", "toolkit", "devicePlugin", "plugin", "dra", "validator"):
            fields = schema["properties"]["spec"]["properties"][key]["properties"]
            assert fields["tolerations"]["type"] == "array", (group, key)
            assert fields["affinity"]["type"] == "object", (group, key)
