"""Serving one resource to the kubelet: take the socket's lock, serve, Register, heal, repeat.

- **One instance per socket.** A :class:`~enflame_gcu.support.socket_lock.SocketLock` decides who
  serves; another instance on the same plugin dir stands by (logging once who holds the socket) and
  takes over when the holder stops. A live socket at our path that nobody locked (an older plugin)
  is never deleted: we wait for it to go away. An instance removes only the socket file that is
  still its own, and only while its listener is open (a closed socket's inode number is free for the
  successor's socket at once); gRPC binds a private name that is linked into place, because gRPC
  deletes the path it bound when the server stops, whoever's file is there by then. The link never
  replaces a file, and an instance whose lock went does not publish at all: a successor's socket
  at the path is never ours to replace.
- **Healing.** The kubelet deletes every socket in its plugin dir when it restarts and re-creates
  ``kubelet.sock``; someone may also delete our socket by hand. Inotify on the plugin dir (plus a
  one-second check for what events miss) notices both; the old server is stopped before the new
  one registers, so an old stream ending cannot race the new registration (SPEC §3: the kubelet
  marks a resource unhealthy and its endpoint stopped whenever any of its streams ends).
- **A deleted socket file under the same kubelet** is published again, not re-registered: the
  kubelet talks to us over the connection it opened at Register, which the file's removal does not
  touch, and ending that stream would mark every card unhealthy. The usual deleter is the plugin
  we took the socket name over from (topscloud's, on ``enflame-ctk migrate``): a gRPC server, Go's
  or ours, unlinks the path it bound, by name, when it stops, and that name is ours by then. A new
  listener (same service, same state) is bound privately and linked into place; the connection
  and stream the kubelet has stay open. Only when the kubelet.sock changed too (a kubelet
  restart), the lock went, or another file took the path do we serve and register anew.
- **A plugin dir we cannot use** (missing, read-only, not a directory) is one error line, then
  retries with back-off (repeats at debug), then one line when it works again.
- **Reconfiguration in place.** SIGHUP gives a running server a new config and snapshot
  (:meth:`ResourceServer.reconfigure`): the open ListAndWatch stream sends the new list, nothing
  ends, nothing re-registers (make-before-break without a break).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass, field

import grpc

from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import service
from enflame_gcu.device_plugin import state as plugin_state
from enflame_gcu.support import aio, inotify, socket_lock, unix_sockets

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT = 15.0  # the kubelet dials us back inside Register with a 10 s timeout
STOP_GRACE = 0.5
CHECK_INTERVAL = 1.0
STANDBY_INTERVAL = 0.5  # how often a standby instance tries the lock (events wake it sooner)
LISTENER_GRACE = 0.1  # a killed holder's listener may outlive its lock by this much
BACKOFF_FIRST, BACKOFF_MAX = 0.25, 5.0


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


class DirUnusable(Exception):
    """The plugin dir cannot hold our socket right now (message says why)."""


class Occupied(Exception):
    """A live server we do not know listens on our socket path."""


class LockLost(Exception):
    """The lock we took is no longer the one at its path (deleted or replaced): not ours to
    serve until :meth:`ResourceServer._take_lock` says so again."""


class _Trouble:
    """Reports a recurring failure once at ERROR, repeats at DEBUG, recovery once at INFO."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.delay = BACKOFF_FIRST

    def failed(self, reason: str) -> float:
        if reason != self.reason:
            log.error("%s; retrying with back-off (at most every %.0f s)", reason, BACKOFF_MAX)
            self.reason, self.delay = reason, BACKOFF_FIRST
        else:
            log.debug("still failing: %s", reason)
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_MAX)
        return delay

    def recovered(self, what: str) -> None:
        if self.reason is not None:
            log.info("%s works again (was: %s)", what, self.reason)
        self.reason, self.delay = None, BACKOFF_FIRST


