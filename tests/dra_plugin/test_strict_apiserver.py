"""The fake API server refuses, drops and fills in what a Kubernetes 1.36 server does, over real
HTTP (DRA.md §5, §8): so the driver's and the chart's objects are checked against the API's
rules, not only against its schema. What only a real 1.36 server can show (its CEL compiler,
the scheduler's use of the objects) is not claimed here."""

from __future__ import annotations

import copy
import glob
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from enflame_gcu import resourceslices
from tests.dra_plugin import slices_helpers
from tests.dra_plugin.fake_apiserver import CLASSES, SLICES, FakeApiServer

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"


def call(fake: FakeApiServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(fake.url + path, data=data, method=method)  # noqa: S310
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 (loopback)
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def device(name: str = "gcu-0", **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gcu"}}, **extra}


def a_slice(devices: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": resourceslices.DRIVER,
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": [device()] if devices is None else devices,
    }
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gcu-0"},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def a_claim(requests: list[dict[str, Any]], constraints: Any = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints is not None:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": devices},
    }


def exact(name: str = "gcus", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gcu.enflame.com", **fields}}


def a_class(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gcu.enflame.com"},
        "spec": spec,
    }


def tainted(name: str) -> dict[str, Any]:
    return device(name, taints=[{"key": "gcu.enflame.com/unhealthy", "effect": "NoSchedule"}])


def policy(multiple: bool) -> dict[str, Any]:
    extra: dict[str, Any] = {"allowMultipleAllocations": True} if multiple else {}
    capacity = {"slices": {"value": "6", "requestPolicy": {"default": "6", "validValues": ["6"]}}}
    return device(capacity=capacity, **extra)


SLICE_REFUSALS: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    "129 devices": (lambda: a_slice([device(f"gcu-{i}") for i in range(129)]), "at most 128"),
    "65 tainted devices": (lambda: a_slice([tainted(f"gcu-{i}") for i in range(65)]), "at most 64"),
    "device name": (lambda: a_slice([device("GCU_0")]), "is not a DNS label"),
    "duplicate device": (lambda: a_slice([device(), device()]), "duplicate device names"),
    "attribute name 33": (
        lambda: a_slice([device(attributes={"a" * 33: {"int": 1}})]),
        "C identifier of at most 32",
    ),
    "attribute domain": (
        lambda: a_slice([device(attributes={"Bad_Domain/x": {"int": 1}})]),
        "must be a DNS subdomain",
    ),
    "string 65": (
        lambda: a_slice([device(attributes={"model": {"string": "x" * 65}})]),
        "longer than 64",
    ),
    "two value types": (
        lambda: a_slice([device(attributes={"index": {"int": 1, "string": "1"}})]),
        "exactly one of",
    ),
    "bad version": (
        lambda: a_slice([device(attributes={"driverVersion": {"version": "1.0"}})]),
        "is not semantic version",
    ),
    "33 attributes": (
        lambda: a_slice([device(attributes={f"a{i}": {"int": i} for i in range(33)})]),
        "at most 32",
    ),
    "17 taints": (
        lambda: a_slice(
            [device(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)])]
        ),
        "at most 16",
    ),
    "taint effect": (
        lambda: a_slice([device(taints=[{"key": "k", "effect": "PreferNoSchedule"}])]),
        "effect",
    ),
    "counters and devices": (
        lambda: a_slice(sharedCounters=[{"name": "gcu-0-drs", "counters": {"s": {"value": "6"}}}]),
        "devices and sharedCounters cannot be in the same slice",
    ),
    "9 counter sets": (
        lambda: a_slice(
            [],
            sharedCounters=[
                {"name": f"gcu-{i}-drs", "counters": {"s": {"value": "6"}}} for i in range(9)
            ],
        ),
        "at most 8",
    ),
    "33 counters": (
        lambda: a_slice(
            [],
            sharedCounters=[
                {"name": "gcu-0-drs", "counters": {f"c{i}": {"value": "1"} for i in range(33)}}
            ],
        ),
        "at most 32",
    ),
    "3 consumed sets": (
        lambda: a_slice(
            [
                device(
                    consumesCounters=[
                        {"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)
                    ]
                )
            ]
        ),
        "at most 2",
    ),
    "requestPolicy alone": (
        lambda: a_slice([policy(False)]),
        "only allowed when allowMultipleAllocations is true",
    ),
    "default not valid": (
        lambda: a_slice(
            [
                device(
                    allowMultipleAllocations=True,
                    capacity={
                        "slices": {
                            "value": "6",
                            "requestPolicy": {"default": "4", "validValues": ["1", "6"]},
                        }
                    },
                )
            ]
        ),
        "must be one of validValues",
    ),
    "two scopes": (lambda: a_slice(allNodes=True), "exactly one of"),
    "device scope without per-device": (
        lambda: a_slice([device(nodeName="node-a")]),
        "only with perDeviceNodeSelection",
    ),
    "driver 64": (lambda: a_slice(driver="a" * 64), "DNS subdomain of <= 63"),
    "no slice count": (
        lambda: a_slice(pool={"name": "node-a", "generation": 1, "resourceSliceCount": 0}),
        "greater than zero",
    ),
}


