"""A plugin rollout that stops because its node went away (issue 52, chaos seed 7), on the fake
API and simulated cluster: what every node runs while it is stopped, and after the node is back.

Seed 7: the operator began the plugin version change on gcu-node-1 (its toolkit Ready, so its old
plugin was deleted), and the node's kubelet was gone right after (in the tier: restarted while
containerd was down, it exited and nothing started it again). What a stopped rollout leaves:

- every node it had not reached runs the plugin and the toolkit it had, Ready (the old version);
  the nodes it finished run the new version, Ready and validated; nothing of either is deleted
  while the rollout is stopped;
- the node it stopped on runs the old toolkit (a plugin-only change does not touch it) and the
  new plugin's pod, which its kubelet has not started: no plugin works there until the node is
  back (nothing starts on a node without its kubelet); setting the previous version rolls that
  node back first;
- once the node is back, the rollout goes on by itself and ends with every node on the new
  version, Ready and validated.

A rollout that stops because a new version's own pod never becomes Ready on a node that is
there sends that node back to the version it ran (a pod of the component's previous template,
which its DaemonSet records): every node then has a working plugin and toolkit of one version,
even after the stopped node's pod is killed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, components, names, pods, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours, set_spec, status

NODES = ["node-a", "node-b", "node-c"]
OLD = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:{rs.DEFAULT_VERSION}"
NEW = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
TOOLKIT = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-container-toolkit:{rs.DEFAULT_VERSION}"


def _live(fake: FakeApi, component: str) -> dict[str, dict[str, Any]]:
    """The component's pods not being deleted, by node."""
    found = {}
    for pod in fake.objects(api.POD):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(names.COMPONENT_LABEL) == component and not pod["metadata"].get(
            "deletionTimestamp"
        ):
            found[pods.node_of(pod)] = pod
    return found


def _image(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def _working(fake: FakeApi, node: str) -> tuple[str, str] | None:
    """(plugin image, toolkit image) when both of the node's pods are Ready, else None."""
    plugin, toolkit = _live(fake, rs.DEVICE_PLUGIN).get(node), _live(fake, rs.TOOLKIT).get(node)
    if plugin is None or toolkit is None or not (pods.ready(plugin) and pods.ready(toolkit)):
        return None
    return _image(plugin), _image(toolkit)


def _node_goes_away(fake: FakeApi, cluster: FakeCluster, node: str) -> None:
    """Its kubelet is gone: the node controller marks the node's pods not Ready."""
    cluster.down_nodes.add(node)
    for pod in fake.objects(api.POD):
        if pods.node_of(pod) == node:
            for condition in pod["status"].get("conditions") or []:
                if condition.get("type") == "Ready":
                    condition["status"] = "False"
            fake.replace(api.POD, pod)


def _node_comes_back(fake: FakeApi, cluster: FakeCluster, node: str) -> None:
    """Its kubelet runs again: the node Ready, its running pods Ready again."""
    cluster.down_nodes.discard(node)
    obj = fake.find(api.NODE, node)
    assert obj is not None
    obj["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    fake.replace(api.NODE, obj)
    for pod in fake.objects(api.POD):
        if pods.node_of(pod) == node and pods.phase(pod) == "Running":
            for condition in pod["status"].get("conditions") or []:
                if condition.get("type") == "Ready":
                    condition["status"] = "True"
                    condition["lastTransitionTime"] = pods.rfc3339(fake.now)
            fake.replace(api.POD, pod)


def test_a_rollout_stopped_by_a_node_gone_away_keeps_every_other_node_working() -> None:
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (OLD, TOOLKIT))
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    # The rollout starts on one node: its old plugin is deleted (the toolkit there is Ready).
    started = ""
    for _ in range(10):
        operator.run_once()
        plugins = _live(fake, rs.DEVICE_PLUGIN)
        gone = [n for n in NODES if n not in plugins or _image(plugins[n]) != OLD]
        if gone:
            started = gone[0]
            break
        cluster.step()
    assert started, "the rollout never began"
    _node_goes_away(fake, cluster, started)
    others = [n for n in NODES if n != started]
    # Longer than podReadyTimeoutSeconds (300): the rollout stops, naming the node.
    for _ in range(80):
        operator.run_once()
        cluster.step()
        for node in others:  # every other node works all along, with one version or the other
            assert _working(fake, node) in ((OLD, TOOLKIT), (NEW, TOOLKIT)), node
    st = status(fake, ours())
    assert st["phase"] in ("Upgrading", "Failed"), st
    assert list(st["rollout"]["upgrading"]) == [started], st["rollout"]
    assert sorted(st["rollout"]["waiting"]) == others, st["rollout"]
    # Stopped: the nodes it had not reached keep the old version; the stopped node its toolkit
    # and no working plugin (the old one's deletion waits for a kubelet to confirm it).
    assert {n: _working(fake, n) for n in others} == dict.fromkeys(others, (OLD, TOOLKIT))
    assert _image(_live(fake, rs.TOOLKIT)[started]) == TOOLKIT
    assert _working(fake, started) is None
    # The node is back: the rollout goes on by itself, to the end.
    _node_comes_back(fake, cluster, started)
    cluster.step()  # its kubelet confirms the old plugin's deletion; the new one starts
    converge(operator, cluster)
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (NEW, TOOLKIT))
    st = status(fake, ours())
    assert (st["phase"], st["readyResource"]) == ("Running", "3/3"), st
    for node in NODES:
        assert cluster.node_labels(node)[names.VALIDATED_LABEL] == "true", node


