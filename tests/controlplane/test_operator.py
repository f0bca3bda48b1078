"""The operator on Kubernetes' own scheduler and controllers, as the chart's ServiceAccount.

Each test creates its own simulated GCU nodes and one GcuResource, and removes both after it
(the nodes of one test are the only GCU nodes while it runs). The operator process runs for the
whole module with the chart's RBAC under the real authorizer. Invariants that must hold at every
step of a rollout (the ``maxUnavailable`` budget) are checked by a sampler thread throughout,
not only at the end.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import names
from enflame_gcu.gcu_operator import resource as rs
from tests.controlplane import conftest, operator_env
from tests.controlplane.harness import Harness, until

pytestmark = [*conftest.MARKS, pytest.mark.timeout(900)]
GCU = "enflame.com/gcu"
COMPONENT_NAMESPACE = operator_env.NAMESPACE  # the chart puts components in its own


@pytest.fixture(scope="module")
def operator(harness: Harness) -> Iterator[str]:
    """The operator process (as its ServiceAccount) for this module; its kubeconfig."""
    kubeconfig = operator_env.install(harness)
    with operator_env.operator_process(harness, kubeconfig) as process:
        yield kubeconfig
        assert process.poll() is None, "the operator exited:\n" + operator_env.log_tail(harness)


@pytest.fixture
def resource(harness: Harness, operator: str) -> Iterator[str]:
    """A name for this test's GcuResource; the resource is deleted (and waited for) after."""
    name = f"gr-{int(time.monotonic() * 1000) % 10_000_000}"
    yield name
    operator_env.delete_resource(harness, name)


def create(harness: Harness, name: str, **spec: Any) -> None:
    harness.plane.api("POST", operator_env.GR_PATH, operator_env.resource_body(name, **spec))


def set_version(harness: Harness, name: str, component: str, version: str) -> None:
    harness.plane.api(
        "PATCH", f"{operator_env.GR_PATH}/{name}", {"spec": {component: {"version": version}}}
    )


def wait_phase(harness: Harness, name: str, wanted: str, timeout: float = 240) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        found = operator_env.get_resource(harness, name)
        status = (found or {}).get("status") or {}
        return status if status.get("phase") == wanted else None

    try:
        reached_status: dict[str, Any] = until(reached, f"phase {wanted}", timeout, every=1)
        return reached_status
    except AssertionError as exc:
        found = operator_env.get_resource(harness, name) or {}
        raise AssertionError(
            f"{exc}\nstatus: {found.get('status')}\noperator log:\n{operator_env.log_tail(harness)}"
        ) from None


def reports(harness: Harness, resource: str) -> dict[str, dict[str, Any]]:
    """Every node's report by name, as the operator keeps it on the Node (its state
    annotation); the status itself names only the first few nodes with a problem."""
    key = f"{rs.GROUP}/{resource}"
    found = {}
    for node in harness.plane.api("GET", "/api/v1/nodes")["items"]:
        text = (node["metadata"].get("annotations") or {}).get(names.NODE_STATE_ANNOTATION)
        entry = json.loads(text).get(key) if text else None
        report = entry.get("report") if isinstance(entry, dict) else None
        if isinstance(report, dict):
            found[node["metadata"]["name"]] = report
    return found


