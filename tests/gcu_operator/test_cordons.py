"""Cordons in a drain rollout (issue 47, points 3 and 6): a cordoned DRA node still validates
(its validator pod goes through the scheduler, which the fake now runs as Kubernetes does, and
tolerates the cordon), a rollback of it too; a node an administrator had cordoned stays
cordoned after the rollout."""

from __future__ import annotations

from typing import Any

from enflame_gcu.gcu_operator import api, components, names, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster, untolerated
from tests.gcu_operator.helpers import converge, node_reports, ours, set_spec, status

NODES = ["node-a", "node-b"]
DRAIN = {"maxUnavailable": 1, "drain": {"enable": True}}


def _start(resource: dict[str, Any], dra: bool = False) -> tuple[FakeApi, FakeCluster, Any]:
    fake = FakeApi(dra_served=dra)
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    return fake, cluster, runner.Operator(fake, clock=lambda: fake.now)


def _unschedulable(fake: FakeApi, name: str) -> bool:
    node = fake.find(api.NODE, name)
    assert node is not None
    return bool((node.get("spec") or {}).get("unschedulable"))


def test_the_fake_scheduler_keeps_pods_off_a_cordoned_node() -> None:
    """The stand-in refuses what the scheduler refuses, or the tests below prove nothing."""
    node = {"metadata": {"name": "n"}, "spec": {"unschedulable": True}}
    assert untolerated(node, [])
    assert not untolerated(node, [components.CORDON_TOLERATION])
    tainted = {"spec": {"taints": [{"key": "x", "value": "y", "effect": "NoSchedule"}]}}
    assert untolerated(tainted, [{"key": "x", "operator": "Equal", "value": "z"}])
    assert not untolerated(tainted, [{"key": "x", "operator": "Exists"}])
    assert not untolerated(tainted, [{"operator": "Exists"}])


def test_a_cordoned_dra_node_validates_in_a_drain_rollout_and_in_its_rollback() -> None:
    resource = ours(dra={}, upgradePolicy=DRAIN)
    fake, cluster, operator = _start(resource, dra=True)
    for name in NODES:
        fake.patch(api.NODE, name, {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    converge(operator, cluster)
    assert status(fake, resource)["phase"] == "Running"
    cordoned: set[str] = set()

    def check() -> None:
        cordoned.update(n for n in NODES if _unschedulable(fake, n))

    set_spec(fake, resource, ["dra", "version"], "0.2.0")
    converge(operator, cluster, check=check)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    assert cordoned == set(NODES)  # each node was cordoned, validated and let go
    assert not any(_unschedulable(fake, n) for n in NODES)
    assert all(n["validated"] for n in node_reports(fake, resource).values())
    # The rollback goes the same way.
    set_spec(fake, resource, ["dra", "version"], "0.1.0")
    converge(operator, cluster)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    assert not any(_unschedulable(fake, n) for n in NODES)


def test_a_node_the_administrator_cordoned_stays_cordoned_after_a_drain_rollout() -> None:
    resource = ours(upgradePolicy=DRAIN)
    fake, cluster, operator = _start(resource)
    converge(operator, cluster)
    fake.patch(api.NODE, "node-b", {"spec": {"unschedulable": True}})
    set_spec(fake, resource, ["devicePlugin", "version"], "0.2.0")
    seen: list[bool] = []

    def check() -> None:
        seen.append(_unschedulable(fake, "node-a"))

    converge(operator, cluster, check=check)
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    plugins = [
        p
        for p in fake.objects(api.POD)
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.DEVICE_PLUGIN
    ]
    assert all(p["spec"]["containers"][0]["image"].endswith(":0.2.0") for p in plugins)
    assert True in seen  # the operator cordoned node-a itself ...
    assert not _unschedulable(fake, "node-a")  # ... and let it go
    assert _unschedulable(fake, "node-b")  # the administrator's cordon is kept


def test_a_drain_never_evicts_the_validator_pod_of_the_node_it_drains() -> None:
    """The validator requests a GCU, so it is a GCU pod on the drained node; evicting it threw
    the validation away, and the rollout finished only when a validator happened to finish
    between two passes (found on Kubernetes' own control plane, issue 46)."""
    resource = ours(validator={}, upgradePolicy=DRAIN)
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES, ready_after=3)  # a validator runs for a few passes
    fake.put(api.GCU_RESOURCE, resource)
    operator = runner.Operator(fake, clock=lambda: fake.now)

    def settle() -> dict[str, Any]:
        # converge() stops at the first pass that changes nothing, which a pod still
        # starting makes; here the cluster ticks on until the resource is Running again.
        for _ in range(80):
            operator.run_once()
            cluster.step()
            st = status(fake, resource)
            if st.get("phase") == "Running" and not st.get("rollout", {}).get("upgrading"):
                return st
        return status(fake, resource)

    assert settle()["phase"] == "Running"
    cluster.add_workload("node-a", "job-a", cards="0")
    evicted: list[str] = []
    evict = fake.evict

    def recording(namespace: str, name: str) -> None:
        evicted.append(f"{namespace}/{name}")
        evict(namespace, name)

    fake.evict = recording  # type: ignore[method-assign]
    set_spec(fake, resource, ["devicePlugin", "version"], "0.2.0")
    operator.run_once()  # the new generation is seen before the cluster ticks
    st = settle()
    assert st["phase"] == "Running", st["conditions"]
    assert evicted == ["default/job-a"], evicted  # the workload, and nothing of ours
    assert all(n["validated"] for n in node_reports(fake, resource).values())
