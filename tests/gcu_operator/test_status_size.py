"""The status stays small as the cluster grows (issue 47, point 11): counts and the first few
nodes with a problem, while every node's report is kept on the Node itself (the operator's
state annotation). benchmarks/bench_operator_status_size.py measures it at 5,000 nodes."""

from __future__ import annotations

from enflame_gcu.gcu_operator import api, runner, status
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, node_reports, ours
from tests.gcu_operator.helpers import status as status_of

NODES = [f"node-{i:02d}" for i in range(30)]


def test_the_status_names_the_first_problem_nodes_and_each_node_keeps_its_report() -> None:
    resource = ours()
    fake = FakeApi()
    cluster = FakeCluster(fake, NODES)
    fake.put(api.GCU_RESOURCE, resource)
    cluster.bad_nodes.update(NODES[5:])  # 25 nodes fail their validation
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    st = status_of(fake, resource)
    assert st["nodeCounts"] == {"total": 30, "ready": 5, "validated": 5, "problems": 25}
    shown = [n["name"] for n in st["nodes"]]
    assert shown == NODES[5 : 5 + status.NODE_REPORT_LIMIT]
    assert all("/dev/gcu0 is missing" in n["lastError"] for n in st["nodes"])
    reports = node_reports(fake, resource)
    assert sorted(reports) == NODES  # every node's detail, healthy or not, on the Node
    assert all(reports[n]["validated"] for n in NODES[:5])
    assert all("/dev/gcu0 is missing" in reports[n]["lastError"] for n in NODES[5:])