def component_pods(harness: Harness, nodes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The operator's component pods per node (of ``nodes``)."""
    pods = harness.plane.api(
        "GET",
        f"/api/v1/namespaces/{COMPONENT_NAMESPACE}/pods?labelSelector={names.COMPONENT_LABEL}",
    )["items"]
    found: dict[str, list[dict[str, Any]]] = {n: [] for n in nodes}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node in found:
            found[node].append(pod)
    return found


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class Budget:
    """Samples the nodes every 0.3 s while a rollout runs: how many were down at once (a
    component pod missing or not Ready, or cordoned by anyone), and the worst seen."""

    def __init__(self, harness: Harness, nodes: list[str], components: int) -> None:
        self.harness, self.nodes, self.components = harness, nodes, components
        self.worst = 0
        self.samples = 0
        self.cordoned_ever: set[str] = set()
        self.lost: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def down(self) -> set[str]:
        pods = component_pods(self.harness, self.nodes)
        nodes = {
            n["metadata"]["name"]: n
            for n in self.harness.plane.api("GET", "/api/v1/nodes")["items"]
        }
        found = set()
        for name in self.nodes:
            ready = [
                p for p in pods[name] if pod_ready(p) and not p["metadata"].get("deletionTimestamp")
            ]
            cordoned = bool(nodes.get(name, {}).get("spec", {}).get("unschedulable"))
            if cordoned:
                self.cordoned_ever.add(name)
            if len(ready) < self.components or cordoned:
                found.add(name)
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.worst = max(self.worst, len(self.down()))
                self.samples += 1
            except Exception as exc:
                self.lost.append(repr(exc))
            time.sleep(0.3)

    def __enter__(self) -> Budget:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def images(harness: Harness, nodes: list[str]) -> dict[str, set[str]]:
    """Per node, the images of its component pods."""
    return {
        node: {c["image"] for p in pods for c in p["spec"]["containers"]}
        for node, pods in component_pods(harness, nodes).items()
    }


def wait_rolled(harness: Harness, nodes: list[str], version: str, timeout: float = 300) -> None:
    """Until every node's component pods include one of ``version``."""
    until(
        lambda: all(any(version in i for i in imgs) for imgs in images(harness, nodes).values()),
        f"every node on version {version}",
        timeout,
        every=1,
    )


def workload(harness: Harness, namespace: str, node: str, name: str) -> None:
    harness.plane.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"limits": {GCU: "1"}}}
                ],
            },
        },
    )


def wait_running(harness: Harness, namespace: str, names_: list[str], what: str) -> None:
    """Until every pod named is Running (60 s)."""
    until(
        lambda: all(
            (harness.plane.get(f"/api/v1/namespaces/{namespace}/pods/{n}") or {})
            .get("status", {})
            .get("phase")
            == "Running"
            for n in names_
        ),
        what,
        60,
    )


def test_a_version_change_drains_and_rolls_node_by_node_within_the_budget(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str, namespace: str
) -> None:
    nodes = sim_nodes(3)
    create(harness, resource, upgradePolicy={"maxUnavailable": 1, "drain": {"enable": True}})
    wait_phase(harness, resource, "Running")
    for node in nodes:
        workload(harness, namespace, node, f"w-{node}")
    wait_running(harness, namespace, [f"w-{n}" for n in nodes], "the workloads running")
    before = images(harness, nodes)
    with Budget(harness, nodes, components=2) as budget:
        set_version(harness, resource, "devicePlugin", "0.1.1-harness")
        status = wait_phase(harness, resource, "Upgrading", 60)
        assert status["phase"] == "Upgrading"
        wait_rolled(harness, nodes, "0.1.1-harness")
        wait_phase(harness, resource, "Running")
    assert budget.samples > 10
    assert budget.worst == 1, f"nodes down at once: {budget.worst} (maxUnavailable 1)"
    assert budget.cordoned_ever == set(nodes), "drain cordons every node once"
    after = harness.plane.api("GET", "/api/v1/nodes")["items"]
    assert not [
        n["metadata"]["name"]
        for n in after
        if n["metadata"]["name"] in nodes and n["spec"].get("unschedulable")
    ]
    for node in nodes:  # drained: the GCU workload was evicted
        assert harness.plane.get(f"/api/v1/namespaces/{namespace}/pods/w-{node}") is None
    assert before != images(harness, nodes)


