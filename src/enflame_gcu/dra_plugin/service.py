"""gRPC servicers of the DRA driver: registration, DRA v1/v1beta1 and health v1/v1alpha1.

They only translate between proto messages and :mod:`driver` / :mod:`node` (DESIGN 1). Per-claim
failures go into the response's ``error`` field; nothing is raised to the kubelet, because a
gRPC error would fail every claim of the call (DRA.md §2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from enflame_gcu._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from enflame_gcu.dra_plugin import claims, driver, node

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# Newest first; the kubelet takes the first DRA service it knows (DRA.md §1).
SUPPORTED_SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
MAX_HEALTH_MESSAGE = 1024
HEALTH_TIMEOUT_SECONDS = 30
# The kubelet stamps each device with the time it *received* the last report and reads it as
# Unknown once that is older than the timeout (DRA.md §3), so the full list goes out again every
# third of the timeout even when nothing changed: one report may be lost or late (a busy event
# loop, a slow kubelet) and the next still arrives inside the timeout.
HEALTH_RESEND_FRACTION = 3


def health_resend_seconds() -> float:
    """How often the unchanged list is sent again (read at call time: tests shorten the timeout)."""
    return HEALTH_TIMEOUT_SECONDS / HEALTH_RESEND_FRACTION


def _refs(request: Any) -> list[claims.ClaimRef]:
    return [claims.ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


def prepare_response(pb2: Any, outcomes: Mapping[str, driver.Outcome], with_share_id: bool) -> Any:
    """A NodePrepareResourcesResponse of module ``pb2`` for the driver's outcomes."""
    response = pb2.NodePrepareResourcesResponse()
    for uid, outcome in outcomes.items():
        entry = response.claims[uid]
        if isinstance(outcome, str):
            entry.error = outcome
            continue
        for result in outcome:
            device = entry.devices.add(
                request_names=[result.request],
                pool_name=result.pool,
                device_name=result.device,
                cdi_device_ids=list(result.cdi_ids),
            )
            if with_share_id and result.share_id:
                device.share_id = result.share_id
    return response


def unprepare_response(pb2: Any, errors: Mapping[str, str]) -> Any:
    """A NodeUnprepareResourcesResponse with an entry for every claim."""
    response = pb2.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        response.claims[uid].error = error
    return response


class _DraService:
    pb2: Any = None
    with_share_id = False

    def __init__(self, prepare_driver: driver.Driver) -> None:
        self._driver = prepare_driver

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        remaining = context.time_remaining()  # None: the caller set no deadline
        deadline = None if remaining is None else time.monotonic() + remaining
        outcomes = await self._driver.prepare(_refs(request), deadline)
        return prepare_response(self.pb2, outcomes, self.with_share_id)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        errors = await self._driver.unprepare(_refs(request))
        return unprepare_response(self.pb2, errors)


class DraV1Service(_DraService, dra_v1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    pb2 = dra_v1_pb2
    with_share_id = True


class DraV1Beta1Service(_DraService, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (kubelets 1.32-1.33)."""

    pb2 = dra_v1beta1_pb2


def health_response(pb2: Any, pool: str, health: list[node.DeviceHealth]) -> Any:
    """A NodeWatchResourcesResponse carrying the complete list."""
    response = pb2.NodeWatchResourcesResponse()
    for item in health:
        message = item.reason.encode("utf-8")[:MAX_HEALTH_MESSAGE].decode("utf-8", "ignore")
        response.devices.add(
            device=pb2.DeviceIdentifier(pool_name=pool, device_name=item.name),
            health=pb2.HEALTHY if item.healthy else pb2.UNHEALTHY,
            last_updated_time=item.since or int(time.time()),
            health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
            message=message,
        )
    return response


class HealthStreams:
    """Streams the node's device health: the full list now, after every change and again every
    :func:`health_resend_seconds` (``last_updated_time`` stays the time a device's health last
    changed: a resend confirms the state, it does not change it)."""

    def __init__(self, devices: node.NodeDevices, pool: str) -> None:
        self._devices = devices
        self._pool = pool
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """End every open stream (shutdown)."""
        self._stopping.set()

    async def watch(self, pb2: Any) -> AsyncIterator[Any]:
        """Yield responses until the stream is cancelled or :meth:`stop` is called."""
        seen = -1
        loop = asyncio.get_running_loop()
        due = 0.0
        while not self._stopping.is_set():
            if self._devices.version != seen or loop.time() >= due:
                seen = self._devices.version
                due = loop.time() + health_resend_seconds()
                yield health_response(pb2, self._pool, self._devices.device_health())
            waiter = asyncio.ensure_future(self._devices.changed(seen))
            stopper = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait(
                    [waiter, stopper],
                    timeout=max(0.0, due - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for task in (waiter, stopper):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task


class HealthV1Service(drahealth_v1_pb2_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self._streams.watch(drahealth_v1_pb2):
            yield response


class HealthV1Alpha1Service(drahealth_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self._streams.watch(drahealth_v1alpha1_pb2):
            yield response


class RegistrationService(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher: who we are and where the DRA service listens."""

    def __init__(
        self, driver_name: str, endpoint: str, on_status: Callable[[bool, str], None]
    ) -> None:
        self._driver_name = driver_name
        self._endpoint = endpoint
        self._on_status = on_status

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver_name,
            endpoint=self._endpoint,
            supported_versions=list(SUPPORTED_SERVICES),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._on_status(bool(request.plugin_registered), str(request.error))
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def add_services(server: Any, prepare_driver: driver.Driver, streams: HealthStreams) -> None:
    """Put the DRA and health services on one server (the kubelet dials one endpoint)."""
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1Service(prepare_driver), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1Beta1Service(prepare_driver), server)
    drahealth_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1Service(streams), server)
    drahealth_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        HealthV1Alpha1Service(streams), server
    )


def add_registration(server: Any, registration: RegistrationService) -> None:
    """Put the registration service on its own server (the plugins_registry socket)."""
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(registration, server)
