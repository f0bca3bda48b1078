"""A kubelet stand-in for DRA drivers: plugin watcher, DRA client and health consumer (DRA.md).

Like the kubelet it watches a ``plugins_registry`` directory for sockets (names starting with
``.`` ignored), calls GetInfo, checks the type and picks the first DRA service it knows from
the advertised list, dials the endpoint, reports the outcome with NotifyRegistrationStatus, and
drops a plugin whose socket goes away. Prepare/Unprepare use the chosen version with the
kubelet's 45 s timeout; the health stream prefers v1. ``restart()`` forgets every plugin and
calls ``on_start`` (the real kubelet deletes the node's ResourceSlices when it starts).

:meth:`DraKubeletStub.follow_health` keeps device health as the kubelet's health cache does
(``pkg/kubelet/cm/dra/healthinfo.go``, DRA.md §3): each device is stamped with the time its
report was *received* (the driver's ``last_updated_time`` is not used for that), reads as
Unknown once no report came within its ``health_check_timeout_seconds`` (30 s when <= 0), and
the driver's data is dropped when its stream ends.

:meth:`DraKubeletStub.prepare_pod` and :meth:`DraKubeletStub.unprepare_pod` are the kubelet's
pod-level use of the calls (DRA.md §2, §4): 45 s per call; a gRPC error discards the answer; a
claim whose entry has an ``error`` or is missing is asked again, with a doubling back-off,
until it is prepared (unprepared) or the attempts run out; an entry for a claim it did not ask
about is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

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

log = logging.getLogger(__name__)

CALL_TIMEOUT = 45.0
RETRY_BACKOFF = 10.0  # the pod worker's first back-off; doubled up to MAX_BACKOFF
MAX_BACKOFF = 300.0
DEFAULT_HEALTH_TIMEOUT = 30.0
HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}
SCAN_INTERVAL = 0.05
DRA_SERVICES = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH_SERVICES = {
    "v1.DRAResourceHealth": (drahealth_v1_pb2, drahealth_v1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc),
}


@dataclass(slots=True)
class DraPlugin:
    """A registered plugin as the kubelet keeps it."""

    driver: str
    socket: str
    endpoint: str
    service: str
    health_service: str | None
    channel: Any
    identity: tuple[int, int, int] | None = None
    getinfo_calls: int = 1

    @property
    def pb2(self) -> Any:
        """Message module of the chosen DRA version."""
        return DRA_SERVICES[self.service][0]

    @property
    def stub(self) -> Any:
        """Client of the chosen DRA version."""
        return DRA_SERVICES[self.service][1].DRAPluginStub(self.channel)


@dataclass(slots=True)
class Refusal:
    """A registration socket the stub refused, and why."""

    socket: str
    error: str


class KubeletRetriesExhausted(Exception):
    """The claims stayed unprepared (or prepared) after every attempt; the text says why."""


@dataclass(slots=True)
class PodCall:
    """What a pod-level Prepare or Unprepare ended with."""

    devices: dict[str, list[Any]]
    attempts: int
    errors: list[str]


@dataclass(slots=True)
class HealthEntry:
    """One device in the kubelet's health cache."""

    health: str
    received: float
    timeout: float
    last_updated_time: int
    message: str


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_ctime_ns) if stat.S_ISSOCK(info.st_mode) else None


