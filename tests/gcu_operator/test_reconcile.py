"""The operator's reconcile against the fake API and simulated cluster (no mocks)."""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, components, names, pods, reconcile, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import (
    converge,
    kind_of,
    node_reports,
    ours,
    set_spec,
    status,
    vendor_example,
)

NODES = ["node-a", "node-b", "node-c"]


def _start(
    resource: dict[str, Any], nodes: list[str] = NODES
) -> tuple[FakeApi, FakeCluster, runner.Operator]:
    fake = FakeApi()
    cluster = FakeCluster(fake, nodes)
    fake.put(kind_of(resource), resource)
    return fake, cluster, runner.Operator(fake, clock=lambda: fake.now)


def _plugin_images(fake: FakeApi) -> dict[str, str]:
    out = {}
    for pod in fake.objects(api.POD):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(names.COMPONENT_LABEL) == rs.DEVICE_PLUGIN and not pod["metadata"].get(
            "deletionTimestamp"
        ):
            out[pod["spec"]["nodeName"]] = pod["spec"]["containers"][0]["image"]
    return out


def test_vendor_example_gives_the_same_components_and_ready_5_of_5() -> None:
    resource = vendor_example()
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    daemonsets = {d["metadata"]["name"] for d in fake.objects(api.DAEMONSET)}
    assert daemonsets == {"enflame-gcu-docker-plugin", "enflame-gcu-k8s-plugin"}
    assert [s["metadata"]["name"] for s in fake.objects(api.SERVICE)] == ["enflame-gcu-exporter"]
    st = status(fake, resource)
    assert (st["readyResource"], st["phase"]) == ("5/5", "Running")
    assert [r["name"] for r in st["resourceStatuses"]] == [
        "containerToolkit",
        "devicePlugin",
        "gcuExporter",
        "gfd",
        "validator",
    ]
    reported = {u["field"] for u in st["unsupported"]}
    # NFD is deployed by the example but is not ours; the vendor's images are replaced: said so.
    assert {"spec.nfd", "spec.toolkit.image", "spec.devicePlugin.image"} <= reported
    assert st["clusterGCUNodes"] == NODES
    for name in NODES:
        assert cluster.node_labels(name)[names.VALIDATED_LABEL] == "true"
    obj = fake.find(api.LEGACY_GCU_RESOURCE, "enflame-gcu-resource")
    assert obj is not None and rs.FINALIZER in obj["metadata"]["finalizers"]


def test_a_converged_pass_writes_nothing() -> None:
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)
    before = fake.writes()
    operator.run_once()
    assert fake.writes() == before


def test_toolkit_readiness_gates_the_plugin_per_node() -> None:
    fake, cluster, operator = _start(ours())
    cluster.broken_images.add(
        f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-container-toolkit:{rs.DEFAULT_VERSION}"
    )
    for _ in range(6):
        operator.run_once()
        cluster.step()
    for name in NODES:
        labels = cluster.node_labels(name)
        assert labels[names.deploy_label(rs.TOOLKIT)] == "true"
        assert names.deploy_label(rs.DEVICE_PLUGIN) not in labels
    assert _plugin_images(fake) == {}
    st = status(fake, ours())
    assert st["phase"] == "Deploying"
    assert "CrashLoopBackOff" in st["nodes"][0]["lastError"]
    assert "CrashLoopBackOff" in node_reports(fake, ours())["node-a"]["lastError"]


def test_version_change_rolls_node_by_node_and_pods_keep_their_cards() -> None:
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)
    for i, name in enumerate(NODES):
        cluster.add_workload(name, f"job-{i}", cards=str(i))
    workloads = {
        p["metadata"]["uid"]
        for p in fake.objects(api.POD)
        if p["metadata"]["namespace"] == "default"
    }
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    seen_unavailable: list[int] = []

    def check() -> None:
        images = _plugin_images(fake)
        new = sum(1 for n in NODES if images.get(n, "").endswith(":0.2.0"))
        old = sum(1 for n in NODES if images.get(n, "").endswith(f":{rs.DEFAULT_VERSION}"))
        seen_unavailable.append(len(NODES) - old - (new if new else 0))
        # Never more than maxUnavailable=1 node without a working, validated plugin.
        not_serving = [
            n for n in NODES if cluster.node_labels(n).get(names.VALIDATED_LABEL) != "true"
        ]
        assert len(not_serving) <= 1, not_serving

    converge(operator, cluster, check=check)
    assert set(_plugin_images(fake).values()) == {
        f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
    }
    left = {
        p["metadata"]["uid"]
        for p in fake.objects(api.POD)
        if p["metadata"]["namespace"] == "default"
    }
    assert left == workloads  # the GCU pods were never touched
    st = status(fake, ours())
    assert (st["phase"], st["readyResource"]) == ("Running", "3/3")
    # The toolkit did not change, so it was not restarted (no undo ran).
    assert cluster.undo_log == []


