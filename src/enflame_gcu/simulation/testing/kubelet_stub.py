"""A kubelet stand-in that speaks v1beta1 the way the real kubelet does (SPEC §3).

It serves Registration on ``<dir>/kubelet.sock``; inside Register it dials the plugin (10 s
timeout), reads its options and keeps ListAndWatch open. Pods are admitted per container:
GetPreferredAllocation only when there is a choice, then Allocate. ``restart()`` deletes every
socket in the dir and re-creates ``kubelet.sock``, as a kubelet restart does.

Like a current kubelet, a new registration does not close an older connection for the same
resource, and whenever *any* ListAndWatch stream of a resource ends, the resource's current
devices turn Unhealthy and its current endpoint counts as stopped (Allocate refused) until the
next registration: the kubelet's disconnect handling is keyed by resource name, not by
connection. ``stream_ends`` and ``history`` record what a kubelet log and the node's
allocatable would have shown.

With ``pod_resources_socket`` it also serves the PodResources API (v1 ``List``; and
``GetAllocatableResources`` unless ``allocatable_api=False``, which stands for a 1.20 kubelet)
from the pods it admitted, for as long as it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from enflame_gcu._proto import (
    api_pb2,
    api_pb2_grpc,
    podresources_v1_pb2,
    podresources_v1_pb2_grpc,
)

log = logging.getLogger(__name__)
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_RESOURCE = "enflame.com/gcu"


class AdmissionError(Exception):
    """The stub could not admit a pod (too few devices, or the plugin refused)."""


@dataclass(frozen=True, slots=True)
class Registration:
    """One successful Register call."""

    resource_name: str
    endpoint: str
    at: float


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """A ListAndWatch stream that ended ("ListAndWatch ended unexpectedly" in a kubelet log)."""

    resource_name: str
    endpoint: str
    at: float


@dataclass(frozen=True, slots=True)
class Allocatable:
    """The healthy-device count of a resource at one moment (one entry per change)."""

    resource_name: str
    healthy: int
    at: float


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container got: device IDs, Allocate answer, whether a preference was asked."""

    device_ids: tuple[str, ...]
    response: Any
    asked_preference: bool


