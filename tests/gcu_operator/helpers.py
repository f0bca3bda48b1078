"""Resources, the vendor's example and a converge loop for the operator tests."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

from enflame_gcu.gcu_operator import api, nodestate, runner
from tests.gcu_operator.fake_api import FakeApi, FakeCluster

REPO = pathlib.Path(__file__).resolve().parents[2]
VENDOR_EXAMPLE = REPO / "deploy" / "operator" / "examples" / "vendor-gcu-resource.json"
EXAMPLE = REPO / "deploy" / "operator" / "examples" / "gcu-resource.yaml"


def vendor_example() -> dict[str, Any]:
    """The vendor's 2.0 example resource (topsops.enflame.com/v1), unchanged."""
    return dict(json.loads(VENDOR_EXAMPLE.read_text()))


def ours(**spec: Any) -> dict[str, Any]:
    """A topscloud.enflame.com/v1 resource with the toolkit and the plugin, plus ``spec``."""
    base: dict[str, Any] = {
        "containerToolkit": {},
        "devicePlugin": {},
        "upgradePolicy": {"maxUnavailable": 1},
    }
    base.update(spec)
    return {
        "apiVersion": api.GCU_RESOURCE.api_version,
        "kind": "GcuResource",
        "metadata": {"name": "gcu"},
        "spec": base,
    }


def kind_of(resource: dict[str, Any]) -> api.Kind:
    return (
        api.LEGACY_GCU_RESOURCE
        if resource["apiVersion"].startswith("topsops")
        else api.GCU_RESOURCE
    )


def converge(
    operator: runner.Operator, cluster: FakeCluster, passes: int = 60, check: Any = None
) -> int:
    """Alternate operator passes and cluster ticks until a pass changes nothing; the pass count."""
    for count in range(1, passes + 1):
        results = operator.run_once()
        if check is not None:
            check()
        if all(r.actions == 0 and not r.error for r in results):
            return count
        cluster.step()
    raise AssertionError(f"no convergence in {passes} passes")


def status(fake: FakeApi, resource: dict[str, Any]) -> dict[str, Any]:
    obj = fake.find(kind_of(resource), resource["metadata"]["name"])
    assert obj is not None
    return dict(obj.get("status") or {})


def set_spec(fake: FakeApi, resource: dict[str, Any], path: list[str], value: Any) -> None:
    kind = kind_of(resource)
    obj = fake.find(kind, resource["metadata"]["name"])
    assert obj is not None
    node = obj["spec"]
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = copy.deepcopy(value)
    fake.replace(kind, obj)


def node_reports(fake: FakeApi, resource: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every node's report, by node name, as the operator keeps it on the Node (its state
    annotation); the status names only the first few nodes with a problem."""
    group = resource["apiVersion"].rpartition("/")[0]
    key = f"{group}/{resource['metadata']['name']}"
    out = {}
    for node in fake.objects(api.NODE):
        report = nodestate.report_of(node, key)
        if report is not None:
            out[node["metadata"]["name"]] = {"name": node["metadata"]["name"], **report}
    return out
