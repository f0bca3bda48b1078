"""Drain and removal finish: a PodDisruptionBudget refusal is reported (not a failed pass), the
drain times out as upgradePolicy.drain.timeoutSeconds says, and removal names the pods on a
NotReady node and leaves them behind after a while, saying so."""

from __future__ import annotations

from typing import Any

from enflame_gcu.gcu_operator import api, reconcile, runner
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours, set_spec, status

NODES = ["node-a", "node-b"]


def _draining(timeout: int) -> tuple[FakeApi, FakeCluster, runner.Operator, dict[str, Any]]:
    resource = ours(
        upgradePolicy={"maxUnavailable": 1, "drain": {"enable": True, "timeoutSeconds": timeout}}
    )
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    cluster.add_workload("node-a", "job-a", cards="0")
    fake.pdb_protected.add("default/job-a")
    set_spec(fake, resource, ["devicePlugin", "version"], "0.2.0")
    return fake, cluster, operator, resource


def _passes(fake: FakeApi, cluster: FakeCluster, operator: runner.Operator, n: int) -> list[Any]:
    results = []
    for _ in range(n):
        results = operator.run_once()
        cluster.step()
    return results


def test_a_pdb_refusal_is_reported_and_the_pass_still_writes_status() -> None:
    fake, cluster, operator, resource = _draining(timeout=600)
    results = _passes(fake, cluster, operator, 4)
    assert all(not r.error for r in results), results
    st = status(fake, resource)
    assert st["phase"] == "Upgrading"
    message = st["conditions"][0]["message"]
    assert "drain of node-a blocked by a PodDisruptionBudget: default/job-a" in message
    assert fake.find(api.POD, "job-a", "default") is not None


def test_the_drain_times_out_and_fails_the_node() -> None:
    fake, cluster, operator, resource = _draining(timeout=60)
    _passes(fake, cluster, operator, 20)  # 100 s
    st = status(fake, resource)
    assert st["phase"] == "Failed"
    failed = st["rollout"]["failed"]
    assert failed[0]["node"] == "node-a"
    assert "drain timed out after 60 s" in failed[0]["reason"]
    assert "default/job-a" in failed[0]["reason"]
    # The GCU pod was not taken, and node-b was never started.
    assert fake.find(api.POD, "job-a", "default") is not None
    assert "node-b" in st["rollout"]["waiting"]


def test_removal_names_pods_on_a_notready_node_then_leaves_them_behind() -> None:
    resource = ours()
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    cluster.down_nodes.add("node-b")
    fake.delete(api.GCU_RESOURCE, "gcu")
    _passes(fake, cluster, operator, 6)
    st = status(fake, resource)
    message = st["conditions"][0]["message"]
    assert "waiting for pods on NotReady nodes" in message
    assert "on node-b" in message
    steps = int(reconcile.REMOVAL_GRACE // 5) + 10
    _passes(fake, cluster, operator, steps)
    assert fake.objects(api.GCU_RESOURCE) == []
    assert cluster.undo_log == ["node-a"]  # node-b's toolkit never got to undo