def test_a_broken_version_stops_on_the_first_node_and_the_old_version_rolls_it_back(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    nodes = sim_nodes(3)
    create(harness, resource, upgradePolicy={"maxUnavailable": 1, "podReadyTimeoutSeconds": 20})
    wait_phase(harness, resource, "Running")
    old = images(harness, nodes)
    harness.call_soon(lambda: harness.nodes.never_ready_images.add(":9.9.9-broken"))
    try:
        with Budget(harness, nodes, components=2) as budget:
            set_version(harness, resource, "devicePlugin", "9.9.9-broken")
            status = wait_phase(harness, resource, "Failed", 240)
            failed = [f["node"] for f in (status.get("rollout") or {}).get("failed") or []]
            assert len(failed) == 1, status
            now = images(harness, nodes)
            untouched = [n for n in nodes if n not in failed]
            assert all(now[n] == old[n] for n in untouched), "the other nodes keep the old version"
            previous = next(
                i.rsplit(":", 1)[1] for i in old[nodes[0]] if "device-plugin" in i or "plugin" in i
            )
            set_version(harness, resource, "devicePlugin", previous)
            wait_phase(harness, resource, "Running", 300)
        assert budget.worst <= 1
        assert images(harness, nodes) == old
    finally:
        harness.call_soon(lambda: harness.nodes.never_ready_images.discard(":9.9.9-broken"))


def test_a_node_whose_cards_are_all_held_waits_for_one_and_then_validates(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str, namespace: str
) -> None:
    """Seen by the chaos run: a rollout reached a node whose cards workload pods all held, the
    kubelet refused its validator pod again and again, and the rollout stopped for good. The
    operator counts the cards held there (a Pod list by ``spec.nodeName``, which this API
    server must accept from the operator's account), makes no validator while none is free,
    says so on the node, and goes on once one is."""
    nodes = sim_nodes(2, cards=2)
    full = nodes[0]
    create(harness, resource, upgradePolicy={"maxUnavailable": 1})
    wait_phase(harness, resource, "Running")
    for name in ("w-a", "w-b"):
        workload(harness, namespace, full, name)
    wait_running(harness, namespace, ["w-a", "w-b"], "the workloads holding both cards running")
    waiting = "validator waiting for a free enflame.com/gcu card (2 held by pods of 2 allocatable)"
    set_version(harness, resource, "devicePlugin", "0.1.1-harness")

    def validators_on_full() -> list[str]:
        listed = harness.plane.api(
            "GET",
            f"/api/v1/namespaces/{COMPONENT_NAMESPACE}/pods?fieldSelector=spec.nodeName%3D{full}",
        )["items"]
        return [
            p["metadata"]["name"]
            for p in listed
            if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.VALIDATOR
        ]

    def said() -> bool:
        assert validators_on_full() == [], "a validator pod made where no card is free"
        found = operator_env.get_resource(harness, resource) or {}
        assert (found.get("status") or {}).get("phase") != "Failed", found.get("status")
        return str(reports(harness, resource).get(full, {}).get("lastError")) == waiting

    until(said, f"{full} to wait for a free card", 180, every=1)
    for _ in range(10):  # it keeps waiting, and keeps to that
        assert said()
        time.sleep(1)
    harness.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/w-b")
    wait_rolled(harness, nodes, "0.1.1-harness")
    wait_phase(harness, resource, "Running")
    assert "waiting" not in str(reports(harness, resource)[full].get("lastError"))


def test_the_operators_count_of_a_nodes_pods_is_served_from_the_cache_to_its_account(
    harness: Harness, operator: str, sim_nodes: conftest.MakeNodes, namespace: str
) -> None:
    """The list the wait for a free card makes, as the operator's ServiceAccount: pods by
    ``spec.nodeName`` with ``resourceVersion=0`` (the API server's watch cache, no etcd read)
    gives what a quorum read gives; a field the server does not index is a 400 in the words
    the hand-written fake uses."""
    import lightkube
    from lightkube.config.kubeconfig import KubeConfig

    from enflame_gcu.gcu_operator import api, kube

    (node,) = sim_nodes(1, cards=2)
    workload(harness, namespace, node, "w-1")
    sent: list[str] = []
    client = kube.LightkubeApi(lightkube.Client(KubeConfig.from_file(operator)))
    try:
        client._client._client._client.event_hooks["request"].append(
            lambda request: sent.append(str(request.url))
        )

        def listed(cached: bool) -> set[str]:
            found = client.list(api.POD, fields={"spec.nodeName": node}, cached=cached)
            return {p["metadata"]["name"] for p in found}

        assert until(lambda: listed(True) == {"w-1"}, "the cache to hold the pod", 30)
        assert listed(False) == {"w-1"}
        assert any(
            "resourceVersion=0" in url and f"fieldSelector=spec.nodeName%3D{node}" in url
            for url in sent
        ), sent
        with pytest.raises(api.ApiError) as refused:
            client.list(api.POD, fields={"spec.priority": "0"}, cached=True)
        assert refused.value.status == 400, refused.value
        assert "field label not supported: spec.priority" in str(refused.value), refused.value
    finally:
        client.close()


def test_a_stopped_rollout_leaves_every_node_a_working_plugin_even_when_a_pod_is_killed(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    """Issue 52: the rollout stops on the node whose new plugin never becomes Ready; that node
    runs the old plugin again, and its plugin pod killed after that comes back as the old
    version (the DaemonSet controller holds only the new template). Every node keeps a Ready
    plugin and toolkit of the old version; setting it again returns the node to its
    DaemonSet."""
    nodes = sim_nodes(3)
    create(harness, resource, upgradePolicy={"maxUnavailable": 1, "podReadyTimeoutSeconds": 20})
    wait_phase(harness, resource, "Running")
    old = images(harness, nodes)
    previous = next(i.rsplit(":", 1)[1] for i in old[nodes[0]] if "device-plugin" in i)
    harness.call_soon(lambda: harness.nodes.never_ready_images.add(":9.9.9-broken"))

    def working(node: str) -> bool:
        live = [
            p
            for p in component_pods(harness, [node])[node]
            if not p["metadata"].get("deletionTimestamp")
        ]
        ready = [p for p in live if pod_ready(p)]
        return (
            len(ready) == 2
            and {c["image"] for p in ready for c in p["spec"]["containers"]} == (old[node])
        )

    try:
        set_version(harness, resource, "devicePlugin", "9.9.9-broken")
        status = wait_phase(harness, resource, "Failed", 240)
        failed = [f["node"] for f in (status.get("rollout") or {}).get("failed") or []]
        assert len(failed) == 1, status
        stopped = failed[0]
        until(lambda: working(stopped), f"{stopped} back on the old plugin", 120, every=1)
        with Budget(harness, [n for n in nodes if n != stopped], components=2) as others:
            plugin = next(
                p
                for p in component_pods(harness, [stopped])[stopped]
                if p["metadata"]["labels"].get(names.COMPONENT_LABEL) == rs.DEVICE_PLUGIN
            )
            harness.plane.api(
                "DELETE",
                f"/api/v1/namespaces/{COMPONENT_NAMESPACE}/pods/{plugin['metadata']['name']}",
            )
            until(
                lambda: (
                    working(stopped)
                    and plugin["metadata"]["uid"]
                    not in {
                        p["metadata"]["uid"] for p in component_pods(harness, [stopped])[stopped]
                    }
                ),
                f"{stopped}'s killed plugin back as the old version",
                120,
                every=1,
            )
            time.sleep(10)  # the DaemonSet controller and the operator both had their turns
            assert working(stopped), images(harness, [stopped])
            found = operator_env.get_resource(harness, resource) or {}
            assert (found.get("status") or {}).get("phase") == "Failed", found.get("status")
        assert others.samples > 5 and others.worst == 0, "the other nodes kept working"
        assert not others.lost, others.lost
        assert {n: images(harness, nodes)[n] for n in nodes} == old
        set_version(harness, resource, "devicePlugin", previous)
        wait_phase(harness, resource, "Running", 300)
        assert images(harness, nodes) == old
        fallback = [
            p["metadata"]["name"]
            for pods in component_pods(harness, nodes).values()
            for p in pods
            if (p["metadata"].get("labels") or {}).get("enflame.com/gcu.fallback")
        ]
        assert not fallback, fallback
    finally:
        harness.call_soon(lambda: harness.nodes.never_ready_images.discard(":9.9.9-broken"))


def test_a_resource_scoped_by_node_selector_runs_on_its_nodes_only(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    pool = sim_nodes(2, labels={"pool": resource})
    other = sim_nodes(1)
    selector = {"pool": resource}
    create(
        harness,
        resource,
        containerToolkit={"nodeSelector": selector},
        devicePlugin={"nodeSelector": selector},
    )
    status = wait_phase(harness, resource, "Running", 180)
    assert status["nodeCounts"]["total"] == len(pool), status
    reported = set(reports(harness, resource))
    assert set(pool) <= reported and not set(other) & reported, reported
    assert not component_pods(harness, other)[other[0]]


def test_a_node_with_an_untolerated_taint_is_reported_and_left_out_of_the_budget(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    plain = sim_nodes(2)
    taint = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}
    tainted = sim_nodes(1, taints=[taint])
    create(harness, resource, upgradePolicy={"maxUnavailable": 1})
    wait_phase(harness, resource, "Running", 180)
    entry = reports(harness, resource).get(tainted[0])
    assert entry is not None and "dedicated" in str(entry.get("lastError")), entry
    # Out of the budget: with maxUnavailable 1, a version change still rolls the other nodes
    # (counted as down, the tainted node would hold the only slot for good).
    set_version(harness, resource, "devicePlugin", "0.1.4-harness")
    wait_rolled(harness, plain, "0.1.4-harness", timeout=240)
    wait_phase(harness, resource, "Running", 180)
    # Tolerating it brings the components there.
    toleration = {
        "key": "dedicated",
        "operator": "Equal",
        "value": "inference",
        "effect": "NoSchedule",
    }
    harness.plane.api(
        "PATCH",
        f"{operator_env.GR_PATH}/{resource}",
        {
            "spec": {
                "containerToolkit": {"tolerations": [toleration]},
                "devicePlugin": {"tolerations": [toleration]},
            }
        },
    )
    until(
        lambda: len(component_pods(harness, tainted)[tainted[0]]) == 2,
        "components on the tainted node",
        120,
    )
    wait_phase(harness, resource, "Running", 180)
    assert all(len(p) == 2 for p in component_pods(harness, plain).values())


def test_a_drain_rollout_leaves_an_admins_cordon_in_place(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    nodes = sim_nodes(2)
    create(harness, resource, upgradePolicy={"maxUnavailable": 1, "drain": {"enable": True}})
    wait_phase(harness, resource, "Running")
    harness.plane.api("PATCH", f"/api/v1/nodes/{nodes[0]}", {"spec": {"unschedulable": True}})
    set_version(harness, resource, "devicePlugin", "0.1.2-harness")
    wait_rolled(harness, nodes, "0.1.2-harness")
    wait_phase(harness, resource, "Running")
    spec = harness.plane.api("GET", f"/api/v1/nodes/{nodes[0]}")["spec"]
    assert spec.get("unschedulable") is True, "the admin's cordon was lifted"
    assert not harness.plane.api("GET", f"/api/v1/nodes/{nodes[1]}")["spec"].get("unschedulable")


def test_a_second_resource_for_the_same_nodes_is_ignored_naming_the_owner(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    nodes = sim_nodes(2)
    create(harness, resource)
    wait_phase(harness, resource, "Running")
    second = f"{resource}-b"
    try:
        create(harness, second)
        status = wait_phase(harness, second, "Ignored", 60)
        assert resource in str(status.get("conditions")), status
        # The real DaemonSet controller schedules exactly one toolkit per node.
        daemonsets = harness.plane.api(
            "GET",
            f"/apis/apps/v1/namespaces/{COMPONENT_NAMESPACE}/daemonsets?labelSelector={names.COMPONENT_LABEL}",
        )["items"]
        scheduled = sum(d["status"].get("desiredNumberScheduled", 0) for d in daemonsets)
        assert scheduled == 2 * len(nodes), [
            (d["metadata"]["name"], d["status"]) for d in daemonsets
        ]
    finally:
        operator_env.delete_resource(harness, second)


def test_the_operators_account_cannot_delete_or_rewrite_what_is_not_its_own(
    harness: Harness, operator: str
) -> None:
    """Under the real authorizer, with the operator's own token (kubectl auth can-i asks the
    API server, which answers from the chart's RBAC)."""
    plane = harness.plane
    plane.api(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "someone-elses"}, "rules": []},
    )  # fmt: skip
    try:
        refusals = {}
        for verb, target, namespace in (
            ("delete", "clusterrole/someone-elses", ""),
            ("update", "clusterrole/someone-elses", ""),
            ("delete", "clusterrolebinding/cluster-admin", ""),
            ("delete", "daemonset/kube-proxy", COMPONENT_NAMESPACE),
            ("update", "serviceaccount/default", COMPONENT_NAMESPACE),
            ("delete", "runtimeclass/someone-elses", ""),
        ):
            args = ["auth", "can-i", verb, target] + (["-n", namespace] if namespace else [])
            answer = plane.kubectl(*args, check=False, kubeconfig=operator).stdout.strip()
            refusals[f"{verb} {target}"] = answer
        assert all(a == "no" for a in refusals.values()), refusals
        # And the API server refuses the real request too.
        result = plane.kubectl(
            "delete", "clusterrole", "someone-elses", check=False, kubeconfig=operator
        )
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), result
    finally:
        plane.request("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterroles/someone-elses")


def test_the_hand_written_fake_agrees_with_kubernetes_on_a_deploy_and_a_rollout(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    """One scenario on both: FakeCluster (tests/gcu_operator/fake_api.py) and the harness.
    A fake that drifts from Kubernetes fails here."""
    from enflame_gcu.gcu_operator import runner
    from tests.gcu_operator import helpers
    from tests.gcu_operator.fake_api import FakeApi, FakeCluster

    nodes = sim_nodes(2)
    spec = {"upgradePolicy": {"maxUnavailable": 1}}

    def summary(status: dict[str, Any], per_node: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {
            "phase": status.get("phase"),
            "readyResource": status.get("readyResource"),
            "nodeCounts": status.get("nodeCounts"),
            "problems": len(status.get("nodes") or []),
            "nodes": sorted(
                (
                    n.get("mode"),
                    n.get("ready"),
                    n.get("validated"),
                    n.get("lastError"),
                    tuple(
                        sorted((c.get("name"), c.get("state")) for c in n.get("components") or [])
                    ),
                )
                for n in per_node.values()
            ),
        }

    fake = FakeApi()
    cluster = FakeCluster(fake, [f"fake-{i}" for i in range(len(nodes))])
    body = operator_env.resource_body("gcu", **copy.deepcopy(spec))
    fake.create(helpers.kind_of(body), body)
    operator = runner.Operator(fake)
    helpers.converge(operator, cluster)
    fake_deployed = summary(helpers.status(fake, body), helpers.node_reports(fake, body))
    helpers.set_spec(fake, body, ["devicePlugin", "version"], "0.1.3-harness")
    helpers.converge(operator, cluster)
    fake_rolled = summary(helpers.status(fake, body), helpers.node_reports(fake, body))

    create(harness, resource, **copy.deepcopy(spec))
    real_deployed = summary(wait_phase(harness, resource, "Running"), reports(harness, resource))
    set_version(harness, resource, "devicePlugin", "0.1.3-harness")
    wait_rolled(harness, nodes, "0.1.3-harness")
    real_rolled = summary(wait_phase(harness, resource, "Running"), reports(harness, resource))
    assert fake_deployed == real_deployed
    assert fake_rolled == real_rolled


def test_nodes_asking_for_dra_where_the_cluster_serves_none_keep_the_device_plugin(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    """A resource with both the device plugin and the DRA driver, on a cluster without the DRA
    API (Kubernetes 1.20): nodes relabelled to DRA stay on the device plugin, at every moment,
    and each says why on its report. (A mode change where DRA is served, budgeted, drained and
    validated, needs that API: it is tested on the FakeCluster, tests/gcu_operator/
    test_mode_change.py.)"""
    nodes = sim_nodes(3)
    create(harness, resource, dra={}, upgradePolicy={"maxUnavailable": 1})
    until(lambda: len(reports(harness, resource)) == len(nodes), "a report from every node", 180)

    def plugins() -> dict[str, bool]:
        pods = component_pods(harness, nodes)
        return {
            node: any("plugin" in p["metadata"]["name"] and pod_ready(p) for p in found)
            for node, found in pods.items()
        }

    until(lambda: all(plugins().values()), "the device plugin on every node", 180)
    for node in nodes[:2]:
        harness.plane.api(
            "PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {names.MODE_LABEL: "dra"}}}
        )

    def said() -> bool:
        found = reports(harness, resource)
        return all("DRA needs" in str(found.get(n, {}).get("lastError")) for n in nodes[:2])

    until(said, "the relabelled nodes' reports naming the missing DRA API", 60)
    lost: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lost |= {n for n, ready in plugins().items() if not ready}
        time.sleep(0.5)
    assert not lost, f"nodes that lost their device plugin: {sorted(lost)}"
    assert all(len(p) == 2 for p in component_pods(harness, nodes).values())


def test_an_overlap_that_appears_later_leaves_one_toolkit_per_node_and_names_the_conflict(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    """Two resources on two pools; a node relabelled into the second pool as well stays with its
    first owner: the real DaemonSet controller schedules one toolkit there, never two, and the
    second resource's status names the conflict."""
    pool_a = sim_nodes(2, labels={"pool-a": resource})
    pool_b = sim_nodes(1, labels={"pool-b": resource})
    first, second = resource, f"{resource}-b"
    selector = {"pool-a": resource}
    create(
        harness,
        first,
        containerToolkit={"nodeSelector": selector},
        devicePlugin={"nodeSelector": selector},
    )
    # The second resource's objects need names of their own, among those the chart's RBAC lets
    # the operator rewrite (operator.componentNames: the vendor 2.0 example's names).
    selector = {"pool-b": resource}
    create(
        harness,
        second,
        containerToolkit={"nodeSelector": selector, "name": "enflame-gcu-docker-plugin"},
        devicePlugin={"nodeSelector": selector, "name": "enflame-gcu-k8s-plugin"},
        gcuExporter={"notDeploy": True},
        gfd={"notDeploy": True},
    )
    try:
        wait_phase(harness, first, "Running", 180)
        wait_phase(harness, second, "Running", 180)
        harness.plane.api(
            "PATCH", f"/api/v1/nodes/{pool_a[1]}", {"metadata": {"labels": {"pool-b": resource}}}
        )
        worst = 0
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            toolkits = [
                p
                for p in component_pods(harness, [pool_a[1]])[pool_a[1]]
                if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.TOOLKIT
                and not p["metadata"].get("deletionTimestamp")
            ]
            worst = max(worst, len(toolkits))
            time.sleep(0.5)
        assert worst == 1, f"{worst} toolkit pods on {pool_a[1]} at once"
        status = (operator_env.get_resource(harness, second) or {}).get("status") or {}
        assert pool_a[1] in json.dumps(status), status
        assert pool_b  # the second pool's own node keeps its components
        assert len(component_pods(harness, pool_b)[pool_b[0]]) == 2
    finally:
        operator_env.delete_resource(harness, second)


def test_a_node_labelled_only_by_stock_node_feature_discovery_is_served(
    harness: Harness, sim_nodes: conftest.MakeNodes, resource: str
) -> None:
    """NFD's default label for a PCI class 0x1200 device of vendor 0x1e36, and nothing else."""
    (node,) = sim_nodes(1)
    harness.plane.api(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": {"enflame.com/gcu.present": None,
                                 "feature.node.kubernetes.io/pci-1200_1e36.present": "true"}}},
    )  # fmt: skip
    create(harness, resource)
    wait_phase(harness, resource, "Running", 180)
    assert len(component_pods(harness, [node])[node]) == 2


# --- issue 46 point 4: converged, at most 10 requests a minute -----------------------------------

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "users": [
                f"system:serviceaccount:{operator_env.NAMESPACE}:{operator_env.SERVICE_ACCOUNT}"
            ],
        },
        {"level": "None"},
    ],
}