@dataclass
class DraKubeletStub:
    """The DRA side of the kubelet over real unix sockets."""

    registry_dir: str
    known_services: Sequence[str] = tuple(DRA_SERVICES)
    on_start: Callable[[], Awaitable[None]] | None = None
    plugins: dict[str, DraPlugin] = field(default_factory=dict)
    refused: list[Refusal] = field(default_factory=list)
    registrations: int = 0
    _task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _seen: dict[str, tuple[int, int, int] | None] = field(default_factory=dict)
    health: dict[tuple[str, str, str], HealthEntry] = field(default_factory=dict)
    health_reports: int = 0
    _health_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def start(self) -> None:
        """Start watching the registry directory (and wipe slices, as a starting kubelet does)."""
        os.makedirs(self.registry_dir, exist_ok=True)
        if self.on_start is not None:
            await self.on_start()
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        """Stop watching and drop every plugin connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for task in self._health_tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task
        self._health_tasks.clear()
        for plugin in list(self.plugins.values()):
            await plugin.channel.close()
        self.plugins.clear()
        self._seen.clear()

    async def restart(self) -> None:
        """A kubelet restart: forget everything, wipe slices, find the sockets again."""
        await self.stop()
        await self.start()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _watch(self) -> None:
        while True:
            try:
                names = sorted(os.listdir(self.registry_dir))
            except FileNotFoundError:
                names = []
            present = {}
            for name in names:
                path = os.path.join(self.registry_dir, name)
                ident = _identity(path)
                if name.startswith(".") or ident is None:
                    continue
                present[path] = ident
                if self._seen.get(path) != ident:
                    self._seen[path] = ident
                    await self._register(path, ident)
            for path in list(self._seen):
                if path not in present:
                    del self._seen[path]
                    await self._deregister(path)
            await asyncio.sleep(SCAN_INTERVAL)

    async def _register(self, socket: str, ident: tuple[int, int, int]) -> None:
        await self._deregister(socket)
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            registration = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            try:
                info = await registration.GetInfo(
                    pluginregistration_v1_pb2.InfoRequest(), timeout=5
                )
            except grpc.aio.AioRpcError as exc:
                self.refused.append(Refusal(socket, f"GetInfo failed: {exc.code().name}"))
                return
            error = self._validate(info)
            if error is None:
                chosen = next(s for s in info.supported_versions if s in self.known_services)
                health_service = next(
                    (s for s in info.supported_versions if s in HEALTH_SERVICES), None
                )
                self.plugins[socket] = DraPlugin(
                    driver=info.name,
                    socket=socket,
                    endpoint=info.endpoint,
                    service=chosen,
                    health_service=health_service,
                    channel=grpc.aio.insecure_channel(f"unix://{info.endpoint}"),
                    identity=ident,
                )
                self.registrations += 1
            else:
                self.refused.append(Refusal(socket, error))
            status = pluginregistration_v1_pb2.RegistrationStatus(
                plugin_registered=error is None, error=error or ""
            )
            with contextlib.suppress(grpc.aio.AioRpcError):
                await registration.NotifyRegistrationStatus(status, timeout=5)
        self._notify()

    def _validate(self, info: Any) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not info.name:
            return "empty driver name"
        if not any(s in self.known_services for s in info.supported_versions):
            return (
                f"none of the services {list(info.supported_versions)} is supported by the "
                f"kubelet ({list(self.known_services)})"
            )
        if not os.path.isabs(info.endpoint):
            return f"endpoint {info.endpoint!r} is not an absolute path"
        return None

    async def _deregister(self, socket: str) -> None:
        plugin = self.plugins.pop(socket, None)
        if plugin is not None:
            await plugin.channel.close()
            self._notify()

    async def _until(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting until {what}")
            changed = self._changed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 0.5))

    async def wait_registered(self, driver: str, count: int = 1, timeout: float = 10) -> DraPlugin:
        """Wait until ``driver`` has been registered ``count`` times in all; return the plugin."""
        await self._until(
            lambda: (
                self.registrations >= count
                and any(p.driver == driver for p in self.plugins.values())
            ),
            f"{driver} is registered ({count} registrations)",
            timeout,
        )
        return self.plugin(driver)

    async def wait_gone(self, driver: str, timeout: float = 10) -> None:
        """Wait until no plugin of ``driver`` is registered."""
        await self._until(
            lambda: not any(p.driver == driver for p in self.plugins.values()),
            f"{driver} is deregistered",
            timeout,
        )

    def plugin(self, driver: str) -> DraPlugin:
        """The newest registered plugin of a driver (the kubelet prefers the newest)."""
        found = [p for p in self.plugins.values() if p.driver == driver]
        if not found:
            raise LookupError(f"DRA driver {driver} is not registered")
        return found[-1]

    async def ping(self, driver: str) -> Any:
        """Call GetInfo again, as the kubelet does from time to time."""
        plugin = self.plugin(driver)
        async with grpc.aio.insecure_channel(f"unix://{plugin.socket}") as channel:
            info = await pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=5
            )
        plugin.getinfo_calls += 1
        return info

    async def prepare(
        self, driver: str, claims: Sequence[tuple[str, str, str]], timeout: float = CALL_TIMEOUT
    ) -> Any:
        """NodePrepareResources for ``(namespace, name, uid)`` claims."""
        plugin = self.plugin(driver)
        request = plugin.pb2.NodePrepareResourcesRequest()
        for namespace, name, uid in claims:
            request.claims.add(namespace=namespace, name=name, uid=uid)
        return await plugin.stub.NodePrepareResources(request, timeout=timeout)

    async def unprepare(
        self, driver: str, claims: Sequence[tuple[str, str, str]], timeout: float = CALL_TIMEOUT
    ) -> Any:
        """NodeUnprepareResources for ``(namespace, name, uid)`` claims."""
        plugin = self.plugin(driver)
        request = plugin.pb2.NodeUnprepareResourcesRequest()
        for namespace, name, uid in claims:
            request.claims.add(namespace=namespace, name=name, uid=uid)
        return await plugin.stub.NodeUnprepareResources(request, timeout=timeout)

    async def watch_health(self, driver: str) -> AsyncGenerator[Any, None]:
        """The plugin's health stream in the version the kubelet prefers."""
        plugin = self.plugin(driver)
        if plugin.health_service is None:
            raise LookupError(f"{driver} offers no health service")
        pb2, grpc_module = HEALTH_SERVICES[plugin.health_service]
        call = grpc_module.DRAResourceHealthStub(plugin.channel).NodeWatchResources(
            pb2.NodeWatchResourcesRequest()
        )
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    def follow_health(self, driver: str) -> None:
        """Open the driver's health stream and keep its reports as the kubelet's cache does."""
        if driver in self._health_tasks and not self._health_tasks[driver].done():
            return
        self._health_tasks[driver] = asyncio.ensure_future(self._follow(driver))

    async def _follow(self, driver: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for response in self.watch_health(driver):
                now = loop.time()
                self.health_reports += 1
                for item in response.devices:
                    timeout = float(item.health_check_timeout_seconds)
                    self.health[(driver, item.device.pool_name, item.device.device_name)] = (
                        HealthEntry(
                            health=HEALTH_NAMES.get(int(item.health), "Unknown"),
                            received=now,
                            timeout=timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT,
                            last_updated_time=int(item.last_updated_time),
                            message=item.message,
                        )
                    )
                self._notify()
        except grpc.aio.AioRpcError as exc:
            log.info("health stream of %s ended: %s", driver, exc.code().name)
        finally:
            # The kubelet clears a driver's health data when its stream ends.
            for key in [k for k in self.health if k[0] == driver]:
                del self.health[key]

    def device_health(self, driver: str, pool: str, device: str) -> str:
        """Healthy, Unhealthy or Unknown, as the kubelet reads it into a pod's status now."""
        entry = self.health.get((driver, pool, device))
        if entry is None:
            return "Unknown"
        if asyncio.get_running_loop().time() - entry.received > entry.timeout:
            return "Unknown"
        return entry.health

    async def _pod_call(
        self,
        operation: str,
        driver: str,
        claims: Sequence[tuple[str, str, str]],
        attempts: int,
        backoff: float,
    ) -> PodCall:
        pending = {uid: (namespace, name, uid) for namespace, name, uid in claims}
        done: dict[str, list[Any]] = {}
        errors: list[str] = []
        delay = backoff
        for attempt in range(1, attempts + 1):
            call = self.prepare if operation == "prepare" else self.unprepare
            try:
                answer = await call(driver, list(pending.values()), timeout=CALL_TIMEOUT)
            except (grpc.aio.AioRpcError, LookupError) as exc:
                # A gRPC error: the kubelet discards the answer and retries every claim.
                text = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                errors.append(f"attempt {attempt}: {operation} failed: {text}")
            else:
                unknown = sorted(set(answer.claims) - set(pending))
                if unknown:
                    errors.append(f"attempt {attempt}: answer for claims not asked: {unknown}")
                for uid in list(pending):
                    if uid not in answer.claims:
                        errors.append(f"attempt {attempt}: claim {uid} missing in the answer")
                    elif answer.claims[uid].error:
                        errors.append(f"attempt {attempt}: {uid}: {answer.claims[uid].error}")
                    else:
                        entry = answer.claims[uid]
                        done[uid] = list(getattr(entry, "devices", []))
                        del pending[uid]
                if not pending and not unknown:
                    return PodCall(done, attempt, errors)
            if attempt < attempts:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)
        raise KubeletRetriesExhausted(
            f"{operation} of {sorted(pending)} did not succeed in {attempts} attempts: "
            + "; ".join(errors[-3:])
        )

    async def prepare_pod(
        self,
        driver: str,
        claims: Sequence[tuple[str, str, str]],
        *,
        attempts: int = 5,
        backoff: float = RETRY_BACKOFF,
    ) -> PodCall:
        """Prepare a pod's claims as the kubelet does: ask again for what failed."""
        return await self._pod_call("prepare", driver, claims, attempts, backoff)

    async def unprepare_pod(
        self,
        driver: str,
        claims: Sequence[tuple[str, str, str]],
        *,
        attempts: int = 5,
        backoff: float = RETRY_BACKOFF,
    ) -> PodCall:
        """Unprepare after the pod's end as the kubelet does (the pod stays Terminating)."""
        return await self._pod_call("unprepare", driver, claims, attempts, backoff)
