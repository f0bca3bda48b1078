"""A client of the kubelet's PodResources API (v1): ``List`` and, where offered, allocatable.

``List`` exists from Kubernetes 1.20; ``GetAllocatableResources`` from 1.21 (behind a feature
gate until 1.23), so a kubelet that lacks it is normal: :attr:`Listing.allocatable` is then None
and :attr:`Listing.allocatable_note` says why. A missing socket or a kubelet that does not answer
is a :class:`~enflame_gcu.errors.KubeletApiError` naming the socket and the likely cause.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import grpc

from enflame_gcu import holders
from enflame_gcu._proto import podresources_v1_pb2, podresources_v1_pb2_grpc
from enflame_gcu.errors import KubeletApiError

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Listing:
    """One answer: who holds what, and the kubelet's allocatable devices when it tells."""

    holdings: tuple[holders.Holding, ...]
    # {resource: device IDs}; None when the kubelet does not offer GetAllocatableResources.
    allocatable: dict[str, tuple[str, ...]] | None
    allocatable_note: str = ""


def holdings_of(response: Any) -> tuple[holders.Holding, ...]:
    """A ``ListPodResourcesResponse`` flattened to one entry per container and resource, then
    one per container, DRA claim and driver (``dynamic_resources``, newer kubelets)."""
    plugin = tuple(
        holders.Holding(pod.namespace, pod.name, container.name, devices.resource_name, ids)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for ids in [tuple(devices.device_ids)]
    )
    claims: list[holders.Holding] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for dynamic in container.dynamic_resources:
                by_driver: dict[str, list[str]] = {}
                for item in dynamic.claim_resources:
                    by_driver.setdefault(item.driver_name, []).append(item.device_name)
                claim = f"{dynamic.claim_namespace}/{dynamic.claim_name}"
                claims.extend(
                    holders.Holding(pod.namespace, pod.name, container.name, driver, (*ids,), claim)
                    for driver, ids in by_driver.items()
                )
    return plugin + tuple(claims)


def allocatable_of(response: Any) -> dict[str, tuple[str, ...]]:
    """An ``AllocatableResourcesResponse`` as ``{resource: device IDs}``."""
    result: dict[str, list[str]] = {}
    for devices in response.devices:
        result.setdefault(devices.resource_name, []).extend(devices.device_ids)
    return {name: tuple(ids) for name, ids in result.items()}


def unavailable(socket_path: str, detail: str) -> KubeletApiError:
    """The error for a PodResources socket that cannot be used, naming the likely causes."""
    return KubeletApiError(
        f"the kubelet's PodResources API is not available at {socket_path}: {detail} (it needs "
        "Kubernetes 1.20 or later, and in a pod a hostPath mount of "
        f"{os.path.dirname(socket_path)})"
    )


def _rpc_error(socket_path: str, exc: grpc.RpcError) -> KubeletApiError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return unavailable(socket_path, f"nobody answers ({details})")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return unavailable(socket_path, "this kubelet has no PodResources v1 List")
    name = code.name if code is not None else "error"
    return KubeletApiError(f"PodResources List at {socket_path} failed: {name}: {details}")


def _allocatable_refused(exc: grpc.RpcError) -> str | None:
    """Why the kubelet does not offer GetAllocatableResources, or None when it is a real error."""
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "this kubelet has no GetAllocatableResources (Kubernetes < 1.21)"
    return f"GetAllocatableResources refused: {details}"


def list_resources(
    socket_path: str = SOCKET, timeout: float = TIMEOUT, *, allocatable: bool = True
) -> Listing:
    """Call ``List`` (and ``GetAllocatableResources`` when ``allocatable``), synchronously."""
    if not os.path.exists(socket_path):
        raise unavailable(socket_path, "the socket does not exist")
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = podresources_v1_pb2_grpc.PodResourcesListerStub(channel)
        try:
            listed = stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise _rpc_error(socket_path, exc) from exc
        if not allocatable:
            return Listing(holdings_of(listed), None, "not asked")
        request = podresources_v1_pb2.AllocatableResourcesRequest()
        try:
            answer = stub.GetAllocatableResources(request, timeout=timeout)
        except grpc.RpcError as exc:
            note = _allocatable_refused(exc)
            if note is None:
                raise _rpc_error(socket_path, exc) from exc
            return Listing(holdings_of(listed), None, note)
    return Listing(holdings_of(listed), allocatable_of(answer))


class Client:
    """An asyncio client on one long-lived channel (the plugin polls it)."""

    def __init__(self, socket_path: str = SOCKET, timeout: float = TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._allocatable_offered = True
        self._socket: tuple[int, int] | None = None

    async def list_resources(self) -> Listing:
        """``List``, plus ``GetAllocatableResources`` while the kubelet offers it."""
        try:
            info = os.stat(self.socket_path)
        except OSError as exc:
            await self.close()
            raise unavailable(self.socket_path, "the socket does not exist") from exc
        if (info.st_dev, info.st_ino) != self._socket:
            await self.close()  # a new kubelet: dial it afresh and ask what it offers
            self._socket = (info.st_dev, info.st_ino)
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket_path}")
            self._stub = podresources_v1_pb2_grpc.PodResourcesListerStub(self._channel)
            self._allocatable_offered = True  # a new kubelet may offer it
        try:
            listed = await self._stub.List(
                podresources_v1_pb2.ListPodResourcesRequest(), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise _rpc_error(self.socket_path, exc) from exc
        allocatable, note = None, "this kubelet has no GetAllocatableResources"
        if self._allocatable_offered:
            request = podresources_v1_pb2.AllocatableResourcesRequest()
            try:
                answer = await self._stub.GetAllocatableResources(request, timeout=self.timeout)
                allocatable, note = allocatable_of(answer), ""
            except grpc.aio.AioRpcError as exc:
                refused = _allocatable_refused(exc)
                if refused is None:
                    await self.close()
                    raise _rpc_error(self.socket_path, exc) from exc
                self._allocatable_offered, note = False, refused
        return Listing(holdings_of(listed), allocatable, note)

    async def close(self) -> None:
        """Drop the channel (the next call dials again)."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None
