"""One owner per (component, node), kept when an overlap appears later (issue 47, point 5): a
node relabelled into a second resource's pool never runs two toolkits or two device plugins;
the owner stays until it releases the node (within its own budget), and a resource that wants
a node another owns says so in its status, while the DaemonSet controller schedules only the
owner's toolkit there (its desiredNumberScheduled)."""

from __future__ import annotations

from typing import Any

from enflame_gcu.gcu_operator import api, names, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, node_reports, ours, status

POOLS = {"a1": "a", "a2": "a", "a3": "a", "b1": "b"}


def _pool_resource(name: str, pool: str) -> dict[str, Any]:
    """A resource for the nodes labelled pool-<pool>, its workloads named after it."""
    resource = ours(
        containerToolkit={"nodeSelector": {f"pool-{pool}": "true"}, "name": f"{name}-toolkit"},
        devicePlugin={"nodeSelector": {f"pool-{pool}": "true"}, "name": f"{name}-plugin"},
        validator={"name": f"{name}-validator"},
    )
    resource["metadata"]["name"] = name
    return resource


def _start() -> tuple[FakeApi, FakeCluster, runner.Operator, dict[str, Any], dict[str, Any]]:
    fake = FakeApi()
    cluster = FakeCluster(fake, sorted(POOLS))
    for node, pool in POOLS.items():
        fake.patch(api.NODE, node, {"metadata": {"labels": {f"pool-{pool}": "true"}}})
    first, second = _pool_resource("first", "a"), _pool_resource("second", "b")
    fake.put(api.GCU_RESOURCE, first)
    fake.now += 1
    fake.put(api.GCU_RESOURCE, second)
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    assert status(fake, first)["phase"] == "Running"
    assert status(fake, second)["phase"] == "Running"
    return fake, cluster, operator, first, second


def _running(fake: FakeApi, node: str, key: str) -> list[dict[str, Any]]:
    """The component's pods on the node, terminating ones too (they still hold the node)."""
    return [
        p
        for p in fake.objects(api.POD)
        if p["spec"].get("nodeName") == node
        and (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == key
    ]


def _owner_uid(fake: FakeApi, resource: dict[str, Any]) -> str:
    found = fake.find(api.GCU_RESOURCE, resource["metadata"]["name"])
    assert found is not None
    return str(found["metadata"]["uid"])


def _desired(fake: FakeApi, resource: dict[str, Any]) -> int:
    uid = _owner_uid(fake, resource)
    [toolkit] = [
        d
        for d in fake.objects(api.DAEMONSET)
        if d["metadata"]["labels"][names.RESOURCE_LABEL] == uid
        and d["metadata"]["labels"][names.COMPONENT_LABEL] == rs.TOOLKIT
    ]
    return int(toolkit["status"]["desiredNumberScheduled"])


def _never_two(fake: FakeApi, problems: list[str]) -> Any:
    def check() -> None:
        for node in POOLS:
            for key in (rs.TOOLKIT, rs.DEVICE_PLUGIN):
                if len(_running(fake, node, key)) > 1:
                    problems.append(f"two {key} pods on {node}")

    return check


def test_an_overlap_that_appears_later_keeps_one_owner_and_names_the_conflict() -> None:
    fake, cluster, operator, first, second = _start()
    # a2 comes into the second resource's pool too: both want it.
    fake.patch(api.NODE, "a2", {"metadata": {"labels": {"pool-b": "true"}}})
    problems: list[str] = []
    for _ in range(3):
        converge(operator, cluster, check=_never_two(fake, problems))
        cluster.step()
    assert not problems, problems[:5]
    # The first (the owner) keeps a2; the second keeps serving b1 and names the conflict.
    st_first, st_second = status(fake, first), status(fake, second)
    assert st_first["phase"] == "Running", st_first["conditions"]
    assert sorted(node_reports(fake, first)) == ["a1", "a2", "a3"]
    assert st_second["phase"] == "Running", st_second["conditions"]
    assert sorted(node_reports(fake, second)) == ["b1"]
    message = st_second["conditions"][0]["message"]
    assert "containerToolkit on a2" in message and "GcuResource first" in message, message
    assert {"component": rs.TOOLKIT, "node": "a2"}.items() <= st_second["conflicts"][0].items()
    assert (_desired(fake, first), _desired(fake, second)) == (3, 1)
    assert cluster.node_labels("a2")[names.owner_label(rs.TOOLKIT)] == _owner_uid(fake, first)


def test_a_resource_that_loses_nodes_releases_them_one_at_a_time_to_the_other() -> None:
    fake, cluster, operator, first, second = _start()
    # a2 and a3 move from the first resource's pool to the second's at once (maxUnavailable 1).
    for node in ("a2", "a3"):
        fake.patch(api.NODE, node, {"metadata": {"labels": {"pool-a": None, "pool-b": "true"}}})
    problems: list[str] = []
    released: dict[str, int] = {}
    passes = 0

    def check() -> None:
        nonlocal passes
        passes += 1
        _never_two(fake, problems)()
        for node in ("a2", "a3"):
            labels = cluster.node_labels(node)
            if labels.get(names.owner_label(rs.TOOLKIT)) != _owner_uid(fake, first):
                released.setdefault(node, passes)

    for _ in range(3):
        converge(operator, cluster, check=check)
        cluster.step()
    assert not problems, problems[:5]
    assert released["a2"] != released["a3"], released  # one node at a time
    assert sorted(node_reports(fake, first)) == ["a1"]
    assert sorted(node_reports(fake, second)) == ["a2", "a3", "b1"]
    assert status(fake, second)["phase"] == "Running"
    assert (_desired(fake, first), _desired(fake, second)) == (1, 3)
    for node in ("a2", "a3"):
        assert len(_running(fake, node, rs.TOOLKIT)) == 1