@pytest.mark.parametrize("case", list(SLICE_REFUSALS))
def test_a_slice_breaking_a_1_36_rule_is_refused_with_422_and_not_stored(case: str) -> None:
    build, cause = SLICE_REFUSALS[case]
    with FakeApiServer() as fake:
        code, body = call(fake, "POST", SLICES, build())
        assert code == 422, body
        assert body["reason"] == "Invalid" and cause in body["message"], body["message"]
        assert fake.slices == {}


def test_the_same_slices_within_the_limits_are_accepted() -> None:
    with FakeApiServer() as fake:
        sixty_four = a_slice([tainted(f"gcu-{i}") for i in range(64)])
        assert call(fake, "POST", SLICES, sixty_four)[0] == 201
        shared = a_slice([policy(True)])
        shared["metadata"]["name"] = "shared"
        assert call(fake, "POST", SLICES, shared)[0] == 201


def test_what_the_driver_publishes_on_every_fixture_is_accepted(tmp_path: Any) -> None:
    """Every fixture, whole and time-shared, through the strict server's rules (the DRS
    counters go through it in the API-side tests, which run against this server)."""
    modes = [
        resourceslices.PublishOptions(),
        resourceslices.PublishOptions(shared_slices=6),
    ]
    with FakeApiServer() as fake:
        count = 0
        for n, fixture in enumerate(slices_helpers.FIXTURES):
            inventory = slices_helpers.make_fixture_node(str(tmp_path / str(n)), fixture)
            for options in modes:
                published = slices_helpers.published(inventory, options)
                for item in resourceslices.build_slices("node-a", None, published, 1, options):
                    item["metadata"]["name"] = f"s{count}"
                    count += 1
                    code, body = call(fake, "POST", SLICES, item)
                    assert code == 201, (fixture, body.get("message"))


def test_update_keeps_driver_and_node_and_counts_generations() -> None:
    with FakeApiServer() as fake:
        code, stored = call(fake, "POST", SLICES, a_slice())
        assert code == 201 and stored["metadata"]["generation"] == 1
        same = copy.deepcopy(stored)
        code, again = call(fake, "PUT", f"{SLICES}/node-a-gcu-0", same)
        assert code == 200 and again["metadata"]["generation"] == 1  # spec unchanged
        assert int(again["metadata"]["resourceVersion"]) > int(
            stored["metadata"]["resourceVersion"]
        )
        stale = copy.deepcopy(stored)  # the resourceVersion of before
        stale["spec"]["devices"].append(device("gcu-1"))
        assert call(fake, "PUT", f"{SLICES}/node-a-gcu-0", stale)[0] == 409
        changed = copy.deepcopy(again)
        changed["spec"]["devices"].append(device("gcu-1"))
        code, grown = call(fake, "PUT", f"{SLICES}/node-a-gcu-0", changed)
        assert code == 200 and grown["metadata"]["generation"] == 2
        moved = copy.deepcopy(grown)
        moved["spec"]["nodeName"] = "node-b"
        code, body = call(fake, "PUT", f"{SLICES}/node-a-gcu-0", moved)
        assert code == 422 and "spec.nodeName: field is immutable" in body["message"]


