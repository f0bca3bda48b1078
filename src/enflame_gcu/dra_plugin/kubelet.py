"""Serving the kubelet: the DRA service socket first, then the registration socket.

The kubelet's plugin watcher finds ``<driver>-reg.sock`` in ``plugins_registry``, asks GetInfo
and dials the endpoint it names (DRA.md §1). Serving the DRA service before the registration
socket appears means the kubelet never dials an endpoint that is not there yet. If either
socket is deleted or replaced (a cleanup script, a kubelet that re-creates its directories),
both servers start again and the registration socket re-appears, so the kubelet registers us
again; inotify on the two directories plus a one-second check notice it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import grpc

from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.dra_plugin import driver, node, service
from enflame_gcu.support import inotify

log = logging.getLogger(__name__)

STOP_GRACE = 0.5
CHECK_INTERVAL = 1.0


def identity(path: str) -> tuple[int, int, int] | None:
    """``(device, inode, ctime)`` of a file; None when absent (tells a re-created file apart:
    a new file may get the inode number of the one just deleted)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_ctime_ns)


class KubeletPlugin:
    """The two gRPC servers the kubelet talks to, kept alive until a stop is asked for."""

    def __init__(
        self,
        settings: dra_config.DraConfig,
        prepare_driver: driver.Driver,
        devices: node.NodeDevices,
    ) -> None:
        self.settings = settings
        self.driver = prepare_driver
        self.devices = devices
        self.registered = asyncio.Event()
        self.registration_error = ""
        self._streams: service.HealthStreams | None = None
        self._servers: list[grpc.aio.Server] = []
        self._sockets: dict[str, tuple[int, int, int] | None] = {}

    def _on_status(self, registered: bool, error: str) -> None:
        if registered:
            log.info("the kubelet registered %s", self.settings.driver_name)
            self.registration_error = ""
            self.registered.set()
        else:
            self.registration_error = error
            self.registered.clear()
            log.error(
                "the kubelet refused the registration of %s: %s", self.settings.driver_name, error
            )

    async def _serve(self, path: str, add: object) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            log.info("removing stale socket %s left by an earlier instance", path)
            os.unlink(path)
        server = grpc.aio.server()
        add(server)  # type: ignore[operator]
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._servers.append(server)
        self._sockets[path] = identity(path)

    async def start(self) -> None:
        """Serve the DRA + health services, then the registration socket."""
        settings = self.settings
        self._streams = service.HealthStreams(self.devices, settings.node_name)
        streams = self._streams
        await self._serve(
            settings.endpoint, lambda server: service.add_services(server, self.driver, streams)
        )
        registration = service.RegistrationService(
            settings.driver_name, settings.endpoint, self._on_status
        )
        await self._serve(
            settings.registration_socket,
            lambda server: service.add_registration(server, registration),
        )
        log.info(
            "serving %s on %s, registration on %s",
            settings.driver_name,
            settings.endpoint,
            settings.registration_socket,
        )

    async def stop(self) -> None:
        """End health streams, stop both servers, remove our sockets (only if still ours)."""
        if self._streams is not None:
            self._streams.stop()
        # The registration socket goes first: the kubelet deregisters before the service ends.
        for server in reversed(self._servers):
            await server.stop(STOP_GRACE)
        for path, ident in self._sockets.items():
            if ident is not None and identity(path) == ident:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._servers.clear()
        self._sockets.clear()
        self._streams = None
        self.registered.clear()

    def restart_reason(self) -> str | None:
        """Why both servers must start again, or None."""
        for path, ident in self._sockets.items():
            if identity(path) != ident:
                return f"socket {path} was deleted or replaced"
        return None

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Serve and heal until ``stop`` is set."""
        directories = [self.settings.registry_dir, self.settings.data_dir]
        with inotify.ChangeWatcher(directories) as watcher:
            try:
                while not stop.is_set():
                    await self.start()
                    while (reason := self.restart_reason()) is None and not stop.is_set():
                        watcher.refresh()
                        await _wait_any(watcher, stop, CHECK_INTERVAL)
                    if reason is not None:
                        log.warning("%s: serving again so that the kubelet re-registers us", reason)
                    await self.stop()
            finally:
                await self.stop()


async def _wait_any(watcher: inotify.ChangeWatcher, stop: asyncio.Event, timeout: float) -> None:
    tasks = [asyncio.ensure_future(watcher.wait(timeout)), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