@dataclass(slots=True)
class PluginConnection:
    """The kubelet's side of one registered plugin."""

    resource_name: str
    endpoint: str
    options: Any
    channel: Any
    stub: Any
    devices: dict[str, str] = field(default_factory=dict)
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)
    stream_open: bool = False
    lists_received: int = 0
    stopped: bool = False
    task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        """Drop the stream and the channel, as a dying kubelet would."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close()


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStub) -> None:
        self._kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:
        return await self._kubelet._register(request, context)


class _PodResources(podresources_v1_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletStub, allocatable_api: bool) -> None:
        self._kubelet = kubelet
        self._allocatable_api = allocatable_api

    async def List(self, request: Any, context: Any) -> Any:
        return self._kubelet.pod_resources()

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        if not self._allocatable_api:  # what a 1.20 kubelet answers
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        answer = podresources_v1_pb2.AllocatableResourcesResponse()
        for name in self._kubelet.plugins:
            answer.devices.add(resource_name=name, device_ids=self._kubelet.allocatable(name))
        return answer


class KubeletStub:
    """The kubelet's device-manager behaviour, over real unix sockets."""

    def __init__(
        self,
        plugin_dir: str,
        *,
        dial_timeout: float = 10.0,
        pod_resources_socket: str | None = None,
        allocatable_api: bool = True,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.dial_timeout = dial_timeout
        self.pod_resources_socket = pod_resources_socket
        self.allocatable_api = allocatable_api
        self._pod_namespace: dict[str, str] = {}
        self.registrations: list[Registration] = []
        self.stream_ends: list[StreamEnd] = []
        self.history: list[Allocatable] = []
        self.plugins: dict[str, PluginConnection] = {}
        self._connections: list[PluginConnection] = []
        self.pods: dict[str, dict[str, ContainerAllocation]] = {}
        # DRA claims by (namespace, pod) and container: PodResources dynamic_resources.
        self.dra_claims: dict[
            tuple[str, str], dict[str, list[tuple[tuple[str, str], list[tuple[str, str]]]]]
        ] = {}
        self._pod_resource: dict[str, str] = {}
        self._server: Any = None
        self._changed = asyncio.Event()

    @property
    def socket_path(self) -> str:
        """``<dir>/kubelet.sock``."""
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)

    def _notify(self) -> None:
        for name, plugin in self.plugins.items():
            healthy = sum(1 for h in plugin.devices.values() if h == "Healthy")
            last = next((a for a in reversed(self.history) if a.resource_name == name), None)
            if last is None or last.healthy != healthy:
                self.history.append(Allocatable(name, healthy, time.monotonic()))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def start(self) -> None:
        """Serve Registration on kubelet.sock."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        if self.pod_resources_socket is not None:
            os.makedirs(os.path.dirname(self.pod_resources_socket), exist_ok=True)
            podresources_v1_pb2_grpc.add_PodResourcesListerServicer_to_server(
                _PodResources(self, self.allocatable_api), server
            )
            server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        for plugin in list(self._connections):
            await plugin.close()
        self._connections.clear()
        for path in (self.socket_path, self.pod_resources_socket):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._notify()

    async def restart(self, *, every_file: bool = False) -> None:
        """A kubelet restart: stop, delete every socket in the dir, serve kubelet.sock anew.

        ``every_file``: delete every file but the kubelet's checkpoint, as older kubelets (1.20)
        do (their device manager's ``removeContents``)."""
        await self.stop()
        for plugin in self.plugins.values():
            plugin.devices = dict.fromkeys(plugin.devices, "Unhealthy")
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(path).st_mode
                if stat.S_ISSOCK(mode) or (
                    every_file and not stat.S_ISDIR(mode) and name != "kubelet_internal_checkpoint"
                ):
                    os.unlink(path)
        await self.start()

    async def __aenter__(self) -> KubeletStub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unsupported API version {request.version!r}; this kubelet speaks v1beta1",
            )
        domain, _, name = request.resource_name.partition("/")
        if not name or "." not in domain or domain == "kubernetes.io":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid resource name {request.resource_name!r}",
            )
        endpoint = os.path.join(self.plugin_dir, request.endpoint)
        channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            await asyncio.wait_for(channel.channel_ready(), self.dial_timeout)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=self.dial_timeout)
        except (asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
            await channel.close()
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"cannot reach the plugin at {endpoint}: {exc!r}"
            )
        plugin = PluginConnection(request.resource_name, request.endpoint, options, channel, stub)
        plugin.task = asyncio.ensure_future(self._watch(plugin))
        self.plugins[request.resource_name] = plugin
        self._connections.append(plugin)
        self.registrations.append(
            Registration(request.resource_name, request.endpoint, time.monotonic())
        )
        self._notify()
        return api_pb2.Empty()

    async def _watch(self, plugin: PluginConnection) -> None:
        call = plugin.stub.ListAndWatch(api_pb2.Empty())
        plugin.stream_open = True
        try:
            async for response in call:
                plugin.devices = {d.ID: d.health for d in response.devices}
                plugin.numa = {
                    d.ID: tuple(n.ID for n in d.topology.nodes) for d in response.devices
                }
                plugin.lists_received += 1
                self._notify()
        except grpc.aio.AioRpcError as exc:
            log.debug("ListAndWatch of %s ended: %s", plugin.resource_name, exc.code())
        finally:
            call.cancel()
            plugin.stream_open = False
            with contextlib.suppress(ValueError):
                self._connections.remove(plugin)
            if self._server is not None:  # a dying kubelet logs nothing about its own streams
                self.stream_ends.append(
                    StreamEnd(plugin.resource_name, plugin.endpoint, time.monotonic())
                )
            # Whichever connection ended, the resource's current endpoint is marked.
            current = self.plugins.get(plugin.resource_name, plugin)
            for marked in {id(plugin): plugin, id(current): current}.values():
                marked.devices = dict.fromkeys(marked.devices, "Unhealthy")
                marked.stopped = True
            self._notify()

    # --- what the node looks like to the scheduler -------------------------------------------

    def devices(self, resource: str = DEFAULT_RESOURCE) -> dict[str, str]:
        """``{device ID: health}`` as last listed by the plugin."""
        plugin = self.plugins.get(resource)
        return dict(plugin.devices) if plugin else {}

    def capacity(self, resource: str = DEFAULT_RESOURCE) -> int:
        """Node capacity: every listed device."""
        return len(self.devices(resource))

    def allocatable(self, resource: str = DEFAULT_RESOURCE) -> list[str]:
        """Healthy devices, in the plugin's order."""
        return [d for d, h in self.devices(resource).items() if h == "Healthy"]

    def in_use(self, resource: str = DEFAULT_RESOURCE) -> set[str]:
        """Devices held by active pods."""
        return {
            d
            for pod, containers in self.pods.items()
            if self._pod_resource[pod] == resource
            for c in containers.values()
            for d in c.device_ids
        }

    def free(self, resource: str = DEFAULT_RESOURCE) -> list[str]:
        """Healthy devices no pod holds."""
        held = self.in_use(resource)
        return [d for d in self.allocatable(resource) if d not in held]

    async def wait_for(
        self, predicate: Callable[[KubeletStub], bool], timeout: float = 10.0, what: str = ""
    ) -> None:
        """Wait until ``predicate(self)`` holds; TimeoutError describes the state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"waited {timeout}s for {what or 'a condition'}; devices "
                    f"{ {r: p.devices for r, p in self.plugins.items()} }, "
                    f"registrations {len(self.registrations)}"
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    # --- pods ---------------------------------------------------------------------------------

    async def allocate_pod(
        self,
        name: str,
        containers: Mapping[str, int],
        resource: str = DEFAULT_RESOURCE,
        namespace: str = "default",
    ) -> dict[str, ContainerAllocation]:
        """Admit a pod: per container choose devices (asking a preference when there is a
        choice) and call Allocate; AdmissionError when that fails."""
        if name in self.pods:
            raise AdmissionError(f"pod {name} already exists")
        self._pod_namespace[name] = namespace
        plugin = self.plugins.get(resource)
        if plugin is None:
            raise AdmissionError(f"no plugin registered for {resource}")
        if plugin.stopped:
            raise AdmissionError(f"endpoint of {resource} is stopped")
        result: dict[str, ContainerAllocation] = {}
        self.pods[name], self._pod_resource[name] = result, resource
        try:
            for container, size in containers.items():
                result[container] = await self._allocate_container(plugin, resource, size)
        except BaseException:
            self.delete_pod(name)
            raise
        self._notify()
        return result

    async def _allocate_container(
        self, plugin: PluginConnection, resource: str, size: int
    ) -> ContainerAllocation:
        available = self.free(resource)
        if size > len(available):
            raise AdmissionError(
                f"asked for {size} {resource} but only {len(available)} free: {available}"
            )
        chosen, asked = available[:size], False
        if size < len(available) and plugin.options.get_preferred_allocation_available:
            asked = True
            request = api_pb2.PreferredAllocationRequest()
            request.container_requests.add(available_deviceIDs=available, allocation_size=size)
            try:
                answer = await plugin.stub.GetPreferredAllocation(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                raise AdmissionError(f"GetPreferredAllocation failed: {exc.details()}") from exc
            preferred = [d for d in answer.container_responses[0].deviceIDs if d in available]
            # Advisory: keep what is valid, fill up from the rest in order (kubelet behaviour).
            chosen = (preferred + [d for d in available if d not in preferred])[:size]
        allocate = api_pb2.AllocateRequest()
        allocate.container_requests.add(devices_ids=chosen)
        try:
            response = await plugin.stub.Allocate(allocate, timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise AdmissionError(f"Allocate failed: {exc.details()}") from exc
        return ContainerAllocation(tuple(chosen), response.container_responses[0], asked)

    def delete_pod(self, name: str) -> None:
        """Forget a pod: its devices are free again (the plugin is not told, as in Kubernetes)."""
        self.pods.pop(name, None)
        self._pod_resource.pop(name, None)
        self._pod_namespace.pop(name, None)
        self._notify()

    def add_dra_claim(
        self,
        pod: str,
        container: str,
        claim: tuple[str, str],
        devices: list[tuple[str, str]],
        namespace: str = "default",
    ) -> None:
        """A pod's container uses a DRA claim (``(namespace, name)``) holding ``(driver,
        device)`` pairs: what a newer kubelet lists in ``dynamic_resources``."""
        self.dra_claims.setdefault((namespace, pod), {}).setdefault(container, []).append(
            (claim, devices)
        )

    def pod_resources(self) -> Any:
        """The PodResources ``List`` answer for the admitted pods."""
        answer = podresources_v1_pb2.ListPodResourcesResponse()
        for pod, containers in self.pods.items():
            entry = answer.pod_resources.add(
                name=pod, namespace=self._pod_namespace.get(pod, "default")
            )
            for container, allocation in containers.items():
                held = entry.containers.add(name=container)
                if allocation.device_ids:
                    held.devices.add(
                        resource_name=self._pod_resource[pod],
                        device_ids=list(allocation.device_ids),
                    )
        for (namespace, pod), uses in self.dra_claims.items():
            entry = answer.pod_resources.add(name=pod, namespace=namespace)
            for container, claims in uses.items():
                held = entry.containers.add(name=container)
                for (claim_namespace, claim_name), devices in claims:
                    dynamic = held.dynamic_resources.add(
                        claim_name=claim_name, claim_namespace=claim_namespace
                    )
                    for driver, device in devices:
                        dynamic.claim_resources.add(
                            driver_name=driver, pool_name="node", device_name=device
                        )
        return answer
