"""Killing the operator at every API write of a rollout, or failing that call, still converges,
and never has more nodes down than maxUnavailable allows: checked before every write and after
every tick of the cluster, with pods that take several ticks to become ready."""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, names, pods, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import WRITES, Crash, FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours, set_spec, status

NODES = ["node-a", "node-b", "node-c"]


def _world(fake: FakeApi, cluster: FakeCluster) -> dict[str, Any]:
    """What must be the same however the rollout got there."""
    images = sorted(
        (p["spec"]["nodeName"], p["spec"]["containers"][0]["image"])
        for p in fake.objects(api.POD)
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL)
        in (rs.TOOLKIT, rs.DEVICE_PLUGIN)
    )
    st = status(fake, ours())
    return {
        "images": images,
        "labels": {n: cluster.node_labels(n) for n in NODES},
        "phase": st["phase"],
        "ready": st["readyResource"],
    }


def _down(fake: FakeApi, cluster: FakeCluster) -> list[str]:
    """Nodes not serving GCUs right now: a component pod missing, not ready or terminating, or
    the node not validated."""
    live: dict[str, set[str]] = {n: set() for n in NODES}
    for pod in fake.objects(api.POD):
        key = (pod["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL)
        if key in (rs.TOOLKIT, rs.DEVICE_PLUGIN) and pods.ready(pod):
            live[pod["spec"]["nodeName"]].add(key)
    return [
        n
        for n in NODES
        if live[n] != {rs.TOOLKIT, rs.DEVICE_PLUGIN}
        or cluster.node_labels(n).get(names.VALIDATED_LABEL) != "true"
    ]


def _deployed(ready_after: int = 1) -> tuple[FakeApi, FakeCluster]:
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES, ready_after=ready_after)
    fake.put(api.GCU_RESOURCE, ours(upgradePolicy={"maxUnavailable": 1}))
    for _ in range(20):
        converge(runner.Operator(fake, clock=lambda: fake.now), cluster)
        if not _down(fake, cluster) and status(fake, ours())["phase"] == "Running":
            break
        cluster.step()
    for i, name in enumerate(NODES):
        cluster.add_workload(name, f"job-{i}", cards=str(i))
    set_spec(fake, ours(), ["containerToolkit", "version"], "0.2.0")
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    return fake, cluster


def _run(kill_at: int | None, error: bool, ready_after: int = 1) -> tuple[dict[str, Any], set[str]]:
    fake, cluster = _deployed(ready_after)
    assert _down(fake, cluster) == []
    workloads = {
        p["metadata"]["uid"]
        for p in fake.objects(api.POD)
        if p["metadata"]["namespace"] == "default"
    }
    counter = {"writes": 0}
    original = fake._call

    def budget_held(when: str) -> None:
        down = _down(fake, cluster)
        assert len(down) <= 1, f"maxUnavailable 1, down {down} {when} (fault at write {kill_at})"

    def call(verb: str, kind: api.Kind) -> None:
        original(verb, kind)
        if verb in WRITES:
            budget_held(f"before write {counter['writes'] + 1} ({verb} {kind.kind})")
            counter["writes"] += 1
            if kill_at is not None and counter["writes"] == kill_at:
                if error:
                    raise api.ApiError(500, "etcdserver: request timed out")
                raise Crash(f"killed at write {kill_at} ({verb} {kind.kind})")

    fake._call = call  # type: ignore[method-assign]
    operator = runner.Operator(fake, clock=lambda: fake.now)
    for _ in range(150):
        try:
            results = operator.run_once()
        except Crash:
            operator = runner.Operator(fake, clock=lambda: fake.now)
            cluster.step()
            budget_held("after a tick")
            continue
        if _settled(results, fake, cluster):
            break
        cluster.step()
        budget_held("after a tick")
    else:
        raise AssertionError("no convergence")
    left = {
        p["metadata"]["uid"]
        for p in fake.objects(api.POD)
        if p["metadata"]["namespace"] == "default"
    }
    return _world(fake, cluster), workloads - left


def _settled(results: list[runner.PassResult], fake: FakeApi, cluster: FakeCluster) -> bool:
    """A pass did nothing and every node serves GCUs (with slow pods, a quiet pass can come
    while pods are still starting)."""
    quiet = all(r.actions == 0 and not r.error for r in results)
    return quiet and not _down(fake, cluster) and status(fake, ours())["phase"] == "Running"


def _writes_of_a_clean_rollout(ready_after: int = 1) -> int:
    fake, cluster = _deployed(ready_after)
    before = fake.writes()
    operator = runner.Operator(fake, clock=lambda: fake.now)
    for _ in range(150):
        if _settled(operator.run_once(), fake, cluster):
            return fake.writes() - before
        cluster.step()
    raise AssertionError("no convergence")


def test_clean_rollout_reference() -> None:
    world, lost = _run(None, error=False)
    assert world["phase"] == "Running" and world["ready"] == "3/3"
    assert {image for _, image in world["images"]} == {
        f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-container-toolkit:0.2.0",
        f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0",
    }
    assert lost == set()


@pytest.mark.slow
@pytest.mark.parametrize("error", [False, True], ids=["killed", "api-error"])
def test_killed_or_failing_at_every_write_converges_to_the_same_state(error: bool) -> None:
    reference, _ = _run(None, error=False)
    total = _writes_of_a_clean_rollout()
    assert total > 10
    for k in range(1, total + 1):
        world, lost = _run(k, error)
        assert world == reference, f"fault at write {k}"
        assert lost == set(), f"fault at write {k} lost GCU pods"


@pytest.mark.slow
# A clean rollout here makes 56 writes (45 before each node's report moved onto the Node), and
# the sweep replays it once per write: over the default 120 s on a loaded 2-vCPU machine.
@pytest.mark.timeout(300)
def test_killed_at_every_write_with_slow_pods_keeps_max_unavailable_at_every_moment() -> None:
    """Pods take three ticks to become ready, so a node stays down across several passes; the
    budget is checked before every write and after every tick, whatever write the kill hits."""
    reference, _ = _run(None, error=False, ready_after=3)
    total = _writes_of_a_clean_rollout(ready_after=3)
    assert total > 10
    for k in range(1, total + 1):
        world, lost = _run(k, error=False, ready_after=3)
        assert world == reference, f"killed at write {k}"
        assert lost == set(), f"killed at write {k} lost GCU pods"