class ResourceServer:
    """One resource on one socket in the plugin dir; a process may run several side by side."""

    def __init__(
        self,
        config: plugin_config.PluginConfig,
        state: plugin_state.PluginState,
        *,
        resource_name: str | None = None,
        socket_name: str | None = None,
        observer: service.PluginObserver | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.observer = observer
        self.resource_name = resource_name or config.resource_name
        self.socket_name = socket_name or config.socket_name
        self.socket_path = os.path.join(config.plugin_dir, self.socket_name)
        self.lock = socket_lock.SocketLock(self.socket_path)
        self.stopping = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        # A listener published after our socket file was deleted under the same kubelet (the
        # first server keeps the kubelet's connection and stream; only the newest spare is kept).
        self._republished: grpc.aio.Server | None = None
        self._service: service.DevicePluginService | None = None
        self._socket: tuple[int, int] | None = None
        self._kubelet: tuple[int, int, int] | None = None
        self._trouble = _Trouble()
        self._cause = "start"  # why the next registration happens (metrics)
        self._kubelet_left = False  # kubelet.sock vanished or changed since we registered

    @property
    def kubelet_socket(self) -> str:
        """The kubelet's registration socket."""
        return os.path.join(self.config.plugin_dir, KUBELET_SOCKET)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies this server to the kubelet: socket path and resource name."""
        return (self.socket_path, self.resource_name)

    def reconfigure(self, config: plugin_config.PluginConfig) -> None:
        """Serve a new config (same socket and resource) from now on, on the open streams."""
        self.config = config
        if self._service is not None:
            self._service.reconfigure(config)

    # --- the socket ---------------------------------------------------------------------------

    def _check_dir(self) -> None:
        directory = self.config.plugin_dir
        if not os.path.isdir(directory):
            what = "is not a directory" if os.path.lexists(directory) else "does not exist"
            raise DirUnusable(
                f"plugin dir {directory} {what} (the kubelet creates it; check the hostPath "
                "mount and --plugin-dir)"
            )

    async def start(self) -> None:
        """Serve on our socket (we hold the lock), removing a stale file nobody listens on.

        gRPC binds a private name next to the socket, which is then linked to the socket path:
        gRPC removes the path it bound, by name, when the server stops, and by then the socket
        path may hold a successor's socket (another instance took over after a wipe). Occupied
        when a file took the path while we bound, LockLost when our lock went meanwhile; either
        way nothing of ours is left serving.
        """
        self._check_dir()
        path = self.socket_path
        if os.path.lexists(path):
            if unix_sockets.listening(path):
                raise Occupied(path)
            log.info("removing stale socket %s left by an earlier instance", path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise DirUnusable(f"cannot remove stale {path}: {exc.strerror or exc}") from exc
        unix_sockets.remove_stale_binds(path)
        self._service = service.DevicePluginService(
            self.state, self.config, self.resource_name, self.observer
        )
        try:
            self._server, private = await self._listen(self._service)
        except DirUnusable:
            self._service = None
            raise
        try:
            await self._publish(private)
        except (Occupied, LockLost):
            await self.stop()  # nothing of ours is at the path: stop the unpublished server
            raise
        log.debug("serving %s on %s", self.resource_name, path)

    async def _listen(self, servicer: service.DevicePluginService) -> tuple[grpc.aio.Server, str]:
        """A started gRPC server for ``servicer``, bound at a fresh private name beside our
        socket."""
        private = unix_sockets.private_bind_name(self.socket_path)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
        try:
            server.add_insecure_port(f"unix://{private}")
        except RuntimeError as exc:  # grpc's whole report of a failed bind
            raise DirUnusable(
                f"cannot create socket {self.socket_path} ({exc}; is the plugin dir writable?)"
            ) from exc
        await server.start()
        return server, private

    async def _publish(self, private: str) -> None:
        """Link our private bind into place (never over another file) and remember the file's
        identity; Occupied when a file arrived at the path meanwhile, LockLost when our lock went.

        A rename would replace whatever is at the path: an instance whose lock was wiped while
        it was binding (the lock is checked before its bind, not at this instant) replaced the
        socket its successor had just published and registered, and then removed it as its own
        when it saw the lock gone; the kubelet, dialing that path inside the successor's Register,
        found nothing for its whole 10 s timeout (tests/device_plugin/test_two_instances.py).
        """
        # Nobody else knows the private name: this is the identity of the file we bound.
        bound = unix_sockets.inode(private)
        if self.lock.acquired and not self.lock.held():
            raise LockLost(self.lock.path)  # tests serve without taking the lock at all
        try:
            _link_no_replace(private, self.socket_path)
        except FileNotFoundError:
            # Wiped before we published it: None makes _lost() say so, and we serve again.
            bound = None
        except FileExistsError as exc:
            raise Occupied(self.socket_path) from exc
        except OSError as exc:
            await self.stop()
            raise DirUnusable(
                f"cannot create socket {self.socket_path}: {exc.strerror or exc}"
            ) from exc
        self._socket = bound

    def _only_file_gone(self) -> bool:
        """True when our socket file is gone (nothing at the path) while our server runs, we
        hold the lock, the kubelet's stream to us is open and its kubelet.sock has not changed
        since we registered: publishing the path again is all that is missing. (A restarting
        kubelet drops our stream; kubelet.sock alone may look unchanged when it is re-created
        within the file system's timestamp granularity with the inode number just freed.)"""
        return (
            self._service is not None
            and self._service.streams > 0
            and self._socket is not None
            and not os.path.lexists(self.socket_path)
            and self.lock.held()
            and not self._kubelet_left
            and self._kubelet is not None
            and unix_sockets.identity(self.kubelet_socket) == self._kubelet
        )

    async def _republish(self) -> bool:
        """Publish our socket path again with a new listener, keeping the server the kubelet is
        connected to (and its stream); False when that cannot be done (serve anew instead)."""
        if self._service is None:  # pragma: no cover - _only_file_gone checked it
            return False
        try:
            server, private = await self._listen(self._service)
        except DirUnusable as exc:
            log.warning("%s; serving anew", exc)
            return False
        if os.path.lexists(self.socket_path):  # someone else's file arrived meanwhile
            await server.stop(None)
            return False
        try:
            await self._publish(private)
        except (Occupied, LockLost):
            await server.stop(None)  # someone else's file arrived, or our lock went: serve anew
            return False
        except DirUnusable as exc:
            await server.stop(None)
            log.warning("%s", exc)
            return False
        previous, self._republished = self._republished, server
        if previous is not None:
            # Its file is gone too; the kubelet's connection is on the first server.
            await previous.stop(STOP_GRACE)
        return not self._lost()

    def _lost(self) -> bool:
        """True when the file at our socket path is not the one our server bound."""
        return self._socket is None or unix_sockets.inode(self.socket_path) != self._socket

    async def stop(self) -> None:
        """Remove our socket (only if it is still ours), end the streams, stop the server.

        The file goes first, while our listener still holds its inode: once the listener is
        closed the file system may give that inode number to the next file at once (ext4
        does), and a successor's socket at our path would then look like ours.
        """
        if self._socket is not None and unix_sockets.inode(self.socket_path) == self._socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        if self._service is not None:
            self._service.stop_streams()
        for server in (self._republished, self._server):
            if server is not None:
                await server.stop(STOP_GRACE)
        self._server = self._republished = self._service = self._socket = None
        if self.observer is not None:
            self.observer.unregistered(self.resource_name)

    # --- registration -------------------------------------------------------------------------

    async def _register_once(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=service.options(),
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT)

    async def register(self, watcher: inotify.ChangeWatcher) -> bool:
        """Register, retrying until the kubelet answers; False when stopping or the socket or
        the lock was lost meanwhile."""
        delay, warned = 0.05, False
        while not self.stopping.is_set():
            if self._lost():
                log.info("our socket vanished before registration; serving again")
                return False
            if not self.lock.held():
                return False
            kubelet = unix_sockets.identity(self.kubelet_socket)
            if kubelet is None:
                reason = f"{self.kubelet_socket} does not exist"
            else:
                try:
                    await self._register_once()
                except grpc.aio.AioRpcError as exc:
                    reason = f"{exc.code().name}: {exc.details()}"
                else:
                    cause = self._cause
                    if self._kubelet_left and cause != "takeover":
                        cause = "kubelet_restart"  # it also deleted our socket
                    self._kubelet, self._kubelet_left = kubelet, False
                    if self.observer is not None:
                        self.observer.registered_with(self.resource_name, cause)
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
            await wait_any(watcher, self.stopping, delay)
            delay = min(delay * 2, 2.0)
        return False

    def restart_reason(self) -> str | None:
        """Why we must serve and register again, or None."""
        if self._lost():
            return f"our socket {self.socket_path} was deleted or replaced"
        if not self.lock.held():
            return f"our lock {self.lock.path} was deleted or replaced"
        kubelet = unix_sockets.identity(self.kubelet_socket)
        if kubelet is not None and kubelet != self._kubelet:
            return f"{self.kubelet_socket} was re-created (kubelet restart)"
        return None

    async def _healed_reason(self) -> str | None:
        """:meth:`restart_reason`, after publishing our socket file again when only the file
        went (the kubelet's connection and stream to us stay open: no re-registration)."""
        if self._only_file_gone() and await self._republish():
            log.info(
                "our socket %s was deleted while the kubelet stayed connected: serving it "
                "again; registration and stream kept",
                self.socket_path,
            )
        return self.restart_reason()

    # --- the whole life -----------------------------------------------------------------------

    async def _take_lock(self, watcher: inotify.ChangeWatcher) -> bool:
        """Hold the lock and see no foreign live socket; wait (standby) meanwhile. False when
        stopping."""
        said = ""
        while not self.stopping.is_set():
            try:
                self._check_dir()
                got = self.lock.try_acquire()
            except DirUnusable as exc:
                await wait_any(watcher, self.stopping, self._trouble.failed(str(exc)))
                continue
            except OSError as exc:
                reason = f"cannot lock {self.lock.path}: {exc.strerror or exc}"
                await wait_any(watcher, self.stopping, self._trouble.failed(reason))
                continue
            self._trouble.recovered(f"plugin dir {self.config.plugin_dir}")
            foreign = got and unix_sockets.listening(self.socket_path)
            if foreign:
                # A holder killed just now drops its lock before its listener (fd order).
                await asyncio.sleep(LISTENER_GRACE)
                foreign = unix_sockets.listening(self.socket_path)
            if got and not foreign:
                if said:
                    log.info("taking over %s", self.socket_path)
                    self._cause = "takeover"
                return True
            if got:
                message = (
                    f"{self.socket_path} is served by a process that does not take "
                    f"{self.lock.path} (an older enflame-device-plugin?); waiting for it to stop"
                )
                self.lock.release()
                if message == said:
                    # Taking and dropping the lock just now created and removed its file: those
                    # events are ours and must not wake us (it would re-take the lock ten times
                    # a second); anything else in the plugin dir, the socket moved aside or
                    # removed above all, does.
                    watcher.refresh()
                    await self._wait_ignoring(watcher, os.path.basename(self.lock.path))
                    continue
            else:
                message = (
                    f"{self.socket_path} is served by another enflame-device-plugin "
                    f"({self.lock.holder()}); this instance stands by and takes over when "
                    "that one stops"
                )
            if message != said:
                log.warning("%s", message)
                said = message
            watcher.refresh()
            await wait_any(watcher, self.stopping, STANDBY_INTERVAL)
        return False

    async def _wait_ignoring(self, watcher: inotify.ChangeWatcher, name: str) -> None:
        """Like :func:`wait_any` for :data:`STANDBY_INTERVAL`, but events about ``name`` alone
        do not end the wait."""
        deadline = time.monotonic() + STANDBY_INTERVAL
        while (left := deadline - time.monotonic()) > 0 and not self.stopping.is_set():
            changes = await _changes(watcher, self.stopping, left)
            if any(changed != name for _, changed in changes):
                return

    async def run(self) -> None:
        """Serve, register and heal until :meth:`close`; stand by while another holds the lock."""
        with inotify.ChangeWatcher([self.config.plugin_dir]) as watcher:
            try:
                while await self._take_lock(watcher):
                    await self._serve_while_locked(watcher)
                    await self.stop()
                    if not self.lock.held():  # deleted under us: _take_lock tries it anew
                        self.lock.release(unlink=False)
            finally:
                await self.stop()
                self.lock.release()

    async def _serve_while_locked(self, watcher: inotify.ChangeWatcher) -> None:
        while not self.stopping.is_set():
            try:
                await self.start()
            except (Occupied, LockLost):
                return  # _take_lock waits for the foreign server to go, or takes the lock anew
            except DirUnusable as exc:
                await self.stop()
                await wait_any(watcher, self.stopping, self._trouble.failed(str(exc)))
                return  # through _take_lock again: the lock may have gone with the dir
            self._trouble.recovered(f"plugin dir {self.config.plugin_dir}")
            if await self.register(watcher):
                while (reason := await self._healed_reason()) is None:
                    if unix_sockets.identity(self.kubelet_socket) != self._kubelet:
                        self._kubelet_left = True
                    if self.stopping.is_set():
                        return
                    watcher.refresh()  # the plugin dir itself may have been re-created
                    await wait_any(watcher, self.stopping, CHECK_INTERVAL)
                log.info("%s: serving again and re-registering", reason)
                self._cause = _cause(reason)
                if unix_sockets.identity(self.kubelet_socket) != self._kubelet:
                    self._kubelet_left = True
                if self.observer is not None:
                    self.observer.unregistered(self.resource_name)
            if not self.lock.held():
                return  # run() stops the server; _take_lock decides whether we still may serve
            await self.stop()

    async def close(self) -> None:
        """Ask :meth:`run` to end (it stops the server and releases the lock)."""
        self.stopping.set()


def _link_no_replace(source: str, target: str) -> None:
    """Give ``source`` the name ``target`` unless ``target`` exists (FileExistsError), then
    drop ``source``: the rename that never replaces (link(2) fails on an existing target)."""
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        # A file system without hard links for sockets: rename, checked just before.
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target) from exc
        os.rename(source, target)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(source)  # gRPC's own unlink of the bound name at stop then finds nothing


def _cause(reason: str) -> str:
    """The registration cause (a metrics label) for a :meth:`ResourceServer.restart_reason`."""
    if "kubelet restart" in reason:
        return "kubelet_restart"
    if "our lock" in reason:
        return "lock_lost"
    return "socket_lost"


async def _changes(
    watcher: inotify.ChangeWatcher, stopping: asyncio.Event, timeout: float
) -> list[tuple[str, str]]:
    """The plugin-dir events of the next wake-up (none on ``stopping`` or ``timeout``)."""
    events = asyncio.ensure_future(watcher.wait(timeout))
    await aio.first(events, stopping.wait())
    if events.done() and not events.cancelled() and events.exception() is None:
        return events.result()
    return []


async def wait_any(watcher: inotify.ChangeWatcher, stopping: asyncio.Event, timeout: float) -> None:
    """Sleep until a plugin-dir event, ``stopping`` or ``timeout``."""
    await aio.first(watcher.wait(timeout), stopping.wait())