TOOLKIT_NEW = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-container-toolkit:0.2.0"


def _kill(fake: FakeApi, node: str, component: str) -> None:
    """The pod is deleted (a kubectl delete, an eviction): its controller must bring one back."""
    pod = _live(fake, component)[node]
    fake.delete(api.POD, pod["metadata"]["name"], pod["metadata"]["namespace"])


def _stop(component: str, broken: str) -> tuple[FakeApi, FakeCluster, runner.Operator, str]:
    """A converged resource whose ``component`` is set to 0.2.0 (image ``broken``, which never
    becomes Ready): the passes until the rollout stops; the node it stopped on."""
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    cluster.broken_images.add(broken)
    set_spec(fake, ours(), [component, "version"], "0.2.0")
    for _ in range(20):
        operator.run_once()
        cluster.step()
        st = status(fake, ours())
        if st.get("phase") == "Failed":
            return fake, cluster, operator, str(st["rollout"]["failed"][0]["node"])
    raise AssertionError(f"the rollout did not stop: {status(fake, ours())}")


def _stopped_rollout_keeps_every_node_working(component: str, broken: str) -> None:
    """``component``'s new version (image ``broken``) never becomes Ready: the rollout stops on
    the first node, which runs the previous version again; its plugin pod killed after that
    comes back as that version, and every node has a Ready plugin and toolkit of one version."""
    fake, cluster, operator, stopped = _stop(component, broken)
    allowed = {(OLD, TOOLKIT)}  # nothing of the new version works anywhere
    lost: list[int] = []

    def others() -> None:
        for node in NODES:
            if node != stopped:
                assert _working(fake, node) in allowed, (node, _working(fake, node))

    def check() -> None:
        others()
        working = _working(fake, stopped)
        # The stopped node: a working plugin and toolkit of the old version, or, for the few
        # passes after its pod is killed, nothing of the new version starting there.
        if working is None:
            lost.append(1)
            assert len(lost) <= 3, "the stopped node stays without a working plugin"
            new = [
                p
                for k in (rs.DEVICE_PLUGIN, rs.TOOLKIT)
                if (p := _live(fake, k).get(stopped)) is not None and _image(p) in (NEW, broken)
            ]
            assert not new, [p["metadata"]["name"] for p in new]
        else:
            lost.clear()
            assert working in allowed, working

    # While the stopped node goes back to the previous version, the others work all along.
    converge(operator, cluster, check=others)
    assert _working(fake, stopped) == (OLD, TOOLKIT)
    _kill(fake, stopped, rs.DEVICE_PLUGIN)
    for _ in range(10):  # the rollout stays stopped: passes keep going, nothing converges to new
        cluster.step()
        operator.run_once()
        check()
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (OLD, TOOLKIT))
    st = status(fake, ours())
    assert st["phase"] == "Failed", st
    assert [f["node"] for f in st["rollout"]["failed"]] == [stopped], st["rollout"]
    assert "runs its previous" in st["rollout"]["failed"][0]["reason"], st["rollout"]
    # An edit of the resource tries the new version there again; still broken, the node goes
    # back once more, and no other node is touched.
    set_spec(fake, ours(), ["upgradePolicy", "podReadyTimeoutSeconds"], 301)
    tried = False
    for _ in range(20):
        operator.run_once()
        cluster.step()
        others()
        tried = tried or any(_image(p) == broken for p in fake.objects(api.POD))
    assert tried, "an edit did not try the new version again"
    assert _working(fake, stopped) == (OLD, TOOLKIT)
    assert status(fake, ours())["phase"] == "Failed"
    # Rolling back (the previous version set again) puts the stopped node on its DaemonSet's
    # pods again, within the budget, validated.
    cluster.broken_images.discard(broken)
    set_spec(fake, ours(), [component, "version"], rs.DEFAULT_VERSION)
    converge(operator, cluster, check=check)
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (OLD, TOOLKIT))
    st = status(fake, ours())
    assert (st["phase"], st["readyResource"]) == ("Running", "3/3"), st
    for node in NODES:
        assert cluster.node_labels(node)[names.VALIDATED_LABEL] == "true", node
        assert cluster.node_labels(node)[names.deploy_label(rs.DEVICE_PLUGIN)] == "true", node
    fallback = [p for p in fake.objects(api.POD) if components.is_fallback(p)]
    assert not fallback, [p["metadata"]["name"] for p in fallback]


