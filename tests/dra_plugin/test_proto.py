"""The DRA driver's committed stubs: exactly the wire API of DRA.md §1-3, all in one pool."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pool

from enflame_gcu._proto import (
    api_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    drahealth_v1_pb2,
    drahealth_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)

SCALARS = {8: "bool", 9: "string", 3: "int64", 5: "int32", 14: "enum"}
REGISTRATION = [
    ("PluginInfo", "type", 1, "string"),
    ("PluginInfo", "name", 2, "string"),
    ("PluginInfo", "endpoint", 3, "string"),
    ("PluginInfo", "supported_versions", 4, "string"),
    ("RegistrationStatus", "plugin_registered", 1, "bool"),
    ("RegistrationStatus", "error", 2, "string"),
]
DRA = [
    ("NodePrepareResourcesRequest", "claims", 1, "Claim"),
    ("NodePrepareResourcesResponse", "claims", 1, "ClaimsEntry"),
    ("NodePrepareResourceResponse", "devices", 1, "Device"),
    ("NodePrepareResourceResponse", "error", 2, "string"),
    ("Device", "request_names", 1, "string"),
    ("Device", "pool_name", 2, "string"),
    ("Device", "device_name", 3, "string"),
    ("Device", "cdi_device_ids", 4, "string"),
    ("NodeUnprepareResourcesRequest", "claims", 1, "Claim"),
    ("NodeUnprepareResourcesResponse", "claims", 1, "ClaimsEntry"),
    ("NodeUnprepareResourceResponse", "error", 1, "string"),
    ("Claim", "namespace", 1, "string"),
    ("Claim", "uid", 2, "string"),
    ("Claim", "name", 3, "string"),
]
HEALTH = [
    ("NodeWatchResourcesResponse", "devices", 1, "DeviceHealth"),
    ("DeviceHealth", "device", 1, "DeviceIdentifier"),
    ("DeviceHealth", "health", 2, "enum"),
    ("DeviceHealth", "last_updated_time", 3, "int64"),
    ("DeviceHealth", "health_check_timeout_seconds", 4, "int64"),
    ("DeviceHealth", "message", 5, "string"),
    ("DeviceIdentifier", "pool_name", 1, "string"),
    ("DeviceIdentifier", "device_name", 2, "string"),
]
CASES = (
    [(pluginregistration_v1_pb2, *row) for row in REGISTRATION]
    + [(module, *row) for module in (dra_v1_pb2, dra_v1beta1_pb2) for row in DRA]
    + [(module, *row) for module in (drahealth_v1_pb2, drahealth_v1alpha1_pb2) for row in HEALTH]
)


def _kind(field: Any) -> str:
    return str(field.message_type.name) if field.message_type else SCALARS[field.type]


@pytest.mark.parametrize(("module", "message", "name", "number", "kind"), CASES)
def test_field_numbers_and_types_follow_the_facts(
    module: Any, message: str, name: str, number: int, kind: str
) -> None:
    field = module.DESCRIPTOR.message_types_by_name[message].fields_by_name[name]
    assert (field.number, _kind(field)) == (number, kind)


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (
            pluginregistration_v1_pb2,
            "pluginregistration.Registration",
            {"GetInfo": False, "NotifyRegistrationStatus": False},
        ),
        (
            dra_v1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            {"NodePrepareResources": False, "NodeUnprepareResources": False},
        ),
        (
            dra_v1beta1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            {"NodePrepareResources": False, "NodeUnprepareResources": False},
        ),
        (drahealth_v1_pb2, "v1.DRAResourceHealth", {"NodeWatchResources": True}),
        (drahealth_v1alpha1_pb2, "v1alpha1.DRAResourceHealth", {"NodeWatchResources": True}),
    ],
)
def test_services_carry_the_full_names_the_kubelet_calls(
    module: Any, service: str, methods: dict[str, bool]
) -> None:
    found = next(s for s in module.DESCRIPTOR.services_by_name.values() if s.full_name == service)
    assert {m.name: m.server_streaming for m in found.methods} == methods


def test_share_id_exists_in_v1_only_and_is_optional() -> None:
    field = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert (field.number, field.has_presence) == (5, True)
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name


def test_health_enum_values() -> None:
    for module in (drahealth_v1_pb2, drahealth_v1alpha1_pb2):
        assert dict(module.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_every_stub_lives_in_one_pool_under_a_distinct_file_name() -> None:
    modules = [
        api_pb2,
        pluginregistration_v1_pb2,
        dra_v1_pb2,
        dra_v1beta1_pb2,
        drahealth_v1_pb2,
        drahealth_v1alpha1_pb2,
    ]
    names = [module.DESCRIPTOR.name for module in modules]
    assert len(set(names)) == len(names)
    pool = descriptor_pool.Default()
    for name in names:
        assert pool.FindFileByName(name).name == name
    assert all(name.startswith("enflame_gcu/_proto/") for name in names)


def test_empty_messages_have_no_fields() -> None:
    assert pluginregistration_v1_pb2.InfoRequest.DESCRIPTOR.fields == []
    assert pluginregistration_v1_pb2.RegistrationStatusResponse.DESCRIPTOR.fields == []
    assert drahealth_v1_pb2.NodeWatchResourcesRequest.DESCRIPTOR.fields == []
