"""The committed v1beta1 stubs: fresh, and exactly the API of SPEC §3."""

from __future__ import annotations

import os
import tempfile

import pytest

from enflame_gcu._proto import api_pb2, regenerate

# (message, field, number, type name or message) straight from the SPEC §3 table.
FIELDS = [
    ("DevicePluginOptions", "pre_start_required", 1, "bool"),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, "bool"),
    ("RegisterRequest", "version", 1, "string"),
    ("RegisterRequest", "endpoint", 2, "string"),
    ("RegisterRequest", "resource_name", 3, "string"),
    ("RegisterRequest", "options", 4, "DevicePluginOptions"),
    ("ListAndWatchResponse", "devices", 1, "Device"),
    ("Device", "ID", 1, "string"),
    ("Device", "health", 2, "string"),
    ("Device", "topology", 3, "TopologyInfo"),
    ("TopologyInfo", "nodes", 1, "NUMANode"),
    ("NUMANode", "ID", 1, "int64"),
    ("PreferredAllocationRequest", "container_requests", 1, "ContainerPreferredAllocationRequest"),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, "string"),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, "string"),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, "int32"),
    (
        "PreferredAllocationResponse",
        "container_responses",
        1,
        "ContainerPreferredAllocationResponse",
    ),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, "string"),
    ("AllocateRequest", "container_requests", 1, "ContainerAllocateRequest"),
    ("ContainerAllocateRequest", "devices_ids", 1, "string"),
    ("AllocateResponse", "container_responses", 1, "ContainerAllocateResponse"),
    ("ContainerAllocateResponse", "envs", 1, "EnvsEntry"),
    ("ContainerAllocateResponse", "mounts", 2, "Mount"),
    ("ContainerAllocateResponse", "devices", 3, "DeviceSpec"),
    ("ContainerAllocateResponse", "annotations", 4, "AnnotationsEntry"),
    ("ContainerAllocateResponse", "cdi_devices", 5, "CDIDevice"),
    ("Mount", "container_path", 1, "string"),
    ("Mount", "host_path", 2, "string"),
    ("Mount", "read_only", 3, "bool"),
    ("DeviceSpec", "container_path", 1, "string"),
    ("DeviceSpec", "host_path", 2, "string"),
    ("DeviceSpec", "permissions", 3, "string"),
    ("CDIDevice", "name", 1, "string"),
    ("PreStartContainerRequest", "devices_ids", 1, "string"),
]
SCALARS = {8: "bool", 9: "string", 3: "int64", 5: "int32"}


def test_committed_stubs_match_a_fresh_regeneration() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for path in regenerate.generate(tmp):
            name = os.path.basename(path)
            with open(path, encoding="utf-8") as fresh:
                committed_path = os.path.join(os.path.dirname(regenerate.__file__), name)
                with open(committed_path, encoding="utf-8") as committed:
                    assert committed.read() == fresh.read(), f"{name} is stale: run make proto"


def test_check_mode_reports_up_to_date_stubs() -> None:
    assert regenerate.main(["--check"]) == 0


def test_package_and_method_names_are_what_the_kubelet_calls() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    services = api_pb2.DESCRIPTOR.services_by_name
    assert [m.full_name for m in services["Registration"].methods] == [
        "v1beta1.Registration.Register"
    ]
    plugin = {m.name: m for m in services["DevicePlugin"].methods}
    assert sorted(plugin) == sorted(
        [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ]
    )
    assert plugin["ListAndWatch"].server_streaming
    assert not any(m.server_streaming for n, m in plugin.items() if n != "ListAndWatch")
    assert plugin["Allocate"].input_type.name == "AllocateRequest"


@pytest.mark.parametrize(("message", "name", "number", "kind"), FIELDS)
def test_field_numbers_and_types_follow_the_spec(
    message: str, name: str, number: int, kind: str
) -> None:
    field = api_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[name]
    assert field.number == number
    actual = field.message_type.name if field.message_type else SCALARS[field.type]
    assert actual == kind


def test_empty_messages_have_no_fields() -> None:
    for name in ("Empty", "PreStartContainerResponse"):
        assert api_pb2.DESCRIPTOR.message_types_by_name[name].fields == []