def test_failing_node_stops_the_rollout_and_the_old_version_rolls_back() -> None:
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)
    bad = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
    cluster.broken_images.add(bad)
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    for _ in range(10):
        operator.run_once()
        cluster.step()
    st = status(fake, ours())
    assert st["phase"] == "Failed"
    failed = st["rollout"]["failed"]
    assert len(failed) == 1 and "CrashLoopBackOff" in failed[0]["reason"]
    assert failed[0]["node"] in st["conditions"][0]["message"]
    # The node that tried it runs the old version again (a pod of its previous template), the
    # others kept theirs.
    old = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:{rs.DEFAULT_VERSION}"
    assert set(_plugin_images(fake).values()) == {old}
    assert "runs its previous devicePlugin again" in failed[0]["reason"]
    set_spec(fake, ours(), ["devicePlugin", "version"], rs.DEFAULT_VERSION)
    converge(operator, cluster)
    assert set(_plugin_images(fake).values()) == {old}
    assert status(fake, ours())["phase"] == "Running"
    # Its DaemonSet's pod again: no pod of the previous template is left.
    assert not [
        p for p in fake.objects(api.POD) if components.FALLBACK_LABEL in p["metadata"]["labels"]
    ]


def test_a_validator_refused_as_unexpected_by_the_kubelet_is_tried_again() -> None:
    """Seen by the chaos run (issue 37): the kubelet refused the validator pod of a new plugin
    version with UnexpectedAdmissionError (its plugin had not listed the devices yet after a
    restart), and the operator took that as a failed validation and stopped the rollout for
    good. The pod never ran and the plugin had just become Ready: the operator says so on the
    node and makes a new one."""
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    cluster.unexpected_admission.add("node-b")
    said: list[str] = []

    def check() -> None:
        node_b = node_reports(fake, ours())["node-b"]
        said.append(node_b["lastError"])

    converge(operator, cluster, check=check)
    assert not cluster.unexpected_admission  # the kubelet did refuse one validator pod
    st = status(fake, ours())
    assert (st["phase"], st["rollout"]["failed"]) == ("Running", [])
    assert any("refused by the kubelet, trying again: Pod Allocate failed" in s for s in said)
    assert cluster.node_labels("node-b")[names.VALIDATED_LABEL] == "true"
    assert set(_plugin_images(fake).values()) == {
        f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
    }


