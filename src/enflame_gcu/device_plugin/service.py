"""The DevicePlugin servicer: translates v1beta1 messages to domain calls and back, nothing more.

Request errors become ``INVALID_ARGUMENT`` and node-state errors ``FAILED_PRECONDITION``, each
with a message naming the bad and the valid IDs; nothing escapes as an UNKNOWN traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import grpc

from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import resources
from enflame_gcu.device_plugin import state as plugin_state
from enflame_gcu.errors import EnflameError, InvalidRequestError

log = logging.getLogger(__name__)
T = TypeVar("T")
DEVICE_SPEC_PERMISSIONS = "rw"
# What every RPC handler is given: the aio context of one call (request and response types vary).
Context = grpc.aio.ServicerContext[object, object]


def options() -> api_pb2.DevicePluginOptions:
    """The options we advertise in Register and GetDevicePluginOptions (they must agree)."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


def device_list(snapshot: plugin_state.Snapshot) -> api_pb2.ListAndWatchResponse:
    """A ListAndWatchResponse with every device of the snapshot."""
    result = api_pb2.ListAndWatchResponse()
    for device in snapshot.devices():
        entry = result.devices.add(ID=device.id, health=device.health)
        if device.numa_node is not None:
            entry.topology.nodes.add(ID=device.numa_node)
    return result


def container_response(grant: resources.Grant) -> api_pb2.ContainerAllocateResponse:
    """One ContainerAllocateResponse from one container's grant (DeviceSpecs when it has nodes)."""
    given = grant.edits
    response = api_pb2.ContainerAllocateResponse(
        envs=dict(given.env), annotations=dict(given.annotations)
    )
    for mount in given.mounts:
        response.mounts.add(
            container_path=mount.container_path,
            host_path=mount.host_path,
            read_only=mount.read_only,
        )
    for name in grant.cdi_devices:
        response.cdi_devices.add(name=name)
    for node in given.device_nodes:
        response.devices.add(
            container_path=node.path,
            host_path=node.host_path,
            permissions=DEVICE_SPEC_PERMISSIONS,
        )
    return response


def _log_choice(
    snapshot: plugin_state.Snapshot,
    index: int,
    *,
    available: list[str],
    required: list[str],
    size: int,
    chosen: list[str],
) -> None:
    """One debug line per preferred allocation: inputs, choice, policy and locality."""
    log.debug(
        "GetPreferredAllocation container %d: available %s; must-include %s; size %d: "
        "chose %s by policy %s: %s",
        index,
        plugin_state.show_ids(available, plugin_state.MAX_LISTED),
        plugin_state.show_ids(required, plugin_state.MAX_LISTED),
        size,
        plugin_state.show_ids(chosen, plugin_state.MAX_LISTED),
        snapshot.policy.name,
        resources.explain(snapshot.kind, chosen),
    )


class PluginObserver(Protocol):
    """Told about RPC outcomes, streams and registrations (metrics and probes)."""

    def allocated(self, resource: str, containers: list[list[str]]) -> None:
        """A successful Allocate: the device IDs of each container."""

    def refused(self, resource: str, code: str) -> None:
        """A refused Allocate and its status code name."""

    def preferred_chosen(self, resource: str, ids: Sequence[str]) -> None:
        """GetPreferredAllocation chose ``ids`` for one container."""

    def rpc_done(self, rpc: str, resource: str, code: str, seconds: float) -> None:
        """An RPC finished with a status code name after ``seconds``."""

    def stream(self, resource: str, delta: int) -> None:
        """A ListAndWatch stream opened (+1) or ended (-1)."""

    def registered_with(self, resource: str, cause: str) -> None:
        """Register succeeded (cause: start, kubelet_restart, socket_lost, ...)."""

    def unregistered(self, resource: str) -> None:
        """The registration is gone."""