def _audited(path: str) -> list[dict[str, Any]]:
    """The operator's requests so far (one ResponseComplete event each)."""
    try:
        with open(path, encoding="utf-8") as handle:
            events = [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []
    return [e for e in events if e.get("stage") == "ResponseComplete"]


def _described(events: list[dict[str, Any]]) -> list[str]:
    return [f"{e['verb']} {(e.get('objectRef') or {}).get('resource')}" for e in events]


def _passes(path: str) -> int:
    """Full passes so far: each lists the resource's DaemonSets, which nothing else does."""
    return sum(
        1
        for e in _audited(path)
        if e["verb"] == "list" and (e.get("objectRef") or {}).get("resource") == "daemonsets"
    )


def test_a_converged_operator_makes_at_most_ten_requests_a_minute_and_still_reacts(
    tmp_path: Any,
) -> None:
    """On a control plane of its own whose API server logs every request of the operator's
    ServiceAccount (the benchmark's audit policy), the operator as the chart runs it (the
    Lease's timings and --max-interval at their defaults): converged, at most 10 requests in a
    minute, Lease renewals included; and a change of its GcuResource, of a Node's labels and of
    one of its pods each still starts a full pass at once. Before, the plugin's NetworkPolicy
    was replaced every pass (the API server drops its empty ``ingress``), so the operator never
    went quiet."""
    from tests.controlplane import agent

    policy = tmp_path / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY), encoding="utf-8")
    audit = str(tmp_path / "audit.log")
    (tmp_path / "plane").mkdir()
    with Harness.started(
        str(tmp_path / "plane"),
        renew=5.0,
        apiserver_args=(
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
        ),
    ) as plane:
        nodes = plane.add([agent.gcu_node(f"quiet-{i}") for i in range(3)])
        kubeconfig = operator_env.install(plane)
        # Passes every second while deploying (the test waits on them); the rest as shipped.
        with operator_env.operator_process(plane, kubeconfig, "--max-interval=300") as process:
            create(plane, "quiet")
            wait_phase(plane, "quiet", "Running", timeout=300)
            time.sleep(10)  # the last pass that wrote, then the first that planned nothing
            before = len(_audited(audit))
            time.sleep(60)
            window = _audited(audit)[before:]
            assert len(window) <= 10, (len(window), _described(window))

            def reacts(what: str, change: Any) -> None:
                passes = _passes(audit)
                change()
                until(lambda: _passes(audit) > passes, f"a pass after {what}", 30, every=0.5)

            reacts(
                "a GcuResource edit",
                lambda: plane.plane.api(
                    "PATCH",
                    f"{operator_env.GR_PATH}/quiet",
                    {"metadata": {"annotations": {"example.com/touched": "1"}}},
                ),
            )
            time.sleep(3)  # that pass planned nothing: its wait (and watches) begin
            reacts(
                "a Node relabelled",
                lambda: plane.plane.api(
                    "PATCH",
                    f"/api/v1/nodes/{nodes[0]}",
                    {"metadata": {"labels": {"example.com/zone": "b"}}},
                ),
            )
            time.sleep(3)
            pod = component_pods(plane, nodes)[nodes[1]][0]["metadata"]["name"]
            reacts(
                "a component pod deleted",
                lambda: plane.plane.request(
                    "DELETE", f"/api/v1/namespaces/{COMPONENT_NAMESPACE}/pods/{pod}"
                ),
            )
            assert process.poll() is None, operator_env.log_tail(plane)
