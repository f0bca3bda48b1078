"""A node's move between the device plugin and DRA (its ``enflame.com/gcu.mode`` label) is an
upgrade of that node (issue 47, point 8): within maxUnavailable, drained first when drain is
on, the old serving component gone before the new one starts, and validated before the next
node moves."""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, names, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, node_reports, ours, status

NODES = ["node-a", "node-b", "node-c"]
SERVING = (rs.DEVICE_PLUGIN, rs.DRA)


def _serving_pods(fake: FakeApi, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in fake.objects(api.POD)
        if p["spec"].get("nodeName") == node
        and (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) in SERVING
    ]


def _serves(fake: FakeApi, node: str) -> bool:
    """A ready serving pod, not being deleted, on the node."""
    return any(
        not p["metadata"].get("deletionTimestamp")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
        for p in _serving_pods(fake, node)
    )


@pytest.mark.parametrize("to_dra", [True, False], ids=["to-dra", "to-device-plugin"])
def test_a_mode_change_is_a_budgeted_drained_validated_upgrade(to_dra: bool) -> None:
    resource = ours(dra={}, upgradePolicy={"maxUnavailable": 1, "drain": {"enable": True}})
    fake = FakeApi(dra_served=True)
    cluster = FakeCluster(fake, NODES)
    if not to_dra:
        for name in NODES:
            fake.patch(api.NODE, name, {"metadata": {"labels": {names.MODE_LABEL: "dra"}}})
    fake.put(api.GCU_RESOURCE, resource)
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    for _ in range(3):
        cluster.step()
        converge(operator, cluster)
    assert status(fake, resource)["phase"] == "Running"
    for name in NODES:
        cluster.add_workload(name, f"job-{name}", cards="0")
    mode = "dra" if to_dra else None
    for name in NODES:  # every node relabelled at once
        fake.patch(api.NODE, name, {"metadata": {"labels": {names.MODE_LABEL: mode}}})
    problems: list[str] = []

    def check() -> None:
        down = [n for n in NODES if not _serves(fake, n)]
        if len(down) > 1:
            problems.append(f"{down} without a serving pod at once")
        for name in NODES:
            kinds = {
                (p["metadata"].get("labels") or {})[names.COMPONENT_LABEL]
                for p in _serving_pods(fake, name)
            }
            if len(kinds) > 1:
                problems.append(f"{name} runs both {sorted(kinds)}")
            if not _serves(fake, name) and fake.find(api.POD, f"job-{name}", "default"):
                problems.append(f"{name} lost its serving pod before its GCU pod was drained")

    for _ in range(6):
        converge(operator, cluster, check=check)
        cluster.step()
    assert not problems, problems[:5]
    st = status(fake, resource)
    assert st["phase"] == "Running", st["conditions"]
    reports = node_reports(fake, resource)
    expected = "dra" if to_dra else "device-plugin"
    assert {n: r["mode"] for n, r in reports.items()} == dict.fromkeys(NODES, expected)
    assert all(r["validated"] for r in reports.values())
    for name in NODES:
        node = fake.find(api.NODE, name)
        assert node is not None and not node["spec"].get("unschedulable"), name
        assert fake.find(api.POD, f"job-{name}", "default") is None  # drained