@pytest.mark.parametrize(
    ("gate", "field"),
    [
        ("DRADeviceTaints", "taints"),
        ("DRAConsumableCapacity", "allowMultipleAllocations"),
        ("DRAPartitionableDevices", "consumesCounters"),
    ],
)
def test_a_server_without_a_gate_drops_its_fields_silently(gate: str, field: str) -> None:
    extra: Any = {
        "taints": [{"key": "gcu.enflame.com/unhealthy", "effect": "NoSchedule"}],
        "allowMultipleAllocations": True,
        "consumesCounters": [{"counterSet": "gcu-0-drs", "counters": {"s": {"value": "1"}}}],
    }[field]
    written = device("gcu-0", **{field: extra})
    if field == "allowMultipleAllocations":  # its requestPolicy goes with it, so no 422
        written = policy(True)
    with FakeApiServer(gates={gate: False}) as fake:
        code, stored = call(fake, "POST", SLICES, a_slice([written]))
        assert code == 201, stored
        kept = stored["spec"]["devices"][0]
        assert field not in kept
        assert "requestPolicy" not in json.dumps(kept)
    with FakeApiServer() as fake:  # 1.36: kept, taints stamped
        code, stored = call(fake, "POST", SLICES, a_slice([written]))
        assert code == 201 and field in stored["spec"]["devices"][0]


CLAIM_REFUSALS: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    "33 requests": (lambda: a_claim([exact(f"r{i}") for i in range(33)]), "at most 32"),
    "both kinds": (
        lambda: a_claim(
            [{**exact(), "firstAvailable": [{"name": "a", "deviceClassName": "gcu.enflame.com"}]}]
        ),
        "exactly one of exactly, firstAvailable",
    ),
    "9 alternatives": (
        lambda: a_claim(
            [
                {
                    "name": "gcus",
                    "firstAvailable": [
                        {"name": f"a{i}", "deviceClassName": "gcu.enflame.com"} for i in range(9)
                    ],
                }
            ]
        ),
        "1 to 8 subrequests",
    ),
    "count 0": (lambda: a_claim([exact(count=0)]), "must be greater than zero"),
    "unknown request": (
        lambda: a_claim([exact()], [{"requests": ["other"], "matchAttribute": "a.b/c"}]),
        "is not a request of this claim",
    ),
    "unqualified attribute": (
        lambda: a_claim([exact()], [{"requests": ["gcus"], "matchAttribute": "pcieSwitch"}]),
        "must be fully qualified",
    ),
    "no class": (lambda: a_claim([{"name": "gcus", "exactly": {}}]), "deviceClassName"),
}


@pytest.mark.parametrize("case", list(CLAIM_REFUSALS))
def test_a_claim_breaking_a_1_36_rule_is_refused(case: str) -> None:
    build, cause = CLAIM_REFUSALS[case]
    with FakeApiServer() as fake:
        code, body = call(fake, "POST", CLAIMS, build())
        assert code == 422 and cause in body["message"], body
        assert fake.claims == {}


