"""Killing the operator at every API write of a rollout, or failing that call, still converges."""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, names, runner
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


def _deployed() -> tuple[FakeApi, FakeCluster]:
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, ours(upgradePolicy={"maxUnavailable": 1}))
    converge(runner.Operator(fake, clock=lambda: fake.now), cluster)
    for i, name in enumerate(NODES):
        cluster.add_workload(name, f"job-{i}", cards=str(i))
    set_spec(fake, ours(), ["containerToolkit", "version"], "0.2.0")
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    return fake, cluster


def _run(kill_at: int | None, error: bool) -> tuple[dict[str, Any], set[str]]:
    fake, cluster = _deployed()
    workloads = {
        p["metadata"]["uid"]
        for p in fake.objects(api.POD)
        if p["metadata"]["namespace"] == "default"
    }
    counter = {"writes": 0}
    original = fake._call

    def call(verb: str, kind: api.Kind) -> None:
        original(verb, kind)
        if verb in WRITES:
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
            continue
        if all(r.actions == 0 and not r.error for r in results):
            break
        cluster.step()
    else:
        raise AssertionError("no convergence")
    left = {
        p["metadata"]["uid"]
        for p in fake.objects(api.POD)
        if p["metadata"]["namespace"] == "default"
    }
    return _world(fake, cluster), workloads - left


def _writes_of_a_clean_rollout() -> int:
    fake, cluster = _deployed()
    before = fake.writes()
    converge(runner.Operator(fake, clock=lambda: fake.now), cluster, passes=150)
    return fake.writes() - before


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
