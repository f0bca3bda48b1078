"""Serving the kubelet: the DRA service socket first, then the registration socket.

The kubelet's plugin watcher finds ``<driver>-reg.sock`` in ``plugins_registry``, asks GetInfo
and dials the endpoint it names (DRA.md §1). Serving the DRA service before the registration
socket appears means the kubelet never dials an endpoint that is not there yet. If either
socket is deleted or replaced (a cleanup script, a kubelet that re-creates its directories),
both servers start again and the registration socket re-appears, so the kubelet registers us
again; inotify on the two directories plus a one-second check notice it.

**One instance per socket name.** With a pod UID the socket names carry it, and two instances (a
rolling update with surge) serve side by side. Without one, two instances on a node (a surge
without the pod UID, a manual run next to the DaemonSet, a Helm release next to the static
manifest) would share the names and each take the other's sockets forever. So without a pod UID
whoever holds the :class:`~enflame_gcu.support.socket_lock.SocketLock` of the service socket
(``dra.sock.lock``, one lock for the pair) serves both sockets; another instance stands by, says
once who holds it, and takes over when the holder stops (the kernel drops the lock when its process
ends, even on SIGKILL; a standby tries on every change in the directory, which includes the
holder's exit closing the lock file, and every half second). A standby serves nothing and publishes
nothing (:attr:`KubeletPlugin.serving`); taking over, it first recovers the checkpoint as a start
does (the holder may have been killed inside a Prepare). A live socket at our path that nobody
locked (an older driver) is never deleted: we wait for it to go away.

Each socket is bound under a private name (``.<name>.<8 hex digits>``) and renamed into place:
gRPC deletes the path it bound, by name, when the server stops, whoever's file is there by then.
An instance removes a socket only while it is still its own and its listener is still open (a
closed socket's inode number is free for the next file at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import grpc

from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.dra_plugin import driver, node, service
from enflame_gcu.errors import EnflameError
from enflame_gcu.support import aio, inotify, socket_lock, unix_sockets

log = logging.getLogger(__name__)

STOP_GRACE = 0.5
CHECK_INTERVAL = 1.0
STANDBY_INTERVAL = 0.5  # how often a standby instance tries the lock (events wake it sooner)
BACKOFF_FIRST, BACKOFF_MAX = 0.25, 5.0


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
        # Set while this instance may serve (it holds the lock, or has a pod UID), cleared
        # while it stands by: the publisher follows it.
        self.serving = asyncio.Event()
        self.standing_by = asyncio.Event()
        self.lock = None if settings.pod_uid else socket_lock.SocketLock(settings.endpoint)
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
        if self.lock is not None and not self.lock.held():
            return f"our lock {self.lock.path} was deleted or replaced"
        return None

    def _stand_by(self) -> None:
        self.serving.clear()
        self.standing_by.set()

    async def _take_lock(self, watcher: inotify.ChangeWatcher, stop: asyncio.Event) -> bool:
        """Hold the lock (without a pod UID) and see no foreign live socket at our paths; stand
        by meanwhile. False when stopping."""
        settings = self.settings
        said, trouble, delay = "", "", BACKOFF_FIRST
        while not stop.is_set():
            try:
                for directory in (settings.data_dir, settings.registry_dir):
                    os.makedirs(directory, exist_ok=True)
                got = self.lock is None or self.lock.try_acquire()
            except OSError as exc:
                reason = f"cannot use {exc.filename or settings.data_dir}: {exc.strerror or exc}"
                if reason != trouble:
                    log.error(
                        "%s; retrying with back-off (at most every %.0f s)", reason, BACKOFF_MAX
                    )
                    trouble, delay = reason, BACKOFF_FIRST
                self._stand_by()
                await _wait_any(watcher, stop, delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            if trouble:
                log.info("the driver's directories work again (was: %s)", trouble)
                trouble = ""
            watcher.refresh()
            foreign = [
                path
                for path in (settings.endpoint, settings.registration_socket)
                if unix_sockets.listening(path)
            ]
            if got and foreign:
                # A holder killed just now drops its lock before its listeners (fd order).
                await asyncio.sleep(0.1)
                foreign = [path for path in foreign if unix_sockets.listening(path)]
            if got and not foreign:
                if said:
                    log.info("taking over %s", settings.endpoint)
                    await self._recover()
                self.standing_by.clear()
                self.serving.set()
                return True
            if got and self.lock is None:
                message = f"{foreign[0]} is served by another process; waiting for it to stop"
            elif got and self.lock is not None:
                message = (
                    f"{foreign[0]} is served by a process that does not take {self.lock.path} "
                    "(an older enflame-dra-plugin?); waiting for it to stop"
                )
                self.lock.release()
            else:
                holder = self.lock.holder() if self.lock is not None else "unknown"
                message = (
                    f"{settings.endpoint} is served by another enflame-dra-plugin ({holder}); "
                    "this instance stands by and takes over when that one stops"
                )
            if message != said:
                log.warning("%s", message)
                said = message
            self._stand_by()
            await _wait_any(watcher, stop, STANDBY_INTERVAL)
        return False

    async def _recover(self) -> None:
        """Roll back what the instance we take over from left half done (it may have been
        killed inside a Prepare since our own start), as a start does."""
        try:
            await asyncio.to_thread(self.driver.recover)
        except (EnflameError, OSError) as exc:  # every call will name the problem too
            log.error("cannot recover the checkpoint on taking over: %s", exc)

    async def _serve_while_locked(
        self, watcher: inotify.ChangeWatcher, stop: asyncio.Event
    ) -> None:
        """Serve and heal while we hold the lock; return to stand by or stop."""
        while not stop.is_set():
            await self.start()
            while (reason := self.restart_reason()) is None and not stop.is_set():
                watcher.refresh()
                await _wait_any(watcher, stop, CHECK_INTERVAL)
            if reason is not None:
                log.warning("%s: serving again so that the kubelet re-registers us", reason)
            await self.stop()
            if self.lock is not None and not self.lock.held():
                self.lock.release(unlink=False)
                return  # _take_lock decides whether we still may serve

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Serve and heal until ``stop`` is set; stand by while another instance serves."""
        directories = [self.settings.registry_dir, self.settings.data_dir]
        with inotify.ChangeWatcher(directories) as watcher:
            try:
                while await self._take_lock(watcher, stop):
                    await self._serve_while_locked(watcher, stop)
            finally:
                await self.stop()
                self.serving.clear()
                if self.lock is not None:
                    self.lock.release()


async def _wait_any(watcher: inotify.ChangeWatcher, stop: asyncio.Event, timeout: float) -> None:
    await aio.first(watcher.wait(timeout), stop.wait())
