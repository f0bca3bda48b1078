"""An object the API server refuses: the resource's status names it and why, an Event says so,
and the resource backs off instead of failing the same way every pass; what the CRD can check
at admission it checks there."""

from __future__ import annotations

import re
from typing import Any

from enflame_gcu.gcu_operator import api, crd, names, runner
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours, set_spec, status


def _run(fake: FakeApi, cluster: FakeCluster, passes: int) -> runner.Operator:
    operator = runner.Operator(fake, clock=lambda: fake.now)
    for _ in range(passes):
        operator.run_once()
        cluster.step()
    return operator


def _creates_of(fake: FakeApi, kind: str) -> int:
    return sum(1 for verb, k in fake.calls if verb == "create" and k == kind)


def test_a_missing_namespace_is_reported_with_an_event_and_backoff() -> None:
    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours(devicePlugin={"namespace": "gcu-missing"}))
    _run(fake, cluster, passes=40)  # 200 s at one pass per 5 s
    st = status(fake, ours())
    condition = st["conditions"][0]
    assert st["phase"] == "Failed"
    assert condition["reason"] == "Refused"
    assert "create DaemonSet gcu-missing/enflame-k8s-device-plugin" in condition["message"]
    assert 'namespaces "gcu-missing" not found' in condition["message"]
    events = fake.objects(api.EVENT)
    assert len(events) == 1, [e["message"] for e in events]
    assert events[0]["type"] == "Warning" and events[0]["reason"] == "Refused"
    assert events[0]["involvedObject"]["name"] == "gcu"
    # Backoff 5, 10, 20, 40, 80 s: a handful of tries in 200 s, not one per pass.
    assert 3 <= _creates_of(fake, "DaemonSet") - 1 <= 6, fake.calls.count


def test_fixing_the_spec_retries_at_once_and_clears_the_condition() -> None:
    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours(devicePlugin={"namespace": "gcu-missing"}))
    operator = _run(fake, cluster, passes=10)
    set_spec(fake, ours(), ["devicePlugin", "namespace"], "kube-system")
    converge(operator, cluster)
    st = status(fake, ours())
    assert st["phase"] == "Running", st["conditions"]


def test_an_invalid_node_selector_value_is_reported() -> None:
    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours(devicePlugin={"nodeSelector": {"zone": "a b"}}))
    _run(fake, cluster, passes=5)
    condition = status(fake, ours())["conditions"][0]
    assert condition["reason"] == "Refused"
    assert '"a b"' in condition["message"]


def test_a_node_name_longer_than_a_label_value_is_validated() -> None:
    long_name = "gcu-node-" + "x" * 70 + ".example.com"
    fake = FakeApi()
    cluster = FakeCluster(fake, [long_name])
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    st = status(fake, ours())
    assert st["phase"] == "Running", st["conditions"]
    assert cluster.node_labels(long_name).get(names.VALIDATED_LABEL) == "true"


def _selector_schema() -> dict[str, Any]:
    spec = crd.spec_schema()
    return dict(spec["properties"]["devicePlugin"]["properties"]["nodeSelector"])


def test_the_crd_checks_node_selector_values_at_admission() -> None:
    values = _selector_schema()["additionalProperties"]
    pattern = re.compile(values["pattern"])
    assert values["maxLength"] == 63
    for good in ("", "true", "a.b-c_d", "Z9"):
        assert pattern.match(good), good
    for bad in ("a b", "-a", "a-", "a/b"):
        assert not pattern.match(bad), bad
