"""Serving one resource to the kubelet: serve, then Register, then watch for reasons to redo it.

The kubelet deletes every socket in its plugin dir when it restarts and re-creates
``kubelet.sock``; someone may also delete our socket by hand. Inotify on the plugin dir (plus a
one-second check for what events miss) notices both; the old server is stopped before the new
one registers, so an old stream ending cannot race the new registration (SPEC §3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

import grpc

from enflame_gcu import health
from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import service
from enflame_gcu.device_plugin import state as plugin_state

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT = 15.0  # the kubelet dials us back inside Register with a 10 s timeout
STOP_GRACE = 0.5
CHECK_INTERVAL = 1.0


def identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of a file, None when it does not exist: tells re-creation apart."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


@dataclass(slots=True)
class Signals:
    """What the process was asked to do: stop (SIGTERM/SIGINT) or restart (SIGHUP)."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    restart: asyncio.Event = field(default_factory=asyncio.Event)

    def pending(self) -> str | None:
        """``stop`` or ``restart`` when one was asked for."""
        if self.stop.is_set():
            return "stop"
        if self.restart.is_set():
            return "restart"
        return None


class ResourceServer:
    """One resource on one socket in the plugin dir; a process may run several side by side."""

    def __init__(
        self,
        config: plugin_config.PluginConfig,
        state: plugin_state.PluginState,
        *,
        resource_name: str | None = None,
        socket_name: str | None = None,
        observer: service.AllocationObserver | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.observer = observer
        self.resource_name = resource_name or config.resource_name
        self.socket_name = socket_name or config.socket_name
        self.socket_path = os.path.join(config.plugin_dir, self.socket_name)
        self._server: grpc.aio.Server | None = None
        self._service: service.DevicePluginService | None = None
        self._socket: tuple[int, int] | None = None
        self._kubelet: tuple[int, int] | None = None

    @property
    def kubelet_socket(self) -> str:
        """The kubelet's registration socket."""
        return os.path.join(self.config.plugin_dir, KUBELET_SOCKET)

    async def start(self) -> None:
        """Serve on our socket, removing a stale file left by an earlier instance."""
        path = self.socket_path
        os.makedirs(self.config.plugin_dir, exist_ok=True)
        if os.path.lexists(path):
            log.info("removing stale socket %s left by an earlier instance", path)
            os.unlink(path)
        server = grpc.aio.server()
        self._service = service.DevicePluginService(
            self.state, self.config, self.resource_name, self.observer
        )
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._service, server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._server = server
        # The file exists from bind() on, so it can be deleted before we note it here: then
        # this is None and _lost() says so (it never compares None with a vanished file).
        self._socket = identity(path)
        log.debug("serving %s on %s", self.resource_name, path)

    def _lost(self) -> bool:
        """True when the file at our socket path is not the one our server bound."""
        return self._socket is None or identity(self.socket_path) != self._socket

    async def stop(self) -> None:
        """End the streams, stop the server, remove our socket (only if it is still ours)."""
        if self._service is not None:
            self._service.stop_streams()
        if self._server is not None:
            await self._server.stop(STOP_GRACE)
        if self._socket is not None and identity(self.socket_path) == self._socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        self._server = self._service = self._socket = None

    async def _register_once(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=service.options(),
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT)

    async def register(self, watcher: health.ChangeWatcher, signals: Signals) -> bool:
        """Register, retrying until the kubelet answers; False on a signal or a lost socket."""
        delay, warned = 0.05, False
        while signals.pending() is None:
            if self._lost():
                log.info("our socket vanished before registration; serving again")
                return False
            kubelet = identity(self.kubelet_socket)
            if kubelet is None:
                reason = f"{self.kubelet_socket} does not exist"
            else:
                try:
                    await self._register_once()
                except grpc.aio.AioRpcError as exc:
                    reason = f"{exc.code().name}: {exc.details()}"
                else:
                    self._kubelet = kubelet
                    log.info(
                        "registered %s (%d devices) with the kubelet at %s",
                        self.resource_name,
                        len(self.state.snapshot.devices()),
                        self.kubelet_socket,
                    )
                    return True
            if not warned:
                log.warning("cannot register with the kubelet yet (%s); will keep trying", reason)
                warned = True
            else:
                log.debug("register retry: %s", reason)
            await wait_any(watcher, signals, delay)
            delay = min(delay * 2, 2.0)
        return False

    def restart_reason(self) -> str | None:
        """Why we must serve and register again, or None."""
        if self._lost():
            return f"our socket {self.socket_path} was deleted or replaced"
        kubelet = identity(self.kubelet_socket)
        if kubelet is not None and kubelet != self._kubelet:
            return f"{self.kubelet_socket} was re-created (kubelet restart)"
        return None

    async def serve_until_signal(self, signals: Signals) -> str:
        """Serve, register and heal until a signal; return ``stop`` or ``restart``."""
        with health.ChangeWatcher([self.config.plugin_dir]) as watcher:
            try:
                while True:
                    await self.start()
                    if await self.register(watcher, signals):
                        while (reason := self.restart_reason()) is None:
                            if signals.pending():
                                break
                            watcher.refresh()  # the plugin dir itself may have been re-created
                            await wait_any(watcher, signals, CHECK_INTERVAL)
                        else:
                            log.info("%s: serving again and re-registering", reason)
                    pending = signals.pending()
                    if pending:
                        return pending
                    await self.stop()
            finally:
                await self.stop()


async def wait_any(watcher: health.ChangeWatcher, signals: Signals, timeout: float) -> None:
    """Sleep until a plugin-dir event, a signal or ``timeout``."""
    tasks = [
        asyncio.ensure_future(watcher.wait(timeout)),
        asyncio.ensure_future(signals.stop.wait()),
        asyncio.ensure_future(signals.restart.wait()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