def test_a_claim_gets_its_defaults_a_version_and_an_immutable_spec() -> None:
    with FakeApiServer() as fake:
        written = a_claim([exact()])
        written["status"] = {"allocation": {"devices": {"results": []}}}
        code, stored = call(fake, "POST", CLAIMS, written)
        assert code == 201, stored
        assert stored["spec"]["devices"]["requests"][0]["exactly"] == {
            "deviceClassName": "gcu.enflame.com",
            "allocationMode": "ExactCount",
            "count": 1,
        }
        assert "status" not in stored  # a create never sets the status
        assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"]
        assert call(fake, "POST", CLAIMS, written)[0] == 409  # the name is taken
        changed = copy.deepcopy(stored)
        changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
        code, body = call(fake, "PUT", f"{CLAIMS}/c", changed)
        assert code == 422 and "spec: field is immutable" in body["message"]
        got = call(fake, "GET", f"{CLAIMS}/c")[1]
        assert got["spec"] == stored["spec"]


def test_a_server_without_prioritized_lists_drops_first_available_and_refuses_the_rest() -> None:
    claim = a_claim(
        [
            {
                "name": "gcus",
                "firstAvailable": [{"name": "a", "deviceClassName": "gcu.enflame.com"}],
            }
        ]
    )
    with FakeApiServer(gates={"DRAPrioritizedList": False}) as fake:
        code, body = call(fake, "POST", CLAIMS, claim)
        assert code == 422 and "exactly one of exactly, firstAvailable" in body["message"]
    with FakeApiServer() as fake:
        code, stored = call(fake, "POST", CLAIMS, claim)
        assert code == 201
        assert stored["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"] == 1


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        ({"extendedResourceName": "kubernetes.io/gcu"}, "is not an extended resource name"),
        ({"extendedResourceName": "gcu"}, "is not an extended resource name"),
        ({"selectors": [{"cel": {"expression": "true"}}] * 33}, "at most 32"),
        ({"selectors": [{"cel": {"expression": "x" * (10 * 1024 + 1)}}]}, "longer than 10240"),
        ({"config": [{"opaque": {"parameters": {}}}]}, "opaque.driver: required"),
    ],
)
def test_a_device_class_breaking_a_rule_is_refused(spec: dict[str, Any], cause: str) -> None:
    with FakeApiServer() as fake:
        code, body = call(fake, "POST", CLASSES, a_class(**spec))
        assert code == 422 and cause in body["message"], body


def test_extended_resource_name_is_kept_by_1_36_and_dropped_without_the_gate() -> None:
    with FakeApiServer() as fake:
        code, stored = call(fake, "POST", CLASSES, a_class(extendedResourceName="enflame.com/gcu"))
        assert code == 201 and stored["spec"]["extendedResourceName"] == "enflame.com/gcu"
    with FakeApiServer(gates={"DRAExtendedResource": False}) as fake:
        code, stored = call(fake, "POST", CLASSES, a_class(extendedResourceName="enflame.com/gcu"))
        assert code == 201 and "extendedResourceName" not in stored["spec"]


def test_the_shipped_device_classes_and_example_claims_are_accepted() -> None:
    documents: list[dict[str, Any]] = []
    for path in [
        os.path.join(slices_helpers.DRA_DEPLOY, "deviceclasses.yaml"),
        *sorted(glob.glob(os.path.join(slices_helpers.EXAMPLES, "*.yaml"))),
    ]:
        with open(path, encoding="utf-8") as handle:
            documents.extend(d for d in yaml.safe_load_all(handle) if d)
    with FakeApiServer() as fake:
        classes = claims = 0
        for document in documents:
            if document["kind"] == "DeviceClass":
                code, body = call(fake, "POST", CLASSES, document)
                classes += 1
            elif document["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                claim = {
                    "metadata": {"name": f"c{claims}"},
                    "spec": document["spec"].get("spec", document["spec"]),
                }
                code, body = call(fake, "POST", CLAIMS, claim)
                claims += 1
            else:
                continue
            assert code == 201, (document["metadata"]["name"], body.get("message"))
        assert classes >= 4 and claims >= 6
