"""A client of the kubelet's PodResources API (``v1.PodResourcesLister/List``).

The message types are built at import time from a descriptor written out below (the fields of
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` as of Kubernetes 1.20), so no generated
code is committed for what only tests use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"

_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    # message: [(field, number, type, label, type_name)]
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [
        ("pod_resources", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".v1.PodResources")
    ],
    "PodResources": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("namespace", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("containers", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".v1.ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("devices", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".v1.ContainerDevices"),
        ("cpu_ids", 3, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("device_ids", 2, _F.TYPE_STRING, _F.LABEL_REPEATED, ""),
        ("topology", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".v1.TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".v1.NUMANode")],
    "NUMANode": [("ID", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "")],
}


def _build() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="enflame_testing/podresources_v1.proto", package="v1", syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            entry = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                entry.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _build()


@dataclass(frozen=True, slots=True)
class Holding:
    """One container's devices of one resource, as the kubelet reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def list_holdings(socket_path: str = SOCKET, timeout: float = 10.0) -> list[Holding]:
    """Call ``List`` and flatten the answer to one entry per container and resource."""
    request = _CLASSES["ListPodResourcesRequest"]()
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=_CLASSES["ListPodResourcesResponse"].FromString,
        )
        response = call(request, timeout=timeout)
    return [
        Holding(pod.namespace, pod.name, container.name, devices.resource_name, tuple(ids))
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for ids in [devices.device_ids]
    ]