def test_a_node_that_keeps_refusing_its_validator_stops_the_rollout_after_the_grace() -> None:
    """The other side of the retry: a plugin that serves no card (or a node with none free) is
    refused the same way, for good. The operator tries again only while the plugin is settling
    (REFUSAL_GRACE after it became Ready); then the refusal is the validation's answer and the
    rollout stops on that node, naming the kubelet's message. Retrying for ever hung the real
    cluster tier's rollout test."""
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    cluster.refusing_nodes.add("node-a")  # the rollout's first node
    refused_at: list[float] = []
    for _ in range(40):
        operator.run_once()
        st = status(fake, ours())
        node_a: dict[str, Any] = next(
            (n for n in st.get("nodes") or [] if n["name"] == "node-a"), {}
        )
        if "trying again" in str(node_a.get("lastError")):
            refused_at.append(fake.now)
        # Never a rollout past a node still refusing, never a label on it.
        assert names.VALIDATED_LABEL not in cluster.node_labels("node-a") or not refused_at
        if st.get("phase") == "Failed":
            break
        cluster.step()
    st = status(fake, ours())
    assert st["phase"] == "Failed", st
    failed = st["rollout"]["failed"]
    assert [f["node"] for f in failed] == ["node-a"]
    assert (
        "UnexpectedAdmissionError" in failed[0]["reason"]
        or "Pod Allocate failed" in (failed[0]["reason"])
    )
    # It did try again first, for about the grace and not much longer.
    assert refused_at
    span = refused_at[-1] - refused_at[0]
    assert reconcile.REFUSAL_GRACE - 15 <= span <= reconcile.REFUSAL_GRACE + 15, refused_at
    images = _plugin_images(fake)
    assert (
        sorted(images.values()).count(f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0")
        == 1
    )  # the other nodes were left on the old version


def _validators_on(fake: FakeApi, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in fake.objects(api.POD)
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.VALIDATOR
        and (p["metadata"].get("annotations") or {}).get(names.VALIDATOR_NODE) == node
    ]


def _full_node_a(fake: FakeApi, cluster: FakeCluster, operator: runner.Operator) -> None:
    """Converged; then node-a (the rollout's first node) offers 2 cards, both held by pods, and
    a new plugin version is set."""
    converge(operator, cluster)
    cluster.set_allocatable("node-a", 2)
    cluster.add_workload("node-a", "w1", "gcu0")
    cluster.add_workload("node-a", "w2", "gcu1")
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")


def test_a_rollout_waits_for_a_free_card_to_validate_a_full_node_on() -> None:
    """Seen by the chaos run: every card of the rollout's node held by workload pods, the
    validator pod the operator bound there was refused by the kubelet again and again, and the
    rollout stopped for good once the refusals outlasted the settling grace. A node whose cards
    are all held is not a failed node: the operator makes no validator pod there while none is
    free, says so on the node, and validates once a card comes free."""
    fake, cluster, operator = _start(ours())
    _full_node_a(fake, cluster, operator)
    said = []
    for _ in range(20):  # 100 s of a full node
        operator.run_once()
        assert _validators_on(fake, "node-a") == []  # none made only to be refused
        said.append(node_reports(fake, ours())["node-a"].get("lastError"))
        st = status(fake, ours())
        assert st["phase"] != "Failed" and not st["rollout"]["failed"], st
        cluster.step()
    assert said[-1] == (
        "validator waiting for a free enflame.com/gcu card (2 held by pods of 2 allocatable)"
    ), said
    # Never past the node it waits on: the others keep the old version.
    assert (
        sorted(_plugin_images(fake).values()).count(
            f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
        )
        == 1
    )
    fake.remove(fake._key(api.POD, "w2", "default"))  # a card comes free
    converge(operator, cluster)
    st = status(fake, ours())
    assert (st["phase"], st["rollout"]["failed"]) == ("Running", []), st
    assert cluster.node_labels("node-a")[names.VALIDATED_LABEL] == "true"
    assert set(_plugin_images(fake).values()) == {
        f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
    }


def test_a_full_node_stops_the_rollout_after_pod_ready_timeout_naming_its_cards() -> None:
    """The wait has an end: no card free podReadyTimeoutSeconds after the node's pods became
    Ready, and the node's validation fails, saying why; the rollout stops there."""
    fake, cluster, operator = _start(ours())
    _full_node_a(fake, cluster, operator)
    for _ in range(100):
        operator.run_once()
        assert _validators_on(fake, "node-a") == []
        if status(fake, ours()).get("phase") == "Failed":
            break
        cluster.step()
    st = status(fake, ours())
    assert st["phase"] == "Failed", st
    assert st["rollout"]["failed"] == [
        {
            "node": "node-a",
            "reason": "validator: no free enflame.com/gcu card on the node in 300 s "
            "(2 held by pods of 2 allocatable)",
        }
    ], st["rollout"]
    assert names.VALIDATED_LABEL not in cluster.node_labels("node-a")


def test_a_validator_another_pod_beat_to_the_last_card_is_tried_again() -> None:
    """The operator saw a card free and made its validator pod; a workload pod was admitted
    first and the kubelet refused the validator (OutOfenflame.com/gcu). Long after the plugin
    settled, that is still no answer about the node: the operator tries again once a card is
    free, and the rollout goes on."""
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)
    cluster.set_allocatable("node-a", 1)
    cluster.step(reconcile.REFUSAL_GRACE + 10)  # the plugin settled long ago
    node = fake.store[fake._key(api.NODE, "node-a", None)]
    node["metadata"]["annotations"].pop(names.NODE_STATE_ANNOTATION)  # validate it again
    node["metadata"]["resourceVersion"] = str(next(fake._rv))
    operator.run_once()
    assert len(_validators_on(fake, "node-a")) == 1
    cluster.add_workload("node-a", "w1", "gcu0")  # admitted before the validator
    cluster.step()
    refused = _validators_on(fake, "node-a")
    assert [p["status"].get("reason") for p in refused] == ["OutOfenflame.com/gcu"]
    said = []
    for _ in range(6):
        operator.run_once()
        said.append(node_reports(fake, ours())["node-a"].get("lastError"))
        assert status(fake, ours())["phase"] != "Failed"
        cluster.step()
    assert any("refused by the kubelet, trying again" in str(s) for s in said), said
    assert str(said[-1]).startswith("validator waiting for a free enflame.com/gcu card"), said
    fake.remove(fake._key(api.POD, "w1", "default"))
    converge(operator, cluster)
    assert cluster.node_labels("node-a")[names.VALIDATED_LABEL] == "true"
    assert status(fake, ours())["phase"] == "Running"