async def _guard(
    rpc: str,
    context: Context,
    work: Callable[[], Awaitable[T]],
    on_error: Callable[[str], None] | None = None,
    timed: Callable[[str, float], None] | None = None,
) -> T:
    """Run an RPC body, turning our errors into explicit status codes; time it for ``timed``."""
    started = time.perf_counter()
    try:
        result = await work()
    except InvalidRequestError as exc:
        log.warning("%s rejected: %s", rpc, exc)
        code, message = grpc.StatusCode.INVALID_ARGUMENT, f"{rpc}: {exc}"
    except EnflameError as exc:
        log.warning("%s failed: %s", rpc, exc)
        code, message = grpc.StatusCode.FAILED_PRECONDITION, f"{rpc}: {exc}"
    except Exception as exc:
        # A bug: say so plainly instead of letting gRPC answer UNKNOWN with a traceback.
        log.exception("%s failed unexpectedly", rpc)
        code, message = grpc.StatusCode.INTERNAL, f"{rpc}: internal error: {exc!r}"
    else:
        if timed is not None:
            timed("OK", time.perf_counter() - started)
        return result
    if on_error is not None:
        on_error(code.name)
    if timed is not None:
        timed(code.name, time.perf_counter() - started)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource's devices from a :class:`~state.PluginState`."""

    def __init__(
        self,
        state: plugin_state.PluginState,
        config: plugin_config.PluginConfig,
        resource_name: str = "",
        observer: PluginObserver | None = None,
    ):
        self._state = state
        self._config = config
        self._resource = resource_name or config.resource_name
        self._observer = observer
        self._stopping = asyncio.Event()
        self.streams = 0  # ListAndWatch streams open now (the kubelet's connection is alive)

    def reconfigure(self, config: plugin_config.PluginConfig) -> None:
        """Answer with a new config from now on (SIGHUP; the state object stays the same)."""
        self._config = config

    def _timer(self, rpc: str) -> Callable[[str, float], None] | None:
        observer = self._observer
        if observer is None:
            return None
        resource = self._resource

        def timed(code: str, seconds: float) -> None:
            observer.rpc_done(rpc, resource, code, seconds)

        return timed

    def stop_streams(self) -> None:
        """End every ListAndWatch stream of this server (shutdown or re-registration)."""
        self._stopping.set()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        """The options: preferred allocation available, no PreStartContainer."""
        return options()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """The full device list now and after every change, until the server stops."""
        snapshot = self._state.snapshot
        if self._observer is not None:
            self._observer.stream(self._resource, +1)
        self.streams += 1
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            yield device_list(snapshot)
            while not self._stopping.is_set():
                change = asyncio.ensure_future(self._state.changed(snapshot.generation))
                await asyncio.wait({change, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not change.done():
                    change.cancel()
                    break
                snapshot = change.result()
                yield device_list(snapshot)
        finally:
            stop.cancel()
            self.streams -= 1
            if self._observer is not None:
                self._observer.stream(self._resource, -1)
        log.debug("ListAndWatch stream ended")

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        """Per container: ``allocation_size`` IDs from ``available`` with every must-include."""

        async def work() -> api_pb2.PreferredAllocationResponse:
            snapshot = self._state.snapshot
            response = api_pb2.PreferredAllocationResponse()
            plugin_state.check_size(snapshot, request.container_requests, "container requests")
            for index, req in enumerate(request.container_requests):
                available = list(req.available_deviceIDs)
                required = list(req.must_include_deviceIDs)
                try:
                    plugin_state.check_size(snapshot, available, "available device IDs")
                    plugin_state.check_size(snapshot, required, "must-include device IDs")
                    plugin_state.check_known(snapshot, available + required)
                    chosen = snapshot.policy.choose(available, required, req.allocation_size)
                except InvalidRequestError as exc:
                    raise type(exc)(f"container request {index}: {exc}") from exc
                if log.isEnabledFor(logging.DEBUG):
                    _log_choice(
                        snapshot,
                        index,
                        available=available,
                        required=required,
                        size=req.allocation_size,
                        chosen=chosen,
                    )
                response.container_responses.add(deviceIDs=chosen)
                if self._observer is not None:
                    self._observer.preferred_chosen(self._resource, chosen)
            return response

        rpc = "GetPreferredAllocation"
        return await _guard(rpc, context, work, timed=self._timer(rpc))

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Context
    ) -> api_pb2.AllocateResponse:
        """Per container: the edits naming its devices; the whole request or nothing."""

        async def work() -> api_pb2.AllocateResponse:
            snapshot = self._state.snapshot
            if not request.container_requests:
                raise InvalidRequestError("no container requests")
            plugin_state.check_size(snapshot, request.container_requests, "container requests")
            requests = [list(req.devices_ids) for req in request.container_requests]
            grants = plugin_state.grants(snapshot, requests, self._config)
            log.info("Allocate %s", " | ".join(",".join(ids) for ids in requests))
            if self._observer is not None:
                self._observer.allocated(self._resource, requests)
            responses = [container_response(grant) for grant in grants]
            return api_pb2.AllocateResponse(container_responses=responses)

        def refused(code: str) -> None:
            if self._observer is not None:
                self._observer.refused(self._resource, code)

        return await _guard("Allocate", context, work, refused, self._timer("Allocate"))

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        """Nothing to do before a container starts (not required in our options)."""
        return api_pb2.PreStartContainerResponse()