def test_a_plugin_that_never_becomes_ready_leaves_the_stopped_node_on_the_old_plugin() -> None:
    _stopped_rollout_keeps_every_node_working("devicePlugin", NEW)


def test_a_toolkit_that_never_becomes_ready_leaves_the_stopped_node_on_the_old_toolkit() -> None:
    _stopped_rollout_keeps_every_node_working("containerToolkit", TOOLKIT_NEW)


def test_a_stopped_node_back_on_its_old_plugin_takes_the_fixed_version_once_edited() -> None:
    """The image is fixed (pushed again under the same tag): an edit of the resource tries the
    stopped node again and the rollout completes, validated, within the budget."""
    fake, cluster, operator, stopped = _stop("devicePlugin", NEW)
    converge(operator, cluster)
    assert _working(fake, stopped) == (OLD, TOOLKIT)
    cluster.broken_images.discard(NEW)
    converge(operator, cluster)  # not edited: it stays stopped, on the old version
    assert status(fake, ours())["phase"] == "Failed"
    set_spec(fake, ours(), ["upgradePolicy", "podReadyTimeoutSeconds"], 301)

    def budget() -> None:
        down = [n for n in NODES if cluster.node_labels(n).get(names.VALIDATED_LABEL) != "true"]
        assert len(down) <= 1, down

    converge(operator, cluster, check=budget)
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (NEW, TOOLKIT))
    st = status(fake, ours())
    assert (st["phase"], st["readyResource"]) == ("Running", "3/3"), st
    assert not [p for p in fake.objects(api.POD) if components.is_fallback(p)]


@pytest.mark.parametrize(
    "recorded",
    ["not json", json.dumps({"metadata": {}, "spec": {"containers": []}}), json.dumps([1, 2])],
)
def test_a_previous_template_that_is_not_what_the_operator_wrote_is_not_run(recorded: str) -> None:
    """The DaemonSet's record of its previous template edited into something else: no pod is
    made from it (the stopped node stays as it is, said in the status); nothing else changes."""
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    cluster.broken_images.add(NEW)
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    for _ in range(3):  # the DaemonSet takes the new template (and records the old one)
        operator.run_once()
        cluster.step()
    (ds,) = [d for d in fake.objects(api.DAEMONSET) if "device-plugin" in d["metadata"]["name"]]
    assert components.PREVIOUS_TEMPLATE in ds["metadata"]["annotations"]
    ds["metadata"]["annotations"][components.PREVIOUS_TEMPLATE] = recorded
    fake.replace(api.DAEMONSET, ds)
    for _ in range(20):
        operator.run_once()
        cluster.step()
    st = status(fake, ours())
    assert st["phase"] == "Failed", st
    assert "CrashLoopBackOff" in st["rollout"]["failed"][0]["reason"], st["rollout"]
    assert not [p for p in fake.objects(api.POD) if components.is_fallback(p)]
    stopped = st["rollout"]["failed"][0]["node"]
    others = [n for n in NODES if n != stopped]
    assert {n: _working(fake, n) for n in others} == dict.fromkeys(others, (OLD, TOOLKIT))