def test_fake_kubelet_refuses_a_pod_past_the_allocatable_cards_and_lists_by_node() -> None:
    """The fake agrees with the kubelet's resource fit and with the API server's field
    selectors (tests/controlplane checks the operator's list on the real one)."""
    fake, cluster, operator = _start(ours())
    converge(operator, cluster)  # node-a's plugin is Ready
    cluster.set_allocatable("node-a", 1)
    cluster.add_workload("node-a", "w1", "gcu0")
    fake.put(
        api.POD,
        {
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "c", "resources": {"limits": {"enflame.com/gcu": "1"}}}],
            },
            "status": {"phase": "Pending"},
        },
    )
    cluster.step()
    got = fake.find(api.POD, "p", "default")
    assert got is not None and got["status"]["reason"] == "OutOfenflame.com/gcu", got
    assert "used: 1, capacity: 1" in got["status"]["message"]
    on_a = {p["metadata"]["name"] for p in fake.list(api.POD, fields={"spec.nodeName": "node-a"})}
    assert {"p", "w1"} <= on_a
    assert on_a == {
        p["metadata"]["name"] for p in fake.objects(api.POD) if pods.node_of(p) == "node-a"
    }
    in_default = fake.list(api.POD, "default", fields={"spec.nodeName": "node-a"})
    assert sorted(p["metadata"]["name"] for p in in_default) == ["p", "w1"]
    assert fake.list(api.POD, fields={"spec.nodeName": "node-x"}) == []
    with pytest.raises(api.ApiError, match=r"field label not supported: spec\.priority"):
        fake.list(api.POD, fields={"spec.priority": "0"})


def test_cards_held_counts_what_the_kubelet_counts() -> None:
    def pod(phase: str, containers: list[str], init: tuple[str, ...] = ()) -> dict[str, Any]:
        def c(n: str) -> dict[str, Any]:
            return {"name": "c", "resources": {"limits": {"enflame.com/gcu": n}}}

        return {
            "spec": {
                "containers": [c(n) for n in containers],
                "initContainers": [c(n) for n in init],
            },
            "status": {"phase": phase},
        }

    assert pods.cards_held(pod("Running", ["1", "2"]), "enflame.com/gcu") == 3
    assert pods.cards_held(pod("Pending", ["1"], ("4", "2")), "enflame.com/gcu") == 4
    assert pods.cards_held(pod("Succeeded", ["8"]), "enflame.com/gcu") == 0
    assert pods.cards_held(pod("Failed", ["8"]), "enflame.com/gcu") == 0
    assert pods.cards_held(pod("Running", ["x"]), "enflame.com/gcu") == 0
    assert pods.cards_held({"status": {"phase": "Running"}}, "enflame.com/gcu") == 0


@pytest.mark.parametrize("ready_at", ["none", "unreadable", "an hour ahead"])
def test_a_refusal_the_times_cannot_place_fails_the_validation(ready_at: str) -> None:
    """A plugin pod whose Ready condition gives no time, or one the operator cannot read, or
    one an hour after the validator's making (its node's clock far ahead): the refusal cannot
    be shown to be a settling plugin's, so it counts as the node's answer (fail closed). A
    skewed clock would otherwise stretch the retry by the skew."""
    fake, cluster, operator = _start(ours(), nodes=["node-a"])
    converge(operator, cluster)
    for pod in fake.objects(api.POD):
        for condition in pod.get("status", {}).get("conditions") or []:
            condition.pop("lastTransitionTime", None)
            if ready_at == "unreadable":
                condition["lastTransitionTime"] = "yesterday"
            elif ready_at == "an hour ahead":
                condition["lastTransitionTime"] = pods.rfc3339(fake.now + 3600)
        fake.store[fake._key(api.POD, pod["metadata"]["name"], pod["metadata"]["namespace"])] = pod
    node = fake.find(api.NODE, "node-a")
    assert node is not None
    annotations = node["metadata"].get("annotations") or {}
    annotations.pop(names.NODE_STATE_ANNOTATION, None)  # validate again
    fake.replace(api.NODE, node)
    cluster.unexpected_admission.add("node-a")
    for _ in range(10):
        operator.run_once()
        cluster.step()
    st = status(fake, ours())
    node_a = st["nodes"][0]
    assert not node_a["validated"] and "Pod Allocate failed" in node_a["lastError"], node_a
    assert "trying again" not in node_a["lastError"]


