"""Serving the kubelet: the DRA service socket first, then the registration socket.

The kubelet's plugin watcher finds ``<driver>-reg.sock`` in ``plugins_registry``, asks GetInfo
and dials the endpoint it names (DRA.md §1). Serving the DRA service before the registration
socket appears means the kubelet never dials an endpoint that is not there yet. If either
socket is deleted or replaced (a cleanup script, a kubelet that re-creates its directories),
both servers start again and the registration socket re-appears, so the kubelet registers us
again; inotify on the two directories plus a one-second check notice it.

Two instances may share the socket names (no pod UID), so each socket is bound under a private
name (``.<name>.<8 hex digits>``) and renamed into place: gRPC deletes the path it bound, by
name, when the server stops, whoever's file is there by then. An instance removes a socket
only while it is still its own and its listener is still open (a closed socket's inode number
is free for the next file at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import grpc

from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.dra_plugin import driver, node, service
from enflame_gcu.support import inotify, unix_sockets

log = logging.getLogger(__name__)

STOP_GRACE = 0.5
CHECK_INTERVAL = 1.0


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
        unix_sockets.remove_stale_binds(path)
        private = unix_sockets.private_bind_name(path)
        server = grpc.aio.server()
        add(server)  # type: ignore[operator]
        server.add_insecure_port(f"unix://{private}")
        await server.start()
        self._servers.append(server)
        # Nobody else knows the private name: this is the identity of the file we bound.
        bound = unix_sockets.identity(private)
        try:
            os.rename(private, path)
        except FileNotFoundError:
            bound = None  # wiped before we published it: restart_reason() says so
        # The rename changed the ctime; the inode, held by our listener, is still ours alone.
        published = unix_sockets.identity(path)
        if bound is None or published is None or published[:2] != bound[:2]:
            published = None
        self._sockets[path] = published

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
        """Remove our sockets (only if still ours), end health streams, stop both servers.

        The files go first, while our listeners still hold their inodes: once a listener is
        closed the file system may give its inode number to the next file at once (ext4 does),
        and a successor's socket at our path would then look like ours.
        """
        # The registration socket goes first: the kubelet deregisters before the service ends.
        for path, ident in reversed(self._sockets.items()):
            if ident is not None and unix_sockets.identity(path) == ident:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if self._streams is not None:
            self._streams.stop()
        for server in reversed(self._servers):
            await server.stop(STOP_GRACE)
        self._servers.clear()
        self._sockets.clear()
        self._streams = None
        self.registered.clear()

    def restart_reason(self) -> str | None:
        """Why both servers must start again, or None."""
        for path, ident in self._sockets.items():
            if unix_sockets.identity(path) != ident:
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