def test_a_node_away_while_its_new_plugin_starts_takes_it_once_back() -> None:
    """The new plugin's pod is made, and the node goes away before it is Ready: the rollout
    stops on its timeout, but the node is not sent back to the old version (it was not the new
    version that failed); once back, its new plugin starts and the rollout completes."""
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    cluster.ready_after = 3  # a new pod takes three ticks to start: time to catch it starting
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    started = ""
    for _ in range(20):
        operator.run_once()
        cluster.step()
        fresh = [n for n, p in _live(fake, rs.DEVICE_PLUGIN).items() if _image(p) == NEW]
        if fresh and not pods.ready(_live(fake, rs.DEVICE_PLUGIN)[fresh[0]]):
            started = fresh[0]
            break
    assert started, "no new plugin pod was made"
    _node_goes_away(fake, cluster, started)
    for _ in range(80):  # past podReadyTimeoutSeconds: the rollout stops, naming the node
        operator.run_once()
        cluster.step()
    st = status(fake, ours())
    assert st["phase"] == "Failed" and st["rollout"]["failed"][0]["node"] == started, st
    assert cluster.node_labels(started)[names.deploy_label(rs.DEVICE_PLUGIN)] == "true"
    _node_comes_back(fake, cluster, started)
    for _ in range(60):  # converge() would stop at a quiet pass while pods start
        operator.run_once()
        cluster.step()
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (NEW, TOOLKIT))
    assert not [p for p in fake.objects(api.POD) if components.is_fallback(p)]
    assert (status(fake, ours())["phase"], status(fake, ours())["readyResource"]) == (
        "Running",
        "3/3",
    )


def test_deleting_the_resource_removes_the_stopped_nodes_fallback_pods_too() -> None:
    """A fallback pod has no DaemonSet whose deletion takes it away: the removal deletes it with
    its component, and leaves the nodes as they were."""
    fake, cluster, operator, stopped = _stop("containerToolkit", TOOLKIT_NEW)
    converge(operator, cluster)
    assert [pods.node_of(p) for p in fake.objects(api.POD) if components.is_fallback(p)] == [
        stopped
    ]
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(operator, cluster)
    assert fake.find(api.GCU_RESOURCE, "gcu") is None  # finalizer released
    assert [p for p in fake.objects(api.POD) if p["metadata"]["namespace"] == "kube-system"] == []
    for name in NODES:
        assert not [k for k in cluster.node_labels(name) if k.startswith(names.DEPLOY_LABEL_PREFIX)]


def test_an_evicted_fallback_pod_is_made_again() -> None:
    """The kubelet evicts the stopped node's fallback plugin (phase Failed, reason Evicted, the
    pod object left behind, as for any evicted pod): it is deleted and made again, the old
    version."""
    fake, cluster, operator, stopped = _stop("devicePlugin", NEW)
    converge(operator, cluster)
    assert _working(fake, stopped) == (OLD, TOOLKIT)
    pod = _live(fake, rs.DEVICE_PLUGIN)[stopped]
    assert components.is_fallback(pod)
    pod["status"] = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on"}
    fake.replace_status(api.POD, pod)
    converge(operator, cluster)
    again = _live(fake, rs.DEVICE_PLUGIN)[stopped]
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]
    assert _working(fake, stopped) == (OLD, TOOLKIT)
    assert components.is_fallback(again)


def test_both_changed_and_the_toolkit_broken_a_killed_old_plugin_comes_back_old() -> None:
    """The toolkit and the plugin change at once and the new toolkit never becomes Ready: the
    stopped node keeps its old plugin; killed, the DaemonSet brings back the new plugin (its
    only template), and the operator sends that one back too: old toolkit, old plugin."""
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    cluster.broken_images.add(TOOLKIT_NEW)
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    set_spec(fake, ours(), ["containerToolkit", "version"], "0.2.0")
    for _ in range(20):
        operator.run_once()
        cluster.step()
        if status(fake, ours()).get("phase") == "Failed":
            break
    st = status(fake, ours())
    assert st["phase"] == "Failed", st
    stopped = st["rollout"]["failed"][0]["node"]
    converge(operator, cluster)
    assert _working(fake, stopped) == (OLD, TOOLKIT)
    assert not components.is_fallback(_live(fake, rs.DEVICE_PLUGIN)[stopped])  # kept as it was
    _kill(fake, stopped, rs.DEVICE_PLUGIN)
    for _ in range(10):
        cluster.step()
        operator.run_once()
    assert {n: _working(fake, n) for n in NODES} == dict.fromkeys(NODES, (OLD, TOOLKIT))
    assert components.is_fallback(_live(fake, rs.DEVICE_PLUGIN)[stopped])
    assert status(fake, ours())["phase"] == "Failed"