def test_validator_failure_removes_the_label_and_says_why() -> None:
    fake, cluster, operator = _start(ours())
    cluster.bad_nodes.add("node-b")
    for _ in range(12):
        operator.run_once()
        cluster.step()
    assert cluster.node_labels("node-a")[names.VALIDATED_LABEL] == "true"
    assert names.VALIDATED_LABEL not in cluster.node_labels("node-b")
    st = status(fake, ours())
    node_b = node_reports(fake, ours())["node-b"]
    assert not node_b["validated"] and "/dev/gcu0 is missing" in node_b["lastError"]
    assert st["phase"] == "Deploying"


def test_delete_removes_in_reverse_order_and_leaves_nodes_as_before() -> None:
    fake, cluster, operator = _start(ours())
    before = {n: cluster.node_labels(n) for n in NODES}
    converge(operator, cluster)
    obj = fake.find(api.GCU_RESOURCE, "gcu")
    assert obj is not None
    fake.delete(api.GCU_RESOURCE, "gcu")
    order: list[str] = []

    def check() -> None:
        for ds in ("enflame-k8s-device-plugin", "enflame-container-toolkit"):
            if fake.find(api.DAEMONSET, ds, "kube-system") is None and ds not in order:
                order.append(ds)

    converge(operator, cluster, check=check)
    assert order == ["enflame-k8s-device-plugin", "enflame-container-toolkit"]
    assert fake.find(api.GCU_RESOURCE, "gcu") is None  # finalizer released
    assert sorted(cluster.undo_log) == NODES  # every toolkit pod terminated (its undo ran)
    assert [p for p in fake.objects(api.POD) if p["metadata"]["namespace"] == "kube-system"] == []
    for name in NODES:
        node = fake.find(api.NODE, name)
        assert node is not None
        assert cluster.node_labels(name) == before[name]
        assert names.NODE_STATE_ANNOTATION not in (node["metadata"].get("annotations") or {})


def _spec_and_meta(obj: Any) -> Any:
    """What a writer other than the DaemonSet controller (which keeps its status) changes."""
    assert obj is not None
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {"metadata": meta, "spec": obj["spec"]}


