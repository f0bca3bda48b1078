"""The GcuResource CRDs: current on disk, structural, and what their schema accepts and refuses.

The API server (1.20, apiextensions.k8s.io/v1) checks the schema is structural and validates
values; kubectl refuses unknown fields from the schema the server publishes. Here the same
schema runs through jsonschema with unknown fields forbidden, as kubectl does; the cluster
tier applies it to a real kube-apiserver (tests/gcu_operator/test_e2e_apiserver.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from enflame_gcu.gcu_operator import crd
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.helpers import REPO, vendor_example

CRD_FILE = REPO / "deploy" / "operator" / "crd.yaml"
CHART_CRD = REPO / "deploy" / "helm" / "enflame-gcu" / "crds" / "gcuresource-crd.yaml"


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _kubectl_schema(schema: Any) -> Any:
    """The OpenAPI schema as jsonschema, unknown fields refused (kubectl's client validation)."""
    if isinstance(schema, list):
        return [_kubectl_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _kubectl_schema(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if "properties" in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _validator() -> jsonschema.Draft7Validator:
    schema = crd.crd(rs.GROUP)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(_kubectl_schema(schema))


def _errors(obj: dict[str, Any]) -> list[str]:
    return [
        ".".join(str(p) for p in e.absolute_path) + ": " + e.message
        for e in _validator().iter_errors(obj)
    ]


def test_the_committed_crd_and_the_chart_copy_are_current() -> None:
    assert CRD_FILE.read_text() == crd.render()
    assert CHART_CRD.read_text() == crd.render()


def test_two_crds_one_per_group_with_status_and_the_vendor_columns() -> None:
    docs = list(yaml.safe_load_all(CRD_FILE.read_text()))
    assert [d["spec"]["group"] for d in docs] == [rs.GROUP, rs.LEGACY_GROUP]
    for doc in docs:
        version = doc["spec"]["versions"][0]
        assert doc["spec"]["scope"] == "Cluster"
        assert version["subresources"] == {"status": {}}
        columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
        assert columns == [
            ("READY", ".status.readyResource"),
            ("STATUS", ".status.phase"),
            ("AGE", ".metadata.creationTimestamp"),
        ]
    assert docs[0]["spec"]["names"]["shortNames"] == ["gr"]


def test_schema_is_structural() -> None:
    schema = crd.crd(rs.GROUP)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema):
        special = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert "type" in node or special, f"{path or '.'} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        for branch in node.get("anyOf", []):
            # Only the int-or-string form may name types inside anyOf.
            assert node.get("x-kubernetes-int-or-string"), path
            assert set(branch) == {"type"}, path  # the API server forbids anything else
        if "default" in node and "enum" in node:
            assert node["default"] in node["enum"], path


def test_vendor_example_and_ours_are_accepted() -> None:
    assert _errors({**vendor_example(), "apiVersion": f"{rs.GROUP}/v1"}) == []
    example = yaml.safe_load(
        (REPO / "deploy" / "operator" / "examples" / "gcu-resource.yaml").read_text()
    )
    assert _errors(example) == []


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (["spec", "devicePlgin"], {}, "'devicePlgin' was unexpected"),
        (
            ["spec", "devicePlugin", "imagePullPolicy"],
            "Sometimes",
            "spec.devicePlugin.imagePullPolicy",
        ),
        (["spec", "nodeMode"], "cdii", "spec.nodeMode"),
        (["spec", "devicePlugin", "notDeploy"], "yes", "spec.devicePlugin.notDeploy"),
        (["spec", "devicePlugin", "name"], "Bad_Name", "spec.devicePlugin.name"),
        (["spec", "upgradePolicy", "maxUnavailable"], "150%", "spec.upgradePolicy.maxUnavailable"),
        (["spec", "gcusharePlugin", "memoryUnit"], "2", "spec.gcusharePlugin.memoryUnit"),
        (["spec", "devicePlugin", "env"], [{"value": "x"}], "spec.devicePlugin.env.0"),
        (["spec", "devicePlugin", "nodeState"], "on", "spec.devicePlugin.nodeState"),
        (
            ["spec", "devicePlugin", "telemetry", "isolation"],
            "none",
            "spec.devicePlugin.telemetry.isolation",
        ),
        (["spec", "devicePlugin", "telemetry", "interval"], 0, "spec.devicePlugin.telemetry"),
        (
            ["spec", "devicePlugin", "telemetry", "libraryDir"],
            "usr/lib",
            "spec.devicePlugin.telemetry.libraryDir",
        ),
        (["spec", "plugin", "telemetry", "enabled"], "yes", "spec.plugin.telemetry.enabled"),
        (
            ["spec", "devicePlugin", "telemetry", "efsmiDir"],
            "/usr/../etc",
            "spec.devicePlugin.telemetry.efsmiDir",
        ),
        (
            ["spec", "devicePlugin", "telemetry", "libraryDir"],
            "/",
            "spec.devicePlugin.telemetry.libraryDir",
        ),
    ],
)
def test_a_typo_is_refused_naming_the_field(path: list[str], value: Any, named: str) -> None:
    obj = copy.deepcopy(vendor_example())
    node = obj
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    errors = _errors(obj)
    assert errors and any(named in e for e in errors), errors


def test_the_plugins_node_state_and_telemetry_fields_are_accepted() -> None:
    obj = {**vendor_example(), "apiVersion": f"{rs.GROUP}/v1"}
    obj["spec"]["devicePlugin"] = {
        "nodeState": False,
        "telemetry": {
            "enabled": True,
            "interval": 30,
            "timeout": 5,
            "isolation": "process",
            "libraryDir": "/usr/lib64/.efml/..x",
            "efsmiDir": "",
        },
    }
    assert _errors(obj) == []