def test_never_touches_what_it_did_not_create() -> None:
    resource = ours()
    fake, cluster, operator = _start(resource)
    foreign = fake.put(
        api.DAEMONSET,
        {
            "metadata": {"name": "enflame-k8s-device-plugin", "namespace": "kube-system"},
            "spec": {
                "template": {"metadata": {}, "spec": {"nodeSelector": {"x": "y"}, "containers": []}}
            },
        },
    )
    cluster.api.patch(api.NODE, "node-a", {"metadata": {"labels": {names.VALIDATED_LABEL: "true"}}})
    for _ in range(8):
        operator.run_once()
        cluster.step()
    still = fake.find(api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
    assert _spec_and_meta(still) == _spec_and_meta(foreign)
    st = status(fake, resource)
    assert st["phase"] == "Failed"
    assert (
        "DaemonSet kube-system/enflame-k8s-device-plugin exists and was not created"
        in st["conditions"][0]["message"]
    )
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(operator, cluster)
    still = fake.find(api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
    assert _spec_and_meta(still) == _spec_and_meta(foreign)
    # A label someone else set stays.
    assert cluster.node_labels("node-a")[names.VALIDATED_LABEL] == "true"


def test_dra_node_on_a_cluster_without_dra_is_reported_and_served_by_the_plugin() -> None:
    resource = ours(dra={})
    fake, cluster, operator = _start(resource)
    fake.patch(api.NODE, "node-a", {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    converge(operator, cluster)
    st = status(fake, resource)
    assert [n["name"] for n in st["nodes"]] == ["node-a"]  # the node with a problem
    node_a = node_reports(fake, resource)["node-a"]
    assert node_a["mode"] == "device-plugin"
    assert "DRA needs Kubernetes >= 1.34" in node_a["lastError"]
    assert "node-a" in _plugin_images(fake)


def test_dra_node_gets_the_dra_driver_where_dra_is_served() -> None:
    resource = ours(dra={})
    fake, cluster, operator = _start(resource)
    fake.dra_served = True
    fake.patch(api.NODE, "node-a", {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    converge(operator, cluster)
    labels = cluster.node_labels("node-a")
    assert labels[names.deploy_label(rs.DRA)] == "true"
    assert names.deploy_label(rs.DEVICE_PLUGIN) not in labels
    assert "node-a" not in _plugin_images(fake)
    assert status(fake, resource)["phase"] == "Running"


def test_turning_a_component_off_removes_only_it() -> None:
    resource = ours(gcuExporter={})
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    assert len(fake.objects(api.SERVICE)) == 1
    set_spec(fake, resource, ["gcuExporter", "notDeploy"], True)
    converge(operator, cluster)
    assert fake.objects(api.SERVICE) == []
    assert len(fake.objects(api.DAEMONSET)) == 2


def test_drain_cordons_evicts_gcu_pods_first_and_uncordons_after_validation() -> None:
    resource = ours(upgradePolicy={"maxUnavailable": 1, "drain": {"enable": True}})
    fake, cluster, operator = _start(resource, nodes=["node-a", "node-b"])
    converge(operator, cluster)
    cluster.add_workload("node-a", "job-a", cards="0")
    cluster.add_workload("node-b", "job-b", cards="1")
    set_spec(fake, resource, ["devicePlugin", "version"], "0.2.0")
    events: list[tuple[str, str]] = []

    def check() -> None:
        for name in ("node-a", "node-b"):
            node = fake.find(api.NODE, name)
            assert node is not None
            cordoned = bool(node["spec"].get("unschedulable"))
            job = fake.find(api.POD, f"job-{name[-1]}", "default")
            image = _plugin_images(fake).get(name, "")
            if image.endswith(":0.2.0"):
                # The node's plugin was replaced only after its GCU pod was gone.
                assert job is None, name
            if cordoned and ("cordon", name) not in events:
                events.append(("cordon", name))
            if not cordoned and ("cordon", name) in events and ("uncordon", name) not in events:
                events.append(("uncordon", name))

    converge(operator, cluster, check=check)
    assert events == [
        ("cordon", "node-a"),
        ("uncordon", "node-a"),
        ("cordon", "node-b"),
        ("uncordon", "node-b"),
    ]
    assert status(fake, resource)["phase"] == "Running"


def test_a_second_resource_for_the_same_nodes_is_ignored_until_the_first_is_gone() -> None:
    """One owner per component and node (as NVIDIA's ClusterPolicy): the same name in the other
    group, created later, deploys nothing and says why; once the first is deleted (its toolkit
    undone on each node once), the second takes over."""
    vendor = vendor_example()
    mine = ours()
    mine["metadata"]["name"] = vendor["metadata"]["name"]
    fake, cluster, operator = _start(vendor, nodes=["node-a", "node-b"])
    fake.now += 1
    fake.put(api.GCU_RESOURCE, mine)
    converge(operator, cluster)
    assert status(fake, vendor)["phase"] == "Running"
    ignored = status(fake, mine)
    assert ignored["phase"] == "Ignored"
    condition = ignored["conditions"][0]
    assert condition["reason"] == "Conflict"
    assert "containerToolkit on node-a" in condition["message"]
    assert vendor["metadata"]["name"] in condition["message"]
    uid = fake.find(api.GCU_RESOURCE, mine["metadata"]["name"])["metadata"]["uid"]  # type: ignore[index]
    assert len(fake.objects(api.DAEMONSET)) == 2  # the first resource's toolkit and plugin
    assert all(
        d["metadata"]["labels"][names.RESOURCE_LABEL] != uid for d in fake.objects(api.DAEMONSET)
    )
    toolkits = [
        p
        for p in fake.objects(api.POD)
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.TOOLKIT
    ]
    assert sorted(p["spec"]["nodeName"] for p in toolkits) == ["node-a", "node-b"]
    fake.delete(api.LEGACY_GCU_RESOURCE, vendor["metadata"]["name"])
    converge(operator, cluster)
    assert cluster.undo_log == ["node-a", "node-b"]  # the first's toolkit, undone once per node
    assert {d["metadata"]["name"] for d in fake.objects(api.DAEMONSET)} == {
        "enflame-container-toolkit",
        "enflame-k8s-device-plugin",
    }
    assert status(fake, mine)["phase"] == "Running"
    for name in ("node-a", "node-b"):
        assert cluster.node_labels(name)[names.deploy_label(rs.DEVICE_PLUGIN)] == "true"


def _edit_daemonset(fake: FakeApi, name: str, edit: Any) -> None:
    ds = fake.find(api.DAEMONSET, name, "kube-system")
    assert ds is not None
    edit(ds["spec"]["template"]["spec"])
    fake.replace(api.DAEMONSET, ds)


def test_hand_edits_of_an_owned_daemonset_are_undone() -> None:
    resource = ours()
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    before = fake.find(api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
    assert before is not None
    want_image = before["spec"]["template"]["spec"]["containers"][0]["image"]

    def image(spec: dict[str, Any]) -> None:
        spec["containers"][0]["image"] = "evil.example/plugin:1"

    def selector(spec: dict[str, Any]) -> None:
        spec["nodeSelector"]["kubernetes.io/hostname"] = "node-a"

    def server_defaults(spec: dict[str, Any]) -> None:
        spec["dnsPolicy"] = "ClusterFirst"
        spec["containers"][0]["terminationMessagePath"] = "/dev/termination-log"

    for edit in (image, selector):
        _edit_daemonset(fake, "enflame-k8s-device-plugin", edit)
        converge(operator, cluster)
        after = fake.find(api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
        assert after is not None
        spec = after["spec"]["template"]["spec"]
        assert spec["containers"][0]["image"] == want_image, edit.__name__
        assert spec["nodeSelector"] == before["spec"]["template"]["spec"]["nodeSelector"]
    # What the API server adds by itself is not drift: no write for it.
    _edit_daemonset(fake, "enflame-k8s-device-plugin", server_defaults)
    writes = fake.writes()
    operator.run_once()
    assert fake.writes() == writes


def test_a_user_node_selector_cannot_replace_the_operators_deploy_label() -> None:
    key = names.deploy_label(rs.DEVICE_PLUGIN)
    resource = ours(devicePlugin={"nodeSelector": {key: "false", "zone": "a"}})
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    ds = fake.find(api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
    assert ds is not None
    uid = ds["metadata"]["labels"][names.RESOURCE_LABEL]
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
        key: "true",
        names.owner_label(rs.DEVICE_PLUGIN): uid,
        "zone": "a",
    }
    fields = [u["field"] for u in status(fake, resource)["unsupported"]]
    assert f"spec.devicePlugin.nodeSelector.{key}" in fields


def test_a_component_outside_the_allowed_namespaces_is_reported_not_deployed() -> None:
    resource = ours(devicePlugin={"namespace": "default"})
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    operator = runner.Operator(
        fake, clock=lambda: fake.now, allowed_namespaces=frozenset({"kube-system"})
    )
    converge(operator, cluster)
    assert [d["metadata"]["name"] for d in fake.objects(api.DAEMONSET)] == [
        "enflame-container-toolkit"
    ]
    st = status(fake, resource)
    assert st["phase"] == "Failed"
    assert (
        "spec.devicePlugin.namespace default is not a namespace" in st["conditions"][0]["message"]
    )
    # Nor its cluster-scoped RBAC, which only the plugin's pods would have used.
    assert fake.objects(api.CLUSTER_ROLE) == [] and fake.objects(api.CLUSTER_ROLE_BINDING) == []
    assert fake.objects(api.SERVICE_ACCOUNT) == [
        fake.find(api.SERVICE_ACCOUNT, "enflame-dra-plugin", "kube-system")
    ]


def test_operator_deployed_plugins_get_the_charts_network_policy() -> None:
    resource = ours()
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    [policy] = fake.objects(api.NETWORK_POLICY)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    plugins = [
        p
        for p in fake.objects(api.POD)
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.DEVICE_PLUGIN
    ]
    assert plugins
    for pod in plugins:
        assert all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())
    # No scraper namespace given (--scraper-namespace): nothing is admitted (issue 48); an
    # Ingress policy with no rule, which the API server stores without ``ingress``.
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"].get("ingress", []) == []
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(operator, cluster)
    assert fake.objects(api.NETWORK_POLICY) == []


PLUGIN_ACCOUNT = ("enflame-k8s-device-plugin", "kube-system")
PLUGIN_ROLE = "enflame-k8s-device-plugin-node-state"


LEASE_RULES = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "patch", "delete"],
    }
]


def _plugin_rbac(fake: FakeApi) -> tuple[Any, Any, Any, Any, Any]:
    return (
        fake.find(api.SERVICE_ACCOUNT, *PLUGIN_ACCOUNT),
        fake.find(api.CLUSTER_ROLE, PLUGIN_ROLE),
        fake.find(api.CLUSTER_ROLE_BINDING, PLUGIN_ROLE),
        fake.find(api.ROLE, PLUGIN_ROLE, PLUGIN_ACCOUNT[1]),
        fake.find(api.ROLE_BINDING, PLUGIN_ROLE, PLUGIN_ACCOUNT[1]),
    )


def test_the_plugin_gets_its_node_state_account_and_deleting_the_resource_removes_it() -> None:
    fake, cluster, operator = _start(ours(devicePlugin={"nodeState": True}))
    converge(operator, cluster)
    account, role, binding, lease_role, lease_binding = _plugin_rbac(fake)
    assert None not in (account, role, binding, lease_role, lease_binding)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    # Its node's Lease (the node state the extender reads) in its own namespace.
    assert lease_role["rules"] == LEASE_RULES
    assert lease_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": PLUGIN_ROLE,
    }
    for made in (binding, lease_binding):
        assert made["subjects"] == [
            {"kind": "ServiceAccount", "name": PLUGIN_ACCOUNT[0], "namespace": PLUGIN_ACCOUNT[1]}
        ]
    # The plugin pods run (the ServiceAccount existed when the DaemonSet made them).
    assert sorted(_plugin_images(fake)) == NODES
    assert status(fake, ours())["phase"] == "Running"
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(operator, cluster)
    assert fake.find(api.GCU_RESOURCE, "gcu") is None
    assert _plugin_rbac(fake) == (None,) * 5
    # Removed by the operator itself, not left to garbage collection.
    deleted = {k[0].rpartition("/")[2] for k in fake.deleted}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} <= deleted
    by_operator = {kind for verb, kind in fake.calls if verb == "delete"}
    assert {"Role", "RoleBinding"} <= by_operator


def test_node_state_off_removes_the_plugins_rbac_and_a_widened_role_is_put_back() -> None:
    resource = ours(devicePlugin={"nodeState": True})
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    role = fake.find(api.CLUSTER_ROLE, PLUGIN_ROLE)
    assert role is not None
    role["rules"][0]["verbs"].append("delete")
    fake.replace(api.CLUSTER_ROLE, role)
    converge(operator, cluster)
    role = fake.find(api.CLUSTER_ROLE, PLUGIN_ROLE)
    assert role is not None and role["rules"][0]["verbs"] == ["get", "patch"]
    lease_role = fake.find(api.ROLE, PLUGIN_ROLE, PLUGIN_ACCOUNT[1])
    assert lease_role is not None
    lease_role["rules"][0]["verbs"].append("update")
    lease_role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    fake.replace(api.ROLE, lease_role)
    converge(operator, cluster)
    lease_role = fake.find(api.ROLE, PLUGIN_ROLE, PLUGIN_ACCOUNT[1])
    assert lease_role is not None and lease_role["rules"] == LEASE_RULES
    set_spec(fake, resource, ["devicePlugin", "nodeState"], False)
    converge(operator, cluster)
    assert _plugin_rbac(fake) == (None,) * 5
    ds = fake.find(api.DAEMONSET, *PLUGIN_ACCOUNT)
    assert ds is not None
    assert "serviceAccountName" not in ds["spec"]["template"]["spec"]


def test_a_foreign_clusterrole_of_the_plugins_name_is_left_alone_and_named() -> None:
    resource = ours(devicePlugin={"nodeState": True})
    fake, cluster, operator = _start(resource)
    foreign = fake.put(
        api.CLUSTER_ROLE,
        {
            "metadata": {"name": PLUGIN_ROLE},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
    )
    for _ in range(6):
        operator.run_once()
        cluster.step()
    assert fake.find(api.CLUSTER_ROLE, PLUGIN_ROLE) == foreign
    message = status(fake, resource)["conditions"][0]["message"]
    assert f"ClusterRole /{PLUGIN_ROLE} exists and was not created by this resource" in message
    assert "give spec.devicePlugin.name another name" in message
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(operator, cluster)
    assert fake.find(api.CLUSTER_ROLE, PLUGIN_ROLE) == foreign
